//! TLS to Redis against real `redis-server --tls-port` processes with certificates generated per
//! test: checks enforced over TLS (server verified by the configured CA), a wrong CA refused with
//! a clear, counted error while the daemon keeps answering by failure mode, mutual TLS required
//! and given, the `insecure` switch, and `sluice config check` refusing what `serve` would.

use std::time::Duration;

use serde_json::json;

use sluice::config::{HumanDuration, RedisTarget, Settings};
use sluice::store::redis::access::{Access, TlsFiles, TlsOptions};
use sluice::store::redis::conn::{self, Timeouts};
use sluice::store::redis::error::ErrorKind;

use crate::helpers::{metric_value, run, sluice_command, spawn_app_in, test_settings, TestApp};
use crate::tls_pki::{TestPki, TlsRedis};

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 3, period: 1h, failure_mode: closed}
";

/// Longest wait for the daemon to connect (or to count a refusal).
const WAIT: Duration = Duration::from_secs(20);

fn login(ip: &str) -> serde_json::Value {
    json!({"policy": "login", "descriptors": {"ip": ip}})
}

async fn spawn(url: String, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_on_redis(POLICIES, |s| {
        s.redis.url = Some(url);
        tweak(s);
    })
    .await
}

/// A daemon enforcing `policies` on the Redis that `tweak` configures, with deadlines for
/// connection tests.
pub async fn spawn_on_redis(policies: &str, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    // Generous deadlines: these tests are about who may connect, not latency (debug build, busy CI).
    settings.redis.timeout = HumanDuration(1_000_000);
    settings.redis.connect_timeout = HumanDuration(1_000_000);
    settings.redis.breaker.probe_min = HumanDuration(20_000);
    settings.redis.breaker.probe_max = HumanDuration(100_000);
    tweak(&mut settings);
    spawn_app_in(dir, settings, policies).await
}

/// Checks `login` until Redis answers (200 or 429, not the fail-closed 503); returns the statuses
/// of four checks of one IP after that.
async fn enforced_statuses(app: &TestApp) -> Vec<u16> {
    crate::wait::eventually_within("connected over TLS", WAIT, || async {
        app.check_tcp(&login("198.51.100.1")).await.status == 200
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(app.check_tcp(&login("198.51.100.2")).await.status.as_u16());
    }
    statuses
}

/// The error the prober would log for one connection attempt with `access`.
async fn first_error(url: &str, access: &Access) -> redis::RedisError {
    let target = RedisTarget::Single(url.to_owned());
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        response: Duration::from_secs(2),
    };
    let mut conn = conn::connect(&target, access, timeouts)
        .await
        .expect("lazy connection builds");
    conn.probe("tls-test:{probe}")
        .await
        .expect_err("connection refused")
}

fn access(
    ca: Option<&std::path::Path>,
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> Access {
    let files = TlsFiles {
        ca,
        cert: client.map(|c| c.0),
        key: client.map(|c| c.1),
    };
    Access {
        tls: TlsOptions::load(files, false, true).expect("tls files load"),
        ..Access::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_are_enforced_over_tls_with_the_configured_ca() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    let ca = pki.path("ca.pem");
    let app = spawn(redis.url(), |s| s.redis.tls.ca_file = Some(ca)).await;
    assert_eq!(enforced_statuses(&app).await, [200, 200, 200, 429]);
    let mut conn = redis.connection(&pki);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:*login*")
        .query(&mut conn)
        .expect("KEYS");
    assert!(!keys.is_empty(), "the counters live in the TLS Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_another_ca_is_refused_and_the_failure_mode_answers() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    // The error, as the prober logs it: names the certificate problem.
    let wrong = access(Some(&pki.path("other-ca.pem")), None);
    let error = first_error(&redis.url(), &wrong).await;
    assert_eq!(ErrorKind::of(&error), ErrorKind::Tls, "{error}");
    let text = error.to_string();
    assert!(
        text.contains("certificate") && text.contains("UnknownIssuer"),
        "{text}"
    );
    // The built-in roots do not know a private CA either.
    let error = first_error(&redis.url(), &Access::default()).await;
    assert_eq!(ErrorKind::of(&error), ErrorKind::Tls, "{error}");

    // The daemon stays up, answers by the failure mode (closed: 503) and counts the refusals.
    let other = pki.path("other-ca.pem");
    let app = spawn(redis.url(), |s| s.redis.tls.ca_file = Some(other)).await;
    crate::wait::eventually_within("TLS refusals are counted", WAIT, || async {
        let reply = app.check_tcp(&login("198.51.100.3")).await;
        assert_eq!(reply.status, 503, "fail closed while TLS is refused");
        let tls_errors = metric_value(
            &app.metrics().await,
            "sluice_redis_errors_total",
            &[("kind", "tls")],
        );
        tls_errors >= 2.0
    })
    .await;
    assert_eq!(app.admin_get("/livez").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_client_certificate_required_and_given() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, true, &[]);
    // Without a client certificate the server refuses the session.
    let no_cert = access(Some(&pki.path("ca.pem")), None);
    let error = first_error(&redis.url(), &no_cert).await;
    assert!(
        matches!(
            ErrorKind::of(&error),
            ErrorKind::Tls | ErrorKind::Connection
        ),
        "{error}"
    );
    // With it, checks are enforced.
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let app = spawn(redis.url(), |s| {
        s.redis.tls.ca_file = Some(ca);
        s.redis.tls.cert_file = Some(cert);
        s.redis.tls.key_file = Some(key);
    })
    .await;
    assert_eq!(enforced_statuses(&app).await, [200, 200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_accepts_a_self_signed_server() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    // 127.0.0.1 is in the certificate too, but no CA is configured: only `insecure` connects.
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let app = spawn(url, |s| s.redis.tls.insecure = true).await;
    assert_eq!(enforced_statuses(&app).await, [200, 200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_hostname_false_checks_the_chain_but_not_the_name() {
    let pki = TestPki::generate();
    let (cert, key) = (pki.path("named.pem"), pki.path("named.key"));
    let (cert, key) = (cert.to_str().expect("utf-8"), key.to_str().expect("utf-8"));
    let redis = TlsRedis::start(
        &pki,
        false,
        &["--tls-cert-file", cert, "--tls-key-file", key],
    );
    // The certificate names redis.internal only: by default the name is checked, and refused.
    let ca = pki.path("ca.pem");
    let error = first_error(&redis.url(), &access(Some(&ca), None)).await;
    assert_eq!(ErrorKind::of(&error), ErrorKind::Tls, "{error}");
    assert!(error.to_string().contains("not valid for name"), "{error}");
    // Without the name check, the CA's signature is still required.
    let mut wrong = access(Some(&pki.path("other-ca.pem")), None);
    wrong.tls.skip_hostname = true;
    let error = first_error(&redis.url(), &wrong).await;
    assert!(error.to_string().contains("UnknownIssuer"), "{error}");
    // The right CA without the name check: enforced.
    let app = spawn(redis.url(), |s| {
        s.redis.tls.ca_file = Some(ca);
        s.redis.tls.verify_hostname = false;
    })
    .await;
    assert_eq!(enforced_statuses(&app).await, [200, 200, 200, 429]);
}

#[test]
fn config_check_validates_tls_like_serve() {
    // A password no temp dir name can contain (a bare "pw" matched `/tmp/.tmpwxn...`).
    const SECRET: &str = "s3cret-pass-9Q";
    let pki = TestPki::generate();
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, POLICIES).expect("write policies");
    let check = |redis: &str| {
        let toml = format!(
            "policies = {:?}\n[redis]\n{redis}\n",
            policies.display().to_string()
        );
        let file = dir.path().join("sluice.toml");
        std::fs::write(&file, toml).expect("write settings");
        run(sluice_command(
            dir.path(),
            &["config", "check", file.to_str().expect("utf-8")],
        ))
    };
    let ca = pki.path("ca.pem").display().to_string();
    let ok = check(&format!(
        "url = \"rediss://:{SECRET}@redis.example:6380\"\ntls = {{ ca_file = {ca:?} }}"
    ));
    assert_eq!(ok.code, Some(0), "{ok:?}");
    assert!(
        !ok.stdout.contains(SECRET) && !ok.stderr.contains(SECRET),
        "{ok:?}"
    );
    for (redis, says) in [
        (
            "url = \"rediss://h:6380\"\ntls = { ca_file = \"/nonexistent/ca.pem\" }",
            "redis.tls.ca_file",
        ),
        (
            &*format!(
                "url = \"rediss://h:6380\"\ntls = {{ ca_file = {:?} }}",
                pki.path("server.key").display().to_string()
            ),
            "redis.tls",
        ),
        (
            "url = \"redis://h:6379\"\ntls = { insecure = true }",
            "rediss://",
        ),
        (
            "url = \"rediss://h:6380\"\ntls = { cert_file = \"c.pem\" }",
            "key_file",
        ),
        (
            &*format!("url = \"rediss://h:6380\"\ntls = {{ insecure = true, ca_file = {ca:?} }}"),
            "insecure",
        ),
        ("cluster = [\"rediss://a:1\", \"redis://b:2\"]", "rediss://"),
        (
            "sentinel = { nodes = [\"rediss://s:26379\"], master = \"m\" }\n\
             tls = { verify_hostname = false }",
            "Sentinel",
        ),
    ] {
        let out = check(redis);
        assert_eq!(out.code, Some(64), "{redis}: {out:?}");
        assert!(out.stderr.contains(says), "{redis}: {out:?}");
        assert!(!out.stderr.contains(SECRET), "{out:?}");
    }
}

//! The real `sluice serve` binary on a TLS Redis with an ACL user, configured the way a
//! Kubernetes Secret does it (`SLUICE_REDIS__USERNAME`, `SLUICE_REDIS__PASSWORD`,
//! `SLUICE_REDIS__TLS__*` in the environment): checks are enforced, the password never reaches the
//! log, a TLS refusal is logged with its reason, and `insecure` is logged as a warning.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use axum::http::Method;
use serde_json::{json, Value};
use sluice::client::{self, Target};

use crate::helpers::{sluice_command, ChildGuard};
use crate::redis_server::free_port;
use crate::tls_pki::{TestPki, TlsRedis};

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 2, period: 1h, failure_mode: closed}
";
const PASSWORD: &str = "env-secret-7f3a";
const WAIT: Duration = Duration::from_secs(20);

/// A running `sluice serve` and where it logs.
pub(crate) struct Served {
    _child: ChildGuard,
    pub(crate) http: Target,
    pub(crate) admin: Target,
    log: std::path::PathBuf,
}

impl Served {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn check(&self, ip: &str) -> Option<u16> {
        self.check_policy("login", json!({"ip": ip})).await
    }

    /// The status of a check of `policy` with `descriptors`; `None` if there was no answer.
    pub(crate) async fn check_policy(&self, policy: &str, descriptors: Value) -> Option<u16> {
        let body = json!({"policy": policy, "descriptors": descriptors}).to_string();
        client::request(
            &self.http,
            Method::POST,
            "/v1/check",
            Some(body.into_bytes()),
        )
        .await
        .ok()
        .map(|reply| u16::from(reply.status))
    }

    /// Checks `ip` until it is admitted (200: Redis answers; the policy fails closed).
    async fn wait_admitted(&self, what: &str, ip: &str) {
        crate::wait::until(&format!("{what}enforced"), WAIT, || async {
            match self.check(ip).await {
                Some(200) => Ok(()),
                _ => Err(self.log()),
            }
        })
        .await;
    }

    /// Waits until the log contains `text`.
    pub(crate) async fn wait_for_log(&self, text: &str) {
        let what = format!("the log says {text:?}");
        crate::wait::until(&what, WAIT, || async {
            let log = self.log();
            match log.contains(text) {
                true => Ok(()),
                false => Err(log),
            }
        })
        .await;
    }
}

fn serve(dir: &Path, url: &str, env: &[(&str, String)]) -> Served {
    serve_policies(dir, POLICIES, url, env)
}

/// `sluice serve` with `policies` on the Redis at `url`, logging to a file in `dir`.
pub(crate) fn serve_policies(
    dir: &Path,
    policies_yaml: &str,
    url: &str,
    env: &[(&str, String)],
) -> Served {
    let policies = dir.join("policies.yaml");
    std::fs::write(&policies, policies_yaml).expect("write policies");
    let http_port = free_port();
    let admin_port = free_port();
    let settings = dir.join("sluice.toml");
    let toml = format!(
        "policies = {:?}\nworker_threads = 1\n[listen]\nhttp = \"127.0.0.1:{http_port}\"\n\
         admin = \"127.0.0.1:{admin_port}\"\nsocket = \"\"\n[redis]\nurl = {url:?}\ntimeout = \"1s\"\n",
        policies.display().to_string(),
    );
    std::fs::write(&settings, toml).expect("write settings");
    let log = dir.join("log");
    let file = std::fs::File::create(&log).expect("log file");
    let mut command = sluice_command(
        dir,
        &["serve", "--config", settings.to_str().expect("utf-8")],
    );
    command
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone"))
        .stderr(file);
    Served {
        _child: ChildGuard(Some(command.spawn().expect("spawn sluice serve"))),
        http: Target::Tcp(format!("127.0.0.1:{http_port}").parse().expect("addr")),
        admin: Target::Tcp(format!("127.0.0.1:{admin_port}").parse().expect("addr")),
        log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_takes_tls_and_acl_credentials_from_the_environment() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    let args = crate::redis::acl::documented_acl("sluice", PASSWORD);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(args)
        .query(&mut redis.connection(&pki))
        .expect("ACL SETUSER");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = pki.path("ca.pem").display().to_string();
    let served = serve(
        dir.path(),
        &redis.url(),
        &[
            ("SLUICE_REDIS__USERNAME", "sluice".into()),
            ("SLUICE_REDIS__PASSWORD", PASSWORD.into()),
            ("SLUICE_REDIS__TLS__CA_FILE", ca),
        ],
    );
    served.wait_admitted("", "192.0.2.1").await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(served.check("192.0.2.2").await);
    }
    assert_eq!(
        statuses,
        [Some(200), Some(200), Some(429)],
        "{}",
        served.log()
    );
    let log = served.log();
    assert!(log.contains("using the Redis store"), "{log}");
    assert!(
        !log.contains(PASSWORD),
        "the password reached the log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_a_tls_refusal_with_its_reason_and_warns_about_insecure() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let other = pki.path("other-ca.pem").display().to_string();
    let refused = serve(
        dir.path(),
        &redis.url(),
        &[("SLUICE_REDIS__TLS__CA_FILE", other)],
    );
    refused.wait_for_log("UnknownIssuer").await;
    let log = refused.log();
    assert!(log.contains("tls"), "the error kind is named:\n{log}");
    // Still up, answering by the failure mode (closed).
    assert_eq!(refused.check("192.0.2.3").await, Some(503), "{log}");

    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let insecure = serve(
        dir.path(),
        &url,
        &[("SLUICE_REDIS__TLS__INSECURE", "true".into())],
    );
    insecure.wait_for_log("redis.tls.insecure is on").await;
    insecure.wait_admitted("", "192.0.2.4").await;
}

/// With no `redis.tls.ca_file`, `rediss://` trusts what the system trusts: a private CA named
/// only by `SSL_CERT_FILE` (or found in `SSL_CERT_DIR`), as OpenSSL, curl and Go read them.
/// Without it the same server is refused: the test CA is in no system bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_trusts_a_ca_given_only_by_ssl_cert_file_or_dir() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false, &[]);
    let ca = pki.path("ca.pem");
    let cert_dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&ca, cert_dir.path().join("private-ca.pem")).expect("copy CA");
    let by_file = ("SSL_CERT_FILE", ca.display().to_string());
    let by_dir = ("SSL_CERT_DIR", cert_dir.path().display().to_string());
    // One Redis for both rounds: each round counts its own address.
    for (name, env, ip) in [
        ("file", vec![by_file], "192.0.2.6"),
        ("dir", vec![by_dir], "192.0.2.8"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let served = serve(dir.path(), &redis.url(), &env);
        served
            .wait_admitted(&format!("SSL_CERT_{name}: "), "192.0.2.5")
            .await;
        let statuses = [
            served.check(ip).await,
            served.check(ip).await,
            served.check(ip).await,
        ];
        assert_eq!(statuses, [Some(200), Some(200), Some(429)], "{name}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = tempfile::tempdir().expect("tempdir");
    let refused = serve(
        dir.path(),
        &redis.url(),
        &[("SSL_CERT_DIR", empty.path().display().to_string())],
    );
    refused.wait_for_log("UnknownIssuer").await;
    assert_eq!(refused.check("192.0.2.7").await, Some(503));
}

//! `examples/envoy/ext_authz.yaml` as it ships: Envoy's ext_authz filter (HTTP) on sluice's
//! `/v1/authz` over the Unix socket, with the shipped policies. The client can neither omit nor
//! rotate the client-address descriptor, path spellings count as the login page, and a
//! fail-closed policy with Redis down is relayed as a denial (429 with `Retry-After`) whatever
//! `failure_mode_allow` says.

use serde_json::{json, Value};
use sluice::config::{HumanDuration, OriginalFrom, Settings};

use crate::helpers::{spawn_app_in, test_settings, TestApp, SHIPPED_POLICIES};
use crate::proxy::{self, count, Envoy};
use crate::redis_server::free_port;

fn authz_settings(dir: &tempfile::TempDir) -> Settings {
    let mut settings = test_settings(dir.path());
    settings.authz.original = OriginalFrom::Path;
    settings.authz.descriptors = vec!["ip".into()];
    settings
}

async fn daemon(redis_down: bool) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = authz_settings(&dir);
    if redis_down {
        settings.redis.url = Some(format!("redis://127.0.0.1:{}", free_port()));
        settings.redis.timeout = HumanDuration(1_000_000);
        settings.redis.connect_timeout = HumanDuration(300_000);
    }
    spawn_app_in(dir, settings, SHIPPED_POLICIES).await
}

/// The shipped example, its `sluice` cluster pointed at the daemon's socket.
fn example(daemon: &TestApp) -> Value {
    let mut config = proxy::example("ext_authz.yaml");
    proxy::point(&mut config, "sluice", proxy::pipe(&daemon.socket_path()));
    config
}

#[tokio::test]
async fn a_client_can_neither_omit_nor_rotate_the_address_descriptor() {
    let daemon = daemon(false).await;
    let Some(envoy) = Envoy::start(example(&daemon)).await else {
        return;
    };
    let mut answers = Vec::new();
    for i in 0..15 {
        let rotated = format!("198.51.100.{i}");
        let headers: &[(&str, &str)] = if i % 2 == 0 {
            &[]
        } else {
            &[("x-sluice-descriptor-ip", &rotated)]
        };
        answers.push(envoy.send("POST", "/login", headers).await);
    }
    let codes: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(count(&codes[..10], 200), 10, "{codes:?}\n{}", envoy.log());
    assert_eq!(count(&codes[10..], 429), 5, "{codes:?}");
    let denied = &answers[10];
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
    assert_eq!(denied.header("x-sluice-denied-by"), Some("rate_limit"));
    assert!(denied.body.contains("\"rate_limit\""), "{}", denied.body);
    // Descriptors and controls a client invents are not believed: never a way through.
    for header in [
        "x-sluice-descriptor-tenant",
        "x-sluice-policy",
        "x-sluice-dry-run",
    ] {
        let answer = envoy.send("POST", "/login", &[(header, "1")]).await;
        assert_eq!(answer.status, 429, "{header}: {answer:?}");
    }
    // Another path is not limited by login.
    assert_eq!(envoy.send("GET", "/", &[]).await.status, 200);
}

#[tokio::test]
async fn path_spellings_count_as_the_login_page() {
    let daemon = daemon(false).await;
    let Some(envoy) = Envoy::start(example(&daemon)).await else {
        return;
    };
    let spellings = [
        "/LOGIN",
        "/login/",
        "//login",
        "/%6Cogin",
        "/./login",
        "/x/../login",
        "/Login?a=1",
        "/login",
        "/login;x=1",
        "/%2e/login",
    ];
    let mut codes = Vec::new();
    for path in spellings {
        codes.push((path, envoy.send("POST", path, &[]).await.status));
    }
    // Every spelling reached the app (or Envoy's redirect) as the login page, and counted.
    let next = envoy.send("POST", "/login", &[]).await;
    assert_eq!(
        next.status,
        429,
        "after {codes:?}: {next:?}\n{}",
        envoy.log()
    );
}

async fn fail_closed_is_a_denial(failure_mode_allow: bool) {
    let daemon = daemon(true).await;
    let mut config = example(&daemon);
    proxy::filter(&mut config, "envoy.filters.http.ext_authz")["failure_mode_allow"] =
        json!(failure_mode_allow);
    let Some(envoy) = Envoy::start(config).await else {
        return;
    };
    for _ in 0..3 {
        let answer = envoy.send("POST", "/login", &[]).await;
        assert_eq!(answer.status, 429, "{answer:?}\n{}", envoy.log());
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(
            answer.header("x-sluice-denied-by"),
            Some("limiter_unavailable")
        );
        assert!(
            answer.body.contains("limiter_unavailable"),
            "{}",
            answer.body
        );
    }
    // public_api fails open: a request it covers still passes (no api_key descriptor here,
    // so it is not covered at all); a path no policy covers is let through.
    assert_eq!(envoy.send("GET", "/", &[]).await.status, 200);
}

#[tokio::test]
async fn fail_closed_is_a_denial_with_failure_mode_allow() {
    fail_closed_is_a_denial(true).await;
}

#[tokio::test]
async fn fail_closed_is_a_denial_without_failure_mode_allow() {
    fail_closed_is_a_denial(false).await;
}

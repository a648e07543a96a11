//! A real `sluice serve` process: SIGHUP reloads the policy file at once (polling is set to an
//! hour), and a shadow policy's "would block" is a JSON log line with the policy and a partition
//! fingerprint, never the raw value.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sluice::client::Target;

use crate::helpers::{get, json_of, post, sluice_command, ChildGuard};
use crate::wait::eventually_within;

fn free_port() -> u16 {
    crate::redis_server::free_port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_shadow_blocks_are_logged_without_raw_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies.yaml");
    std::fs::write(
        &policies,
        "policies:\n  - {name: watch, key: [ip], algorithm: fixed_window, limit: 1, period: 1h, shadow: true}\n",
    )
    .expect("write");
    let (http, admin) = (free_port(), free_port());
    let settings = dir.path().join("sluice.toml");
    std::fs::write(
        &settings,
        format!(
            "policies = {:?}\npolicies_poll = \"1h\"\n[listen]\nhttp = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\nsocket = \"\"\n[log]\nformat = \"json\"\n",
            policies.display().to_string()
        ),
    )
    .expect("write");
    let stderr = dir.path().join("stderr.log");
    let child = sluice_command(
        dir.path(),
        &["serve", "--config", &settings.display().to_string()],
    )
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&stderr).expect("stderr file"))
    .spawn()
    .expect("spawn");
    let mut guard = ChildGuard(Some(child));
    let (tcp, admin) = (
        Target::Tcp(format!("127.0.0.1:{http}").parse().expect("addr")),
        Target::Tcp(format!("127.0.0.1:{admin}").parse().expect("addr")),
    );
    eventually_within("the daemon starts", Duration::from_secs(10), || async {
        sluice::client::request(&admin, axum::http::Method::GET, "/livez", None)
            .await
            .is_ok()
    })
    .await;

    let body = json!({"descriptors": {"ip": "203.0.113.99"}})
        .to_string()
        .into_bytes();
    assert_eq!(post(&tcp, "/v1/check", body.clone()).await.status, 200);
    let second = post(&tcp, "/v1/check", body.clone()).await;
    assert_eq!(second.status, 200, "shadow never blocks");
    assert_eq!(json_of(&second)["mode"], "shadow");

    std::fs::write(
        &policies,
        "policies:\n  - {name: enforced, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}\n",
    )
    .expect("write");
    let status = Command::new("kill")
        .args(["-HUP", &guard.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    eventually_within("SIGHUP reloads", Duration::from_secs(5), || async {
        json_of(&get(&admin, "/v1/policies").await)["policies"][0]["name"] == "enforced"
    })
    .await;
    assert_eq!(post(&tcp, "/v1/check", body.clone()).await.status, 200);
    assert_eq!(post(&tcp, "/v1/check", body).await.status, 429);

    let _ = Command::new("kill")
        .args(["-TERM", &guard.id().to_string()])
        .status();
    guard.wait_timeout(Duration::from_secs(10));
    let log = std::fs::read_to_string(&stderr).expect("log");
    let would_block: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["message"] == "would block (shadow)")
        .collect();
    assert_eq!(would_block.len(), 1, "{log}");
    assert_eq!(would_block[0]["policy"], "watch");
    assert_eq!(
        would_block[0]["partition"].as_str().map(str::len),
        Some(16),
        "a fingerprint"
    );
    assert!(
        !log.contains("203.0.113.99"),
        "no raw values at info: {log}"
    );
    assert!(log.contains("policies reloaded"), "{log}");
}

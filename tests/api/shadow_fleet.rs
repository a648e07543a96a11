//! Shadow tuning across a fleet (issue 39): six real `sluice serve` processes given the same
//! `shadow.fingerprint_key` log one partition's would-block under the same fingerprint (the one
//! `printf '%s\0%s' POLICY PARTITION | openssl dgst -sha1 -hmac KEY` gives, so an operator can
//! find a suspect's lines), and list it under that fingerprint in `/v1/top`'s `shadow` lists; the
//! log line is once per partition per minute while the counter and the list count every
//! would-block; a daemon without the secret warns at start and names the partition otherwise.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::client::Target;

use crate::helpers::{get, json_of, metric_value, post, sluice_command, ChildGuard};
use crate::wait::eventually_within;

const SECRET: &str = "0123456789abcdef-fleet";
/// HMAC-SHA1(SECRET, "watch\0203.0.113.99"), first 8 bytes (computed with openssl).
const FINGERPRINT: &str = "5a17bc9dd0e0d079";
const WOULD_BLOCKS: usize = 4;

fn free_port() -> u16 {
    crate::redis_server::free_port()
}

/// What one daemon showed: its would-block log lines, whole log, `/v1/top` and `/metrics`.
struct Seen {
    would_block: Vec<Value>,
    log: String,
    top: Value,
    metrics: String,
}

/// The partition every pod of the fleet sees.
const SHARED: &str = "203.0.113.99";

/// Runs a daemon (with `secret` in the environment, if any), checks each of `ips` (the shared
/// partition first) `1 + WOULD_BLOCKS` times against a shadow policy of limit 1, and stops it.
async fn run_daemon(secret: Option<&str>, ips: &[String]) -> Seen {
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
            "policies = {:?}\n[listen]\nhttp = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\nsocket = \"\"\n[log]\nformat = \"json\"\n",
            policies.display().to_string()
        ),
    )
    .expect("write");
    let stderr = dir.path().join("stderr.log");
    let mut command = sluice_command(
        dir.path(),
        &["serve", "--config", &settings.display().to_string()],
    );
    if let Some(secret) = secret {
        command.env("SLUICE_SHADOW__FINGERPRINT_KEY", secret);
    }
    let child = command
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
    for ip in ips {
        let body = json!({"descriptors": {"ip": ip}}).to_string().into_bytes();
        for _ in 0..=WOULD_BLOCKS {
            let answer = post(&tcp, "/v1/check", body.clone()).await;
            assert_eq!(answer.status, 200, "shadow never blocks");
        }
    }
    let top = json_of(&get(&admin, "/v1/top").await);
    let metrics = String::from_utf8_lossy(&get(&admin, "/metrics").await.body).into_owned();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &guard.id().to_string()])
        .status();
    guard.wait_timeout(Duration::from_secs(10));
    let log = std::fs::read_to_string(&stderr).expect("log");
    let would_block = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "would block (shadow)")
        .collect();
    Seen {
        would_block,
        log,
        top,
        metrics,
    }
}

/// Six pods given one secret, each seeing the shared partition and one of its own: each logs the
/// shared one under the same fingerprint, and their `/v1/top` shadow lists join by fingerprint
/// into one fleet list (the shared partition with every pod's would-blocks, each pod's own once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_sharing_a_secret_name_a_partition_alike_and_count_every_would_block() {
    let mut pods = Vec::new();
    for pod in 0..6 {
        let ips = [SHARED.to_owned(), format!("198.51.100.{pod}")];
        pods.push(run_daemon(Some(SECRET), &ips).await);
    }
    let mut fleet = std::collections::BTreeMap::<String, u64>::new();
    for pod in &pods {
        // Logged once per partition (once a minute), counted every time.
        let shared: Vec<&Value> = pod
            .would_block
            .iter()
            .filter(|line| line["partition"] == FINGERPRINT)
            .collect();
        assert_eq!(shared.len(), 1, "{}", pod.log);
        assert_eq!(shared[0]["policy"], "watch");
        assert_eq!(pod.would_block.len(), 2, "{}", pod.log);
        let counted = metric_value(
            &pod.metrics,
            "sluice_decisions_total",
            &[("policy", "watch"), ("outcome", "shadow_denied")],
        );
        assert_eq!(counted, 2.0 * WOULD_BLOCKS as f64);
        // Listed apart from denials (there were none), under the same fingerprint.
        assert_eq!(pod.top["policies"], json!([]), "{}", pod.top);
        let list = &pod.top["shadow"][0];
        assert_eq!(
            (&list["policy"], &list["denials"]),
            (&json!("watch"), &json!(2 * WOULD_BLOCKS)),
            "{}",
            pod.top
        );
        let entries = list["entries"].as_array().expect("entries");
        let entry = entries
            .iter()
            .find(|entry| entry["fingerprint"] == FINGERPRINT)
            .expect("the shared partition is listed");
        assert_eq!(entry["partition"], SHARED, "a loopback client");
        assert_eq!(entry["denials"], json!(WOULD_BLOCKS));
        for entry in entries {
            let fingerprint = entry["fingerprint"]
                .as_str()
                .expect("fingerprint")
                .to_owned();
            *fleet.entry(fingerprint).or_default() += entry["denials"].as_u64().expect("denials");
        }
        assert!(!pod.log.contains(SHARED), "no raw value: {}", pod.log);
        assert!(!pod.log.contains(SECRET), "the secret is never logged");
        assert!(
            !pod.log.contains("fingerprint_key is not set"),
            "{}",
            pod.log
        );
    }
    // One joinable list: 7 partitions, the shared one with all six pods' would-blocks.
    assert_eq!(fleet.len(), 7, "{fleet:?}");
    assert_eq!(fleet[FINGERPRINT], 6 * WOULD_BLOCKS as u64, "{fleet:?}");
    assert!(fleet
        .values()
        .all(|&n| n == WOULD_BLOCKS as u64 || n == 6 * WOULD_BLOCKS as u64));

    let alone = run_daemon(None, &[SHARED.to_owned()]).await;
    assert!(
        alone.log.contains("shadow.fingerprint_key is not set"),
        "{}",
        alone.log
    );
    assert_eq!(alone.would_block.len(), 1, "{}", alone.log);
    assert_ne!(alone.would_block[0]["partition"], FINGERPRINT);
}

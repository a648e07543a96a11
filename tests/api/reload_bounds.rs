//! Hot reload against hostile files: a policy file swapped for `/dev/zero`, one over
//! `files.max_bytes`, one with no policies at all. The daemon keeps answering with the policies
//! in force, counts the refusal, and (for the empty file) removes every limit only when told to.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::config::HumanDuration;
use tempfile::TempDir;

use crate::helpers::{json_of, metric_value, remaining, test_settings, TestApp};
use crate::wait::{eventually_within, until};

const ONE: &str =
    "policies:\n  - {name: one, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}\n";
const TWO: &str =
    "policies:\n  - {name: two, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}\n";

/// A daemon built from `policy_file` (written with `ONE`), polling it every 20 ms.
async fn spawn(dir: TempDir, configure: impl FnOnce(&mut sluice::config::Settings)) -> TestApp {
    let policy_file = dir.path().join("policies.yaml");
    std::fs::write(&policy_file, ONE).expect("write");
    let mut settings = test_settings(dir.path());
    settings.policies = policy_file;
    settings.policies_poll = HumanDuration(20_000);
    configure(&mut settings);
    crate::helpers::spawn_served(dir, settings).await
}

/// How long a reload may take to be seen.
const RELOAD_WITHIN: Duration = Duration::from_secs(5);

/// Waits (bounded) until the invalid-reload count reaches `count`.
async fn wait_invalid(app: &TestApp, count: f64) {
    until(
        &format!("refusal {count} counted"),
        RELOAD_WITHIN,
        || async {
            let metrics = app.metrics().await;
            let invalid = metric_value(
                &metrics,
                "sluice_policy_reloads_total",
                &[("result", "invalid")],
            );
            match invalid >= count {
                true => Ok(()),
                false => Err(metrics),
            }
        },
    )
    .await;
}

async fn policy_name(app: &TestApp) -> serde_json::Value {
    json_of(&app.admin_get("/v1/policies").await)["policies"][0]["name"].clone()
}

/// Replaces `path` by a rename, as editors and the kubelet do.
fn replace(path: &Path, text: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unending_and_oversized_policy_files_are_refused_and_the_old_set_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policies.yaml");
    let app = spawn(dir, |s| s.files.max_bytes = 4096).await;
    let probe = json!({"policy": "one", "descriptors": {"ip": "192.0.2.9"}});

    let zero = path.with_extension("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    std::fs::rename(&zero, &path).expect("swap in /dev/zero");
    wait_invalid(&app, 1.0).await;
    let started = Instant::now();
    assert_eq!(app.check_tcp(&probe).await.status, 200);
    assert_eq!(app.admin_get("/livez").await.status, 200);
    assert!(started.elapsed() < Duration::from_secs(1), "checks stalled");

    // A valid file over files.max_bytes is refused unread.
    let mut big = TWO.to_owned();
    big.push_str(&format!("# {}\n", "x".repeat(5000)));
    replace(&path, big.as_bytes());
    wait_invalid(&app, 2.0).await;
    assert_eq!(policy_name(&app).await, "one");
    assert_eq!(remaining(&app.dry_run(&probe).await), 3, "one still counts");

    // A good file is taken again.
    replace(&path, TWO.as_bytes());
    eventually_within("reloaded", RELOAD_WITHIN, || async {
        policy_name(&app).await == "two"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_policy_set_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policies.yaml");
    let app = spawn(dir, |_| {}).await;
    replace(&path, b"policies: []\n");
    wait_invalid(&app, 1.0).await;
    assert_eq!(policy_name(&app).await, "one", "the limits stay");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policies.yaml");
    let app = spawn(dir, |s| s.policies_allow_empty = true).await;
    replace(&path, b"policies: []\n");
    eventually_within("emptied", RELOAD_WITHIN, || async {
        json_of(&app.admin_get("/v1/policies").await)["policies"]
            .as_array()
            .is_some_and(Vec::is_empty)
    })
    .await;
}

/// An unchanged file (same inode, size and modification time) is not read again: an in-place
/// edit that restores all three is not seen (SIGHUP forces a read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_file_is_not_read_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policies.yaml");
    // A slow poll: the edit below changes the modification time for a few microseconds before
    // restoring it, and a poll in that window would rightly read the file.
    let app = spawn(dir, |s| s.policies_poll = HumanDuration(500_000)).await;
    // Let the reloader take its first stamp (the second look begins after the first ends).
    app.wait_policy_polls(2.0).await;
    let modified = std::fs::metadata(&path)
        .expect("meta")
        .modified()
        .expect("mtime");
    std::fs::write(&path, TWO).expect("same length, in place");
    let file = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_modified(modified).expect("restore mtime");
    drop(file);
    app.wait_policy_polls(2.0).await;
    assert_eq!(policy_name(&app).await, "one", "read although unchanged");
}

/// A 4.7 KB alias bomb (77,000 aliases of a 1.5 KB string: 115 MB once expanded; before the
/// bound it took `config check` 155 MB and half a second, the 3.6 KB one 1.45 GB): hot
/// reload refuses it and keeps the set in force, and `sluice config check` refuses it with the
/// reason and exit 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_bomb_is_refused_unexpanded_by_reload_and_config_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policies.yaml");
    let bomb_path = dir.path().join("bomb.yaml");
    let bomb = format!(
        "a0: &a0 \"{}\"\na1: &a1 [{}]\npolicies: [{}]\n",
        "x".repeat(1500),
        vec!["*a0"; 700].join(","),
        vec!["*a1"; 110].join(",")
    );
    std::fs::write(&bomb_path, &bomb).expect("write bomb");
    let app = spawn(dir, |_| {}).await;
    replace(&path, bomb.as_bytes());
    wait_invalid(&app, 1.0).await;
    assert_eq!(policy_name(&app).await, "one", "the set in force serves");

    let out = crate::helpers::sluice_command(
        bomb_path.parent().expect("dir"),
        &["config", "check", bomb_path.to_str().expect("utf-8")],
    )
    .output()
    .expect("run config check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("anchors and aliases expand"), "{stderr}");
}

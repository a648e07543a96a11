//! Policies from a directory laid out as the kubelet lays out a mounted ConfigMap: each key a
//! symlink `key -> ..data/key`, `..data` a symlink to a timestamped directory, an update the
//! atomic rename of a new `..data` symlink. The daemon serves every file's policies, follows the
//! swap, refuses a bad version whole (the set in force keeps serving), and `sluice config check
//! DIR` says the same as the daemon.

use std::path::Path;
use std::time::Duration;

use sluice::config::HumanDuration;

use crate::helpers::{json_of, metric_value, run_async, sluice_command, test_settings, TestApp};
use crate::wait::{eventually_within, until};

fn policy(name: &str, limit: u32) -> String {
    format!(
        "  - {{name: {name}, key: [ip], algorithm: fixed_window, limit: {limit}, period: 1h}}\n"
    )
}

/// Publishes `files` as the kubelet does: a new timestamped directory, then `..data` swapped to
/// it by renaming a fresh symlink over it, then a `key -> ..data/key` link for each new key.
fn publish(dir: &Path, version: u32, files: &[(&str, String)]) {
    let target = format!("..2026_01_01_00_00_0{version}.{version}");
    std::fs::create_dir(dir.join(&target)).expect("mkdir");
    for (key, text) in files {
        std::fs::write(dir.join(&target).join(key), text).expect("write");
    }
    let next = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&target, &next).expect("symlink");
    std::fs::rename(&next, dir.join("..data")).expect("atomic swap");
    for (key, _) in files {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(key), &link).expect("key link");
        }
    }
}

async fn names(app: &TestApp) -> Vec<String> {
    let body = json_of(&app.admin_get("/v1/policies").await);
    body["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Waits (bounded) until the served policy names are `expected`, in order.
async fn wait_until_named(app: &TestApp, expected: &[&str]) {
    until("the names served", Duration::from_secs(5), || async {
        let now = names(app).await;
        match now == expected {
            true => Ok(()),
            false => Err(format!("serving {now:?}, not {expected:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_directory_serves_every_file_and_follows_the_data_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cm = dir.path().join("policies");
    std::fs::create_dir(&cm).expect("mkdir");
    let head = "policies:\n".to_owned();
    publish(
        &cm,
        1,
        &[
            ("team-b.yaml", head.clone() + &policy("b", 2)),
            ("team-a.yaml", head.clone() + &policy("a", 1)),
        ],
    );
    let mut settings = test_settings(dir.path());
    settings.policies = cm.clone();
    settings.policies_poll = HumanDuration(20_000);
    let app = crate::helpers::spawn_served(dir, settings).await;
    assert_eq!(names(&app).await, ["a", "b"], "files in name order");

    // A new version: team-a changes, team-c is added.
    publish(
        &cm,
        2,
        &[
            ("team-a.yaml", head.clone() + &policy("a2", 1)),
            ("team-b.yaml", head.clone() + &policy("b", 2)),
            ("team-c.yaml", head.clone() + &policy("c", 3)),
        ],
    );
    wait_until_named(&app, &["a2", "b", "c"]).await;

    // A bad version (the same name in two files) is refused whole; the set in force serves.
    publish(
        &cm,
        3,
        &[
            ("team-a.yaml", head.clone() + &policy("a2", 1)),
            ("team-b.yaml", head.clone() + &policy("a2", 9)),
            ("team-c.yaml", head.clone() + &policy("c", 3)),
        ],
    );
    eventually_within("a refusal counted", Duration::from_secs(5), || async {
        let metrics = app.metrics().await;
        let labels = [("result", "invalid")];
        metric_value(&metrics, "sluice_policy_reloads_total", &labels) >= 1.0
    })
    .await;
    wait_until_named(&app, &["a2", "b", "c"]).await;
}

#[tokio::test]
async fn config_check_of_a_directory_lists_its_policies_and_names_both_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cm = dir.path().join("cm");
    std::fs::create_dir(&cm).expect("mkdir");
    let head = "policies:\n".to_owned();
    publish(
        &cm,
        1,
        &[
            ("a.yaml", head.clone() + &policy("a", 1)),
            ("b.yml", head.clone() + &policy("b", 2)),
        ],
    );
    let cm_arg = cm.display().to_string();
    let ok = run_async(sluice_command(dir.path(), &["config", "check", &cm_arg])).await;
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(ok.stdout.contains("ok, 2 policies: a, b"), "{}", ok.stdout);

    publish(
        &cm,
        2,
        &[
            ("a.yaml", head.clone() + &policy("a", 1)),
            ("b.yml", head.clone() + &policy("x", 1) + &policy("a", 2)),
        ],
    );
    let bad = run_async(sluice_command(dir.path(), &["config", "check", &cm_arg])).await;
    assert_eq!(bad.code, Some(64), "{}", bad.stdout);
    let second = format!("{}:3:", cm.join("b.yml").display());
    let first = format!("{}:2", cm.join("a.yaml").display());
    assert!(
        bad.stderr.contains(&second) && bad.stderr.contains(&first),
        "{}",
        bad.stderr
    );
}

//! `GET /v1/top` and `sluice top`: per policy, the partitions denied most, with their counts,
//! error bounds and last denial; bounded whatever the traffic (thousands of distinct denied
//! partitions leave each list at its capacity, the heavy hitter still listed); strict queries
//! (4xx JSON); a reload drops the lists of removed policies and keeps the others'.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sluice::check::TOP_CAPACITY;
use sluice::config::HumanDuration;

use crate::helpers::{
    assert_error, json_of, run_async, sluice_command, spawn_app_with, spawn_served, test_settings,
    TestApp,
};

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], match: {route: login}, algorithm: sliding_log, limit: 1, period: 1h}
  - {name: api, key: [tenant, api_key], match: {route: api}, algorithm: fixed_window, limit: 1, period: 1h}
";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `n` checks of `route` for the partition `value` (the first passes, the rest are denied).
async fn hammer(app: &TestApp, route: &str, value: &str, n: usize) {
    let body = match route {
        "login" => json!({"descriptors": {"route": "login", "ip": value}}),
        _ => json!({"descriptors": {"route": "api", "tenant": "t1", "api_key": value}}),
    };
    for _ in 0..n {
        app.check_tcp(&body).await;
    }
}

async fn top(app: &TestApp, query: &str) -> Value {
    let reply = app.admin_get(&format!("/v1/top{query}")).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    json_of(&reply)
}

#[tokio::test]
async fn the_most_denied_partitions_come_first_with_counts_and_last_denial() {
    let app = spawn_app_with(POLICIES).await;
    assert_eq!(
        top(&app, "").await,
        json!({"raw_partitions": true, "policies": [], "shadow": [], "concurrency": []})
    );
    let before = unix_ms();
    hammer(&app, "login", "203.0.113.7", 6).await;
    hammer(&app, "login", "198.51.100.1", 3).await;
    hammer(&app, "api", "key:with:colons", 2).await;
    let after = unix_ms();

    let body = top(&app, "?policy=login&limit=5").await;
    let list = &body["policies"][0];
    assert_eq!(
        (&list["policy"], &list["denials"], &list["capacity"]),
        (&json!("login"), &json!(7), &json!(TOP_CAPACITY))
    );
    let entries = list["entries"].as_array().expect("entries");
    let rows: Vec<(&str, u64, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["partition"].as_str().unwrap_or("?"),
                e["denials"].as_u64().unwrap_or(0),
                e["error"].as_u64().unwrap_or(9),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [("203.0.113.7", 5, 0), ("198.51.100.1", 2, 0)],
        "allowed checks are not counted"
    );
    for entry in entries {
        let last = entry["last_denied_unix_ms"].as_u64().expect("a time");
        assert!((before..=after).contains(&last), "{entry}");
        assert_eq!(entry["fingerprint"].as_str().map(str::len), Some(16));
    }
    // Without a policy: every policy with a denial, in name order; the partition as
    // /v1/counters names it (escaped values joined by `:`).
    let all = top(&app, "?limit=1").await;
    let names: Vec<&str> = all["policies"]
        .as_array()
        .expect("lists")
        .iter()
        .filter_map(|p| p["policy"].as_str())
        .collect();
    assert_eq!(names, ["api", "login"]);
    assert_eq!(
        all["policies"][0]["entries"][0]["partition"],
        "t1:key%3Awith%3Acolons"
    );
    assert_eq!(
        all["policies"][1]["entries"].as_array().map(Vec::len),
        Some(1)
    );
}

#[tokio::test]
async fn thousands_of_denied_partitions_keep_each_list_at_its_capacity() {
    let app = spawn_app_with(POLICIES).await;
    // One heavy hitter among 3,000 partitions denied once each (checked twice: one pass, one
    // denial), over one keep-alive connection.
    let mut conn = crate::helpers::connect(&app.tcp).await;
    let mut total = 0u64;
    for i in 0..3_000u32 {
        for _ in 0..2 {
            let body = json!({"descriptors": {"route": "login", "ip": format!("10.0.{}.{}", i / 256, i % 256)}});
            conn.post_json("/v1/check", &body).await.expect("check");
        }
        total += 1;
        if i % 10 == 0 {
            for _ in 0..2 {
                conn.post_json(
                    "/v1/check",
                    &json!({"descriptors": {"route": "login", "ip": "192.0.2.66"}}),
                )
                .await
                .expect("check");
            }
            total += if i == 0 { 1 } else { 2 };
        }
    }
    let body = top(&app, &format!("?policy=login&limit={TOP_CAPACITY}")).await;
    let list = &body["policies"][0];
    assert_eq!(list["denials"], total);
    let entries = list["entries"].as_array().expect("entries");
    assert_eq!(
        entries.len(),
        TOP_CAPACITY,
        "at capacity, not 3,001 entries"
    );
    assert_eq!(
        entries[0]["partition"], "192.0.2.66",
        "denied more than total/capacity: listed"
    );
    let (count, error) = (
        entries[0]["denials"].as_u64().unwrap_or(0),
        entries[0]["error"].as_u64().unwrap_or(0),
    );
    assert!(
        count - error <= 599 && 599 <= count,
        "true count within its bound: {}",
        entries[0]
    );
    assert!(error <= total / TOP_CAPACITY as u64);
}

#[tokio::test]
async fn bad_queries_are_4xx_json() {
    let app = spawn_app_with(POLICIES).await;
    for query in [
        "?limit=0",
        "?limit=65",
        "?limit=ten",
        "?policy=login&policy=api",
        "?polcy=login",
        "?d.ip=1",
    ] {
        assert_error(
            &app.admin_get(&format!("/v1/top{query}")).await,
            400,
            "bad_request",
        );
    }
    assert_error(
        &app.admin_get("/v1/top?policy=nope").await,
        400,
        "unknown_policy",
    );
    let reply = crate::helpers::post(
        &sluice::client::Target::Tcp(app.admin),
        "/v1/top",
        b"{}".to_vec(),
    )
    .await;
    assert_error(&reply, 405, "method_not_allowed");
}

#[tokio::test]
async fn sluice_top_prints_a_table_and_json() {
    let app = spawn_app_with(POLICIES).await;
    hammer(&app, "login", "203.0.113.7", 4).await;
    let cwd = app.dir.path().to_owned();
    let admin = app.admin.to_string();
    let out = run_async(sluice_command(&cwd, &["top", "--admin", &admin])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("policy login: 3 denials (top 1 of at most {TOP_CAPACITY} partitions tracked)")
    );
    assert!(lines[1].starts_with("   DENIALS"), "{out:?}");
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        (row[0], row[1], row[4]),
        ("3", "0", "203.0.113.7"),
        "{out:?}"
    );
    let out = run_async(sluice_command(
        &cwd,
        &["top", "-p", "login", "--json", "--admin", &admin],
    ))
    .await;
    let answer: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(answer["policies"][0]["entries"][0]["denials"], 3);
    let out = run_async(sluice_command(
        &cwd,
        &["top", "-p", "nope", "--admin", &admin],
    ))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stdout.contains("unknown_policy"), "{out:?}");
}

#[tokio::test]
async fn a_reload_drops_removed_policies_lists_and_keeps_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, POLICIES).expect("write");
    let mut settings = test_settings(dir.path());
    settings.policies = file.clone();
    settings.policies_poll = HumanDuration(20_000);
    let app = spawn_served(dir, settings).await;
    hammer(&app, "login", "203.0.113.7", 3).await;
    hammer(&app, "api", "k", 3).await;
    let kept = POLICIES
        .lines()
        .filter(|l| !l.contains("name: api"))
        .collect::<Vec<_>>()
        .join("\n");
    let next = file.with_extension("next");
    std::fs::write(&next, kept).expect("write");
    std::fs::rename(&next, &file).expect("swap");
    crate::wait::eventually("the reload is seen", || async {
        app.admin_get("/v1/top?policy=api").await.status != 200
    })
    .await;
    assert_error(
        &app.admin_get("/v1/top?policy=api").await,
        400,
        "unknown_policy",
    );
    let body = top(&app, "").await;
    assert_eq!(body["policies"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        body["policies"][0]["entries"][0]["denials"], 2,
        "login's list survives"
    );
}

/// Lists are kept for the first `MAX_POLICIES` policies: one past them, asked for by name, is
/// answered as not tracked (a 409), never as an empty list that reads as "nobody was denied".
#[tokio::test]
async fn a_policy_past_the_tracked_ones_is_answered_as_not_tracked() {
    let tracked = sluice::check::MAX_POLICIES;
    let mut yaml = String::from("policies:\n");
    for n in 0..=tracked {
        yaml.push_str(&format!(
            "  - {{name: p{n:04}, key: [ip], match: {{route: r{n}}}, algorithm: fixed_window, \
             limit: 1, period: 1h}}\n"
        ));
    }
    let app = spawn_app_with(&yaml).await;
    let last = format!("p{tracked:04}");
    for _ in 0..3 {
        let body = json!({"descriptors": {"route": format!("r{tracked}"), "ip": "192.0.2.1"}});
        app.check_tcp(&body).await;
    }
    let reason = assert_error(
        &app.admin_get(&format!("/v1/top?policy={last}")).await,
        409,
        "not_tracked",
    );
    assert!(reason.contains(&format!("`{last}`")), "{reason}");
    assert!(reason.contains(&tracked.to_string()), "{reason}");
    // The first policy is tracked: an empty list is a true "no denial".
    let body = top(&app, "?policy=p0000").await;
    assert_eq!(body["policies"][0]["denials"], json!(0), "{body}");
}

//! Local limits through the real API, on a real Redis: a hot partition past its per-pod
//! `local_limit` is denied in the pod (with the bucket's own retry), its denials are counted
//! apart, and Redis is asked only for what the bucket let through (`INFO commandstats`). The
//! same scenario on the embedded store. Exactness across pods is in `redis_exactness`.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{
    header, json_of, metric_value, spawn_app_in, spawn_app_with, test_settings, TestApp,
};
use crate::redis_server::RedisServer;

const POLICIES: &str = "
policies:
  - {name: plain, key: [k], algorithm: fixed_window, limit: 1000000, period: 1h, failure_mode: closed}
  - {name: capped, key: [k], algorithm: fixed_window, limit: 1000000, period: 1h, failure_mode: closed, local_limit: {limit: 10, period: 1h}}
";

/// Checks sent per policy.
const CHECKS: u64 = 100;

fn body(policy: &str) -> Value {
    json!({"policy": policy, "descriptors": {"k": "hot"}})
}

/// Sends [`CHECKS`] checks in turn on one connection; returns how many were admitted.
async fn storm(app: &TestApp, policy: &str) -> u64 {
    let mut conn = crate::helpers::connect(&app.tcp).await;
    let mut admitted = 0;
    for _ in 0..CHECKS {
        let reply = crate::helpers::check_on(&mut conn, &body(policy)).await;
        admitted += u64::from(reply.status == 200);
    }
    admitted
}

/// The answers and counts every store gives, after one storm on each policy.
async fn after_storms(app: &TestApp) {
    let denied = app.check_tcp(&body("capped")).await;
    assert_eq!(denied.status, 429);
    let answer = json_of(&denied);
    assert_eq!(answer["mode"], "local_limit");
    assert_eq!(answer["policy"], "capped");
    // 10 an hour, all spent at one instant: the next token in exactly 6 minutes.
    assert_eq!(answer["retry_after_ms"], 360_000);
    assert_eq!(header(&denied, "retry-after"), "360");
    assert_eq!(header(&denied, "ratelimit"), "\"capped/local\";r=0;t=3600");
    let metrics = app.metrics().await;
    let count = |outcome| {
        metric_value(
            &metrics,
            "sluice_decisions_total",
            &[("policy", "capped"), ("outcome", outcome)],
        )
    };
    assert_eq!(count("local_limit_denied"), (CHECKS - 10 + 1) as f64);
    assert_eq!(count("allowed"), 10.0);
    assert_eq!(count("denied"), 0.0);
    // Explain shows the bucket, and that it would deny now.
    let explain = crate::helpers::post(
        &sluice::client::Target::Tcp(app.admin),
        "/v1/explain",
        body("capped").to_string().into_bytes(),
    )
    .await;
    let explained = json_of(&explain);
    assert_eq!(explained["outcome"], "denied", "{explained}");
    assert_eq!(explained["policies"][1]["local_limit"]["remaining"], 0);
    assert_eq!(
        explained["policies"][1]["allowed"], true,
        "the store itself has room"
    );
}

#[tokio::test]
async fn a_local_limit_on_the_embedded_store() {
    let app = spawn_app_with(POLICIES).await;
    assert_eq!(storm(&app, "plain").await, CHECKS);
    assert_eq!(storm(&app, "capped").await, 10, "10 an hour in this pod");
    after_storms(&app).await;
}

/// EVAL and EVALSHA calls Redis has served so far.
fn script_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection())
        .expect("INFO");
    info.lines()
        .filter_map(|line| {
            let fields = line
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| line.strip_prefix("cmdstat_eval:"))?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_limit_keeps_a_hot_partition_off_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(redis.url());
    settings.redis.timeout = HumanDuration(2_000_000);
    let app = spawn_app_in(dir, settings, POLICIES).await;
    let probe = json!({"policy": "plain", "descriptors": {"k": "probe"}, "dry_run": true});
    for _ in 0..200 {
        if json_of(&app.check_tcp(&probe).await)["mode"] == "enforced" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let before = script_calls(&redis);
    assert_eq!(storm(&app, "plain").await, CHECKS);
    let plain = script_calls(&redis) - before;
    let before = script_calls(&redis);
    assert_eq!(storm(&app, "capped").await, 10);
    let capped = script_calls(&redis) - before;
    println!(
        "one hot key, {CHECKS} checks in turn: {plain} Redis script calls without local_limit, \
         {capped} with local_limit 10/h"
    );
    // Checks in turn are one call each; the bucket let 10 through.
    assert_eq!((plain, capped), (CHECKS, 10));
    after_storms(&app).await;
}

//! Local limits through the real API, on a real Redis: a hot partition past its per-pod
//! `local_limit` is denied in the pod (with the bucket's own retry), its denials are counted
//! apart, and Redis is asked only for what the bucket let through (`INFO commandstats`). The
//! same scenario on the embedded store. Exactness across pods is in `redis_exactness`.

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{
    header, json_of, metric_value, spawn_app_in, spawn_app_with, test_settings, TestApp,
};
use crate::redis_server::RedisServer;
use crate::wait::{until, WAIT};

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
    app.wait_for_store().await;
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

/// `/v1/counters` on a policy of two windows with a local limit, two daemons on one Redis: every
/// window is shown and reset, each pod shows its own bucket, and a reset on one pod reaches the
/// other's remembered denial (of the window that denied) and its bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_show_and_reset_every_window_and_the_buckets() {
    const BOTH: &str = "
policies:
  - {name: plain, key: [k], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: both, key: [ip], algorithm: sliding_log, limits: [{limit: 3, period: 1m}, {limit: 5, period: 1h}], local_limit: {limit: 4, period: 1h}}
";
    let redis = RedisServer::start();
    let spawn = || {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = test_settings(dir.path());
        settings.redis.url = Some(redis.url());
        settings.redis.timeout = HumanDuration(2_000_000);
        spawn_app_in(dir, settings, BOTH)
    };
    let (a, b) = (spawn().await, spawn().await);
    for app in [&a, &b] {
        app.wait_for_store().await;
    }
    let ip: sluice::limit::Descriptors = [("ip".to_owned(), "x".to_owned())].into();
    let path = sluice::client::counters_path("both", &ip, None);
    let counter = |app: &TestApp, method: axum::http::Method| {
        let (admin, path) = (sluice::client::Target::Tcp(app.admin), path.clone());
        async move {
            let reply = sluice::client::request(&admin, method, &path, None)
                .await
                .expect("admin");
            assert_eq!(reply.status, 200, "{}", json_of(&reply));
            json_of(&reply)
        }
    };
    let check = json!({"policy": "both", "descriptors": {"ip": "x"}});
    for _ in 0..3 {
        assert_eq!(b.check_tcp(&check).await.status, 200);
    }
    let denied = json_of(&b.check_tcp(&check).await);
    assert_eq!(
        (denied["mode"].clone(), denied["window"].clone()),
        (json!("enforced"), json!(0))
    );

    let on_a = counter(&a, axum::http::Method::GET).await;
    let keys: Vec<&str> = on_a["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .map(|w| w["key"].as_str().expect("key"))
        .collect();
    assert_eq!(keys, ["rl:{both:x}:1m", "rl:{both:x}:1h"]);
    assert_eq!(
        (on_a["key"].clone(), on_a["allowed"].clone()),
        (json!("rl:{both:x}:1m"), json!(false))
    );
    assert_eq!(
        on_a["local_limit"]["remaining"], 4,
        "a's own bucket: {on_a}"
    );
    let on_b = counter(&b, axum::http::Method::GET).await;
    assert_eq!(
        on_b["local_limit"]["remaining"], 0,
        "4 tokens, the denied one too: {on_b}"
    );
    assert!(
        on_b["windows"][0]["local_layer_retry_after_ms"].as_u64() > Some(0),
        "{on_b}"
    );

    let report = counter(&a, axum::http::Method::DELETE).await;
    assert_eq!(report["keys"], json!(["rl:{both:x}:1m", "rl:{both:x}:1h"]));
    assert_eq!(
        (report["existed"].clone(), report["fleet"].clone()),
        (json!(true), json!("announced"))
    );
    let on_b = until("b hears", WAIT, || async {
        let on_b = counter(&b, axum::http::Method::GET).await;
        let forgot = on_b["windows"][0]["local_layer_retry_after_ms"].is_null();
        match forgot && on_b["local_limit"]["remaining"] == 4 {
            true => Ok(on_b),
            false => Err(on_b),
        }
    })
    .await;
    assert_eq!(on_b["remaining"], 3, "{on_b}");
    let again = json_of(&b.check_tcp(&check).await);
    assert_eq!(
        (again["allowed"].clone(), again["remaining"].clone()),
        (json!(true), json!(2))
    );
}

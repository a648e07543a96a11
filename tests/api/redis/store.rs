//! The Redis store through the real API, against a real single node and a real 3-primary Cluster:
//! the same scenarios on both, plus script-cache loss, TTLs, hostile keys and memory per key.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{json_of, remaining, TestApp, SHIPPED_POLICIES};
use crate::stores::{spawn_on_with, Backend, OnStore, Store};

/// Losing the script cache: `SCRIPT FLUSH` on every primary.
fn flush_scripts(store: &Store) {
    for mut conn in store.primaries() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut conn)
            .expect("SCRIPT FLUSH");
    }
}

/// A daemon on a store of the test's own (these tests flush scripts and count calls).
async fn spawn_on(store: &Store, policies: &str, prefix: &str) -> OnStore<TestApp> {
    spawn_on_with(store.clone(), policies, prefix, |_| {}).await
}

const POLICIES: &str = "
policies:
  - {name: warmup, key: [ip], algorithm: fixed_window, limit: 1000000, period: 1h, failure_mode: closed}
  - {name: login, match: {path: /login}, key: [ip], algorithm: sliding_log, limit: 10, period: 5m, failure_mode: closed}
  - {name: api, match: {api_key: '*'}, key: [tenant, api_key], algorithm: token_bucket, limit: 10, period: 1h, burst: 150, failure_mode: closed}
  - {name: window, key: [user], algorithm: fixed_window, limit: 5, period: 1h, failure_mode: closed}
  - {name: per_account, match: {path: /login}, key: [account], algorithm: fixed_window, limit: 100, period: 1h, failure_mode: closed}
";

async fn scenarios(backend: &Store) {
    let app = spawn_on(backend, POLICIES, "t1").await;

    // Login: 10 in the window, then denied for (almost) the whole window.
    let login = json!({"descriptors": {"path": "/login", "ip": "198.51.100.1", "account": "a"}});
    for i in 0..10 {
        let reply = app.check_tcp(&login).await;
        assert_eq!(reply.status, 200, "attempt {i}: {}", json_of(&reply));
    }
    let denied = app.check_tcp(&login).await;
    assert_eq!(denied.status, 429);
    let body = json_of(&denied);
    assert_eq!(body["policy"], "login");
    let retry_ms = body["retry_after_ms"].as_u64().expect("retry");
    assert!(
        (290_000..=300_000).contains(&retry_ms),
        "retry {retry_ms} ms"
    );
    assert_eq!(body["retry_after_sec"], 300);
    // The denied group spent nothing from per_account: 10 spent, this probe would be the 11th.
    let probe = json!({"policy": "per_account", "descriptors": {"account": "a"}, "dry_run": true});
    assert_eq!(remaining(&app.check_tcp(&probe).await), 100 - 10 - 1);

    // A burst of 150, then one token per 6 minutes (slow enough that test time does not refill).
    let api = json!({"descriptors": {"tenant": "acme", "api_key": "k1"}});
    for i in 0..150 {
        assert_eq!(app.check_tcp(&api).await.status, 200, "request {i}");
    }
    let denied = json_of(&app.check_tcp(&api).await);
    assert_eq!(denied["allowed"], false);
    let retry_ms = denied["retry_after_ms"].as_u64().expect("retry");
    assert!((350_000..=360_000).contains(&retry_ms), "{denied}");

    // Cost and dry runs.
    let window = json!({"descriptors": {"user": "u1"}, "cost": 3});
    let dry = json!({"descriptors": {"user": "u1"}, "cost": 3, "dry_run": true});
    for _ in 0..5 {
        assert_eq!(app.check_tcp(&dry).await.status, 200);
    }
    assert_eq!(remaining(&app.check_tcp(&window).await), 2);
    assert_eq!(app.check_tcp(&window).await.status, 429);

    // Hostile values: separators and braces neither collide nor move the hash tag.
    let hostile = [("t:a", "b"), ("t", "a:b"), ("{t}", "}{"), ("t%3Aa", "b")];
    for (tenant, key) in hostile {
        let body = json!({"descriptors": {"tenant": tenant, "api_key": key}, "cost": 100});
        let reply = app.check_tcp(&body).await;
        assert_eq!(remaining(&reply), 50, "{tenant}/{key} shares a counter");
    }
    let keys = backend.keys("t1:*");
    assert!(keys.len() >= 8, "{keys:?}");
    for (_, key) in &keys {
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        assert!(key.ends_with('}'), "{key}");
    }

    // Every key expires, with a TTL derived from its policy.
    let mut conns = backend.primaries();
    for (node, key) in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query(&mut conns[*node])
            .expect("PTTL");
        assert!(ttl > 0, "{key} has PTTL {ttl}");
        // The longest state here: an empty 150-token bucket refilling 10 per hour takes 15 h.
        assert!(
            ttl <= 15 * 3_600_000,
            "{key} has PTTL {ttl}, longer than its policy allows"
        );
    }
    assert_eq!(
        crate::helpers::metric_value(
            &app.metrics().await,
            "sluice_redis_errors_total",
            &[("kind", "timeout")]
        ),
        0.0
    );
}

/// Losing the script cache mid-traffic (restart, failover, SCRIPT FLUSH) costs no check.
async fn script_flush_mid_traffic(backend: &Store) {
    let app = spawn_on(backend, POLICIES, "t2").await;
    let app = std::sync::Arc::new(app);
    let mut load = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let app = app.clone();
        load.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..150 {
                let user = format!("w{worker}-{}", i % 7);
                let reply = app.check_tcp(&json!({"descriptors": {"user": user}})).await;
                statuses.push((reply.status.as_u16(), json_of(&reply)["mode"].clone()));
            }
            statuses
        });
    }
    for _ in 0..5 {
        flush_scripts(backend);
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let mut answered = 0;
    while let Some(statuses) = load.join_next().await {
        for (status, mode) in statuses.expect("worker") {
            assert!(
                status == 200 || status == 429,
                "status {status}: the flush cost a check"
            );
            assert_eq!(mode, Value::from("enforced"));
            answered += 1;
        }
    }
    assert_eq!(answered, 600);
    let metrics = app.metrics().await;
    assert!(
        crate::helpers::metric_value(
            &metrics,
            "sluice_redis_errors_total",
            &[("kind", "noscript")]
        ) >= 1.0,
        "the flush was seen and recovered from"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_on_single_redis() {
    let backend = Store::start(Backend::Redis);
    scenarios(&backend).await;
    script_flush_mid_traffic(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_on_redis_cluster() {
    let backend = Store::start(Backend::Cluster);
    scenarios(&backend).await;
    script_flush_mid_traffic(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_policies_work_on_redis() {
    let backend = Store::start(Backend::Redis);
    let policies = format!("{SHIPPED_POLICIES}\n  - {{name: warmup, key: [ip], algorithm: fixed_window, limit: 1000, period: 1h}}\n");
    let app = spawn_on(&backend, &policies, "t3").await;
    let enterprise =
        json!({"descriptors": {"tenant": "big", "api_key": "k", "tier": "enterprise"}});
    assert_eq!(json_of(&app.check_tcp(&enterprise).await)["limit"], 1500);
}

/// Redis memory per key for each algorithm (`MEMORY USAGE`), printed for docs/redis.md and bounded
/// loosely so that a layout regression shows up. Run with `--nocapture` to see the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_key() {
    let backend = Store::start(Backend::Redis);
    let policies = "
policies:
  - {name: warmup, key: [ip], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: tb, key: [tenant, api_key], algorithm: token_bucket, limit: 1000, period: 1m, burst: 150}
  - {name: log, key: [ip], algorithm: sliding_log, limit: 10, period: 5m}
  - {name: fw, key: [tenant, api_key], algorithm: fixed_window, limit: 1000, period: 1m}
";
    let app = spawn_on(&backend, policies, "rl").await;
    let api = json!({"tenant": "acme", "api_key": "key-0001"});
    app.check_tcp(&json!({"policy": "tb", "descriptors": api}))
        .await;
    app.check_tcp(&json!({"policy": "fw", "descriptors": api}))
        .await;
    for _ in 0..10 {
        app.check_tcp(&json!({"policy": "log", "descriptors": {"ip": "203.0.113.7"}}))
            .await;
    }
    let mut conn = backend.primaries().remove(0);
    let mut report = Vec::new();
    for (key, bound) in [
        ("rl:{tb:acme:key-0001}", 128),
        ("rl:{log:203.0.113.7}", 288),
        ("rl:{fw:acme:key-0001}", 128),
    ] {
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query(&mut conn)
            .expect("MEMORY USAGE");
        report.push(format!("{key}: {bytes} B"));
        assert!(bytes > 0 && bytes <= bound, "{key}: {bytes} B > {bound} B");
    }
    println!("Redis MEMORY USAGE per key: {}", report.join(", "));
}

/// `POST /v1/check/batch` of eight checks costs Redis one script call, not eight: the checks
/// reach the batcher's queue together. One thread, as `sluice serve` runs by default, so the
/// dispatcher cannot flush the first check alone before the others are queued.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_request_is_one_redis_call() {
    let backend = Store::start(Backend::Redis);
    let policies = format!("{SHIPPED_POLICIES}\n  - {{name: warmup, key: [ip], algorithm: fixed_window, limit: 1000, period: 1h}}\n");
    let app = spawn_on(&backend, &policies, "t4").await;
    let calls = |metrics: &str| {
        crate::helpers::metric_value(metrics, "sluice_redis_calls_total", &[("scope", "slot")])
    };
    let before = calls(&app.metrics().await);
    let checks: Vec<serde_json::Value> = (0..8)
        .map(|i| json!({"policy": "login", "descriptors": {"ip": format!("192.0.2.{i}")}}))
        .collect();
    let reply = app.batch(&checks).await;
    assert_eq!(reply.status, 200);
    let results = json_of(&reply)["results"]
        .as_array()
        .expect("results")
        .clone();
    assert!(results
        .iter()
        .all(|r| r["allowed"] == true && r["remaining"] == 9));
    let after = calls(&app.metrics().await);
    assert_eq!(after - before, 1.0, "one script call for the batch of 8");
}

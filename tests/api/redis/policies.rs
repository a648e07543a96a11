//! The policy layer on Redis: tenant tiers changed in Redis reach every daemon within the refresh
//! interval, multi-policy checks are all-or-nothing under concurrency, and the local layer saves
//! Redis calls for a partition hammered far over its limit without admitting anything extra.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::config::HumanDuration;

use crate::helpers::{json_of, remaining, spawn_app_in, test_settings, TestApp};
use crate::redis_server::RedisServer;

const POLICIES: &str = "
policies:
  - {name: api, key: [tenant, api_key], algorithm: token_bucket, limit: 1000, period: 1h, burst: 100, tiers: {levels: {enterprise: {multiplier: 10}}}}
  - {name: per_ip, match: {path: /login}, key: [ip], algorithm: sliding_log, limit: 3, period: 1h}
  - {name: per_account, match: {path: /login}, key: [account], algorithm: fixed_window, limit: 5, period: 1h}
  - {name: hot, key: [user], algorithm: fixed_window, limit: 10, period: 1h}
";

async fn spawn(redis: &RedisServer, local_layer: bool) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(redis.url());
    settings.redis.timeout = HumanDuration(2_000_000);
    settings.tenants.refresh = HumanDuration(200_000);
    settings.local_layer.enabled = local_layer;
    let app = spawn_app_in(dir, settings, POLICIES).await;
    app.wait_for_store().await;
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_changed_in_redis_reaches_every_daemon_within_the_refresh() {
    let redis = RedisServer::start();
    let daemons = [spawn(&redis, true).await, spawn(&redis, true).await];
    let body = json!({"policy": "api", "descriptors": {"tenant": "acme", "api_key": "k"}, "dry_run": true});
    for app in &daemons {
        assert_eq!(json_of(&app.check_tcp(&body).await)["limit"], 100);
    }
    let _: () = redis::cmd("HSET")
        .arg("rl:tenant-tiers")
        .arg("acme")
        .arg("enterprise")
        .query(&mut redis.connection())
        .expect("HSET");
    let changed = Instant::now();
    for app in &daemons {
        crate::wait::eventually_within("seen", Duration::from_secs(5), || async {
            json_of(&app.check_tcp(&body).await)["limit"] == 1000
        })
        .await;
    }
    let seen = changed.elapsed();
    println!("tenant tier changed in Redis: seen by both daemons after {seen:?} (refresh 200 ms)");
    assert!(
        seen < Duration::from_millis(200) + Duration::from_secs(2),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_limits_are_all_or_nothing_under_concurrency() {
    let redis = RedisServer::start();
    let app = Arc::new(spawn(&redis, false).await);
    // Two IPs (3 each) share an account (5): 24 concurrent attempts.
    let mut attempts = tokio::task::JoinSet::new();
    for i in 0..24 {
        let app = Arc::clone(&app);
        attempts.spawn(async move {
            let ip = if i % 2 == 0 { "192.0.2.1" } else { "192.0.2.2" };
            let body = json!({"descriptors": {"path": "/login", "ip": ip, "account": "alice"}});
            (ip, app.check_tcp(&body).await.status.as_u16())
        });
    }
    let mut admitted: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    while let Some(attempt) = attempts.join_next().await {
        let (ip, status) = attempt.expect("attempt");
        assert!(status == 200 || status == 429, "status {status}");
        if status == 200 {
            *admitted.entry(ip).or_insert(0) += 1;
        }
    }
    let total: u64 = admitted.values().sum();
    assert!(total <= 5, "account limit: {admitted:?}");
    assert!(admitted.values().all(|&n| n <= 3), "ip limit: {admitted:?}");
    // Every counter holds exactly what was admitted: denied attempts spent nothing anywhere.
    let probe = |policy: &str, descriptors: serde_json::Value| json!({"policy": policy, "descriptors": descriptors, "dry_run": true});
    let account = remaining(
        &app.check_tcp(&probe("per_account", json!({"account": "alice"})))
            .await,
    );
    // A probe that would pass reports what is left after it; a full counter reports 0.
    assert_eq!(account, (5 - total).saturating_sub(1), "{admitted:?}");
    for (ip, n) in &admitted {
        let left = remaining(&app.check_tcp(&probe("per_ip", json!({"ip": ip}))).await);
        assert_eq!(left, (3 - n).saturating_sub(1), "{ip}: {admitted:?}");
    }
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection())
        .expect("INFO");
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// One partition hammered far over its limit: Redis calls per 1,000 denied checks, with and
/// without the local layer; admissions are the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_layer_saves_redis_calls_without_extra_admissions() {
    let mut report = Vec::new();
    for local_layer in [false, true] {
        let redis = RedisServer::start();
        let app = spawn(&redis, local_layer).await;
        let body = json!({"policy": "hot", "descriptors": {"user": "storm"}});
        let before = evalsha_calls(&redis);
        let (mut admitted, mut denied) = (0, 0);
        for _ in 0..1_010 {
            match app.check_tcp(&body).await.status.as_u16() {
                200 => admitted += 1,
                429 => denied += 1,
                other => panic!("status {other}"),
            }
        }
        let calls = evalsha_calls(&redis) - before;
        assert_eq!((admitted, denied), (10, 1_000), "no extra admissions");
        report.push(format!(
            "local layer {}: {calls} Redis script calls for 10 admitted + 1000 denied",
            if local_layer { "on" } else { "off" }
        ));
        if local_layer {
            assert!(calls <= 10 + 5, "{calls} calls with the local layer");
            let hits = crate::helpers::metric_value(
                &app.metrics().await,
                "sluice_local_layer_hits_total",
                &[("policy", "hot")],
            );
            assert!(hits >= 995.0, "{hits} local-layer hits");
        } else {
            assert!(calls >= 1_010, "{calls} calls without the local layer");
        }
    }
    println!("{}", report.join("; "));
}

//! A hash slot moving between Cluster nodes under live checks (`redis-cli --cluster reshard`
//! does the same steps): a slot MIGRATING with none, some or all of its keys moved, then owned
//! by the new node. A moment of resharding is no outage: every check is answered from Redis (no
//! failure mode, with the production deadline), and the counts stay exact across the move.

use std::sync::Arc;

use serde_json::json;

use crate::helpers::{json_of, spawn_app_in, test_settings, TestApp};
use crate::redis_server::RedisCluster;

/// Two windows: two keys in the partition's slot (one hash tag), so that a migration can hold
/// them on two nodes at once. Fail closed: a failure-mode answer is a 503.
const POLICIES: &str = "
policies:
  - name: login
    key: [ip]
    algorithm: fixed_window
    limits:
      - {limit: 1000, period: 1h}
      - {limit: 1000, period: 1m}
    failure_mode: closed
";

async fn daemon(cluster: &RedisCluster, node_calls: bool) -> Arc<TestApp> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.cluster = cluster.urls();
    settings.redis.cluster_node_calls = node_calls;
    // The production default (100 ms), not a test's generous one: a migrating slot must be
    // followed within it.
    settings.redis.timeout = sluice::config::Settings::default().redis.timeout;
    let app = Arc::new(spawn_app_in(dir, settings, POLICIES).await);
    app.wait_for_store().await;
    app
}

/// `n` concurrent checks of each of `ips`; every answer must be an enforced one from Redis.
/// Returns how many were admitted.
async fn checks(app: &Arc<TestApp>, ips: &[String], n: usize) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..ips.len() * n {
        let (app, ip) = (Arc::clone(app), ips[i % ips.len()].clone());
        tasks.spawn(async move {
            let body = json!({"policy": "login", "descriptors": {"ip": ip}});
            json_of(&app.check_tcp(&body).await)
        });
    }
    let mut admitted = 0;
    while let Some(done) = tasks.join_next().await {
        let reply = done.expect("check");
        if reply["mode"] != "enforced" {
            panic!("{reply}\nRedis errors:\n{}", redis_errors(app).await);
        }
        admitted += usize::from(reply["allowed"] == true);
    }
    admitted
}

/// The daemon's `sluice_redis_errors_total` lines with a count.
async fn redis_errors(app: &TestApp) -> String {
    let metrics = app.metrics().await;
    metrics
        .lines()
        .filter(|line| line.starts_with("sluice_redis_errors_total{") && !line.ends_with(" 0"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `remaining` of one check of `ip` (which spends 1).
async fn remaining(app: &TestApp, ip: &str) -> u64 {
    let reply = json_of(
        &app.check_tcp(&json!({"policy": "login", "descriptors": {"ip": ip}}))
            .await,
    );
    assert_eq!(reply["mode"], "enforced", "{reply}");
    reply["remaining"].as_u64().expect("remaining")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_through_a_slot_migration_are_answered_by_redis_and_stay_exact() {
    for node_calls in [true, false] {
        let cluster = RedisCluster::start();
        let app = daemon(&cluster, node_calls).await;
        // The moving partition, and others (other slots, some on the same nodes) in the same
        // batches.
        let ips: Vec<String> = (0..8).map(|i| format!("10.1.0.{i}")).collect();
        let moving = ips[0].clone();
        let slot = sluice::store::redis::keys::slot(&format!("{{login:{moving}}}"));
        assert_eq!(checks(&app, &ips, 2).await, 16);
        let migration = cluster.begin_migration(slot);
        // MIGRATING, nothing moved: the source still answers.
        assert_eq!(checks(&app, &ips, 2).await, 16);
        // One window's key moved, the other not: Redis refuses a call naming both (TRYAGAIN)
        // until the rest follows, which a resharding does within moments.
        let keys = migration.keys_left(&cluster);
        assert_eq!(keys.len(), 2, "two windows, two keys: {keys:?}");
        migration.migrate(&cluster, &keys[..1]);
        let app_during = Arc::clone(&app);
        let ips_during = ips.clone();
        let during = tokio::spawn(async move { checks(&app_during, &ips_during, 2).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        migration.migrate(&cluster, &keys[1..]);
        assert_eq!(during.await.expect("checks"), 16);
        // Every key moved, the slot still MIGRATING: the source answers ASK.
        assert_eq!(checks(&app, &ips, 2).await, 16);
        // The new owner announced: MOVED for a stale map.
        migration.finish(&cluster);
        assert_eq!(checks(&app, &ips, 2).await, 16);
        // Exact across the move: 1 + 5 * 2 = 11 units spent on the moving partition.
        assert_eq!(
            remaining(&app, &moving).await,
            1000 - 11,
            "node calls {node_calls}"
        );
        eprintln!("node calls {node_calls}: {}", redis_errors(&app).await);
    }
}

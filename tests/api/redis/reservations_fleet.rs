//! Reservations across pods: six real `sluice serve` processes on one Redis (single node, a
//! Cluster, and through Sentinel), sharing `shadow.fingerprint_key`. 200 callers each reserve an
//! estimate (10-40 units) through one daemon and settle a real cost at or below it through
//! another, half on a fixed window, half on a token bucket; each counter then holds exactly the
//! sum of its settled costs (refunds gave back exactly what was reserved and not used), which
//! never exceeds the limit. Then, across
//! daemons: a cost above the estimate is spent, a second settle is refused (409) and changes
//! nothing, a reservation never settled keeps its estimate and is refused as expired once its
//! `reservation_ttl` has passed on Redis' clock (the host's), and one reservation's id over
//! another partition's payload is refused. On the Cluster, each settle mark sits on the node
//! that holds its partition's counter.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sluice::client::{Connection, Target};

use super::exactness::{start_daemon_with, Daemon};
use super::permits_fleet::next;
use crate::redis_server::{RedisCluster, RedisServer};
use crate::reservations::{expires_us, settle_on, spliced};
use crate::wait::wait_for_store;

const LIMIT: u64 = 1000;
const DAEMONS: usize = 6;
const CALLERS: usize = 200;
/// Each caller's attempts: bounded, whatever it is answered.
const ATTEMPTS: usize = 4;

fn policies() -> String {
    format!(
        "policies:\n  - {{name: tokens, key: [tenant], algorithm: fixed_window, limit: {LIMIT}, period: 1h, reservations: true, reservation_ttl: 30s, failure_mode: closed}}\n  - {{name: bucket, key: [tenant], algorithm: token_bucket, limit: 1, period: 1h, burst: {LIMIT}, reservations: true, reservation_ttl: 30s, failure_mode: closed}}\n  - {{name: brief, key: [tenant], algorithm: fixed_window, limit: {LIMIT}, period: 1h, reservations: true, reservation_ttl: 1s, failure_mode: closed}}\n"
    )
}

/// What is left of `policy`'s counter for `tenant`, spending nothing.
async fn left(daemon: &Daemon, policy: &str, tenant: &str) -> u64 {
    let probe = json!({"policy": policy, "descriptors": {"tenant": tenant}, "dry_run": true});
    let mut conn = Connection::open(&daemon.http).await.expect("connect");
    let reply = conn.post_json("/v1/check", &probe).await.expect("answer");
    crate::reservations::units_left(&reply.json())
}

async fn reserve(daemon: &Daemon, policy: &str, tenant: &str, cost: u64) -> String {
    let ask =
        json!({"policy": policy, "descriptors": {"tenant": tenant}, "cost": cost, "reserve": true});
    let mut conn = Connection::open(&daemon.http).await.expect("connect");
    let reply = conn.post_json("/v1/check", &ask).await.expect("answer");
    let body: Value = reply.json();
    assert_eq!(reply.status, 200, "{body}");
    body["reservation"]
        .as_str()
        .expect("a reservation")
        .to_owned()
}

/// Runs the scenario on six daemons of `redis_toml`; the daemons (for checks of the store) and
/// the id of the reservation settled on `{run}-over`.
async fn fleet_settles_exactly(
    redis_toml: String,
    run: &str,
) -> (Vec<Daemon>, tempfile::TempDir, String) {
    crate::wait::within_one_window(Duration::from_secs(3600), Duration::from_secs(120)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policies.yaml"), policies()).expect("write policies");
    let shared = "[shadow]\nfingerprint_key = \"0123456789abcdef0123456789abcdef\"\n";
    let daemons: Vec<Daemon> = (0..DAEMONS)
        .map(|i| start_daemon_with(dir.path(), i, &redis_toml, shared))
        .collect();
    for daemon in &daemons {
        wait_for_store(&daemon.admin).await;
    }
    let targets: Arc<Vec<Target>> = Arc::new(daemons.iter().map(|d| d.http.clone()).collect());
    // Half the callers on the fixed window, half on the token bucket (1 token an hour: no
    // refill to speak of, so its counter is as exact as the window's).
    let policies = ["tokens", "bucket"];
    let settled = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let admitted = Arc::new(AtomicUsize::new(0));
    let denied = Arc::new(AtomicUsize::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (targets, settled, admitted, denied) = (
            Arc::clone(&targets),
            Arc::clone(&settled),
            Arc::clone(&admitted),
            Arc::clone(&denied),
        );
        let tenant = run.to_owned();
        callers.spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (caller as u64 + 1);
            let mut taker = Connection::open(&targets[caller % DAEMONS])
                .await
                .expect("connect");
            let mut settler = Connection::open(&targets[(caller + 1) % DAEMONS])
                .await
                .expect("connect");
            for _ in 0..ATTEMPTS {
                let estimate = 10 + next(&mut seed) % 31;
                let ask = json!({"policy": policies[caller % 2], "descriptors": {"tenant": tenant}, "cost": estimate, "reserve": true});
                let reply = taker.post_json("/v1/check", &ask).await.expect("answer");
                match reply.status.as_u16() {
                    200 => {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        let token = reply.json()["reservation"]
                            .as_str()
                            .expect("reservation")
                            .to_owned();
                        tokio::time::sleep(Duration::from_millis(next(&mut seed) % 20)).await;
                        let cost = next(&mut seed) % (estimate + 1);
                        let body = json!({ "reservation": token, "cost": cost });
                        let back = settler.post_json("/v1/settle", &body).await.expect("settle");
                        let answer = back.json();
                        assert_eq!(back.status, 200, "{answer}");
                        // The window gets back exactly the unused units; the bucket the
                        // same less what it refilled by itself since the reservation (a
                        // fraction of a token: the whole units shown are one fewer).
                        let refunded = answer["policies"][0]["refunded"].as_u64();
                        let unused = estimate - cost;
                        let exact = if caller % 2 == 0 {
                            refunded == Some(unused)
                        } else {
                            refunded.is_some_and(|r| r <= unused && r + 1 >= unused)
                        };
                        assert!(exact, "{answer}");
                        settled[caller % 2].fetch_add(cost, Ordering::SeqCst);
                    }
                    429 => {
                        denied.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => panic!("status {other}: {}", reply.json()),
                }
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.expect("caller");
    }
    let (admitted, denied) = (
        admitted.load(Ordering::SeqCst),
        denied.load(Ordering::SeqCst),
    );
    println!(
        "{run}: {CALLERS} callers on {DAEMONS} daemons: {admitted} reservations, {denied} denied"
    );
    for (at, policy) in policies.iter().enumerate() {
        let settled = settled[at].load(Ordering::SeqCst);
        let used = LIMIT - left(&daemons[at], policy, run).await;
        println!(
            "{run}: {policy}, limit {LIMIT}: {settled} units settled, the counter holds {used}"
        );
        assert_eq!(
            used, settled,
            "{policy}: refunds gave back exactly what was not used"
        );
        assert!(
            settled <= LIMIT,
            "{policy}: {settled} settled, limit {LIMIT}"
        );
    }
    assert!(denied > 0, "the callers reached the limits");

    // Over the estimate, across daemons: the difference is spent; a second settle elsewhere
    // changes nothing.
    let over = format!("{run}-over");
    let token = reserve(&daemons[0], "tokens", &over, 10).await;
    let over_id = token[..32].to_owned();
    let (status, body) = settle_on(&daemons[1].http, &token, 25).await;
    assert_eq!(
        (status, &body["policies"][0]["charged"]),
        (200, &json!(15)),
        "{body}"
    );
    let (status, body) = settle_on(&daemons[2].http, &token, 0).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("already_settled")),
        "{body}"
    );
    assert_eq!(left(&daemons[3], "tokens", &over).await, LIMIT - 25);

    // Never settled: once its ttl has passed on Redis' clock, it is refused and keeps its
    // estimate.
    let late = format!("{run}-late");
    let token = reserve(&daemons[3], "brief", &late, 10).await;
    let end = expires_us(&token);
    crate::wait::eventually("the reservation's ttl to end", || async move {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        u64::try_from(now.as_micros()).unwrap_or(u64::MAX) > end + 20_000
    })
    .await;
    let (status, body) = settle_on(&daemons[4].http, &token, 0).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (410, Some("reservation_expired")),
        "{body}"
    );
    assert_eq!(left(&daemons[5], "brief", &late).await, LIMIT - 10);

    // One reservation's id and MAC over another partition's payload: refused, nothing back.
    let mine = reserve(&daemons[0], "tokens", &format!("{run}-a"), 10).await;
    let theirs = reserve(&daemons[1], "tokens", &format!("{run}-b"), 10).await;
    let (status, body) = settle_on(&daemons[2].http, &spliced(&mine, &theirs), 0).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("forged_reservation")),
        "{body}"
    );
    assert_eq!(
        left(&daemons[3], "tokens", &format!("{run}-b")).await,
        LIMIT - 10
    );
    (daemons, dir, over_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_on_single_redis_settle_reservations_exactly() {
    let redis = RedisServer::start();
    fleet_settles_exactly(format!("url = \"{}\"\n", redis.url()), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_on_redis_cluster_settle_reservations_exactly_in_the_partitions_slot() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let (_daemons, _dir, id) =
        fleet_settles_exactly(format!("cluster = [{}]\n", nodes.join(", ")), "cluster").await;
    // The settle mark of the reservation on `cluster-over` is on the node of its counter.
    let node_of = |pattern: &str| -> Vec<usize> {
        cluster
            .connections()
            .into_iter()
            .enumerate()
            .filter_map(|(i, mut node)| {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(pattern)
                    .query(&mut node)
                    .expect("KEYS");
                (!keys.is_empty()).then_some(i)
            })
            .collect()
    };
    let counter = node_of("*{tokens:cluster-over}");
    assert_eq!(counter.len(), 1, "one node holds the counter: {counter:?}");
    assert_eq!(
        node_of(&format!("*{id}*")),
        counter,
        "the mark is on the counter's node"
    );
    // The callers' marks (dozens, kept for the 30 s ttl) are on their counter's node: no node
    // holds a mark but the nodes of the three counters settled on.
    let mut counters = node_of("*{tokens:cluster}");
    counters.extend(node_of("*{bucket:cluster}"));
    counters.extend(counter);
    for node in node_of("*rsv:*") {
        assert!(
            counters.contains(&node),
            "node {node} holds marks of no counter of theirs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_through_sentinel_settle_reservations_exactly() {
    let primary = RedisServer::start();
    let (_sentinel, port, _dir) = super::sentinel_of(&primary);
    let redis_toml = format!(
        "sentinel.nodes = [\"redis://127.0.0.1:{port}\"]\nsentinel.master = \"mymaster\"\n"
    );
    fleet_settles_exactly(redis_toml, "sentinel").await;
}

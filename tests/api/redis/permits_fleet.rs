//! Concurrency limits across pods: six real `sluice serve` processes on one Redis (single node,
//! then a Cluster), 200 callers each taking a permit through one daemon, holding it 5-50 ms and
//! releasing it through another (the fleet shares `shadow.fingerprint_key`; the permits last the
//! default 30 s, so none expires under a caller on a slow machine). Counted from the
//! callers' side (a caller counts itself from its 200 until just before it sends its release),
//! never more than `limit` hold a permit at once. Then callers take every slot and vanish: once
//! `permit_ttl` + 1 s has passed, every slot is back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::client::Connection;

use super::exactness::{start_daemon_with, Daemon};
use crate::redis_server::{RedisCluster, RedisServer};
use crate::wait::wait_for_store;

const LIMIT: usize = 8;
const DAEMONS: usize = 6;
const CALLERS: usize = 200;
/// Each caller's attempts: bounded, whatever it is answered.
const ATTEMPTS: usize = 6;

fn policies() -> String {
    format!(
        "policies:\n  - {{name: gen, key: [tenant], algorithm: concurrency, limit: {LIMIT}, failure_mode: closed}}\n  - {{name: gone, key: [tenant], algorithm: concurrency, limit: {LIMIT}, permit_ttl: 1s, failure_mode: closed}}\n"
    )
}

/// A small xorshift: each caller's hold times, 5-50 ms (and the reservation callers' figures).
pub(super) fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn fleet_holds_at_most_the_limit(redis_toml: String, run: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policies.yaml"), policies()).expect("write policies");
    let shared = "[shadow]\nfingerprint_key = \"0123456789abcdef0123456789abcdef\"\n";
    let daemons: Vec<Daemon> = (0..DAEMONS)
        .map(|i| start_daemon_with(dir.path(), i, &redis_toml, shared))
        .collect();
    for daemon in &daemons {
        wait_for_store(&daemon.admin).await;
    }
    let daemons = Arc::new(daemons);
    let held = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let ask = json!({"policy": "gen", "descriptors": {"tenant": run}});
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let (daemons, held, most, admitted) = (
            Arc::clone(&daemons),
            Arc::clone(&held),
            Arc::clone(&most),
            Arc::clone(&admitted),
        );
        let ask = ask.clone();
        callers.spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (caller as u64 + 1);
            let mut taker = Connection::open(&daemons[caller % DAEMONS].http)
                .await
                .expect("connect");
            let mut giver = Connection::open(&daemons[(caller + 1) % DAEMONS].http)
                .await
                .expect("connect");
            for _ in 0..ATTEMPTS {
                let reply = taker.post_json("/v1/check", &ask).await.expect("answer");
                match reply.status.as_u16() {
                    200 => {
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        let permit = reply.json()["permit"].as_str().expect("permit").to_owned();
                        let hold = 5 + next(&mut seed) % 46;
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        let back = giver
                            .post_json("/v1/release", &json!({ "permit": permit }))
                            .await
                            .expect("release");
                        assert_eq!(back.status, 200, "{}", back.json());
                        assert_eq!(back.json()["released"], true, "{}", back.json());
                    }
                    429 => tokio::time::sleep(Duration::from_millis(5)).await,
                    other => panic!("status {other}: {}", reply.json()),
                }
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.expect("caller");
    }
    let (most, admitted) = (most.load(Ordering::SeqCst), admitted.load(Ordering::SeqCst));
    println!(
        "{run}: {CALLERS} callers on {DAEMONS} daemons, limit {LIMIT}: {admitted} permits, at most {most} held at once"
    );
    assert!(most <= LIMIT, "{most} held at once, limit {LIMIT}");
    assert!(admitted >= LIMIT, "{admitted} permits taken");

    // Every slot taken by callers that vanish without releasing.
    let vanished = format!("{run}-vanished");
    let ask = json!({"policy": "gone", "descriptors": {"tenant": vanished}});
    let mut last_taken = Instant::now();
    for i in 0..LIMIT {
        let mut conn = Connection::open(&daemons[i % DAEMONS].http)
            .await
            .expect("connect");
        let reply = conn.post_json("/v1/check", &ask).await.expect("answer");
        assert_eq!(reply.status, 200, "{}", reply.json());
        last_taken = Instant::now();
    }
    let mut conn = Connection::open(&daemons[0].http).await.expect("connect");
    let full = conn.post_json("/v1/check", &ask).await.expect("answer");
    assert_eq!(full.status, 429, "{}", full.json());
    // permit_ttl (1 s) + 1 s after the last holder vanished, every slot is back.
    let back_by = last_taken + Duration::from_secs(2);
    tokio::time::sleep(back_by.saturating_duration_since(Instant::now())).await;
    for i in 0..LIMIT {
        let mut conn = Connection::open(&daemons[i % DAEMONS].http)
            .await
            .expect("connect");
        let reply = conn.post_json("/v1/check", &ask).await.expect("answer");
        assert_eq!(reply.status, 200, "slot {i}: {}", reply.json());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_on_single_redis_never_hold_more_than_the_limit() {
    let redis = RedisServer::start();
    fleet_holds_at_most_the_limit(format!("url = \"{}\"\n", redis.url()), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_on_redis_cluster_never_hold_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    fleet_holds_at_most_the_limit(format!("cluster = [{}]\n", nodes.join(", ")), "cluster").await;
}

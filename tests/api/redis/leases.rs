//! Quota leases across pods: six real `sluice serve` processes share one Redis (single node, then
//! a Cluster) and hammer one partition of leased policies (a fixed window, a token bucket, and a
//! request both apply to). Leases must carry most admissions, the fleet must never admit more
//! than the limit, and once the leases are given back (idle) the last units are all admissible:
//! the fleet ends at exactly the limit, less (a token bucket) the units of earlier takes that
//! could not be given back beneath a later take's and were left to refill.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::client::Connection;

use super::exactness::{metrics_of, start_daemon_with, Daemon};
use crate::helpers::metric_value;
use crate::redis_server::{RedisCluster, RedisServer};
use crate::wait::{wait_for_store, within_one_window};

/// Refill 10 per hour: over a test's seconds a token bucket adds less than one token, so its
/// burst is its limit here.
const POLICIES: &str = "
policies:
  - {name: window, match: {route: api}, key: [user], algorithm: fixed_window, limit: 3000, period: 1h, lease: true, failure_mode: closed}
  - {name: bucket, match: {route: api}, key: [user], algorithm: token_bucket, limit: 10, period: 1h, burst: 3000, lease: true, failure_mode: closed}
  - {name: per-ip, match: {route: login}, key: [ip], algorithm: fixed_window, limit: 2500, period: 1h, lease: true, failure_mode: closed}
  - {name: per-user, match: {route: login}, key: [user], algorithm: token_bucket, limit: 10, period: 1h, burst: 2000, lease: true, failure_mode: closed}
";

const DAEMONS: usize = 6;
const CLIENTS_PER_DAEMON: usize = 3;
const REQUESTS_PER_CLIENT: usize = 250;
/// `leases.idle`: short, so that the test sees leases given back.
const IDLE: &str = "300ms";

fn start_daemon(dir: &Path, index: usize, redis_toml: &str) -> Daemon {
    let leases = format!("[leases]\nmin_units = 2\nidle = \"{IDLE}\"\n");
    start_daemon_with(dir, index, redis_toml, &leases)
}

/// Every client of every daemon sends its requests as fast as it can; returns the admissions.
async fn hammer(daemons: &[Daemon], body: &Value) -> usize {
    let mut clients = tokio::task::JoinSet::new();
    for daemon in daemons {
        for _ in 0..CLIENTS_PER_DAEMON {
            let (target, body) = (daemon.http.clone(), body.clone());
            clients.spawn(async move {
                let mut conn = Connection::open(&target).await.expect("connect");
                let mut admitted = 0;
                for _ in 0..REQUESTS_PER_CLIENT {
                    admitted += usize::from(allowed(&mut conn, &body).await);
                }
                admitted
            });
        }
    }
    let mut admitted = 0;
    while let Some(count) = clients.join_next().await {
        admitted += count.expect("client");
    }
    admitted
}

async fn allowed(conn: &mut Connection, body: &Value) -> bool {
    let reply = conn.post_json("/v1/check", body).await.expect("answer");
    let status = reply.status.as_u16();
    assert!(
        status == 200 || status == 429,
        "status {status}: {}",
        reply.json()
    );
    status == 200
}

async fn fleet_metric(daemons: &[Daemon], metric: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for daemon in daemons {
        sum += metric_value(&metrics_of(daemon).await, metric, labels);
    }
    sum
}

/// Waits (bounded) until no daemon holds a lease of `policy`.
async fn until_given_back(daemons: &[Daemon], policy: &str) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let held = fleet_metric(daemons, "sluice_lease_units_held", &[("policy", policy)]).await;
        if held == 0.0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{policy}: leases of {held} units still held after 20 s"
        );
    }
}

/// One daemon checks one at a time until the store denies 3 in a row (bounded): the last units.
async fn drain(daemon: &Daemon, body: &Value, most: usize) -> usize {
    let mut conn = Connection::open(&daemon.http).await.expect("connect");
    let (mut admitted, mut denied_in_a_row) = (0, 0);
    for _ in 0..most {
        if allowed(&mut conn, body).await {
            admitted += 1;
            denied_in_a_row = 0;
        } else {
            denied_in_a_row += 1;
            if denied_in_a_row == 3 {
                break;
            }
        }
    }
    admitted
}

async fn leases_across_daemons(redis_toml: String, run: &str) {
    // Redis counts in real time: the run stays inside one hour's window.
    within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write policies");
    let daemons: Vec<Daemon> = (0..DAEMONS)
        .map(|i| start_daemon(dir.path(), i, &redis_toml))
        .collect();
    for daemon in &daemons {
        wait_for_store(&daemon.admin).await;
    }
    let attempts = DAEMONS * CLIENTS_PER_DAEMON * REQUESTS_PER_CLIENT;
    let cases = [
        (
            "window",
            json!({"policy": "window", "descriptors": {"route": "api", "user": run}}),
            3000,
        ),
        (
            "bucket",
            json!({"policy": "bucket", "descriptors": {"route": "api", "user": run}}),
            3000,
        ),
        (
            "per-ip",
            json!({"descriptors": {"route": "login", "ip": run, "user": run}}),
            2000,
        ),
    ];
    for (policy, body, limit) in cases {
        let started = Instant::now();
        let hammered = hammer(&daemons, &body).await;
        let leased =
            fleet_metric(&daemons, "sluice_lease_checks_total", &[("policy", policy)]).await;
        assert!(
            hammered <= limit,
            "{run} {policy}: {hammered} admitted of {attempts}, over the limit of {limit}"
        );
        until_given_back(&daemons, policy).await;
        // A leased policy's denial is remembered at most `leases.idle`: then it is asked again.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let last = drain(&daemons[0], &body, limit + 10).await;
        let admitted = hammered + last;
        // A token bucket refills 10 an hour: at most one more over the test.
        let refill = if policy == "window" {
            0
        } else {
            usize::try_from((started.elapsed().as_secs() * 10).div_ceil(3600)).unwrap_or(1)
        };
        let returned = fleet_metric(
            &daemons,
            "sluice_lease_units_total",
            &[("policy", policy), ("fate", "returned")],
        )
        .await;
        let named: &[&str] = if policy == "per-ip" {
            &["per-ip", "per-user"]
        } else {
            &[policy]
        };
        for name in named {
            let mut fates = Vec::new();
            for fate in [
                "taken", "admitted", "returned", "expired", "refilled", "dropped",
            ] {
                let labels = [("policy", *name), ("fate", fate)];
                let n = fleet_metric(&daemons, "sluice_lease_units_total", &labels).await;
                fates.push(format!("{fate} {n}"));
            }
            let mut takes = Vec::new();
            for outcome in ["granted", "empty", "failed", "stale"] {
                let labels = [("policy", *name), ("outcome", outcome)];
                let n = fleet_metric(&daemons, "sluice_lease_takes_total", &labels).await;
                takes.push(format!("{outcome} {n}"));
            }
            println!(
                "{run} {name}: lease units {}; takes {}",
                fates.join(", "),
                takes.join(", ")
            );
        }
        println!(
            "{run} {policy}: {hammered} of {attempts} admitted by 6 pods ({leased} from leases), \
             {returned} units given back, then {last} more: {admitted} of {limit}"
        );
        assert!(
            leased >= hammered as f64 / 2.0,
            "{run} {policy}: only {leased} of {hammered} admissions came from leases"
        );
        // A token bucket's units a pod could not give back (a later take sits after them:
        // only the latest take's give-back lands) refill by themselves, 10 an hour: lost to
        // this run, never admitted twice.
        let mut lost = 0;
        for name in named {
            let labels = [("policy", *name), ("fate", "refilled")];
            lost += fleet_metric(&daemons, "sluice_lease_units_total", &labels).await as usize;
        }
        assert!(
            (limit - lost.min(limit)..=limit + refill).contains(&admitted),
            "{run} {policy}: the fleet admitted {admitted}, the limit is {limit} ({lost} units \
             of token buckets left to refill)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_leasing_on_single_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    leases_across_daemons(format!("url = \"{}\"\n", redis.url()), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_daemons_leasing_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    leases_across_daemons(format!("cluster = [{}]\n", nodes.join(", ")), "cluster").await;
}

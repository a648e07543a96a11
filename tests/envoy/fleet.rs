//! Six Envoys, each with its own sluice, all on one Redis: concurrent clients of every Envoy
//! together get exactly the limit, never more (the counters are Redis's, not a pod's), with
//! every check on Redis and with quota leases (`lease: true`: pods admit from blocks of units
//! taken from the counter first).

use std::time::Duration;

use serde_json::json;

use crate::grpc_client::{grpc_settings, spawn_grpc_in, GrpcApp};
use crate::helpers::metric_value;
use crate::proxy::{self, count, Envoy};
use crate::rls::{rls_example, Via};
use crate::stores::{Backend, Store};
use crate::wait::within_one_window;

const POLICIES: &str = "
policies:
  - {name: shared, match: {generic_key: shared}, key: [generic_key], algorithm: sliding_log, limit: 50, period: 1h, failure_mode: closed}
";
/// The leased policy: a fixed window far from its end, its units taken in leases.
const LEASED: &str = "
policies:
  - {name: shared, match: {generic_key: shared}, key: [generic_key], algorithm: fixed_window, limit: 300, period: 1h, lease: true, failure_mode: closed}
";
const PODS: usize = 6;
const PER_CLIENT: usize = 20;

async fn sluice_on(store: &Store, prefix: &str, policies: &str, leased: bool) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    store.configure(&mut settings, prefix);
    if leased {
        // Small leases, given back soon after the clients stop.
        settings.leases.min_units = 4;
        settings.leases.idle = sluice::config::HumanDuration(500_000);
    }
    let daemon = spawn_grpc_in(dir, settings, policies).await;
    daemon.app.wait_for_store().await;
    daemon
}

/// Six sluices on `store` (keys under `prefix`), each behind its own Envoy (the socket and TCP
/// in turn), every request in the `shared` partition.
async fn pods(store: &Store, prefix: &str, policies: &str, leased: bool) -> Vec<(GrpcApp, Envoy)> {
    let mut pods = Vec::new();
    for i in 0..PODS {
        let daemon = sluice_on(store, prefix, policies, leased).await;
        let via = if i % 2 == 0 { Via::Socket } else { Via::Tcp };
        let mut config = rls_example(&daemon, via);
        let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
        host["rate_limits"] =
            json!([{ "actions": [{ "generic_key": { "descriptor_value": "shared" } }] }]);
        let envoy = Envoy::start(config).await.expect("envoy");
        pods.push((daemon, envoy));
    }
    pods
}

/// Statuses of `per_client` requests from each of two concurrent clients per Envoy.
async fn load(pods: &[(GrpcApp, Envoy)], per_client: usize) -> Vec<u16> {
    let mut clients = Vec::new();
    for (_, envoy) in pods {
        for _ in 0..2 {
            let port = envoy.port;
            clients.push(tokio::spawn(async move {
                let mut codes = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let answer = proxy::request(port, "GET", "/api", &[]).await;
                    codes.push(answer.map_or(0, |a| a.status));
                }
                codes
            }));
        }
    }
    let mut codes = Vec::new();
    for client in clients {
        codes.extend(client.await.expect("client"));
    }
    assert_eq!(codes.len(), pods.len() * 2 * per_client);
    codes
}

#[tokio::test]
async fn six_envoys_on_one_redis_admit_exactly_the_limit() {
    if proxy::binary().is_none() {
        return;
    }
    let store = Store::shared(Backend::Redis);
    let pods = pods(&store, "fleet", POLICIES, false).await;
    let codes = load(&pods, PER_CLIENT).await;
    assert_eq!(count(&codes, 200), 50, "{codes:?}");
    assert_eq!(count(&codes, 429), codes.len() - 50, "{codes:?}");
    for (_, envoy) in &pods {
        assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    }
}

/// With quota leases, the same fleet admits at most the limit while the clients run; once the
/// pods have given back what they held (idle), the rest of the limit is admitted through one
/// Envoy, and not one request more: every unit was admitted once or given back.
#[tokio::test]
async fn six_envoys_with_leases_on_one_redis_admit_exactly_the_limit() {
    with_leases(Backend::Redis, "fleet_leased").await;
}

#[tokio::test]
async fn six_envoys_with_leases_on_a_redis_cluster_admit_exactly_the_limit() {
    with_leases(Backend::Cluster, "fleet_leased_cluster").await;
}

async fn with_leases(backend: Backend, prefix: &str) {
    const LIMIT: usize = 300;
    if proxy::binary().is_none() {
        return;
    }
    // Redis counts in real time: the run stays inside one hour's window.
    within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    // Held to the end: the last holder of a shared store stops it.
    let store = Store::shared(backend);
    let pods = pods(&store, prefix, LEASED, true).await;
    let codes = load(&pods, 40).await;
    let admitted = count(&codes, 200);
    assert!(admitted <= LIMIT, "admitted {admitted} > {LIMIT}");
    assert_eq!(admitted + count(&codes, 429), codes.len(), "{codes:?}");
    let mut leased = 0.0;
    for (daemon, envoy) in &pods {
        let metrics = daemon.app.metrics().await;
        leased += metric_value(
            &metrics,
            "sluice_lease_checks_total",
            &[("policy", "shared")],
        );
        assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
    }
    assert!(leased > 0.0, "no check was admitted from a lease");
    // Past leases.idle (0.5 s) every pod has given its lease back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let envoy = &pods[0].1;
    let mut after = Vec::new();
    for _ in 0..LIMIT {
        let answer = proxy::request(envoy.port, "GET", "/api", &[]).await;
        after.push(answer.map_or(0, |a| a.status));
        if after.ends_with(&[429, 429, 429]) {
            break;
        }
    }
    eprintln!(
        "admitted {admitted} of {} under load ({leased} from leases), {} after",
        codes.len(),
        count(&after, 200)
    );
    assert_eq!(admitted + count(&after, 200), LIMIT, "{after:?}");
}

//! Redis down behind Envoy: each policy's failure mode decides what the client gets, whatever
//! Envoy's own `failure_mode_deny` (which applies only when sluice itself cannot answer): `open`
//! lets requests through, `closed` is a 429 with `Retry-After: 1`, `local` enforces this pod's
//! share of the limit.

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::grpc_client::{grpc_settings, spawn_grpc_in, GrpcApp};
use crate::proxy::{self, count, statuses, Envoy};
use crate::redis_server::free_port;
use crate::rls::{rls_example, Via};

const POLICIES: &str = "
policies:
  - {name: open, match: {generic_key: open}, key: [generic_key], algorithm: token_bucket, limit: 2, period: 1h, failure_mode: open}
  - {name: closed, match: {generic_key: closed}, key: [generic_key], algorithm: sliding_log, limit: 2, period: 1h, failure_mode: closed}
  - {name: local, match: {generic_key: local}, key: [generic_key], algorithm: fixed_window, limit: 8, period: 1h, failure_mode: local}
";

/// A daemon whose Redis never answers (nothing listens on its port), two replicas sharing it.
async fn daemon_without_redis() -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(format!("redis://127.0.0.1:{}", free_port()));
    settings.redis.timeout = HumanDuration(1_000_000);
    settings.redis.connect_timeout = HumanDuration(300_000);
    settings.local.replicas = 2;
    settings.local.margin_percent = 0;
    spawn_grpc_in(dir, settings, POLICIES).await
}

fn bootstrap(daemon: &GrpcApp, via: Via, failure_mode_deny: bool) -> Value {
    let mut config = rls_example(daemon, via);
    let routes: Vec<Value> = ["open", "closed", "local"]
        .iter()
        .map(|mode| {
            json!({ "match": { "prefix": format!("/{mode}") }, "route": { "cluster": "app",
                "rate_limits": [{ "actions": [{ "generic_key": { "descriptor_value": mode } }] }] } })
        })
        .collect();
    let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
    host["routes"] = json!(routes);
    host.as_object_mut().expect("host").remove("rate_limits");
    proxy::filter(&mut config, "envoy.filters.http.ratelimit")["failure_mode_deny"] =
        json!(failure_mode_deny);
    config
}

async fn failure_modes(via: Via, failure_mode_deny: bool) {
    let daemon = daemon_without_redis().await;
    let Some(envoy) = Envoy::start(bootstrap(&daemon, via, failure_mode_deny)).await else {
        return;
    };
    let open = statuses(&envoy, 5, "/open", &[]).await;
    assert_eq!(count(&open, 200), 5, "open: {open:?}\n{}", envoy.log());
    for _ in 0..3 {
        let closed = envoy.send("GET", "/closed", &[]).await;
        assert_eq!(closed.status, 429, "closed: {closed:?}");
        assert_eq!(closed.header("retry-after"), Some("1"));
    }
    // This pod's share of 8 across 2 replicas.
    let local = statuses(&envoy, 6, "/local", &[]).await;
    assert_eq!(local, [200, 200, 200, 200, 429, 429], "local");
    // Every answer was sluice's, never an error Envoy had to resolve.
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}

#[tokio::test]
async fn failure_modes_over_tcp_with_envoy_failing_open() {
    failure_modes(Via::Tcp, false).await;
}

#[tokio::test]
async fn failure_modes_over_the_socket_with_envoy_failing_closed() {
    failure_modes(Via::Socket, true).await;
}

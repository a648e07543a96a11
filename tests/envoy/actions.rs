//! Envoy's rate limit actions, each producing the descriptor a sluice policy selects:
//! `remote_address`, `generic_key`, `header_value_match` (exact), `request_headers`, and a cost
//! through `hits_addend` in the per-route `RateLimitPerRoute`; `rate_limited_as_resource_exhausted`.

use serde_json::{json, Value};

use crate::grpc_client::{spawn_grpc, GrpcApp};
use crate::proxy::{self, count, statuses, Envoy};
use crate::rls::{rls_example, Via};

const POLICIES: &str = "
policies:
  - {name: per-peer, match: {remote_address: '*', route: peer}, key: [remote_address], algorithm: fixed_window, limit: 3, period: 1h}
  - {name: generic, match: {generic_key: slow}, key: [generic_key], algorithm: fixed_window, limit: 2, period: 1h}
  - {name: admins, match: {header_match: admin}, key: [header_match], algorithm: fixed_window, limit: 4, period: 1h}
  - {name: per-user, match: {user: '*'}, key: [user], algorithm: sliding_log, limit: 10, period: 1h}
";

fn route(prefix: &str, rate_limits: Value) -> Value {
    json!({ "match": { "prefix": prefix }, "route": { "cluster": "app", "rate_limits": rate_limits } })
}

/// The example's bootstrap (TCP), its routes replaced by one route per action.
fn bootstrap(daemon: &GrpcApp) -> Value {
    let mut config = rls_example(daemon, Via::Tcp);
    let routes = json!([
        route("/peer", json!([{ "actions": [
            { "generic_key": { "descriptor_key": "route", "descriptor_value": "peer" } },
            { "remote_address": {} }
        ] }])),
        route("/generic", json!([{ "actions": [{ "generic_key": { "descriptor_value": "slow" } }] }])),
        route("/match", json!([{ "actions": [{ "header_value_match": {
            "descriptor_value": "admin",
            "headers": [{ "name": "x-role", "string_match": { "exact": "admin" } }]
        } }] }])),
        {
            "match": { "prefix": "/spend" },
            "route": { "cluster": "app" },
            "typed_per_filter_config": { "envoy.filters.http.ratelimit": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
                "rate_limits": [{
                    "actions": [{ "request_headers": { "header_name": "x-user", "descriptor_key": "user" } }],
                    "hits_addend": { "number": 4 }
                }]
            } }
        },
        { "match": { "prefix": "/" }, "route": { "cluster": "app" } }
    ]);
    let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
    host["routes"] = routes;
    host.as_object_mut().expect("host").remove("rate_limits");
    config
}

#[tokio::test]
async fn each_action_selects_its_policy() {
    let daemon = spawn_grpc(POLICIES).await;
    let Some(envoy) = Envoy::start(bootstrap(&daemon)).await else {
        return;
    };
    let peer = statuses(&envoy, 4, "/peer", &[]).await;
    assert_eq!(
        peer,
        [200, 200, 200, 429],
        "remote_address: {}",
        envoy.log()
    );
    let generic = statuses(&envoy, 3, "/generic", &[]).await;
    assert_eq!(generic, [200, 200, 429], "generic_key");
    // Only the exact header value matches; the others carry no descriptor (unlimited).
    let others = statuses(&envoy, 6, "/match", &[("x-role", "Admin")]).await;
    assert_eq!(count(&others, 200), 6, "header_value_match is exact");
    let admins = statuses(&envoy, 5, "/match", &[("x-role", "admin")]).await;
    assert_eq!(admins, [200, 200, 200, 200, 429], "header_value_match");
    // Cost 4 out of 10 per user: two requests, the third would take it to 12.
    let spend = statuses(&envoy, 3, "/spend", &[("x-user", "u1")]).await;
    assert_eq!(
        spend,
        [200, 200, 429],
        "hits_addend through RateLimitPerRoute"
    );
    let other = statuses(&envoy, 2, "/spend", &[("x-user", "u2")]).await;
    assert_eq!(other, [200, 200], "another user's own budget");
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}

#[tokio::test]
async fn resource_exhausted_and_failure_mode_deny_settings() {
    let daemon = spawn_grpc(POLICIES).await;
    let mut config = bootstrap(&daemon);
    let filter = proxy::filter(&mut config, "envoy.filters.http.ratelimit");
    filter["rate_limited_as_resource_exhausted"] = json!(true);
    filter["failure_mode_deny"] = json!(true);
    let Some(envoy) = Envoy::start(config).await else {
        return;
    };
    let generic = statuses(&envoy, 2, "/generic", &[]).await;
    assert_eq!(generic, [200, 200]);
    // A gRPC client's answer: RESOURCE_EXHAUSTED becomes HTTP 429 all the same for HTTP/1.1.
    let denied = envoy.send("GET", "/generic", &[]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 1);
}

//! What a client of Envoy gets back from the shipped `examples/envoy/rls.yaml`: a denial with
//! the body sluice's own API answers (`{"error":"rate_limit","retry_after_sec":N}`, N an integer
//! equal to `Retry-After`, through the example's `local_reply_config`), other answers untouched,
//! and the cost route (`RateLimitPerRoute` with `hits_addend: 10`) charging 10 units of
//! `public_api` per request.

use serde_json::Value;

use crate::grpc_client::spawn_grpc;
use crate::helpers::SHIPPED_POLICIES;
use crate::proxy::{self, count, statuses, Envoy};
use crate::rls::{rls_example, Via};

#[tokio::test]
async fn a_denial_through_envoy_carries_sluices_json_body_with_an_integer_retry() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let Some(envoy) = Envoy::start(rls_example(&daemon, Via::Socket)).await else {
        return;
    };
    let allowed = statuses(&envoy, 10, "/login", &[]).await;
    assert_eq!(count(&allowed, 200), 10, "{allowed:?}\n{}", envoy.log());
    let denied = envoy.send("POST", "/login", &[]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_str(&denied.body)
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", denied.body, envoy.log()));
    let retry = denied.header("retry-after").expect("Retry-After");
    assert_eq!(body["error"], "rate_limit", "{body}");
    assert!(body["retry_after_sec"].is_u64(), "an integer: {body}");
    assert_eq!(body["retry_after_sec"].to_string(), retry, "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{body}");
    // Answers other than sluice's 429 keep their bodies.
    let page = envoy.send("GET", "/", &[]).await;
    assert_eq!((page.status, page.body.as_str()), (200, proxy::APP_BODY));
}

#[tokio::test]
async fn the_cost_route_charges_its_hits_addend() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let Some(envoy) = Envoy::start(rls_example(&daemon, Via::Socket)).await else {
        return;
    };
    // public_api: a burst of 150 per key; /v1/reports costs 10, so 15 pass and the 16th is denied.
    let key = [("x-api-key", "k-reports")];
    let reports = statuses(&envoy, 16, "/v1/reports", &key).await;
    assert_eq!(
        count(&reports[..15], 200),
        15,
        "{reports:?}\n{}",
        envoy.log()
    );
    assert_eq!(reports[15], 429, "{reports:?}");
    // The same counter: an ordinary route of that key is denied too (it needs one unit).
    assert_eq!(envoy.send("GET", "/v1/things", &key).await.status, 429);
    // Another key's ordinary route charges 1: 150 pass.
    let other = statuses(&envoy, 151, "/v1/things", &[("x-api-key", "k-things")]).await;
    assert_eq!(count(&other, 200), 150, "{other:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}

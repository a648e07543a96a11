//! The figures of a request of several descriptors, as envoyproxy/ratelimit reports them: a
//! passing descriptor of a denied request reports what is really left (sluice spent nothing
//! from it), on the embedded store and on Redis, also once the local layer remembers the denial;
//! a descriptor's `hits_addend: 0` reports what is left without spending, next to spending ones.

use sluice::config::HumanDuration;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::grpc_client::{
    ask, descriptor, grpc_settings, request, spawn_grpc, spawn_grpc_in, GrpcApp, OK, OVER_LIMIT,
};
use crate::redis_server::RedisServer;

/// Five an hour per user, one an hour per IP (an envoyproxy/ratelimit file).
const TWO: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: warmup
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

/// `(code, current_limit.requests_per_unit, limit_remaining)` of each status.
async fn figures(
    client: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str, Option<u64>)],
) -> (i32, Vec<(i32, Option<u32>, u32)>) {
    let descriptors = entries
        .iter()
        .map(|(key, value, hits)| {
            let mut d = descriptor(&[(key, value)]);
            d.hits_addend = *hits;
            d
        })
        .collect();
    let answer = ask(client, request("d", descriptors)).await;
    let statuses = answer
        .statuses
        .iter()
        .map(|s| {
            let limit = s.current_limit.as_ref().map(|l| l.requests_per_unit);
            (s.code, limit, s.limit_remaining)
        })
        .collect();
    (answer.overall_code, statuses)
}

async fn scenario(daemon: &GrpcApp) {
    let mut c = daemon.tcp().await;
    let both = [("user", "u", None), ("ip", "i", None)];
    assert_eq!(
        figures(&mut c, &both).await,
        (OK, vec![(OK, Some(5), 4), (OK, Some(1), 0)])
    );
    // Denied by the IP: nothing spent from the user, who still has 4 (three times: on Redis the
    // second and third are answered by the local layer).
    for round in 0..3 {
        assert_eq!(
            figures(&mut c, &both).await,
            (OVER_LIMIT, vec![(OK, Some(5), 4), (OVER_LIMIT, Some(1), 0)]),
            "round {round}"
        );
    }
    // `hits_addend: 0` reports what is left and spends nothing, also next to a spending one.
    let peek = [("user", "u", Some(0)), ("ip", "j", None)];
    assert_eq!(
        figures(&mut c, &peek).await,
        (OK, vec![(OK, Some(5), 4), (OK, Some(1), 0)])
    );
    let mut four = descriptor(&[("user", "u")]);
    four.hits_addend = Some(4);
    assert_eq!(ask(&mut c, request("d", vec![four])).await.overall_code, OK);
    // Nothing left: a peek is still OK (upstream: over the limit only past it), remaining 0.
    assert_eq!(
        figures(&mut c, &[("user", "u", Some(0))]).await,
        (OK, vec![(OK, Some(5), 0)])
    );
}

#[tokio::test]
async fn figures_of_several_descriptors_on_the_embedded_store() {
    let daemon = spawn_grpc(TWO).await;
    scenario(&daemon).await;
}

#[tokio::test]
async fn figures_of_several_descriptors_on_redis_with_the_local_layer() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = "envoy-figures".into();
    settings.redis.timeout = HumanDuration(1_000_000);
    assert!(settings.local_layer.enabled, "the local layer is on");
    let daemon = spawn_grpc_in(dir, settings, TWO).await;
    daemon.app.wait_for_store().await;
    scenario(&daemon).await;
}

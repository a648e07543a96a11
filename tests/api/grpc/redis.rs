//! The gRPC rate limit service on the Redis store: the all-or-nothing scenario of `grpc.rs` on
//! other algorithms (a token bucket and a sliding log), and failure modes
//! while Redis cannot answer: `open` is OK, `closed` is OVER_LIMIT with `Retry-After: 1`, `local`
//! enforces this pod's share.

use sluice::config::HumanDuration;

use crate::grpc_client::{
    ask, descriptor, grpc_settings, request, response_header, spawn_grpc_in, GrpcApp, OK,
    OVER_LIMIT,
};
use crate::redis_server::RedisServer;

const POLICIES: &str = "
policies:
  - {name: per-user, match: {user: '*'}, key: [user], algorithm: token_bucket, limit: 5, period: 1h, failure_mode: open}
  - {name: per-ip, match: {ip: '*'}, key: [ip], algorithm: sliding_log, limit: 1, period: 1h, failure_mode: closed}
  - {name: shared, match: {team: '*'}, key: [team], algorithm: fixed_window, limit: 8, period: 1h, failure_mode: local}
";

async fn spawn(url: String, prefix: &str) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(url);
    settings.redis.key_prefix = prefix.into();
    settings.redis.timeout = HumanDuration(1_000_000);
    settings.redis.connect_timeout = HumanDuration(300_000);
    settings.local.replicas = 2;
    settings.local.margin_percent = 0;
    spawn_grpc_in(dir, settings, POLICIES).await
}

/// The all-or-nothing scenario of `grpc.rs`, with a token bucket and a sliding log.
#[tokio::test]
async fn descriptors_are_all_or_nothing_on_redis() {
    let redis = RedisServer::start();
    let daemon = spawn(redis.url(), "grpc-aon").await;
    daemon.app.wait_for_store().await;
    crate::grpc::check::descriptors_are_all_or_nothing::run(&daemon).await;
}

#[tokio::test]
async fn failure_modes_while_redis_is_down() {
    let port = RedisServer::free_port();
    let daemon = spawn(format!("redis://127.0.0.1:{port}"), "grpc-down").await;
    let mut client = daemon.tcp().await;

    let open = ask(
        &mut client,
        request("d", vec![descriptor(&[("user", "u")])]),
    )
    .await;
    assert_eq!((open.overall_code, open.statuses[0].code), (OK, OK));

    let closed = ask(&mut client, request("d", vec![descriptor(&[("ip", "i")])])).await;
    assert_eq!(
        (closed.overall_code, closed.statuses[0].code),
        (OVER_LIMIT, OVER_LIMIT)
    );
    assert_eq!(response_header(&closed, "retry-after"), Some("1"));

    // `local`: this pod's share of 8 across 2 replicas.
    let team = || request("d", vec![descriptor(&[("team", "t")])]);
    for i in 0..4 {
        assert_eq!(ask(&mut client, team()).await.overall_code, OK, "check {i}");
    }
    assert_eq!(ask(&mut client, team()).await.overall_code, OVER_LIMIT);

    // A fail-open descriptor next to a fail-closed one: the request is refused, whole.
    let mixed = request(
        "d",
        vec![descriptor(&[("user", "u")]), descriptor(&[("ip", "j")])],
    );
    let answer = ask(&mut client, mixed).await;
    let codes: Vec<i32> = answer.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        (answer.overall_code, codes),
        (OVER_LIMIT, vec![OK, OVER_LIMIT])
    );
}

//! Envoy's rate limit service through a real gRPC client against a spawned daemon: the seed's two
//! routes, the same answers as `/v1/check`, all-or-nothing across descriptors, hits_addend,
//! limit overrides, shadow mode, health, metrics and bad requests. All-or-nothing and
//! `hits_addend` run on every store (the others advance the manual clock, use windows of a second
//! or a minute that real time could cross on Redis, or do not touch the store); failure modes
//! are in `grpc_redis.rs`, converted envoyproxy/ratelimit files in `grpc_envoy_config.rs`.

use serde_json::json;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::grpc_client::{
    ask, descriptor, request, response_header, spawn_grpc, spawn_grpc_on, tcp_channel,
    with_override, GrpcApp, OK, OVER_LIMIT,
};
use crate::helpers::{json_of, metric_value, SHIPPED_POLICIES};
use crate::stores::{on_stores, Backend, OnStore};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;

const MINUTE: i32 = 2;
const SECOND: i32 = 1;
const HOUR: i32 = 3;

/// The seed's public API route over both gRPC listeners: a burst of 150, then OVER_LIMIT with
/// the policy's figures; the same counter as `/v1/check` (each answer one lower).
#[tokio::test]
async fn public_api_route_matches_the_http_check_api() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut tcp = daemon.tcp().await;
    let mut uds = daemon.uds().await;
    let entries = [("tenant", "acme"), ("api_key", "k1")];
    let http_body = json!({"descriptors": {"tenant": "acme", "api_key": "k1"}});
    let mut expected = 149;
    for round in 0..25 {
        let client = if round % 2 == 0 { &mut tcp } else { &mut uds };
        let answer = ask(client, request("edge", vec![descriptor(&entries)])).await;
        assert_eq!(answer.overall_code, OK);
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, expected, "round {round}");
        let limit = status.current_limit.as_ref().expect("a limit applied");
        assert_eq!(limit.name, "public_api");
        // 150 per 9 s refill-from-empty window: 1000 per minute.
        assert_eq!((limit.requests_per_unit, limit.unit), (1000, MINUTE));
        let http = daemon.app.check_tcp(&http_body).await;
        assert_eq!(json_of(&http)["remaining"], expected - 1, "round {round}");
        expected -= 2;
    }
    let mut denied = None;
    for _ in 0..200 {
        let answer = ask(&mut tcp, request("edge", vec![descriptor(&entries)])).await;
        if answer.overall_code == OVER_LIMIT {
            denied = Some(answer);
            break;
        }
    }
    let denied = denied.expect("the burst runs out");
    assert_eq!(denied.statuses[0].code, OVER_LIMIT);
    assert_eq!(denied.statuses[0].limit_remaining, 0);
    assert!(response_header(&denied, "retry-after").is_some());
    assert_eq!(response_header(&denied, "x-ratelimit-limit"), Some("150"));
    assert!(response_header(&denied, "ratelimit-policy")
        .is_some_and(|v| v.starts_with("\"public_api\";q=150")));
}

/// The login route: 10 per 5 minutes per IP (reported as 120 per hour), then OVER_LIMIT.
#[tokio::test]
async fn login_route_denies_the_eleventh_attempt() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut client = daemon.tcp().await;
    let login = || {
        request(
            "edge",
            vec![descriptor(&[("path", "/login"), ("ip", "203.0.113.7")])],
        )
    };
    for attempt in 0..10 {
        let answer = ask(&mut client, login()).await;
        assert_eq!(answer.overall_code, OK, "attempt {attempt}");
        let limit = answer.statuses[0].current_limit.as_ref().expect("limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("login", 120, HOUR)
        );
    }
    let answer = ask(&mut client, login()).await;
    assert_eq!(answer.overall_code, OVER_LIMIT);
    let wait = answer.statuses[0].duration_until_reset.expect("reset");
    assert!(wait.seconds > 0 && wait.seconds <= 300, "{wait:?}");
}

const TWO: &str = "
policies:
  - {name: per-user, match: {user: '*'}, key: [user], algorithm: fixed_window, limit: 5, period: 1h}
  - {name: per-ip, match: {ip: '*'}, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: fixed, domain: other, match: {route: '*'}, key: [route], algorithm: fixed_window, limit: 2, period: 1s, limit_override: false}
  - {name: soft, match: {soft: '*'}, key: [soft], algorithm: fixed_window, limit: 1, period: 1h, shadow: true}
";

/// `TWO` on `backend`, for the scenarios every store runs.
async fn spawn(backend: Backend, prefix: &str) -> OnStore<GrpcApp> {
    spawn_grpc_on(backend, TWO, prefix).await
}

on_stores! {
/// A request denied by one descriptor spends nothing from the others (envoyproxy/ratelimit
/// would spend them: its #1060); each descriptor gets its own status, in order; the HTTP check
/// API spends from the same counter.
async fn descriptors_are_all_or_nothing(daemon: &GrpcApp)
    via spawn, on [memory, redis, cluster]
{
    let mut client = daemon.tcp().await;
    let both = || {
        request(
            "d",
            vec![descriptor(&[("user", "u")]), descriptor(&[("ip", "i")])],
        )
    };
    let first = ask(&mut client, both()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        (
            first.statuses[0].limit_remaining,
            first.statuses[1].limit_remaining
        ),
        (4, 0)
    );
    for _ in 0..3 {
        let denied = ask(&mut client, both()).await;
        assert_eq!(denied.overall_code, OVER_LIMIT);
        let codes: Vec<i32> = denied.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [OK, OVER_LIMIT]);
    }
    let alone = ask(
        &mut client,
        request("d", vec![descriptor(&[("user", "u")])]),
    )
    .await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 3,
        "denied requests spent nothing"
    );
    // A descriptor no policy selects is OK without a limit.
    let none = ask(
        &mut client,
        request("d", vec![descriptor(&[("color", "red")])]),
    )
    .await;
    assert_eq!(none.overall_code, OK);
    assert!(none.statuses[0].current_limit.is_none());
    // The HTTP check API spends from the same counter.
    let http = daemon
        .app
        .check_tcp(&json!({"descriptors": {"user": "u"}}))
        .await;
    assert_eq!(json_of(&http)["remaining"], 2);
}
}

on_stores! {
/// `hits_addend` spends that many units; a descriptor's own `hits_addend` of 0 checks without
/// spending.
async fn hits_addend_spends_and_zero_only_checks(daemon: &GrpcApp)
    via spawn, on [memory, redis, cluster]
{
    let mut client = daemon.tcp().await;
    let mut three = request("d", vec![descriptor(&[("user", "h")])]);
    three.hits_addend = 3;
    assert_eq!(
        ask(&mut client, three.clone()).await.statuses[0].limit_remaining,
        2
    );
    let mut peek = descriptor(&[("user", "h")]);
    peek.hits_addend = Some(0);
    for _ in 0..3 {
        let answer = ask(&mut client, request("d", vec![peek.clone()])).await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(
            answer.statuses[0].limit_remaining, 2,
            "what is left, nothing spent"
        );
    }
    assert_eq!(ask(&mut client, three).await.overall_code, OVER_LIMIT);
    // A peek rides along with spending descriptors, as upstream's does, and never denies.
    let mixed = request("d", vec![peek.clone(), descriptor(&[("ip", "p")])]);
    let answer = ask(&mut client, mixed).await;
    assert_eq!(answer.overall_code, OK);
    let codes: Vec<(i32, u32)> = answer
        .statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect();
    assert_eq!(codes, [(OK, 2), (OK, 0)]);
    let mut too_much = descriptor(&[("user", "h2")]);
    too_much.hits_addend = Some(6);
    let refused = client
        .should_rate_limit(request("d", vec![too_much]))
        .await
        .expect_err("a cost above the limit is refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
}
}

/// A descriptor's `limit` replaces the policy's quota (in its own counter); a policy can forbid
/// it, and a malformed one is refused.
#[tokio::test]
async fn limit_override_applies_where_allowed() {
    let daemon = spawn_grpc(TWO).await;
    let mut client = daemon.tcp().await;
    let raised = || {
        request(
            "d",
            vec![with_override(descriptor(&[("ip", "o")]), 3, MINUTE)],
        )
    };
    for _ in 0..3 {
        let answer = ask(&mut client, raised()).await;
        assert_eq!(answer.overall_code, OK);
        let limit = answer.statuses[0].current_limit.as_ref().expect("limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, MINUTE));
    }
    assert_eq!(ask(&mut client, raised()).await.overall_code, OVER_LIMIT);
    // The policy's own counter was not touched.
    let own = ask(&mut client, request("d", vec![descriptor(&[("ip", "o")])])).await;
    assert_eq!((own.overall_code, own.statuses[0].limit_remaining), (OK, 0));

    let forbidden = request(
        "other",
        vec![with_override(descriptor(&[("route", "r")]), 100, SECOND)],
    );
    let refused = client
        .should_rate_limit(forbidden)
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("does not accept a limit override"),
        "{}",
        refused.message()
    );
    for (per_unit, unit) in [(0, SECOND), (5, 0), (5, 99)] {
        let bad = request(
            "d",
            vec![with_override(descriptor(&[("ip", "x")]), per_unit, unit)],
        );
        let refused = client.should_rate_limit(bad).await.expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{per_unit}/{unit}");
    }
}

/// A policy's `domain` limits only requests of that domain; a shadow policy never blocks.
#[tokio::test]
async fn domains_select_policies_and_shadow_never_blocks() {
    let daemon = spawn_grpc(TWO).await;
    let mut client = daemon.tcp().await;
    let route = |domain: &str| request(domain, vec![descriptor(&[("route", "r")])]);
    for _ in 0..2 {
        assert_eq!(ask(&mut client, route("other")).await.overall_code, OK);
    }
    assert_eq!(
        ask(&mut client, route("other")).await.overall_code,
        OVER_LIMIT
    );
    let elsewhere = ask(&mut client, route("edge")).await;
    assert_eq!(elsewhere.overall_code, OK);
    assert!(elsewhere.statuses[0].current_limit.is_none());
    for _ in 0..5 {
        let soft = ask(
            &mut client,
            request("d", vec![descriptor(&[("soft", "s")])]),
        )
        .await;
        assert_eq!(soft.overall_code, OK);
        assert_eq!(soft.statuses[0].code, OK);
    }
}

/// Malformed requests are INVALID_ARGUMENT with a reason, never a panic or an internal error.
#[tokio::test]
async fn bad_requests_are_invalid_arguments() {
    let daemon = spawn_grpc(TWO).await;
    let mut client = daemon.tcp().await;
    let long = "v".repeat(257);
    let cases = [
        (
            request("", vec![descriptor(&[("user", "u")])]),
            "domain is required",
        ),
        (request("d", vec![]), "at least one descriptor"),
        (request("d", vec![descriptor(&[])]), "at least one entry"),
        (
            request("d", vec![descriptor(&[("user", "a"); 33])]),
            "at most 32 entries",
        ),
        (
            request("d", vec![descriptor(&[("rls.domain", "x")])]),
            "reserved",
        ),
        (
            request("d", vec![descriptor(&[("user", &long)])]),
            "must be 1 to 256 bytes",
        ),
        (
            request("d", vec![descriptor(&[("bad key", "v")])]),
            "descriptor name",
        ),
        (
            request("d", vec![descriptor(&[("user", "u")]); 101]),
            "at most 100 descriptors",
        ),
    ];
    for (bad, reason) in cases {
        let status = client.should_rate_limit(bad).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{reason}");
        assert!(
            status.message().contains(reason),
            "{reason}: {}",
            status.message()
        );
    }
    // The daemon still answers, and the refusals were counted.
    assert_eq!(
        ask(
            &mut client,
            request("d", vec![descriptor(&[("user", "u")])])
        )
        .await
        .overall_code,
        OK
    );
    let metrics = daemon.app.metrics().await;
    let invalid = metric_value(
        &metrics,
        "sluice_http_responses_total",
        &[("transport", "grpc"), ("code", "invalid_argument")],
    );
    assert_eq!(invalid, 8.0);
}

/// The standard health service answers SERVING for the server and the rate limit service, and
/// the latency histogram has a `grpc` transport.
#[tokio::test]
async fn health_and_metrics() {
    let daemon: GrpcApp = spawn_grpc(SHIPPED_POLICIES).await;
    let mut health = HealthClient::new(tcp_channel(daemon.addr).await);
    for service in ["", sluice::transport::grpc::SERVICE_NAME] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers")
            .into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let mut client = daemon.uds().await;
    ask(
        &mut client,
        request("edge", vec![descriptor(&[("ip", "1")])]),
    )
    .await;
    let metrics = daemon.app.metrics().await;
    let count = metric_value(
        &metrics,
        "sluice_check_duration_seconds_count",
        &[("transport", "grpc")],
    );
    assert_eq!(count, 1.0);
    let ok = metric_value(
        &metrics,
        "sluice_http_responses_total",
        &[("transport", "grpc"), ("code", "ok")],
    );
    assert_eq!(ok, 1.0);
}

/// On shutdown the gRPC listeners drain: an open client connection does not hold the daemon
/// past its grace period, the socket file is removed and new connections are refused.
#[tokio::test]
async fn shutdown_drains_the_grpc_listeners() {
    let mut daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut client = daemon.uds().await;
    ask(
        &mut client,
        request("edge", vec![descriptor(&[("ip", "1")])]),
    )
    .await;
    let started = std::time::Instant::now();
    daemon.app.stop().await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(!daemon.socket.exists(), "socket file removed");
    assert!(tokio::net::TcpStream::connect(daemon.addr).await.is_err());
    assert!(client
        .should_rate_limit(request("edge", vec![descriptor(&[("ip", "1")])]))
        .await
        .is_err());
}

/// A policy of several windows: each descriptor's status carries the window that decided
/// (named as in `RateLimit-Policy`); a limit override replaces every window with one.
#[tokio::test]
async fn several_windows_answer_with_the_deciding_window() {
    let policies = "
policies:
  - {name: windows, match: {user: '*'}, key: [user], algorithm: fixed_window, limits: [{limit: 2, period: 1s}, {limit: 3, period: 1h}]}
";
    let daemon = spawn_grpc(policies).await;
    let mut client = daemon.tcp().await;
    let user = || request("d", vec![descriptor(&[("user", "u")])]);
    let figures = |answer: &RateLimitResponse| {
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("limit");
        (
            answer.overall_code,
            limit.name.clone(),
            limit.requests_per_unit,
            limit.unit,
            status.limit_remaining,
        )
    };
    let second = |code, remaining| (code, "windows/1s".to_owned(), 2, SECOND, remaining);
    let hour = |code, remaining| (code, "windows/1h".to_owned(), 3, HOUR, remaining);
    assert_eq!(figures(&ask(&mut client, user()).await), second(OK, 1));
    assert_eq!(figures(&ask(&mut client, user()).await), second(OK, 0));
    assert_eq!(
        figures(&ask(&mut client, user()).await),
        second(OVER_LIMIT, 0)
    );
    daemon.app.advance(1_000_000);
    assert_eq!(figures(&ask(&mut client, user()).await), hour(OK, 0));
    let denied = ask(&mut client, user()).await;
    assert_eq!(figures(&denied), hour(OVER_LIMIT, 0));
    let wait = denied.statuses[0].duration_until_reset.expect("reset");
    assert!(wait.seconds > 1_000, "{wait:?}");
    assert_eq!(
        response_header(&denied, "ratelimit-policy"),
        Some("\"windows/1s\";q=2;w=1, \"windows/1h\";q=3;w=3600")
    );

    let overridden = request(
        "d",
        vec![with_override(descriptor(&[("user", "u")]), 10, MINUTE)],
    );
    let answer = ask(&mut client, overridden).await;
    assert_eq!(
        figures(&answer),
        (OK, "windows".to_owned(), 10, MINUTE, 9),
        "one window, its own counter"
    );
}

/// A local limit denies a descriptor in the pod: its status says so, the other descriptor of the
/// group is untouched.
#[tokio::test]
async fn a_local_limit_denies_its_descriptor() {
    let policies = "
policies:
  - {name: capped, match: {user: '*'}, key: [user], algorithm: fixed_window, limit: 100, period: 1h, local_limit: {limit: 1, period: 1h}}
  - {name: roomy, match: {ip: '*'}, key: [ip], algorithm: fixed_window, limit: 100, period: 1h}
";
    let daemon = spawn_grpc(policies).await;
    let mut client = daemon.tcp().await;
    let both = || {
        request(
            "d",
            vec![descriptor(&[("user", "u")]), descriptor(&[("ip", "i")])],
        )
    };
    assert_eq!(ask(&mut client, both()).await.overall_code, OK);
    let denied = ask(&mut client, both()).await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    let codes: Vec<i32> = denied.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OVER_LIMIT, OK]);
    let limit = denied.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("capped/local", 1, HOUR)
    );
    let roomy = json_of(
        &daemon
            .app
            .dry_run(&json!({"policy": "roomy", "descriptors": {"ip": "i"}}))
            .await,
    );
    assert_eq!(roomy["remaining"], 98, "one spent, not two");
}

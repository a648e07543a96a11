//! envoyproxy/ratelimit's integration flows (`test/integration/integration_test.go` on its
//! runtime directory `runtime/current/ratelimit/config/*.yaml`, the three files converted
//! together) replayed over gRPC on the embedded store and on Redis (with the local layer): codes,
//! `current_limit` and `limit_remaining` request by request.

use std::path::Path;

use sluice::config::envoy::{convert_sources, DomainMerge};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

use crate::envoy_upstream::{daemon, fixture, statuses_of, Case, Status, Want};
use crate::grpc_client::{ask, descriptor, request, GrpcApp, OK, OVER_LIMIT};
use crate::redis_server::RedisServer;

/// The runtime directory as one policy file.
fn runtime() -> String {
    let names = [
        "runtime_basic.yaml",
        "runtime_another.yaml",
        "runtime_share_threshold.yaml",
    ];
    let texts: Vec<String> = names.iter().map(|n| fixture(n)).collect();
    let sources: Vec<(&Path, &str)> = names
        .iter()
        .zip(&texts)
        .map(|(n, t)| (Path::new(*n), t.as_str()))
        .collect();
    convert_sources(&sources, DomainMerge::Refuse).expect("the runtime directory converts")
}

/// `(overall, [(code, requests_per_unit, unit, remaining)])`, `0` per unit when no limit.
type Figures = (i32, Vec<Status>);

/// Runs upstream's flows; returns how many requests gave upstream's answer.
async fn flows(daemon: &GrpcApp) -> usize {
    let mut c = daemon.tcp().await;
    let mut asked = 0;
    let mut expect = |answer: RateLimitResponse, want: Figures, what: &str| {
        assert_eq!(statuses_of(&answer), want, "{what}");
        asked += 1;
    };
    // An unknown domain: OK, no limit.
    let one = |d: &str, k: &str, v: &str| request(d, vec![descriptor(&[(k, v)])]);
    let answer = ask(&mut c, one("foo", "hello", "world")).await;
    expect(
        answer,
        (OK, vec![(OK, 0, Unit::Unknown, 0)]),
        "unknown domain",
    );
    let answer = ask(&mut c, one("basic", "key1", "foo")).await;
    expect(answer, (OK, vec![(OK, 50, Unit::Second, 49)]), "basic key1");
    // Over a minute limit: 20 pass, then OVER_LIMIT with remaining 0.
    for i in 0..25u32 {
        let answer = ask(&mut c, one("another", "key2", "r1")).await;
        let want = if i < 20 {
            (OK, vec![(OK, 20, Unit::Minute, 19 - i)])
        } else {
            (OVER_LIMIT, vec![(OVER_LIMIT, 20, Unit::Minute, 0)])
        };
        expect(answer, want, &format!("key2 request {i}"));
    }
    // Two keys of one domain: key3 (10 an hour) denies from the 11th; key2 then keeps what is
    // left, as upstream does with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` (sluice spends a
    // request whole or not at all; upstream's default spends key2 anyway).
    for i in 0..15u32 {
        let two = request(
            "another",
            vec![descriptor(&[("key2", "r2")]), descriptor(&[("key3", "r2")])],
        );
        let answer = ask(&mut c, two).await;
        let want = if i < 10 {
            (
                OK,
                vec![(OK, 20, Unit::Minute, 19 - i), (OK, 10, Unit::Hour, 9 - i)],
            )
        } else {
            (
                OVER_LIMIT,
                vec![(OK, 20, Unit::Minute, 10), (OVER_LIMIT, 10, Unit::Hour, 0)],
            )
        };
        expect(answer, want, &format!("key2 + key3 request {i}"));
    }
    // share_threshold: every value of `files/*` shares 10 an hour.
    let d = "share-threshold-test";
    for i in 0..10u32 {
        let answer = ask(&mut c, one(d, "files", "files/a.pdf")).await;
        expect(
            answer,
            (OK, vec![(OK, 10, Unit::Hour, 9 - i)]),
            "files/a.pdf",
        );
    }
    let answer = ask(&mut c, one(d, "files", "files/b.csv")).await;
    expect(
        answer,
        (OVER_LIMIT, vec![(OVER_LIMIT, 10, Unit::Hour, 0)]),
        "files/b.csv shares the threshold",
    );
    // Without it, each value has its own.
    for i in 0..10 {
        let value = format!("files_no_share/{i}");
        let answer = ask(&mut c, one(d, "files_no_share", &value)).await;
        expect(answer, (OK, vec![(OK, 10, Unit::Hour, 9)]), &value);
    }
    asked
}

/// A limited case of the runtime files, for the Redis readiness probe.
fn probe() -> Vec<Case> {
    let entries = vec![("key3".to_owned(), "probe".to_owned())];
    vec![("another".into(), entries, Want::Limit(10, Unit::Hour, 9))]
}

#[tokio::test]
async fn upstream_integration_flows_on_the_embedded_store() {
    let daemon = daemon(&runtime(), None, &probe()).await;
    assert_eq!(flows(&daemon).await, 63);
}

#[tokio::test]
async fn upstream_integration_flows_on_redis_with_the_local_layer() {
    let redis = RedisServer::start();
    // Windows follow Redis's clock: the flow is retried (at most 3 times) if a minute ended.
    for attempt in 0..3 {
        let started = std::time::SystemTime::now();
        let prefix = format!("upstream-flows-{attempt}");
        let daemon = daemon(&runtime(), Some((&redis, &prefix)), &probe()).await;
        let run = tokio::spawn(async move { flows(&daemon).await });
        match run.await {
            Ok(asked) => return assert_eq!(asked, 63),
            Err(e) if crossed_a_minute(started) => eprintln!("a minute ended: {e}"),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    panic!("three attempts each crossed a minute");
}

fn crossed_a_minute(since: std::time::SystemTime) -> bool {
    let minute = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 60)
    };
    minute(since) != minute(std::time::SystemTime::now())
}

//! A stream's buckets against the embedded store: what each report is answered, and what the
//! counter holds after takes, renewals and settlements.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::Session;
use super::Quota;
use crate::check::{CheckRequest, CheckService, LocalShare, Spend};
use crate::clock::ManualClock;
use crate::config::{parse_policies, RequestLimits, RlqsSettings};
use crate::store::MemoryStore;
use crate::telemetry::Metrics;
use crate::transport::grpc::proto::envoy::r#type::v3::{
    rate_limit_strategy::{BlanketRule, Strategy},
    TokenBucket,
};
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{bucket_action::BucketAction as Action, BucketAction},
    rate_limit_quota_usage_reports::BucketQuotaUsage,
    BucketId,
};

const POLICIES: &str = "
policies:
  - {name: window, match: {b: window}, key: [b], algorithm: fixed_window, limit: 100, period: 1h}
  - {name: big, match: {b: big}, key: [b], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: blocked, match: {b: blocked}, key: [b], deny: true, period: 1m}
  - {name: log, match: {b: log}, key: [b], algorithm: sliding_log, limit: 10, period: 1h}
  - {name: two, match: {b: two}, key: [b], algorithm: fixed_window, limit: 10, period: 1h}
  - {name: other, match: {b: two}, key: [b], algorithm: token_bucket, limit: 10, period: 1h, burst: 10}
";

fn session() -> (Session, Arc<CheckService>) {
    let policies = parse_policies(Path::new("t.yaml"), POLICIES).expect("valid");
    // Fixed windows of an hour from the start: the window never ends in a test.
    let clock = Arc::new(ManualClock::new(3_600_000_000 * 1_000));
    let store = Arc::new(MemoryStore::new(1_000, clock.clone(), None));
    let local = LocalShare::new(Arc::new(MemoryStore::new(1_000, clock, None)), 1, 0);
    let metrics = Metrics::new();
    let service = Arc::new(CheckService::new(
        policies,
        store,
        local,
        RequestLimits::default(),
        metrics.clone(),
    ));
    let quota = Quota::new(&metrics, RlqsSettings::default());
    let mut session = Session::new(Arc::new(quota), Arc::clone(&service), Arc::default());
    session.domain("edge").expect("a domain");
    (session, service)
}

fn usage(bucket: &str, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("b".to_owned(), bucket.to_owned())].into(),
        }),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: denied,
        last_report: None,
    }
}

/// The strategy of the one assignment in `actions`.
fn strategy(actions: &[BucketAction]) -> Strategy {
    match actions {
        [BucketAction {
            bucket_action: Some(Action::QuotaAssignmentAction(a)),
            ..
        }] => a
            .rate_limit_strategy
            .as_ref()
            .and_then(|s| s.strategy)
            .expect("a strategy"),
        other => panic!("one assignment expected: {other:?}"),
    }
}

/// The token bucket bucket `window`'s first report (the request `no_assignment_behavior`
/// denied) is answered with at `at`.
async fn first_assignment(session: &mut Session, at: Instant) -> TokenBucket {
    match strategy(&session.report(&usage("window", 0, 1), at).await) {
        Strategy::TokenBucket(bucket) => bucket,
        other => panic!("a token bucket: {other:?}"),
    }
}

/// The time to live of the one assignment in `actions`, in seconds.
fn ttl_s(actions: &[BucketAction]) -> i64 {
    match actions {
        [BucketAction {
            bucket_action: Some(Action::QuotaAssignmentAction(a)),
            ..
        }] => a.assignment_time_to_live.expect("a time to live").seconds,
        other => panic!("one assignment expected: {other:?}"),
    }
}

/// Units the counter has left (a dry run's `remaining` is what one more request would leave).
async fn left(service: &CheckService, bucket: &str) -> u64 {
    let request = CheckRequest {
        policy: None,
        descriptors: [("b".to_owned(), bucket.to_owned())].into_iter().collect(),
        cost: 1,
        spend: Spend::DryRun,
    };
    let verdict = service.check(&request).await.expect("a check");
    verdict.evaluated[0].decision.remaining + 1
}

/// The token bucket of the one assignment in `actions`.
fn bucket(actions: &[BucketAction]) -> TokenBucket {
    match strategy(actions) {
        Strategy::TokenBucket(bucket) => bucket,
        other => panic!("a token bucket: {other:?}"),
    }
}

/// A token bucket's (max_tokens, tokens a second).
fn terms(bucket: &TokenBucket) -> (u32, u32) {
    let per_s = match bucket.fill_interval {
        Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }) => bucket.tokens_per_fill.unwrap_or(0),
        _ => 0,
    };
    (bucket.max_tokens, per_s)
}

#[tokio::test]
async fn units_back_each_assignment_are_topped_up_with_demand_and_come_back_at_the_end() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    // Reports 5 s apart, as Envoy 1.40 makes them.
    let at = |s: u64| t0 + Duration::from_secs(s);
    // A burst from idle: a quarter of the window's 100 as tokens, a token a second, for the
    // report interval and a second; backed to its end (25 + 7 over 6.5 s taken).
    let first = session.report(&usage("window", 0, 1), t0).await;
    assert_eq!(terms(&bucket(&first)), (25, 1));
    assert_eq!(ttl_s(&first), 6);
    assert_eq!(left(&service, "window").await, 68, "taken before sent");
    // One admitted a second: 3 a second and 2 tokens; Envoy's running bucket may still hold 20
    // until this lands, 13 more taken.
    let second = session.report(&usage("window", 5, 0), at(5)).await;
    assert_eq!(terms(&bucket(&second)), (2, 3));
    assert_eq!(left(&service, "window").await, 55);
    // Two a second: 3 tokens and 4 a second, backed by what is held.
    let third = session.report(&usage("window", 10, 0), at(10)).await;
    assert_eq!(terms(&bucket(&third)), (3, 4));
    assert_eq!(left(&service, "window").await, 55);
    // The same demand: the same settings (Envoy keeps its bucket), a fresh time to live, the
    // units topped up for it.
    let renewal = session.report(&usage("window", 10, 0), at(15)).await;
    assert_eq!(bucket(&renewal), bucket(&third));
    assert_eq!(left(&service, "window").await, 46);
    // No demand: the assignment runs out; once over and reported, all but the 25 admitted
    // come back.
    assert!(session
        .report(&usage("window", 0, 0), at(20))
        .await
        .is_empty());
    assert!(session
        .report(&usage("window", 0, 0), at(30))
        .await
        .is_empty());
    assert_eq!(left(&service, "window").await, 75);
}

#[tokio::test]
async fn an_assignment_is_never_more_than_the_units_left_back() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    // Others spend all but 10 of the window's 100.
    let spend = CheckRequest {
        policy: None,
        descriptors: [("b".to_owned(), "window".to_owned())]
            .into_iter()
            .collect(),
        cost: 90,
        spend: Spend::Record,
    };
    let spent = service.check(&spend).await.expect("a check");
    assert_eq!(spent.outcome.as_str(), "allowed");
    // A burst from idle asks for 25 tokens and a refill: the 10 left back 10 tokens and no
    // refill for the longest time to live.
    let first = session.report(&usage("window", 0, 1), t0).await;
    assert_eq!(terms(&bucket(&first)), (10, 0));
    let one = CheckRequest {
        cost: 1,
        spend: Spend::DryRun,
        ..spend
    };
    let verdict = service.check(&one).await.expect("a check");
    assert_eq!(verdict.outcome.as_str(), "denied", "all 10 taken");
    // All 10 admitted, more asked: nothing is left to back more; nothing is sent.
    let t1 = t0 + Duration::from_secs(1);
    assert!(session
        .report(&usage("window", 10, 30), t1)
        .await
        .is_empty());
}

#[tokio::test]
async fn blanket_rules_answer_what_cannot_or_need_not_be_leased() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    let blanket = |rule: BlanketRule| Strategy::BlanketRule(rule as i32);
    for (bucket, rule) in [
        ("free", BlanketRule::AllowAll),
        ("blocked", BlanketRule::DenyAll),
        ("log", BlanketRule::DenyAll),
        ("two", BlanketRule::DenyAll),
    ] {
        let actions = session.report(&usage(bucket, 0, 1), t0).await;
        assert_eq!(strategy(&actions), blanket(rule), "{bucket}");
        // Said once, not again while it lasts.
        let t1 = t0 + Duration::from_secs(1);
        assert!(session.report(&usage(bucket, 5, 0), t1).await.is_empty());
    }
    assert_eq!(left(&service, "log").await, 10, "nothing spent");
    // `free` matches no policy at all: counted once, when it is first kept.
    assert_eq!(session.quota().metrics.unmatched.get(), 1);
}

#[tokio::test]
async fn a_stream_keeps_its_first_domain() {
    let (mut session, _) = session();
    assert!(session.domain("").is_ok(), "later messages may omit it");
    assert!(session.domain("edge").is_ok());
    assert!(session.domain("other").is_err());
}

#[tokio::test]
async fn an_oversized_id_is_neither_kept_nor_echoed_and_the_budget_is_released() {
    let (_, service) = session();
    let metrics = Metrics::new();
    let budget = RlqsSettings {
        max_buckets_per_stream: 2,
        ..RlqsSettings::default()
    };
    let quota = Arc::new(Quota::new(&metrics, budget));
    let connection = Arc::default();
    let mut session = Session::new(
        Arc::clone(&quota),
        Arc::clone(&service),
        Arc::clone(&connection),
    );
    session.domain("edge").expect("a domain");
    let t0 = Instant::now();
    let huge = BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("b".to_owned(), "x".repeat(60_000))].into(),
        }),
        ..usage("window", 0, 1)
    };
    assert!(session.report(&huge, t0).await.is_empty(), "never echoed");
    let kept = || connection.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(kept(), 0, "nothing kept");
    // Two buckets kept; a third is past the stream's budget: answered by its policy's failure
    // mode (open), not kept, nothing taken.
    first_assignment(&mut session, t0).await;
    let free = session.report(&usage("free", 0, 1), t0).await;
    assert_eq!(
        strategy(&free),
        Strategy::BlanketRule(BlanketRule::AllowAll as i32)
    );
    assert_eq!(kept(), 2);
    let past = session.report(&usage("two", 0, 1), t0).await;
    assert_eq!(
        strategy(&past),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    let past = session.report(&usage("other", 0, 1), t0).await;
    assert_eq!(
        strategy(&past),
        Strategy::BlanketRule(BlanketRule::AllowAll as i32)
    );
    assert_eq!(kept(), 2, "past the budget: not kept");
    drop(session);
    assert_eq!(kept(), 0, "released when the stream ends");
}

#[tokio::test]
async fn a_claimed_demand_of_a_billion_leaves_another_client_its_share() {
    let (_, service) = session();
    let quota = Arc::new(Quota::new(&Metrics::new(), RlqsSettings::default()));
    let open = || {
        let mut s = Session::new(Arc::clone(&quota), Arc::clone(&service), Arc::default());
        s.domain("edge").expect("a domain");
        s
    };
    let (mut greedy, mut steady) = (open(), open());
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    // Denials are a claim: sized at most by the policy's burst share and fair rate, whatever
    // their number (a quarter of the window's 1000; its rate rounds to 0 a second).
    let big = greedy.report(&usage("big", 0, 1_000_000_000), t0).await;
    assert_eq!(terms(&bucket(&big)), (250, 1));
    assert_eq!(left(&service, "big").await, 743);
    // The other client's burst from idle comes out of what is left (at most half of it).
    let small = steady.report(&usage("big", 0, 5), t0).await;
    assert_eq!(terms(&bucket(&small)), (250, 1));
    assert_eq!(left(&service, "big").await, 486);
    // A report on, the greedy client admitted nothing and still claims a billion: the claim
    // adds nothing, nothing more is taken.
    let again = greedy.report(&usage("big", 0, 1_000_000_000), at(5)).await;
    assert_eq!(terms(&bucket(&again)), (1, 1));
    assert_eq!(left(&service, "big").await, 486);
    // The steady client, 5 admitted a second, gets what it asks for: 8 a second.
    let next = steady.report(&usage("big", 25, 0), at(5)).await;
    assert_eq!(terms(&bucket(&next)), (5, 8));
    assert_eq!(left(&service, "big").await, 441);
}

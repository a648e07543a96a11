//! A stream's buckets against the embedded store: what each report is answered, and what the
//! counter holds after takes, renewals and settlements.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::Session;
use super::Quota;
use crate::check::{CheckRequest, CheckService, LocalShare, Spend};
use crate::clock::ManualClock;
use crate::config::{parse_policies, RequestLimits};
use crate::store::MemoryStore;
use crate::telemetry::Metrics;
use crate::transport::grpc::proto::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy,
};
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{bucket_action::BucketAction as Action, BucketAction},
    rate_limit_quota_usage_reports::BucketQuotaUsage,
    BucketId,
};

const POLICIES: &str = "
policies:
  - {name: window, match: {b: window}, key: [b], algorithm: fixed_window, limit: 100, period: 1h}
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
    let mut session = Session::new(Arc::new(Quota::new(&metrics)), Arc::clone(&service));
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

#[tokio::test]
async fn a_lease_backs_each_assignment_and_its_unused_part_comes_back() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    // The first report (the request no_assignment_behavior denied): a small first lease.
    let first = session.report(&usage("window", 0, 1), t0).await;
    let Strategy::TokenBucket(bucket) = strategy(&first) else {
        panic!("a token bucket: {first:?}");
    };
    assert_eq!(bucket.max_tokens, 3, "one request a second, for 3 s");
    assert_eq!(left(&service, "window").await, 97, "taken before sent");
    // Half a second on, 1 of 3 used: nothing to change.
    let half = t0 + Duration::from_millis(500);
    assert!(session
        .report(&usage("window", 1, 0), half)
        .await
        .is_empty());
    // Three seconds on, the assignment is over and reported: 2 unused units come back.
    let later = t0 + Duration::from_secs(3);
    assert!(session
        .report(&usage("window", 0, 0), later)
        .await
        .is_empty());
    assert_eq!(left(&service, "window").await, 99);
}

#[tokio::test]
async fn demand_renews_a_lease_with_a_fresh_envoy_bucket() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    let Strategy::TokenBucket(first) = strategy(&session.report(&usage("window", 0, 1), t0).await)
    else {
        panic!("a token bucket");
    };
    // A second on, all used and 20 denied: the assignment still runs at Envoy, and is never
    // replaced (Envoy may keep a running bucket's tokens).
    let t1 = t0 + Duration::from_secs(1);
    assert!(session.report(&usage("window", 3, 20), t1).await.is_empty());
    // Three seconds on it is over: renewed for the demand, with a fresh Envoy bucket.
    let t3 = t0 + Duration::from_secs(3);
    let Strategy::TokenBucket(second) =
        strategy(&session.report(&usage("window", 0, 23), t3).await)
    else {
        panic!("a token bucket");
    };
    assert!(second.max_tokens > first.max_tokens, "sized by the demand");
    assert_ne!(
        first.fill_interval, second.fill_interval,
        "Envoy keeps a bucket whose settings repeat"
    );
    let taken = u64::from(second.max_tokens);
    assert_eq!(left(&service, "window").await, 100 - 3 - taken);
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
}

#[tokio::test]
async fn a_stream_keeps_its_first_domain() {
    let (mut session, _) = session();
    assert!(session.domain("").is_ok(), "later messages may omit it");
    assert!(session.domain("edge").is_ok());
    assert!(session.domain("other").is_err());
}

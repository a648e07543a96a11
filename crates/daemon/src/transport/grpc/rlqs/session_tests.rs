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

/// The strategy of a replacement: a `DENY_ALL` that clears Envoy's running bucket, then the
/// fresh assignment, in one message.
fn replacement(actions: &[BucketAction]) -> Strategy {
    let [clear, fresh] = actions else {
        panic!("a replacement is two actions: {actions:?}");
    };
    assert_eq!(
        strategy(std::slice::from_ref(clear)),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    strategy(std::slice::from_ref(fresh))
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
    assert_eq!(ttl_s(&first), 9, "the longest time to live");
    assert_eq!(left(&service, "window").await, 97, "taken before sent");
    // Half a second on, 1 of 3 used: a renewal would add too little.
    let half = t0 + Duration::from_millis(500);
    assert!(session
        .report(&usage("window", 1, 0), half)
        .await
        .is_empty());
    // Three seconds on, one more used: renewed with the same bucket (Envoy keeps its
    // tokens), nothing taken.
    let t3 = t0 + Duration::from_secs(3);
    let renewal = session.report(&usage("window", 1, 0), t3).await;
    assert_eq!(strategy(&renewal), Strategy::TokenBucket(bucket));
    assert_eq!(ttl_s(&renewal), 9);
    assert_eq!(left(&service, "window").await, 97);
    // No demand in the next report: not renewed; over (3 s + 9 s), and reported after that:
    // the unused unit comes back.
    let t6 = t0 + Duration::from_secs(6);
    assert!(session.report(&usage("window", 0, 0), t6).await.is_empty());
    let later = t0 + Duration::from_secs(13);
    assert!(session
        .report(&usage("window", 0, 0), later)
        .await
        .is_empty());
    assert_eq!(left(&service, "window").await, 98);
}

#[tokio::test]
async fn a_used_up_assignment_is_replaced_by_a_fresh_envoy_bucket() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    let first = first_assignment(&mut session, t0).await;
    // A second on, all 3 used and 20 denied: Envoy's bucket admits nothing more, so a fresh
    // one replaces it at once, sized by the demand.
    let t1 = t0 + Duration::from_secs(1);
    let Strategy::TokenBucket(second) =
        replacement(&session.report(&usage("window", 3, 20), t1).await)
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
    // Two of it used by the next report: renewed, never replaced (what Envoy admitted since
    // this report would be counted nowhere).
    let t4 = t0 + Duration::from_secs(4);
    let renewal = session.report(&usage("window", 2, 0), t4).await;
    assert_eq!(strategy(&renewal), Strategy::TokenBucket(second));
    assert_eq!(left(&service, "window").await, 100 - 3 - taken);
}

#[tokio::test]
async fn an_assignment_that_will_not_last_is_replaced_and_its_rest_written_off() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    let first = first_assignment(&mut session, t0).await;
    assert_eq!(first.max_tokens, 3);
    // A second on, 2 of 3 used at 2 a second: the last token will not last until the next
    // report. A fresh bucket replaces it (6 tokens: 2 a second for 3 s); the 1 left is written
    // off, never given back (what Envoy admitted after this report is not known).
    let t1 = t0 + Duration::from_secs(1);
    let Strategy::TokenBucket(second) =
        replacement(&session.report(&usage("window", 2, 0), t1).await)
    else {
        panic!("a token bucket");
    };
    assert_eq!(second.max_tokens, 6);
    assert_ne!(
        first.fill_interval, second.fill_interval,
        "a fresh Envoy bucket"
    );
    assert_eq!(left(&service, "window").await, 100 - 3 - 6);
    // The next report counts what the old bucket admitted after t1 against the new lease
    // (over-counted, never under): 1 of 6 reported, it will last: renewed. Settled after its
    // end: 5 come back.
    let t2 = t0 + Duration::from_secs(2);
    let renewal = session.report(&usage("window", 1, 0), t2).await;
    assert_eq!(strategy(&renewal), Strategy::TokenBucket(second));
    let over = t0 + Duration::from_secs(20);
    assert!(session
        .report(&usage("window", 0, 0), over)
        .await
        .is_empty());
    assert_eq!(left(&service, "window").await, 100 - 3 - 6 + 5);
}

#[tokio::test]
async fn a_replacement_that_would_hold_fewer_tokens_is_not_made() {
    let (mut session, service) = session();
    let t0 = Instant::now();
    let first = first_assignment(&mut session, t0).await;
    assert_eq!(first.max_tokens, 3);
    // Others spend all but 1 of the 97 left.
    let spend = CheckRequest {
        policy: None,
        descriptors: [("b".to_owned(), "window".to_owned())]
            .into_iter()
            .collect(),
        cost: 96,
        spend: Spend::Record,
    };
    let spent = service.check(&spend).await.expect("a check");
    assert_eq!(spent.outcome.as_str(), "allowed");
    // Demand that 2 tokens will not serve: a replacement would have 1 unit for it, fewer than
    // the running one has left. It is given back and the running one renewed.
    let t2 = t0 + Duration::from_secs(2);
    let renewal = session.report(&usage("window", 1, 11), t2).await;
    assert_eq!(strategy(&renewal), Strategy::TokenBucket(first));
    assert_eq!(left(&service, "window").await, 1);
}

#[tokio::test]
async fn a_renewal_never_reaches_envoy_after_the_running_assignment_ends() {
    let (mut session, _) = session();
    let t0 = Instant::now();
    let first = session.report(&usage("window", 0, 1), t0).await;
    assert_eq!(ttl_s(&first), 9);
    // A report 8.5 s on (a late one): the assignment may end at Envoy before a renewal
    // arrives, and a late renewal would be a fresh, full bucket. Nothing is sent.
    let late = t0 + Duration::from_millis(8_500);
    assert!(session
        .report(&usage("window", 1, 0), late)
        .await
        .is_empty());
    // Once over and reported, the next assignment is a fresh bucket.
    let after = t0 + Duration::from_secs(10);
    let next = session.report(&usage("window", 1, 0), after).await;
    assert!(matches!(strategy(&next), Strategy::TokenBucket(_)));
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
async fn a_claimed_demand_of_a_billion_takes_a_quarter_and_leaves_the_rest_to_others() {
    let (_, service) = session();
    let quota = Arc::new(Quota::new(&Metrics::new(), RlqsSettings::default()));
    let open = || {
        let mut s = Session::new(Arc::clone(&quota), Arc::clone(&service), Arc::default());
        s.domain("edge").expect("a domain");
        s
    };
    let (mut greedy, mut steady) = (open(), open());
    let t0 = Instant::now();
    let Strategy::TokenBucket(big) =
        strategy(&greedy.report(&usage("window", 0, 1_000_000_000), t0).await)
    else {
        panic!("a token bucket");
    };
    assert_eq!(big.max_tokens, 25, "a quarter of the window's 100");
    assert_eq!(left(&service, "window").await, 75);
    // The other client, at 5 a second, gets all it asks for out of what is left (at most
    // half of it while the two hold leases, at most a quarter of the limit).
    let Strategy::TokenBucket(small) = strategy(&steady.report(&usage("window", 0, 5), t0).await)
    else {
        panic!("a token bucket for the steady client too");
    };
    assert_eq!(
        small.max_tokens, 15,
        "5 a second until two reports 1 s apart, and 1 s"
    );
    assert_eq!(left(&service, "window").await, 60);
    // Admissions no assignment backed are a claim too.
    let mut liar = open();
    let Strategy::TokenBucket(claimed) =
        strategy(&liar.report(&usage("window", 1_000_000_000, 0), t0).await)
    else {
        panic!("a token bucket");
    };
    assert_eq!(
        claimed.max_tokens, 20,
        "a quarter of the limit, a third of the 60 left"
    );
    assert_eq!(left(&service, "window").await, 40);
}

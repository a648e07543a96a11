//! Tests of the check path: selection, group decisions, failure modes, metrics.

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::config::parse_policies;
use crate::store::{MemoryStore, StoreCheck, StoreError, StoreFuture};

const POLICIES: &str = "
policies:
  - {name: per_ip, match: {path: /login}, key: [ip], algorithm: sliding_log, limit: 3, period: 1m, failure_mode: closed}
  - {name: per_account, match: {path: /login}, key: [account], algorithm: fixed_window, limit: 5, period: 1m, failure_mode: open}
  - {name: watch, match: {path: /login}, key: [ip], algorithm: fixed_window, limit: 1, period: 1m, shadow: true}
";

fn service_on(store: Arc<dyn RateStore>) -> CheckService {
    service_with(POLICIES, store)
}

fn service_with(policies: &str, store: Arc<dyn RateStore>) -> CheckService {
    let policies = parse_policies(Path::new("t.yaml"), policies).expect("valid");
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    // Two replicas, no margin: each pod gets half of every limit while the store is down.
    let local = LocalShare::new(Arc::new(MemoryStore::new(1_000, clock, None)), 2, 0);
    CheckService::new(
        policies,
        store,
        local,
        RequestLimits::default(),
        Metrics::new(),
    )
}

fn service() -> CheckService {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    service_on(Arc::new(MemoryStore::new(1_000, clock, None)))
}

fn login(ip: &str, account: &str) -> CheckRequest {
    CheckRequest {
        policy: None,
        descriptors: [("path", "/login"), ("ip", ip), ("account", account)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        cost: 1,
        spend: Spend::Record,
    }
}

pub(super) fn outcome_count(service: &CheckService, policy: &str, outcome: &str) -> u64 {
    service
        .metrics
        .decisions
        .with_label_values(&[policy, outcome])
        .get()
}

#[tokio::test]
async fn tightest_enforced_policy_decides_and_shadow_never_blocks() {
    let service = service();
    let first = service
        .check(&login("1.1.1.1", "alice"))
        .await
        .expect("valid");
    assert_eq!(first.outcome, Outcome::Allowed);
    assert_eq!(first.evaluated.len(), 3);
    let deciding = first.deciding().expect("a policy decided");
    assert_eq!(deciding.policy.name(), "per_ip");
    assert_eq!(deciding.decision.remaining, 2);

    // The shadow policy (limit 1) would block now, but only reports it.
    let second = service
        .check(&login("1.1.1.1", "alice"))
        .await
        .expect("valid");
    assert_eq!(second.outcome, Outcome::Allowed);
    assert_eq!(outcome_count(&service, "watch", "shadow_denied"), 1);
}

#[tokio::test]
async fn a_denial_spends_nothing_from_the_other_policies() {
    let service = service();
    for _ in 0..3 {
        service
            .check(&login("1.1.1.1", "alice"))
            .await
            .expect("valid");
    }
    let denied = service
        .check(&login("1.1.1.1", "alice"))
        .await
        .expect("valid");
    assert_eq!(denied.outcome, Outcome::Denied);
    assert_eq!(denied.deciding().expect("decided").policy.name(), "per_ip");
    // per_account spent 3 of 5, not 4: the denied request was all-or-nothing.
    let mut probe = login("2.2.2.2", "alice");
    probe.spend = Spend::DryRun;
    let account = service.check(&probe).await.expect("valid");
    let part = account
        .evaluated
        .iter()
        .find(|p| p.policy.name() == "per_account")
        .expect("evaluated");
    assert_eq!(part.decision.remaining, 1, "5 - 3 spent - 1 for this probe");
}

#[tokio::test]
async fn explicit_policy_skips_matching_but_needs_its_key() {
    let service = service();
    let mut request = login("1.1.1.1", "alice");
    request.descriptors.remove("path");
    request.policy = Some("per_ip".into());
    let verdict = service.check(&request).await.expect("valid");
    assert_eq!(verdict.evaluated.len(), 1);
    request.descriptors.remove("ip");
    assert_eq!(
        service.check(&request).await.unwrap_err(),
        CheckError::MissingDescriptor {
            policy: "per_ip".into(),
            descriptor: "ip".into()
        }
    );
    request.policy = Some("nope".into());
    assert_eq!(
        service.check(&request).await.unwrap_err(),
        CheckError::UnknownPolicy("nope".into())
    );
}

#[tokio::test]
async fn requests_are_validated_before_anything_is_spent() {
    let service = service();
    let mut big = login("1.1.1.1", "alice");
    big.cost = 4;
    assert!(matches!(
        service.check(&big).await.unwrap_err(),
        CheckError::CostExceedsLimit { limit: 3, .. }
    ));
    let mut zero = login("1.1.1.1", "alice");
    zero.cost = 0;
    assert!(matches!(
        service.check(&zero).await,
        Err(CheckError::Invalid(_))
    ));
    let mut bad_name = login("1.1.1.1", "alice");
    bad_name.descriptors.insert("bad name".into(), "x".into());
    assert!(matches!(
        service.check(&bad_name).await,
        Err(CheckError::Invalid(_))
    ));
    let batch = vec![login("1.1.1.1", "alice"), zero];
    let error = service.check_batch(batch).await.unwrap_err();
    assert!(error.to_string().starts_with("checks[1]: cost"), "{error}");
    let mut probe = login("1.1.1.1", "alice");
    probe.spend = Spend::DryRun;
    let verdict = service.check(&probe).await.expect("valid");
    assert_eq!(verdict.deciding().expect("decided").decision.remaining, 2);
}

/// A store that can never answer: stands in for Redis being down.
struct DownStore;

impl RateStore for DownStore {
    fn check<'a>(
        &'a self,
        _: &'a [StoreCheck],
        _: Spend,
        _: Option<std::time::Duration>,
    ) -> StoreFuture<'a> {
        Box::pin(std::future::ready(Err(StoreError::Timeout)))
    }

    fn spend<'a>(&'a self, _: &'a [StoreCheck], _: Option<std::time::Duration>) -> StoreFuture<'a> {
        Box::pin(std::future::ready(Err(StoreError::Timeout)))
    }

    fn reset<'a>(&'a self, _: &'a crate::limit::Key) -> crate::store::ResetFuture<'a> {
        Box::pin(std::future::ready(Err(StoreError::Timeout)))
    }

    fn name(&self) -> &'static str {
        "down"
    }
}

#[tokio::test]
async fn failure_modes_apply_per_policy_when_the_store_cannot_answer() {
    let service = service_on(Arc::new(DownStore));
    let verdict = service
        .check(&login("1.1.1.1", "alice"))
        .await
        .expect("valid");
    assert_eq!(verdict.outcome, Outcome::Unavailable, "per_ip fails closed");
    assert_eq!(verdict.deciding().expect("decided").mode, Mode::FailClosed);
    assert_eq!(outcome_count(&service, "per_ip", "fail_closed"), 1);
    assert_eq!(outcome_count(&service, "per_account", "fail_open"), 1);

    let mut open_only = login("1.1.1.1", "alice");
    open_only.policy = Some("per_account".into());
    let verdict = service.check(&open_only).await.expect("valid");
    assert_eq!(verdict.outcome, Outcome::Allowed);
    assert_eq!(verdict.deciding().expect("decided").mode, Mode::FailOpen);
}

#[tokio::test]
async fn local_mode_enforces_this_pods_share_in_memory() {
    let policies = "
policies:
  - {name: api, key: [user], algorithm: fixed_window, limit: 10, period: 1h, failure_mode: local}
  - {name: beta, key: [user], algorithm: fixed_window, limit: 1, period: 1h, failure_mode: closed, shadow: true}
";
    let service = service_with(policies, Arc::new(DownStore));
    let request = CheckRequest {
        policy: None,
        descriptors: [("user".to_owned(), "u".to_owned())].into(),
        cost: 1,
        spend: Spend::Record,
    };
    for i in 0..5 {
        let verdict = service.check(&request).await.expect("valid");
        assert_eq!(
            verdict.outcome,
            Outcome::Allowed,
            "request {i} within the share"
        );
        let deciding = verdict.deciding().expect("decided");
        assert_eq!(deciding.mode, Mode::Local);
        assert_eq!(deciding.decision.limit, 5, "10 / 2 replicas");
    }
    let verdict = service.check(&request).await.expect("valid");
    assert_eq!(verdict.outcome, Outcome::Denied, "the share is spent");
    assert!(verdict.deciding().expect("decided").decision.retry_after_us > 0);
    assert_eq!(outcome_count(&service, "api", "local_allowed"), 5);
    assert_eq!(outcome_count(&service, "api", "local_denied"), 1);
}

fn counter_query(policy: &str, descriptors: &[(&str, &str)]) -> CounterQuery {
    CounterQuery {
        policy: policy.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        cost: 1,
    }
}

#[tokio::test]
async fn a_counter_is_read_without_spending_and_a_reset_restores_it_everywhere_here() {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let store = Arc::new(MemoryStore::new(1_000, clock, None));
    let service = service_on(store.clone()).with_local_layer(HotKeys::new(100));
    let query = counter_query("per_ip", &[("ip", "1.1.1.1")]);
    for _ in 0..3 {
        let fresh = service.counter(&query).await.expect("valid");
        assert_eq!(
            (
                fresh.deciding.limit,
                fresh.deciding.remaining,
                fresh.deciding.reset_after_ms
            ),
            (3, 3, 0),
            "a key never seen is a full quota, and reading it spends nothing"
        );
        assert!(fresh.deciding.allowed && fresh.deciding.retry_after_ms == 0);
        assert!(fresh.windows.is_empty(), "one counter");
    }
    assert!(store.is_empty(), "reads write nothing");
    let fresh = service.counter(&query).await.expect("valid");
    assert_eq!(
        (
            fresh.deciding.key.as_str(),
            fresh.store,
            fresh.deciding.algorithm,
            fresh.mode
        ),
        ("per_ip:1.1.1.1", "memory", "sliding_log", "enforced")
    );

    for _ in 0..4 {
        service
            .check(&login("1.1.1.1", "alice"))
            .await
            .expect("valid");
    }
    let blocked = service.counter(&query).await.expect("valid");
    let blocked = blocked.deciding;
    assert_eq!((blocked.remaining, blocked.allowed), (0, false));
    assert_eq!(blocked.retry_after_ms, 60_000);
    assert_eq!(blocked.reset_after_ms, 60_000);
    assert_eq!(
        blocked.local_layer_retry_after_ms.map(|ms| ms > 59_000),
        Some(true),
        "the local layer remembers the denial: {blocked:?}"
    );

    let report = service
        .reset_counter(&query, &"192.0.2.9:4242")
        .await
        .expect("reset");
    assert_eq!((report.existed, report.fleet), (true, "alone"));
    assert_eq!(report.keys, ["per_ip:1.1.1.1"]);
    assert_eq!(report.fingerprint.len(), 16);
    let after = service.counter(&query).await.expect("valid").deciding;
    assert_eq!((after.remaining, after.allowed), (3, true));
    assert_eq!(after.local_layer_retry_after_ms, None, "forgotten at once");
    let verdict = service
        .check(&login("1.1.1.1", "alice"))
        .await
        .expect("valid");
    assert_eq!(verdict.outcome, Outcome::Allowed);
    assert_eq!(
        service.counter_resets.with_label_values(&["per_ip"]).get(),
        1
    );
    let again = service.reset_counter(&query, &"x").await.expect("reset");
    assert!(again.existed, "the check after the reset spent from it");
}

#[tokio::test]
async fn counter_questions_are_checked_like_checks_and_a_dead_store_changes_nothing() {
    let service = service();
    let refused = |result: Result<CounterState, CounterError>| match result {
        Err(CounterError::Request(error)) => error,
        other => panic!("refused expected, got {other:?}"),
    };
    assert!(matches!(
        refused(
            service
                .counter(&counter_query("nope", &[("ip", "1")]))
                .await
        ),
        CheckError::UnknownPolicy(_)
    ));
    assert!(matches!(
        refused(
            service
                .counter(&counter_query("per_ip", &[("account", "a")]))
                .await
        ),
        CheckError::MissingDescriptor { .. }
    ));
    let mut costly = counter_query("per_ip", &[("ip", "1")]);
    costly.cost = 4;
    assert!(matches!(
        refused(service.counter(&costly).await),
        CheckError::CostExceedsLimit { .. }
    ));
    costly.cost = 0;
    assert!(matches!(
        refused(service.counter(&costly).await),
        CheckError::Invalid(_)
    ));
    let shadow = service
        .counter(&counter_query("watch", &[("ip", "1")]))
        .await
        .expect("valid");
    assert_eq!(
        (shadow.mode, shadow.deciding.algorithm),
        ("shadow", "fixed_window")
    );

    let down = service_on(Arc::new(DownStore));
    let query = counter_query("per_ip", &[("ip", "1")]);
    assert!(matches!(
        down.counter(&query).await,
        Err(CounterError::Store(StoreError::Timeout))
    ));
    assert!(matches!(
        down.reset_counter(&query, &"x").await,
        Err(CounterError::Store(StoreError::Timeout))
    ));
    assert_eq!(down.counter_resets.with_label_values(&["per_ip"]).get(), 0);
}

/// A reload that leaves a policy as it was (another policy changed) leaves its checks in flight
/// alone: a check planned before it is decided as usual, not answered superseded.
#[tokio::test]
async fn a_reload_that_leaves_a_policy_as_it_was_leaves_its_checks_in_flight_alone() {
    let kept = "  - {name: kept, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}\n";
    let before = format!("policies:\n{kept}  - {{name: other, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}}\n");
    let after = format!("policies:\n{kept}  - {{name: other, key: [ip], algorithm: token_bucket, limit: 9, period: 1h}}\n");
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let service = service_with(&before, Arc::new(MemoryStore::new(1_000, clock, None)));
    let request = CheckRequest {
        policy: Some("kept".into()),
        descriptors: [("ip".to_owned(), "192.0.2.1".to_owned())].into(),
        cost: 1,
        spend: Spend::Record,
    };
    let old = service.policies();
    let mut late = service.plan(&old, &request).await.expect("planned");
    service.replace_policies(parse_policies(Path::new("t.yaml"), &after).expect("valid"));
    let new = service.policies();
    assert_eq!(new.revision("kept"), old.revision("kept"));
    assert_eq!(new.revision("other"), new.generation());
    assert!(service.check(&request).await.expect("valid").outcome == Outcome::Allowed);
    let verdict = service.run(Spend::Record, &mut late).await;
    assert_eq!(verdict.outcome, Outcome::Allowed, "{verdict:?}");
}

/// The interleaving a busy machine gave `algorithm_changes_start_afresh_on_the_embedded_store`,
/// driven explicitly: a check planned under the old set (a token bucket of 1000) reaches the
/// store after four checks of the new set (a fixed window of 5). It is denied as superseded,
/// spends nothing and does not restart the window: the partition admits exactly 5 after the
/// reload (without the generation the late check was admitted and restarted the window).
#[tokio::test]
async fn a_check_planned_before_a_reload_never_restarts_the_new_policys_partition() {
    let before = "policies:\n  - {name: swap, key: [ip], algorithm: token_bucket, limit: 1000, period: 1h, burst: 1000}\n";
    let after =
        "policies:\n  - {name: swap, key: [ip], algorithm: fixed_window, limit: 5, period: 7d}\n";
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let service = service_with(before, Arc::new(MemoryStore::new(1_000, clock, None)));
    let request = CheckRequest {
        policy: Some("swap".into()),
        descriptors: [("ip".to_owned(), "192.0.2.1".to_owned())].into(),
        cost: 1,
        spend: Spend::Record,
    };
    let old = service.policies();
    let mut late = service.plan(&old, &request).await.expect("planned");
    assert!(service.check(&request).await.expect("valid").outcome == Outcome::Allowed);
    service.replace_policies(parse_policies(Path::new("t.yaml"), after).expect("valid"));
    assert_eq!(service.policies().generation(), old.generation() + 1);

    let mut admitted = 0;
    for _ in 0..4 {
        let verdict = service.check(&request).await.expect("valid");
        admitted += u64::from(verdict.outcome == Outcome::Allowed);
    }
    let verdict = service.run(Spend::Record, &mut late).await;
    assert_eq!(verdict.outcome, Outcome::Denied, "{verdict:?}");
    let deciding = verdict.deciding().expect("a policy decided");
    assert_eq!(
        (deciding.decision.limit, deciding.decision.retry_after_us),
        (1000, 1),
        "the old plan's quota, retry at once (under the set in force)"
    );
    for _ in 0..3 {
        let verdict = service.check(&request).await.expect("valid");
        admitted += u64::from(verdict.outcome == Outcome::Allowed);
    }
    assert_eq!(admitted, 5, "the new limit, exactly");
}

//! Tests of policies of several windows and of local limits on the check path (embedded store,
//! manual clock): all-or-nothing across windows, the deciding window, one count per policy, tiers,
//! failure modes and rollouts per window; local limits that deny before the store.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::tests::outcome_count;
use super::*;
use crate::clock::ManualClock;
use crate::config::parse_policies;
use crate::store::{StoreCheck, StoreError, StoreFuture};

const SEC: u64 = 1_000_000;

/// The embedded store, counting how often it is asked (to show what never reaches it).
struct Counted {
    store: MemoryStore,
    calls: AtomicUsize,
    down: bool,
}

impl RateStore for Counted {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: Spend,
        deadline: Option<std::time::Duration>,
    ) -> StoreFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down {
            return Box::pin(std::future::ready(Err(StoreError::Timeout)));
        }
        self.store.check(checks, spend, deadline)
    }

    fn spend<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        deadline: Option<std::time::Duration>,
    ) -> StoreFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down {
            return Box::pin(std::future::ready(Err(StoreError::Timeout)));
        }
        self.store.spend(checks, deadline)
    }

    fn reset<'a>(&'a self, key: &'a crate::limit::Key) -> crate::store::ResetFuture<'a> {
        self.store.reset(key)
    }

    fn name(&self) -> &'static str {
        "counted"
    }
}

struct Fixture {
    service: CheckService,
    store: Arc<Counted>,
    clock: Arc<ManualClock>,
}

fn fixture_with(policies: &str, down: bool) -> Fixture {
    let policies = parse_policies(Path::new("t.yaml"), policies).expect("valid");
    let clock = Arc::new(ManualClock::new(1_000 * SEC));
    let memory = |keys| Arc::new(MemoryStore::new(keys, clock.clone(), None));
    let store = Arc::new(Counted {
        store: MemoryStore::new(1_000, clock.clone(), None),
        calls: AtomicUsize::new(0),
        down,
    });
    // Two replicas, no margin, for the `local` failure mode.
    let share = LocalShare::new(memory(1_000), 2, 0);
    let service = CheckService::new(
        policies,
        store.clone(),
        share,
        RequestLimits::default(),
        Metrics::new(),
    )
    .with_local_limits(memory(1_000));
    Fixture {
        service,
        store,
        clock,
    }
}

fn fixture(policies: &str) -> Fixture {
    fixture_with(policies, false)
}

fn request(policy: &str, user: &str) -> CheckRequest {
    CheckRequest {
        policy: Some(policy.into()),
        descriptors: [("user".to_owned(), user.to_owned())].into(),
        cost: 1,
        spend: Spend::Record,
    }
}

/// Remaining units of each window of the only policy, without spending.
async fn remaining(service: &CheckService, policy: &str, user: &str) -> Vec<u64> {
    let mut probe = request(policy, user);
    probe.spend = Spend::DryRun;
    let verdict = service.check(&probe).await.expect("valid");
    // A dry run leaves one unit for itself: add it back.
    verdict
        .evaluated
        .iter()
        .map(|p| p.decision.remaining + u64::from(p.decision.allowed))
        .collect()
}

const TWO_WINDOWS: &str = "
policies:
  - name: api
    key: [user]
    algorithm: sliding_log
    limits: [{limit: 2, period: 1s}, {limit: 5, period: 1h}]
    tiers: {levels: {gold: {multiplier: 10}}}
";

#[tokio::test]
async fn either_window_denies_and_a_denial_spends_from_neither() {
    let f = fixture(TWO_WINDOWS);
    let service = &f.service;
    for _ in 0..2 {
        let verdict = service.check(&request("api", "u")).await.expect("valid");
        assert_eq!(verdict.outcome, Outcome::Allowed);
        assert_eq!(verdict.evaluated.len(), 2, "one decision per window");
    }
    let denied = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(denied.outcome, Outcome::Denied);
    let deciding = denied.deciding().expect("decided");
    assert_eq!(
        (deciding.policy.name(), deciding.window_index),
        ("api", Some(0))
    );
    assert!(deciding.decision.retry_after_us <= SEC);
    assert_eq!(
        remaining(service, "api", "u").await,
        [0, 3],
        "the hour spent 2, not 3"
    );

    // The second fills; the hour then decides, for the rest of the hour.
    f.clock.advance(SEC);
    for _ in 0..2 {
        let verdict = service.check(&request("api", "u")).await.expect("valid");
        assert_eq!(verdict.outcome, Outcome::Allowed);
    }
    f.clock.advance(SEC);
    let allowed = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(
        allowed.deciding().expect("decided").window_index,
        Some(1),
        "least remaining"
    );
    let denied = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(denied.outcome, Outcome::Denied);
    let deciding = denied.deciding().expect("decided");
    assert_eq!(deciding.window_index, Some(1));
    assert!(deciding.decision.retry_after_us > 3_000 * SEC);
    assert_eq!(
        remaining(service, "api", "u").await,
        [1, 0],
        "the second spent nothing"
    );

    // One count per policy, not per window.
    assert_eq!(outcome_count(service, "api", "allowed"), 5);
    assert_eq!(outcome_count(service, "api", "denied"), 2);
}

#[tokio::test]
async fn tiers_multiply_every_window_and_cost_must_fit_each() {
    let f = fixture(TWO_WINDOWS);
    let mut gold = request("api", "g");
    gold.descriptors.insert("tier".into(), "gold".into());
    gold.spend = Spend::DryRun;
    let verdict = f.service.check(&gold).await.expect("valid");
    let limits: Vec<u64> = verdict.evaluated.iter().map(|p| p.decision.limit).collect();
    assert_eq!(limits, [20, 50]);
    let mut big = request("api", "u");
    big.cost = 3;
    assert!(matches!(
        f.service.check(&big).await,
        Err(CheckError::CostExceedsLimit { limit: 2, .. })
    ));
}

#[tokio::test]
async fn the_local_failure_mode_shares_every_window() {
    let policies = "
policies:
  - {name: api, key: [user], algorithm: fixed_window, failure_mode: local, limits: [{limit: 4, period: 1s}, {limit: 6, period: 1h}]}
";
    let f = fixture_with(policies, true);
    let mut admitted = 0;
    for second in 0..4 {
        for _ in 0..4 {
            let verdict = f.service.check(&request("api", "u")).await.expect("valid");
            assert_eq!(verdict.deciding().expect("decided").mode, Mode::Local);
            admitted += usize::from(verdict.outcome == Outcome::Allowed);
        }
        assert!(admitted <= 2 * (second + 1), "2 per second per pod");
        f.clock.advance(SEC);
    }
    assert_eq!(admitted, 3, "this pod's share of the hour: 6 / 2");
}

#[tokio::test]
async fn a_rollout_enforces_all_windows_of_a_partition_or_none() {
    let policies = "
policies:
  - {name: api, key: [user], algorithm: fixed_window, enforce_percent: 50, limits: [{limit: 4, period: 1s}, {limit: 6, period: 1h}]}
";
    let f = fixture(policies);
    let mut modes = std::collections::BTreeSet::new();
    for user in 0..40 {
        let verdict = f
            .service
            .check(&request("api", &user.to_string()))
            .await
            .expect("valid");
        let mode = verdict.evaluated[0].mode;
        assert!(
            verdict.evaluated.iter().all(|p| p.mode == mode),
            "{verdict:?}"
        );
        modes.insert(mode.as_str());
    }
    assert_eq!(
        modes.len(),
        2,
        "both enforced and shadow partitions: {modes:?}"
    );
}

const LOCAL: &str = "
policies:
  - {name: api, key: [user], algorithm: fixed_window, limit: 3, period: 1h, local_limit: {limit: 2, period: 1s}}
  - {name: watch, key: [user], algorithm: fixed_window, limit: 100, period: 1h, shadow: true, local_limit: {limit: 1, period: 1h}}
";

#[tokio::test]
async fn a_local_limit_denies_before_the_store_with_its_own_retry() {
    let f = fixture(LOCAL);
    let service = &f.service;
    for _ in 0..2 {
        let verdict = service.check(&request("api", "u")).await.expect("valid");
        assert_eq!(verdict.outcome, Outcome::Allowed);
    }
    assert_eq!(f.store.calls.load(Ordering::SeqCst), 2);
    let denied = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(denied.outcome, Outcome::Denied);
    let deciding = denied.deciding().expect("decided");
    assert_eq!(deciding.mode, Mode::LocalLimit);
    // 2 per second, both spent at once: the next token in exactly half a second.
    assert_eq!(deciding.decision.retry_after_us, SEC / 2);
    assert_eq!(
        f.store.calls.load(Ordering::SeqCst),
        2,
        "the store was not asked"
    );
    assert_eq!(outcome_count(service, "api", "local_limit_denied"), 1);
    assert_eq!(outcome_count(service, "api", "denied"), 0);

    // A dry run spends no local token; half a second later the store decides again.
    f.clock.advance(SEC / 2 - 1);
    let still = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(still.deciding().expect("decided").mode, Mode::LocalLimit);
    f.clock.advance(1);
    let mut dry = request("api", "u");
    dry.spend = Spend::DryRun;
    assert_eq!(
        service.check(&dry).await.expect("valid").outcome,
        Outcome::Allowed
    );
    let third = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(
        (third.outcome, third.deciding().expect("d").mode),
        (Outcome::Allowed, Mode::Enforced)
    );

    // The store's own limit (3 an hour) still holds: the local limit only denies earlier, and
    // a token it gave for a request the store then denied is not given back.
    f.clock.advance(SEC);
    for _ in 0..2 {
        let over = service.check(&request("api", "u")).await.expect("valid");
        assert_eq!(
            (over.outcome, over.deciding().expect("d").mode),
            (Outcome::Denied, Mode::Enforced)
        );
    }
    let again = service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(
        again.deciding().expect("d").mode,
        Mode::LocalLimit,
        "both tokens spent, not refunded"
    );
}

#[tokio::test]
async fn a_shadow_partition_has_no_local_limit() {
    let f = fixture(LOCAL);
    for _ in 0..3 {
        let verdict = f
            .service
            .check(&request("watch", "u"))
            .await
            .expect("valid");
        assert_eq!(verdict.outcome, Outcome::Allowed);
        assert_eq!(verdict.deciding().expect("decided").mode, Mode::Shadow);
    }
    assert_eq!(f.store.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_cost_beyond_the_local_limit_is_refused_before_anything_is_spent() {
    let f = fixture(LOCAL);
    let mut big = request("api", "u");
    big.cost = 3;
    assert!(matches!(
        f.service.check(&big).await,
        Err(CheckError::CostExceedsLimit { limit: 2, .. })
    ));
    assert_eq!(f.store.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_local_limit_still_caps_a_policy_failing_open_while_the_store_is_down() {
    let policies = "
policies:
  - {name: api, key: [user], algorithm: fixed_window, limit: 100, period: 1h, failure_mode: open, local_limit: {limit: 2, period: 1h}}
";
    let f = fixture_with(policies, true);
    for _ in 0..2 {
        let verdict = f.service.check(&request("api", "u")).await.expect("valid");
        assert_eq!(verdict.outcome, Outcome::Allowed);
        assert_eq!(verdict.deciding().expect("decided").mode, Mode::FailOpen);
    }
    let capped = f.service.check(&request("api", "u")).await.expect("valid");
    assert_eq!(capped.outcome, Outcome::Denied);
    assert_eq!(capped.deciding().expect("decided").mode, Mode::LocalLimit);
    assert_eq!(f.store.calls.load(Ordering::SeqCst), 2);
    assert_eq!(outcome_count(&f.service, "api", "fail_open"), 2);
}

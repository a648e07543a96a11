//! A hot leased partition over its limit, on the embedded store (which leases as Redis does):
//! two pods (two services on one store), demand at twice the refill, time stepped by hand. The
//! pods deny what their leases cannot cover without asking the store and take the refill in
//! blocks: at most 0.01 store calls per check, never more admitted than the burst and the refill
//! (a token bucket) or the limit per window (a fixed window), the refill shared between the
//! pods; a reset and a reload end the local denials.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::clock::ManualClock;
use crate::config::{parse_policies, LeaseSettings};
use crate::limit::{Decision, Grant, Key};
use crate::store::{LeaseFuture, ResetFuture, StoreCheck, StoreFuture};

/// The hot key: 100,000 a minute, a burst of 1,000.
const BUCKET: &str = "{name: hot, key: [user], algorithm: token_bucket, limit: 100000, period: 1m, burst: 1000, lease: true}";
/// A window the demand exhausts halfway: 10,000 per 6 s.
const WINDOW: &str =
    "{name: hot, key: [user], algorithm: fixed_window, limit: 10000, period: 6s, lease: true}";

/// The embedded store, counting every call made of it (checks, takes, give-backs).
struct Counting {
    inner: MemoryStore,
    calls: AtomicU64,
    /// Checks, takes, give-backs.
    kinds: [AtomicU64; 3],
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn kind(&self, kind: usize) {
        self.kinds[kind].fetch_add(1, Ordering::Relaxed);
    }

    fn kinds(&self) -> [u64; 3] {
        [0, 1, 2].map(|k| self.kinds[k].load(Ordering::Relaxed))
    }
}

impl RateStore for Counting {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: crate::store::Spend,
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        self.count();
        self.kind(0);
        self.inner.check(checks, spend, deadline)
    }

    fn spend<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        self.count();
        self.inner.spend(checks, deadline)
    }

    fn take<'a>(
        &'a self,
        check: &'a StoreCheck,
        fraction: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Option<Grant>> {
        self.count();
        self.kind(1);
        self.inner.take(check, fraction, deadline)
    }

    fn give_back<'a>(
        &'a self,
        check: &'a StoreCheck,
        unused: u64,
        grant: Grant,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, u64> {
        self.count();
        self.kind(2);
        self.inner.give_back(check, unused, grant, deadline)
    }

    fn reset<'a>(&'a self, key: &'a Key) -> ResetFuture<'a> {
        self.inner.reset(key)
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

/// Two pods on one store, and the one clock both read (the store in µs, the leases as an
/// `Instant`), stepped by hand.
struct Fleet {
    pods: [CheckService; 2],
    store: Arc<Counting>,
    clock: Arc<ManualClock>,
    offset: Arc<AtomicU64>,
}

impl Fleet {
    /// Two pods enforcing `policy`, the store's clock at `start_us`.
    fn new(policy: &str, start_us: u64) -> Self {
        let clock = Arc::new(ManualClock::new(start_us));
        let store = Arc::new(Counting {
            inner: MemoryStore::new(1_000, clock.clone(), None),
            calls: AtomicU64::new(0),
            kinds: Default::default(),
        });
        let (base, offset) = (Instant::now(), Arc::new(AtomicU64::new(0)));
        let pod = || {
            let metrics = Metrics::new();
            let since = Arc::clone(&offset);
            let now = move || base + Duration::from_micros(since.load(Ordering::Relaxed));
            let leases = Leases::with_test_clock(
                store.clone(),
                LeaseSettings::default(),
                metrics.registry(),
                now,
            );
            let local = LocalShare::new(Arc::new(MemoryStore::new(10, clock.clone(), None)), 2, 0);
            CheckService::new(
                policies(policy),
                store.clone(),
                local,
                RequestLimits::default(),
                metrics,
            )
            .with_leases(leases)
        };
        let pods = [pod(), pod()];
        Self {
            pods,
            store,
            clock,
            offset,
        }
    }

    fn advance(&self, us: u64) {
        self.clock.advance(us);
        self.offset.fetch_add(us, Ordering::Relaxed);
    }

    fn calls(&self) -> u64 {
        self.store.calls.load(Ordering::Relaxed)
    }

    /// One check on pod `pod`, then the takes it started land; the deciding figures.
    async fn check(&self, pod: usize) -> Decision {
        let verdict = self.pods[pod].check(&request()).await.expect("valid");
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let deciding = verdict.deciding().expect("a policy applies");
        assert_eq!(
            deciding.decision.allowed,
            verdict.outcome == Outcome::Allowed
        );
        deciding.decision
    }
}

fn policies(policy: &str) -> PolicySet {
    parse_policies(Path::new("t.yaml"), &format!("policies:\n  - {policy}\n")).expect("valid")
}

fn request() -> CheckRequest {
    CheckRequest {
        policy: Some("hot".into()),
        descriptors: [("user".to_owned(), "mallory".to_owned())]
            .into_iter()
            .collect(),
        cost: 1,
        spend: Spend::Record,
    }
}

fn lease_denials(pod: &CheckService) -> u64 {
    pod.metrics
        .registry()
        .gather()
        .iter()
        .filter(|family| family.name() == "sluice_lease_denials_total")
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value() as u64)
        .sum()
}

/// What a run saw: admissions per pod over the whole run; checks and store calls after the
/// warm-up.
struct Run {
    admitted: [u64; 2],
    checks: u64,
    calls: u64,
}

impl Run {
    fn total(&self) -> u64 {
        self.admitted[0] + self.admitted[1]
    }
}

/// Demand at twice the refill (one check every 300 µs, the pods in turn) for `warmup` then
/// `seconds` more. `bound(elapsed_us)` is the most the fleet may have admitted by then: checked
/// after every check.
async fn hammer(fleet: &Fleet, warmup: u64, seconds: u64, bound: impl Fn(u64) -> u64) -> Run {
    let mut admitted = [0u64; 2];
    let warm = warmup * 1_000_000 / 300;
    let checks = (warmup + seconds) * 1_000_000 / 300;
    let mut calls_warm = fleet.calls();
    for i in 0..checks {
        if i == warm {
            calls_warm = fleet.calls();
        }
        fleet.advance(300);
        let pod = usize::try_from(i % 2).expect("0 or 1");
        let decision = fleet.check(pod).await;
        if decision.allowed {
            admitted[pod] += 1;
        } else {
            assert!(
                (1..=6_000_000).contains(&decision.retry_after_us),
                "a denial says when to retry: {decision:?}"
            );
        }
        let elapsed = (i + 1) * 300;
        let total = admitted[0] + admitted[1];
        assert!(
            total <= bound(elapsed),
            "{total} admitted after {elapsed} us, over {}",
            bound(elapsed)
        );
    }
    Run {
        admitted,
        checks: checks - warm,
        calls: fleet.calls() - calls_warm,
    }
}

#[tokio::test]
async fn a_bucket_over_its_limit_is_denied_locally_and_taken_in_blocks() {
    let fleet = Fleet::new(BUCKET, 1_000_000_000);
    let refill = |us: u64| us * 100_000 / 60_000_000;
    let run = hammer(&fleet, 2, 10, |us| 1_000 + refill(us)).await;
    let (total, denials) = (
        run.total(),
        lease_denials(&fleet.pods[0]) + lease_denials(&fleet.pods[1]),
    );
    println!(
        "bucket: {total} admitted ({:?}) in 12 s; after 2 s, {} checks cost {} store calls ({:.4} per check); \
         over the run {} calls (checks, takes, give-backs {:?}), {denials} lease denials",
        run.admitted,
        run.checks,
        run.calls,
        run.calls as f64 / run.checks as f64,
        fleet.calls(),
        fleet.store.kinds(),
    );
    assert!(
        run.calls * 100 <= run.checks,
        "{} store calls for {} checks",
        run.calls,
        run.checks
    );
    // The refill is admitted, not held back: at least 90% of burst and refill.
    let most = 1_000 + refill(12_000_000);
    assert!(total * 10 >= most * 9, "{total} admitted of {most}");
    // Shared between the pods (in the worst phase 2:1).
    assert!(
        run.admitted.iter().all(|&a| a * 3 >= total),
        "unfair: {:?}",
        run.admitted
    );
}

#[tokio::test]
async fn a_window_over_its_limit_is_denied_locally_until_it_ends() {
    // The store's clock starts as a window does (1,002 s: 167 windows of 6 s).
    let fleet = Fleet::new(WINDOW, 1_002_000_000);
    let windows = |us: u64| us / 6_000_000 + 1;
    let run = hammer(&fleet, 6, 12, |us| 10_000 * windows(us)).await;
    let total = run.total();
    println!(
        "window: {total} admitted ({:?}) in 18 s; after 6 s, {} checks cost {} store calls ({:.4} per check); \
         over the run {} calls (checks, takes, give-backs {:?})",
        run.admitted,
        run.checks,
        run.calls,
        run.calls as f64 / run.checks as f64,
        fleet.calls(),
        fleet.store.kinds(),
    );
    assert!(
        run.calls * 100 <= run.checks,
        "{} store calls for {} checks",
        run.calls,
        run.checks
    );
    // Three windows the demand exhausts halfway, each admitted whole (not held back).
    assert!(total >= 29_900, "{total} admitted");
}

#[tokio::test]
async fn a_reset_or_a_reload_ends_the_local_denials() {
    let fleet = Fleet::new(BUCKET, 1_000_000_000);
    hammer(&fleet, 0, 2, |us| 1_000 + us * 100_000 / 60_000_000).await;
    until_denied_here(&fleet).await;
    // Pod 0 resets the counter (and hears it); pod 1 has not heard yet.
    let query = CounterQuery {
        policy: "hot".into(),
        descriptors: request().descriptors,
        cost: 1,
    };
    fleet.pods[0]
        .reset_counter(&query, &"test")
        .await
        .expect("reset");
    fleet.advance(300);
    assert!(
        fleet.check(0).await.allowed,
        "the pod that reset admits at once"
    );
    // The other pod denies at most until its next block is due (1.25 x 150 ms), then takes from
    // the full counter.
    let mut waited = 0;
    while !fleet.check(1).await.allowed {
        fleet.advance(1_000);
        waited += 1;
        assert!(
            waited <= 190,
            "pod 1 still denies {waited} ms after the reset"
        );
    }
    // A reload that raises the limit: pod 0's local denials end at once.
    hammer(&fleet, 0, 2, |_| u64::MAX).await;
    until_denied_here(&fleet).await;
    let starved = lease_denials(&fleet.pods[0]);
    fleet.pods[0].replace_policies(policies(&BUCKET.replace("burst: 1000", "burst: 100000")));
    fleet.advance(300);
    let decision = fleet.check(0).await;
    assert_eq!(
        lease_denials(&fleet.pods[0]),
        starved,
        "denied here after the reload: {decision:?}"
    );
}

/// Checks on pod 0 (bounded) until one is denied by its leases.
async fn until_denied_here(fleet: &Fleet) {
    let before = lease_denials(&fleet.pods[0]);
    for _ in 0..1_000 {
        fleet.advance(300);
        fleet.check(0).await;
        if lease_denials(&fleet.pods[0]) > before {
            return;
        }
    }
    panic!("pod 0 never denied a check locally");
}

//! Quota leases in the check path, on the embedded store (which leases like Redis does): a lease
//! carries admissions, a reload that changes the policy retires it (given back; checks of the new
//! revision are decided by the counter as it is), a reset drops it, a lowered limit is never
//! exceeded, and what was not used goes back when idle.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::config::{parse_policies, LeaseSettings};
use crate::store::MemoryStore;

fn policies(limit: u64) -> PolicySet {
    let text = format!(
        "policies:\n  - {{name: api, key: [user], algorithm: fixed_window, limit: {limit}, period: 1h, lease: true}}\n"
    );
    parse_policies(Path::new("t.yaml"), &text).expect("valid")
}

fn settings() -> LeaseSettings {
    LeaseSettings {
        min_units: 2,
        idle: crate::config::HumanDuration(50_000),
        ..LeaseSettings::default()
    }
}

/// A service over an embedded store (as shared store) with leases, and the store.
fn leased(limit: u64) -> (CheckService, Arc<MemoryStore>) {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let store = Arc::new(MemoryStore::new(1_000, clock.clone(), None));
    let metrics = Metrics::new();
    let leases = Leases::new(store.clone(), settings(), metrics.registry()).expect("metrics");
    let local = LocalShare::new(Arc::new(MemoryStore::new(1_000, clock, None)), 1, 0);
    let service = CheckService::new(
        policies(limit),
        store.clone(),
        local,
        RequestLimits::default(),
        metrics,
    )
    .with_leases(leases);
    (service, store)
}

fn request(user: &str) -> CheckRequest {
    CheckRequest {
        policy: Some("api".into()),
        descriptors: [("user".to_owned(), user.to_owned())].into_iter().collect(),
        cost: 1,
        spend: Spend::Record,
    }
}

fn leased_checks(service: &CheckService) -> u64 {
    service
        .metrics
        .registry()
        .gather()
        .iter()
        .filter(|family| family.name() == "sluice_lease_checks_total")
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value() as u64)
        .sum()
}

/// Checks `n` requests, letting background takes land between them; the admissions.
async fn checks(service: &CheckService, user: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let verdict = service.check(&request(user)).await.expect("valid");
        admitted += usize::from(verdict.outcome == Outcome::Allowed);
        tokio::task::yield_now().await;
    }
    admitted
}

/// What the store's counter still has (a read: cost 0, nothing spent).
async fn store_remaining(store: &MemoryStore, service: &CheckService, user: &str) -> u64 {
    let mut checks = service
        .plan(&service.policies(), &request(user))
        .await
        .expect("plan")
        .checks;
    checks[0].cost = 0;
    store.check_now(&checks, crate::store::Spend::DryRun)[0].remaining
}

#[tokio::test]
async fn a_lease_carries_admissions_and_the_limit_holds() {
    let (service, _) = leased(100);
    let admitted = checks(&service, "ann", 150).await;
    assert_eq!(admitted, 100, "exactly the limit");
    assert!(
        leased_checks(&service) >= 50,
        "{} of 100 admissions from leases",
        leased_checks(&service)
    );
}

#[tokio::test]
async fn a_reload_that_lowers_the_limit_retires_the_lease() {
    let (service, store) = leased(1_000);
    let admitted = checks(&service, "bob", 60).await;
    assert_eq!(admitted, 60);
    assert!(leased_checks(&service) > 0, "a lease was in use");
    // Lowered below what was admitted: nothing more passes, whatever this pod still held.
    service.replace_policies(policies(50));
    assert_eq!(checks(&service, "bob", 20).await, 0);
    // Raised to 80: the lease of the old revision went back, so exactly 20 more.
    service.replace_policies(policies(80));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(checks(&service, "bob", 40).await, 20);
    assert_eq!(store_remaining(&store, &service, "bob").await, 0);
}

#[tokio::test]
async fn an_idle_lease_goes_back_and_a_reset_drops_it() {
    let (service, store) = leased(1_000);
    let stop = tokio_util::sync::CancellationToken::new();
    let sweeper = tokio::spawn(
        service
            .leases()
            .expect("leases")
            .clone()
            .run_sweeper(stop.clone()),
    );
    assert_eq!(checks(&service, "cy", 40).await, 40);
    assert!(
        store_remaining(&store, &service, "cy").await < 960,
        "a lease is held"
    );
    // Idle (50 ms): given back; the counter then shows exactly what was admitted.
    let mut waited = 0;
    while store_remaining(&store, &service, "cy").await != 960 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(store_remaining(&store, &service, "cy").await, 960);
    // A reset forgets the counter and this pod's lease with it.
    assert_eq!(checks(&service, "cy", 40).await, 40);
    let key = service
        .plan(&service.policies(), &request("cy"))
        .await
        .expect("plan")
        .checks[0]
        .key
        .clone();
    service.leases().expect("leases").forget(&key);
    store.reset_now(&key);
    assert_eq!(store_remaining(&store, &service, "cy").await, 1_000);
    stop.cancel();
    sweeper.await.expect("sweeper");
}

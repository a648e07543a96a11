//! A give-back lands only on the counter its units were taken from, on the embedded store and
//! on Redis alike: a lease of 60 on a fixed window of 100, the counter reset (an operator's
//! `DELETE /v1/counters`) or lost (Redis restarted without persistence), 100 admitted on the
//! fresh counter, then the lease's honest give-back of its 60 unused units: none of them may
//! land, or 160 would be admitted on a limit of 100.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::ManualClock;
use sluice::config::RedisTarget;
use sluice::limit::{Algorithm, FixedWindow, Key};
use sluice::store::{MemoryStore, RateStore, Spend, StoreCheck};

use super::generation::{connected, store};
use crate::redis_server::RedisServer;

const HOUR: u64 = 3_600_000_000;
const LIMIT: u64 = 100;
const LEASED: u64 = 60;

fn check(cost: u64) -> StoreCheck {
    StoreCheck {
        key: Key::new(Arc::from("epoch"), ["k"]),
        algorithm: Algorithm::FixedWindow(FixedWindow::new(LIMIT, HOUR).expect("valid")),
        cost,
        enforce: true,
        generation: 0,
    }
}

/// Checks of 1 unit admitted, out of `tries`.
async fn admitted(store: &dyn RateStore, tries: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..tries {
        let decisions = store
            .check(&[check(1)], Spend::Record, None)
            .await
            .expect("the store answers");
        admitted += u64::from(decisions[0].allowed);
    }
    admitted
}

/// Takes a lease of 60, runs `lose` (which makes the counter another one), admits the fresh
/// counter's 100, gives the 60 back: none lands, and nothing more is admitted.
async fn give_back_after(store: &dyn RateStore, lose: impl std::future::Future<Output = ()>) {
    let grant = store
        .take(&check(LEASED), 1, None)
        .await
        .expect("the store answers")
        .expect("a fixed window leases");
    assert_eq!(grant.units, LEASED);
    assert!(
        grant.epoch > 0,
        "a grant of units names its counter's epoch"
    );
    lose.await;
    assert_eq!(
        admitted(store, LIMIT + 10).await,
        LIMIT,
        "the fresh counter's limit"
    );
    let back = store
        .give_back(&check(LEASED), LEASED, grant, None)
        .await
        .expect("the store answers");
    assert_eq!(back, 0, "the units go back to no counter but their own");
    assert_eq!(
        admitted(store, 10).await,
        0,
        "never {} on {LIMIT}",
        LIMIT + back
    );
}

/// Without a reset the units go back to the counter they came from; after one, nowhere.
async fn reset_case(store: &dyn RateStore) {
    let grant = store.take(&check(LEASED), 1, None).await.unwrap().unwrap();
    assert_eq!(
        store
            .give_back(&check(LEASED), 10, grant, None)
            .await
            .unwrap(),
        10
    );
    store.reset(&check(1).key).await.expect("reset");
    let reset = async {
        store.reset(&check(1).key).await.expect("reset");
    };
    give_back_after(store, reset).await;
}

#[tokio::test]
async fn a_give_back_after_a_reset_lands_nowhere_on_the_embedded_store() {
    let store = MemoryStore::new(1_000, Arc::new(ManualClock::new(HOUR * 1_000)), None);
    reset_case(&store).await;
}

#[tokio::test]
async fn a_give_back_after_a_reset_lands_nowhere_on_redis() {
    let server = RedisServer::start();
    let store = store(RedisTarget::Single(server.url()));
    connected(&store).await;
    reset_case(&store).await;
}

#[tokio::test]
async fn a_give_back_after_redis_lost_its_data_lands_nowhere() {
    let mut server = RedisServer::start();
    let store = store(RedisTarget::Single(server.url()));
    connected(&store).await;
    let restart = async {
        // `kill -9` and a start with no data, as a restart without persistence.
        server.restart();
        let started = Instant::now();
        while admitted_dry(&store).await.is_none() {
            assert!(started.elapsed() < Duration::from_secs(20), "Redis is back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    give_back_after(&store, restart).await;
}

/// A dry run's answer, once the store answers again after a restart.
async fn admitted_dry(store: &dyn RateStore) -> Option<bool> {
    let decisions = store.check(&[check(1)], Spend::DryRun, None).await.ok()?;
    Some(decisions[0].allowed)
}

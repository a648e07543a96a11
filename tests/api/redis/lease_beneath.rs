//! A token bucket's give-back never moves the bucket's TAT back beneath units another holder
//! took later (issue 47, the transition simulator's suspicion), on the embedded store and on
//! Redis alike.
//!
//! A token-bucket grant taken behind others' debt does not start to shrink until that debt has
//! refilled (its `hold`): its units sit in the bucket after the earlier holders' units. If an
//! earlier holder gave its unused units back by moving the TAT back beneath them, the later
//! grant's units would be counted earlier than their holder assumes, the bucket would hand the
//! same stretch of refill to a third holder, and at the instant before the later grant starts
//! to shrink both could admit on top of what refilled meanwhile: with a burst of 10, holders A
//! and B taking 5 each, A giving its 5 back, C taking the 5 that makes free, then 0.4 s later
//! (4 units refilled) B's 5 + C's 5 + 4 fresh = 14 admitted at one instant, where the bucket
//! allows at most its burst of 10. So a token bucket's give-back lands only while its grant is
//! the counter's latest take (each take makes the counter's lease epoch afresh): A's 5 are
//! lost to the refill (under-admission), never admitted twice.

use std::sync::Arc;
use std::time::Duration;

use sluice::clock::{Clock, ManualClock};
use sluice::config::RedisTarget;
use sluice::limit::{bucket_lease_shrunk, Algorithm, Grant, Key, TokenBucket};
use sluice::store::{MemoryStore, RateStore, StoreCheck};

use super::generation::{connected, store};
use crate::redis_server::RedisServer;

/// 10 a second (a unit every 100 ms), burst 10.
const LIMIT: u64 = 10;
const PERIOD_US: u64 = 1_000_000;
const BURST: u64 = 10;
/// How long after the takes the units are admitted: before B's hold (500 ms) ends.
const LATER_US: u64 = 400_000;

fn bucket() -> TokenBucket {
    TokenBucket::new(LIMIT, PERIOD_US, BURST).expect("valid")
}

fn check(cost: u64) -> StoreCheck {
    StoreCheck {
        key: Key::new(Arc::from("beneath"), ["k"]),
        algorithm: Algorithm::TokenBucket(bucket()),
        cost,
        enforce: true,
        generation: 0,
    }
}

async fn take(store: &dyn RateStore, want: u64) -> Grant {
    store
        .take(&check(want), 1, None)
        .await
        .expect("the store answers")
        .expect("a token bucket leases")
}

/// What a holder of `grant` may still admit `elapsed_us` after its take.
fn holdable(grant: &Grant, elapsed_us: u64) -> u64 {
    grant.units - bucket_lease_shrunk(&bucket(), grant.hold_us, elapsed_us, grant.units)
}

/// A and B take 5 each, A gives its 5 back, C takes what is free, `pass` lets 400 ms go by,
/// D takes what refilled: B's, C's and D's units, admissible at that one instant, are at most
/// the burst.
async fn case(store: &dyn RateStore, pass: impl std::future::Future<Output = ()>) {
    let a = take(store, 5).await;
    let b = take(store, 5).await;
    assert_eq!(
        (a.units, b.units),
        (5, 5),
        "a full bucket of 10: {a:?} {b:?}"
    );
    assert!(b.hold_us >= 400_000, "B waits behind A's 5: {b:?}");
    let back = store
        .give_back(&check(5), 5, a, None)
        .await
        .expect("the store answers");
    let c = take(store, BURST).await;
    pass.await;
    let d = take(store, BURST).await;
    let elapsed = d.at_us - b.at_us;
    assert!(elapsed < b.hold_us, "still within B's hold: {elapsed} µs");
    let at_once = holdable(&b, d.at_us - b.at_us) + holdable(&c, d.at_us - c.at_us) + d.units;
    assert!(
        at_once <= BURST,
        "{at_once} admissible at one instant on a burst of {BURST}: A gave {back} back beneath \
         B's units, C took {} and D {} (B {b:?}, C {c:?})",
        c.units,
        d.units
    );
}

#[tokio::test]
async fn a_give_back_never_lands_beneath_a_later_take_on_the_embedded_store() {
    let clock = Arc::new(ManualClock::new(PERIOD_US * 1_000_000));
    let store = MemoryStore::new(1_000, clock.clone() as Arc<dyn Clock>, None);
    let pass = async { clock.advance(LATER_US) };
    case(&store, pass).await;
}

#[tokio::test]
async fn a_give_back_never_lands_beneath_a_later_take_on_redis() {
    let server = RedisServer::start();
    let store = store(RedisTarget::Single(server.url()));
    connected(&store).await;
    // Redis reads its own clock: the 400 ms pass for real (B's hold is 500 ms).
    case(&store, tokio::time::sleep(Duration::from_micros(LATER_US))).await;
}

/// The latest take's own give-back still lands (a holder alone keeps its give-backs).
#[tokio::test]
async fn the_latest_take_gives_back_on_both_stores() {
    let clock = Arc::new(ManualClock::new(PERIOD_US * 1_000_000));
    let memory = MemoryStore::new(1_000, clock as Arc<dyn Clock>, None);
    let server = RedisServer::start();
    let redis = store(RedisTarget::Single(server.url()));
    connected(&redis).await;
    for store in [&memory as &dyn RateStore, &redis] {
        let _first = take(store, 3).await;
        let latest = take(store, 5).await;
        let back = store
            .give_back(&check(5), 5, latest, None)
            .await
            .expect("the store answers");
        assert!(back >= 4, "the latest take's unused units go back: {back}");
    }
}

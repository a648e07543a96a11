//! Leases against a store whose take answers late: the lease simulator
//! (`tests/api/redis/lease_changes.rs`) meets this only by chance, so it is pinned here.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::Semaphore;

use super::*;
use crate::clock::ManualClock;
use crate::limit::FixedWindow;
use crate::store::{LeaseFuture, MemoryStore, ResetFuture, Spend, StoreFuture};

/// The embedded store, except that a take's answer waits for a permit after the take ran: a
/// reply still on its way while the counter is reset.
struct LateTakes {
    inner: MemoryStore,
    replies: Semaphore,
}

impl RateStore for LateTakes {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: Spend,
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        self.inner.check(checks, spend, deadline)
    }

    fn spend<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        self.inner.spend(checks, deadline)
    }

    fn take<'a>(
        &'a self,
        check: &'a StoreCheck,
        fraction: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Option<Grant>> {
        Box::pin(async move {
            let grant = self.inner.take(check, fraction, deadline).await;
            let _permit = self.replies.acquire().await;
            grant
        })
    }

    fn give_back<'a>(
        &'a self,
        check: &'a StoreCheck,
        unused: u64,
        grant: Grant,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, u64> {
        self.inner.give_back(check, unused, grant, deadline)
    }

    fn reset<'a>(&'a self, key: &'a Key) -> ResetFuture<'a> {
        self.inner.reset(key)
    }

    fn name(&self) -> &'static str {
        "late takes"
    }
}

/// Lets the lease's background tasks run (a bounded number of turns).
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_take_answered_after_a_reset_of_its_counter_is_not_admitted_from() {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let store = Arc::new(LateTakes {
        inner: MemoryStore::new(1_000, clock, None),
        replies: Semaphore::new(0),
    });
    let settings = LeaseSettings {
        min_units: 1,
        ..LeaseSettings::default()
    };
    let leases = Leases::new(store.clone(), settings, &Registry::new()).expect("metrics");
    let window: Algorithm = FixedWindow::new(100, 3_600_000_000).expect("valid").into();
    let check = StoreCheck {
        key: Key::new("p".into(), ["u"]),
        algorithm: window,
        cost: 1,
        enforce: true,
        generation: 1,
    };
    let one = std::slice::from_ref(&check);
    // No lease yet: the store decides, and a take starts; it runs at the counter.
    assert!(leases.admit(one).is_none());
    settle().await;
    let left = store
        .inner
        .check(one, Spend::DryRun, None)
        .await
        .expect("check");
    assert!(left[0].remaining < 100, "the take ran: {left:?}");
    // The counter is reset (this pod forgets its lease of it) before the take's reply is in.
    store.reset(&check.key).await.expect("reset");
    leases.forget(&check.key);
    store.replies.add_permits(1);
    settle().await;
    // The units came from the counter the reset forgot: admitting them would add to a full
    // quota. They are dropped (a take that follows runs on the new counter, answered late).
    assert!(
        leases.admit(one).is_none(),
        "admitted from a lease taken before the reset"
    );
}

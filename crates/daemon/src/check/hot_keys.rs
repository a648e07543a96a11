//! The local layer: partitions the store recently denied, remembered until the instant the same
//! request could pass again, so that a client hammering far over its limit is answered here
//! instead of costing Redis a script call each time.
//!
//! Correctness first: it only ever denies, and only what the store would deny. A denial of cost
//! `c` with retry-after `r` means no request of cost `>= c` can pass before `r` has elapsed
//! (other pods only spend more), so it is remembered for that long, measured from before the
//! store was asked, and applies to requests of cost `>= c` only.

use std::time::{Duration, Instant};

use moka::sync::Cache;

use crate::limit::{Decision, Key, NEVER};

#[derive(Clone)]
struct Denial {
    until: Instant,
    cost: u64,
    decision: Decision,
}

struct UntilRetry;

impl moka::Expiry<Key, Denial> for UntilRetry {
    fn expire_after_create(
        &self,
        _: &Key,
        denial: &Denial,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(denial.until.saturating_duration_since(created_at))
    }
}

/// Recent denials, bounded in size. Clones share the same memory (the Redis reset feed forgets
/// through one).
#[derive(Clone)]
pub struct HotKeys {
    cache: Cache<Key, Denial>,
}

impl HotKeys {
    /// Remembers at most `capacity` partitions.
    pub fn new(capacity: u64) -> Self {
        Self {
            cache: Cache::builder()
                .max_capacity(capacity)
                .expire_after(UntilRetry)
                .build(),
        }
    }

    /// The store answered `decision` for `cost` on `key`; `asked` is when the store was asked.
    /// A denial is remembered; an allowance forgets what was remembered of the key, whose figures
    /// are then stale (this pod may just have spent there): the next check asks the store.
    pub fn remember(&self, key: &Key, cost: u64, decision: &Decision, asked: Instant) {
        self.remember_for(key, cost, decision, asked, None);
    }

    /// As [`HotKeys::remember`], for at most `at_most` (a leased policy: units other pods hold
    /// come back when their leases go idle, so its denial is asked again by then).
    pub fn remember_for(
        &self,
        key: &Key,
        cost: u64,
        decision: &Decision,
        asked: Instant,
        at_most: Option<Duration>,
    ) {
        if decision.allowed {
            if self.cache.contains_key(key) {
                self.cache.invalidate(key);
            }
            return;
        }
        if decision.retry_after_us == 0 || decision.retry_after_us == NEVER {
            return;
        }
        let wait = Duration::from_micros(decision.retry_after_us);
        let until = asked + at_most.map_or(wait, |most| wait.min(most));
        self.cache.insert(
            key.clone(),
            Denial {
                until,
                cost,
                decision: *decision,
            },
        );
    }

    /// A denial for `cost` on `key` that the store would give too, if one is remembered.
    pub fn denial(&self, key: &Key, cost: u64, now: Instant) -> Option<Decision> {
        let denial = self.cache.get(key)?;
        if now >= denial.until || cost < denial.cost {
            return None;
        }
        let left = denial.until - now;
        let elapsed = denial.decision.retry_after_us.saturating_sub(micros(left));
        Some(Decision {
            retry_after_us: micros(left).max(1),
            reset_after_us: denial.decision.reset_after_us.saturating_sub(elapsed),
            ..denial.decision
        })
    }

    /// Forgets `key`'s denial (its counter was reset, here or on another pod).
    pub fn forget(&self, key: &Key) {
        self.cache.invalidate(key);
    }

    /// Forgets everything (the policies changed, or resets may have been missed).
    pub fn clear(&self) {
        self.cache.invalidate_all();
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn denied(retry_after_us: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_after_us: 5_000_000,
            retry_after_us,
        }
    }

    #[test]
    fn remembers_until_the_retry_instant_and_only_for_costs_as_large() {
        let hot = HotKeys::new(100);
        let key = Key::new(Arc::from("p"), ["k"]);
        let asked = Instant::now();
        hot.remember(&key, 2, &denied(1_000_000), asked);
        let half = asked + Duration::from_millis(500);
        let local = hot.denial(&key, 2, half).expect("still denied");
        assert!(!local.allowed);
        assert_eq!(local.retry_after_us, 500_000);
        assert_eq!(local.reset_after_us, 4_500_000);
        assert!(
            hot.denial(&key, 1, half).is_none(),
            "a smaller cost may pass: ask the store"
        );
        assert!(
            hot.denial(&key, 2, asked + Duration::from_secs(1))
                .is_none(),
            "retry instant reached"
        );
    }

    #[test]
    fn a_forgotten_key_is_asked_of_the_store_again_and_others_stay() {
        let hot = HotKeys::new(100);
        let (a, b) = (
            Key::new(Arc::from("p"), ["a"]),
            Key::new(Arc::from("p"), ["b"]),
        );
        let asked = Instant::now();
        hot.remember(&a, 1, &denied(1_000_000), asked);
        hot.remember(&b, 1, &denied(1_000_000), asked);
        hot.clone().forget(&a);
        assert!(
            hot.denial(&a, 1, asked).is_none(),
            "a clone forgets for all"
        );
        assert!(hot.denial(&b, 1, asked).is_some());
    }

    #[test]
    fn an_allowance_forgets_the_remembered_denial() {
        let hot = HotKeys::new(10);
        let key = Key::new("p".into(), ["a"]);
        let now = Instant::now();
        hot.remember(&key, 2, &denied(60_000_000), now);
        assert!(hot.denial(&key, 2, now).is_some());
        let allowed = Decision {
            allowed: true,
            ..denied(0)
        };
        hot.remember(&key, 1, &allowed, now);
        assert!(
            hot.denial(&key, 2, now).is_none(),
            "stale figures are not answered"
        );
    }

    #[test]
    fn allowed_and_never_admissible_are_not_remembered() {
        let hot = HotKeys::new(100);
        let key = Key::new(Arc::from("p"), ["k"]);
        let now = Instant::now();
        hot.remember(
            &key,
            1,
            &Decision {
                allowed: true,
                ..denied(0)
            },
            now,
        );
        hot.remember(&key, 1, &denied(NEVER), now);
        assert!(hot.denial(&key, 1, now).is_none());
    }
}

//! The embedded store's permits (concurrency limits): [`RateStore::acquire`] and
//! [`RateStore::release`] on a partition's [`PermitState`], under its shard's lock, on the
//! store's clock.
//!
//! [`RateStore::acquire`]: crate::store::RateStore::acquire
//! [`RateStore::release`]: crate::store::RateStore::release

use super::MemoryStore;
use crate::limit::{Algorithm, Key, PermitState, State};
use crate::store::{Acquired, Released, Spend, StoreCheck};

impl MemoryStore {
    /// The synchronous core of [`RateStore::acquire`](crate::store::RateStore::acquire): a
    /// check of an older policy set than the counter's gets its superseded answer, a check of
    /// another algorithm than a concurrency limit its ordinary decision (nothing taken).
    pub fn acquire_now(&self, check: &StoreCheck, permit: u128, spend: Spend) -> Acquired {
        let now = self.clock.now_us();
        let mut shard = self.lock(self.shard_of(&check.key));
        let slot = shard.slots.get(&check.key);
        if slot.is_some_and(|slot| slot.supersedes(check)) {
            return Acquired {
                decision: check.algorithm.superseded(),
                expired: 0,
            };
        }
        let Algorithm::Concurrency(limit) = check.algorithm else {
            let fresh = check.algorithm.new_state();
            let state = slot
                .filter(|s| s.idle_at > now)
                .map_or(&fresh, |s| &s.state);
            return Acquired {
                decision: check.algorithm.decide(state, now, check.cost),
                expired: 0,
            };
        };
        if spend == Spend::DryRun {
            let held = match slot.map(|slot| &slot.state) {
                Some(State::Permits(permits)) => permits.clone(),
                _ => PermitState::default(),
            };
            let expired = held.permits.iter().filter(|(e, _)| *e <= now).count();
            return Acquired {
                decision: limit.decide(&held, now, 1),
                expired: expired as u64,
            };
        }
        self.update(&mut shard, check, now, |_, state| {
            if let State::Permits(permits) = state {
                let expired = permits.expire(now) as u64;
                return Acquired {
                    decision: limit.acquire(permits, now, permit),
                    expired,
                };
            }
            // Another algorithm's state (the policy changed): the partition starts afresh.
            let mut permits = PermitState::default();
            let decision = limit.acquire(&mut permits, now, permit);
            *state = State::Permits(permits);
            Acquired {
                decision,
                expired: 0,
            }
        })
    }

    /// The synchronous core of [`RateStore::release`](crate::store::RateStore::release).
    pub fn release_now(&self, key: &Key, permit: u128) -> Released {
        let now = self.clock.now_us();
        let mut shard = self.lock(self.shard_of(key));
        let Some(slot) = shard.slots.get_mut(key) else {
            return Released {
                released: false,
                expired: 0,
            };
        };
        let State::Permits(permits) = &mut slot.state else {
            return Released {
                released: false,
                expired: 0,
            };
        };
        let expired = permits.expire(now) as u64;
        let released = permits.release(now, permit);
        // Never later than before: the slot's bytes only shrink, the budget holds.
        slot.idle_at = permits.idle_at();
        Released { released, expired }
    }
}

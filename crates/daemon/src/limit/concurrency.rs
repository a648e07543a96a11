//! Concurrency limits: at most `limit` requests in flight per partition. Each admitted request
//! holds a permit (a random id) until it is released or its time to live ends; a permit nobody
//! releases (its holder crashed) returns by itself. The twin of `lua/concurrency.lua`, which
//! keeps the same permits in a sorted set scored by their expiry on Redis' clock.
//!
//! A permit is one request in flight, whatever the request's cost: the cost spends the other
//! policies a request matches (a token budget beside its concurrency), never more than one slot
//! here.

use super::{check_rate, Decision, Micros, ParamError};

/// A concurrency limit: `limit` permits at once, each held at most `ttl_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    limit: u64,
    ttl_us: Micros,
}

/// The permits a partition holds: `(expires_at_us, id)`, in no particular order. A permit is
/// held while `now < expires_at_us`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermitState {
    /// Held (and, until the next change, expired) permits.
    pub permits: Vec<(Micros, u128)>,
}

impl PermitState {
    /// Drops the permits expired at `now`; how many were dropped.
    pub fn expire(&mut self, now: Micros) -> usize {
        let before = self.permits.len();
        self.permits.retain(|&(expires, _)| expires > now);
        before - self.permits.len()
    }

    /// Returns permit `id`'s slot at `now` (expired permits dropped first): whether it was
    /// still held. Needs no limit: a release finds its permit whatever the policy says now.
    pub fn release(&mut self, now: Micros, id: u128) -> bool {
        self.expire(now);
        match self.permits.iter().position(|&(_, held)| held == id) {
            Some(at) => {
                self.permits.swap_remove(at);
                true
            }
            None => false,
        }
    }

    /// When every permit has expired.
    pub fn idle_at(&self) -> Micros {
        self.permits.iter().map(|&(e, _)| e).max().unwrap_or(0)
    }

    fn live(&self, now: Micros) -> impl Iterator<Item = Micros> + '_ {
        self.permits
            .iter()
            .map(|&(expires, _)| expires)
            .filter(move |&expires| expires > now)
    }
}

impl Concurrency {
    /// At most `limit` permits at once, each held at most `ttl_us` unless released.
    pub fn new(limit: u64, ttl_us: Micros) -> Result<Self, ParamError> {
        check_rate(limit, ttl_us)?;
        Ok(Self { limit, ttl_us })
    }

    /// The most permits held at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a permit is held unless released.
    pub fn ttl_us(&self) -> Micros {
        self.ttl_us
    }

    /// Whether one more permit may be taken at `now` (the cost is not a number of slots: see
    /// the module's doc); nothing changes. Denied: retry when the earliest permit expires. A
    /// cost of 0 is a read (`/v1/counters`): see [`Concurrency::as_read`].
    pub fn decide(&self, state: &PermitState, now: Micros, cost: u64) -> Decision {
        let one = self.decide_one(state, now);
        if cost == 0 {
            Self::as_read(one)
        } else {
            one
        }
    }

    /// A read of the slots free now (a check of cost 0), from the decision on taking one:
    /// always allowed, `remaining` the slots free before taking one; the other figures as
    /// they were. The Redis store turns its script's answer into a read the same way.
    pub fn as_read(one: Decision) -> Decision {
        Decision {
            allowed: true,
            remaining: if one.allowed { one.remaining + 1 } else { 0 },
            retry_after_us: 0,
            ..one
        }
    }

    fn decide_one(&self, state: &PermitState, now: Micros) -> Decision {
        let held = state.live(now).count() as u64;
        let last = state.live(now).max().map_or(0, |e| e - now);
        if held < self.limit {
            // After the admission: one more held, and the full set back at the latest expiry.
            Decision::allow(self.limit, self.limit - held - 1, last.max(self.ttl_us))
        } else {
            let first = state.live(now).min().map_or(1, |e| e - now);
            Decision::deny(self.limit, 0, last, first)
        }
    }

    /// Takes permit `id` at `now` if [`Concurrency::decide`] allows it (expired permits are
    /// dropped first); the decision either way.
    pub fn acquire(&self, state: &mut PermitState, now: Micros, id: u128) -> Decision {
        state.expire(now);
        let decision = self.decide(state, now, 1);
        if decision.allowed {
            state.permits.push((now.saturating_add(self.ttl_us), id));
        }
        decision
    }

    /// Records an admission [`Concurrency::decide`] allowed without an id to release it by (a
    /// path with no release: it is held for its whole time to live).
    pub fn admit(&self, state: &mut PermitState, now: Micros) {
        self.acquire(state, now, 0);
    }

    /// Returns permit `id`'s slot at `now`: whether it was still held (false for one released
    /// already, expired or never taken). See [`PermitState::release`].
    pub fn release(&self, state: &mut PermitState, now: Micros, id: u128) -> bool {
        state.release(now, id)
    }

    /// When every permit has expired (the state is then a fresh one).
    pub fn idle_at(&self, state: &PermitState) -> Micros {
        state.idle_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Concurrency {
        Concurrency::new(3, 1_000).expect("valid")
    }

    #[test]
    fn at_most_limit_held_and_the_denial_waits_for_the_earliest_expiry() {
        let c = three();
        let mut s = PermitState::default();
        for (at, id) in [(0, 1), (100, 2), (250, 3)] {
            let d = c.acquire(&mut s, at, id);
            assert!(d.allowed, "{id}");
        }
        let denied = c.acquire(&mut s, 400, 4);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        // Permit 1 expires at 1_000: at 1_000 one passes, at 999 none does.
        assert_eq!(denied.retry_after_us, 600);
        assert!(!c.acquire(&mut s, 999, 5).allowed);
        assert!(c.acquire(&mut s, 1_000, 6).allowed);
        assert_eq!(s.permits.len(), 3);
    }

    #[test]
    fn release_returns_the_slot_once() {
        let c = three();
        let mut s = PermitState::default();
        for id in 1..=3 {
            assert!(c.acquire(&mut s, 10, id).allowed);
        }
        assert!(!c.decide(&s, 20, 1).allowed);
        assert!(c.release(&mut s, 20, 2));
        assert!(
            !c.release(&mut s, 21, 2),
            "a second release changes nothing"
        );
        assert!(
            !c.release(&mut s, 21, 99),
            "an id never taken releases nothing"
        );
        let d = c.acquire(&mut s, 22, 7);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(!c.acquire(&mut s, 23, 8).allowed);
    }

    #[test]
    fn an_unreleased_permit_returns_by_itself_and_releases_as_false() {
        let c = three();
        let mut s = PermitState::default();
        assert!(c.acquire(&mut s, 0, 1).allowed);
        assert_eq!(c.idle_at(&s), 1_000);
        assert_eq!(c.decide(&s, 999, 1).remaining, 1);
        assert_eq!(c.decide(&s, 1_000, 1).remaining, 2);
        assert!(
            !c.release(&mut s, 1_000, 1),
            "expired: nothing to give back"
        );
        assert!(s.permits.is_empty());
    }

    #[test]
    fn figures_are_counted_after_the_admission() {
        let c = three();
        let mut s = PermitState::default();
        let first = c.acquire(&mut s, 0, 1);
        assert_eq!(
            (first.limit, first.remaining, first.reset_after_us),
            (3, 2, 1_000)
        );
        let second = c.acquire(&mut s, 500, 2);
        assert_eq!((second.remaining, second.reset_after_us), (1, 1_000));
        // The cost never takes more than one slot.
        assert_eq!(c.decide(&s, 600, 50).remaining, 0);
        assert!(c.decide(&s, 600, 50).allowed);
    }

    #[test]
    fn time_going_backwards_never_panics() {
        let c = three();
        let mut s = PermitState::default();
        assert!(c.acquire(&mut s, 5_000, 1).allowed);
        let d = c.acquire(&mut s, 10, 2);
        assert!(d.allowed);
        assert!(c.release(&mut s, 0, 1));
    }
}

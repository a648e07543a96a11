//! Quota leases, pure: a block of units taken from a counter in one step (spent there before a
//! single one is admitted), and the unused part given back. The twin of `lua/lease.lua`.
//!
//! A lease only moves where units are counted; the fleet never admits more than the counter
//! allows, provided the holder keeps to the grant's terms ([`Grant`]):
//! - **fixed window**: the units belong to the window they were taken in and may be admitted
//!   only until that window ends (`hold_us` from the store's `now`);
//! - **token bucket**: the units may be admitted at any time, but the lease shrinks at the
//!   bucket's refill rate (one unit per `period / limit`) from `hold_us` after the take on: the
//!   instant the bucket, draining first-in first-out, starts refilling the leased units. A unit
//!   admitted before it would have refilled is exactly a unit the bucket still counts as spent,
//!   so the admissions, at their real times, conform to the bucket (see docs/policies.md);
//!   what shrank was refilled by the bucket itself and is not lost.
//! - a **sliding log** is never leased: it records each admission's instant, and a unit taken
//!   now but admitted later would leave the window a period after the take, not after the
//!   admission.
//!
//! How much is granted is decided at the counter, so that pods racing for the last units get
//! none: at most `want`, and at most `1/fraction` of what the counter has left. Near the limit
//! that is 0 and every check is decided at the counter, exactly as without leases.

use super::{Algorithm, BucketState, Decision, Micros, State};

/// What a take got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Units taken (spent at the counter) for the holder to admit; 0: none, decide per check.
    pub units: u64,
    /// The counter's figures after the take: `remaining` is what is left for everyone else.
    /// With no units granted, the answer to a check of 1 unit (which may be a denial).
    pub decision: Decision,
    /// A fixed window: the number of the window the units belong to (`now / period` at the
    /// counter), which a give-back names. 0 for a token bucket.
    pub window: u64,
    /// A fixed window: µs from the counter's `now` to the end of the window (the units expire
    /// then). A token bucket: µs from the counter's `now` until the leased units start to
    /// refill, i.e. until the lease starts to shrink (rounded down).
    pub hold_us: Micros,
    /// The counter's `now` at the take (its clock: a give-back measures the shrink on it).
    pub at_us: Micros,
    /// The counter's lease epoch at the take, set by the store (0 here, and for no units): a
    /// counter gets a fresh one when it is created or reset (Redis: or loses its data), and a
    /// give-back lands only on a counter whose epoch is still this one, never on a counter
    /// that replaced the one the units were taken from.
    pub epoch: u64,
}

/// The units a token bucket lease of `units`, taken at the counter `hold_us` µs before it
/// starts to shrink, has lost to the refill `elapsed_us` after the take: one unit per
/// `period / limit` µs past `hold_us`, rounded up (a holder that counts from before the take,
/// with a clock that is not ahead, only ever loses more).
pub fn bucket_lease_shrunk(
    bucket: &super::TokenBucket,
    hold_us: Micros,
    elapsed_us: Micros,
    units: u64,
) -> u64 {
    let past = u128::from(elapsed_us.saturating_sub(hold_us));
    let shrunk = (past * u128::from(bucket.limit())).div_ceil(u128::from(bucket.period_us()));
    super::saturate(shrunk).min(units)
}

impl Algorithm {
    /// Whether this algorithm can be leased (a token bucket or a fixed window of a period: a
    /// calendar window's units would be kept by a window of fixed length; never a sliding log
    /// or a concurrency limit).
    pub fn leasable(&self) -> bool {
        match self {
            Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => false,
            Algorithm::FixedWindow(window) => window.calendar_of().is_none(),
            Algorithm::TokenBucket(_) => true,
        }
    }

    /// Takes up to `want` units at `now`, at most `1 / fraction` of what the counter has left
    /// (`fraction` at least 1), spending them in `state`. `fraction` 0 takes all or nothing (a
    /// reservation): `want` units if the counter has them, else none, and then the figures are
    /// those of a check of `want` (its denial). `None` for a sliding log; nothing granted (and
    /// nothing written) on another algorithm's state.
    pub fn take(&self, state: &mut State, now: Micros, want: u64, fraction: u64) -> Option<Grant> {
        let all_or_nothing = fraction == 0;
        if !self.leasable() {
            return None;
        }
        if matches!(state, State::Log(_)) {
            // A sliding log's set reads as absent, as in the scripts.
            *state = self.new_state();
        }
        if !matches!(
            (self, &*state),
            (Algorithm::TokenBucket(_), State::Bucket(_))
                | (Algorithm::FixedWindow(_), State::Window(_))
        ) {
            // The other leasable algorithm's live state (a reload switched algorithm; this take may have
            // been sent before it): never overwritten by a take, which grants nothing. The
            // checks of the new algorithm own the counter.
            let (window, hold_us) = match self {
                Algorithm::FixedWindow(a) => {
                    let period = a.period_us();
                    (now / period, period - now % period)
                }
                _ => (0, 0),
            };
            return Some(Grant {
                units: 0,
                decision: self.decide(
                    &self.new_state(),
                    now,
                    if all_or_nothing { want } else { 1 },
                ),
                window,
                hold_us,
                at_us: now,
                epoch: 0,
            });
        }
        let left = self.decide(state, now, 0);
        let available = if left.allowed { left.remaining } else { 0 };
        let units = if all_or_nothing {
            if want <= available {
                want
            } else {
                0
            }
        } else {
            want.min(available / fraction)
        };
        let (window, hold_us) = match (self, &*state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => (0, bucket_ahead_us(a, s, now)),
            (Algorithm::FixedWindow(a), _) => {
                let period = a.period_us();
                (now / period, period - now % period)
            }
            _ => return None,
        };
        let decision = if units == 0 {
            self.decide(state, now, if all_or_nothing { want } else { 1 })
        } else {
            let decision = self.decide(state, now, units);
            self.admit(state, now, units);
            decision
        };
        Some(Grant {
            units,
            decision,
            window,
            hold_us,
            at_us: now,
            epoch: 0,
        })
    }

    /// Gives back what is left of `grant` at `now`, of which `unused` units were not admitted:
    /// for a fixed window all of them if the counter still counts the grant's window; for a
    /// token bucket what the lease has not lost to the refill by `now`, exactly (a fraction of
    /// a token included; measured on the counter's clock from the grant's `at_us`, so a late
    /// give-back returns less, never too much), the TAT moving back by its refill time (never
    /// before `now`: a bucket is never more than full). A state of another algorithm (the
    /// policy changed) is left alone. Returns the whole units given back; the counter then
    /// reads as if they had never been taken.
    pub fn give_back(&self, state: &mut State, now: Micros, unused: u64, grant: &Grant) -> u64 {
        match (self, state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => {
                // What the lease still holds, exactly (in 1/limit µs, a fraction of a token
                // included): its unused tokens less the refill since it started to shrink.
                let l = u128::from(a.limit());
                let p = u128::from(a.period_us());
                let past =
                    u128::from(now.saturating_sub(grant.at_us.saturating_add(grant.hold_us)));
                let held = u128::from(unused.min(grant.units)) * p;
                let back = held.saturating_sub(past * l);
                let tat = u128::from(s.tat_us) * l + u128::from(s.tat_rem);
                let now_s = u128::from(now) * l;
                let ahead = tat.saturating_sub(now_s);
                if back == 0 || ahead == 0 {
                    return 0;
                }
                let new = now_s + ahead.saturating_sub(back);
                *s = BucketState {
                    tat_us: super::saturate(new / l),
                    tat_rem: super::saturate(new % l),
                };
                super::saturate(back / p)
            }
            (Algorithm::FixedWindow(a), State::Window(s))
                if s.window == grant.window && now / a.period_us() == grant.window =>
            {
                let back = unused.min(grant.units).min(s.count);
                s.count -= back;
                back
            }
            _ => 0,
        }
    }
}

/// How far the bucket's TAT is past `now`, in whole µs (rounded down).
fn bucket_ahead_us(bucket: &super::TokenBucket, state: &BucketState, now: Micros) -> Micros {
    let l = u128::from(bucket.limit());
    let tat = u128::from(state.tat_us) * l + u128::from(state.tat_rem);
    super::saturate(tat.saturating_sub(u128::from(now) * l) / l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{FixedWindow, SlidingLog, TokenBucket};

    #[test]
    fn a_take_is_capped_by_want_and_by_the_fraction_of_what_is_left() {
        let alg: Algorithm = FixedWindow::new(100, 1_000_000).unwrap().into();
        let mut state = alg.new_state();
        let grant = alg.take(&mut state, 2_500_000, 30, 4).unwrap();
        assert_eq!(grant.units, 25, "100 left / 4");
        assert_eq!(grant.decision.remaining, 75);
        assert_eq!(
            (grant.window, grant.hold_us, grant.at_us),
            (2, 500_000, 2_500_000)
        );
        let grant = alg.take(&mut state, 2_500_000, 10, 4).unwrap();
        assert_eq!(grant.units, 10, "want");
        // 65 left: a quarter each time until fewer than 4 are left, then none.
        let mut left = 65;
        for _ in 0..40 {
            let g = alg.take(&mut state, 2_600_000, 1_000, 4).unwrap();
            assert_eq!(g.units, left / 4);
            left -= g.units;
        }
        assert_eq!(left, 3);
        let none = alg.take(&mut state, 2_600_000, 1_000, 4).unwrap();
        assert_eq!(none.units, 0);
        assert!(none.decision.allowed, "the answer for one unit: 3 are left");
    }

    #[test]
    fn a_reservations_take_is_all_or_nothing_with_the_whole_costs_figures() {
        let alg: Algorithm = FixedWindow::new(100, 1_000_000).unwrap().into();
        let mut state = alg.new_state();
        let grant = alg.take(&mut state, 2_500_000, 70, 0).unwrap();
        assert_eq!((grant.units, grant.decision.remaining), (70, 30));
        let kept = state.clone();
        let none = alg.take(&mut state, 2_500_000, 31, 0).unwrap();
        assert_eq!(none.units, 0, "31 do not fit in 30: none taken");
        assert_eq!(
            none.decision,
            alg.decide(&kept, 2_500_000, 31),
            "a check of 31"
        );
        assert!(!none.decision.allowed);
        assert_eq!(state, kept);
        assert_eq!(alg.take(&mut state, 2_500_000, 30, 0).unwrap().units, 30);
        let bucket: Algorithm = TokenBucket::new(10, 1_000_000, 20).unwrap().into();
        let mut state = bucket.new_state();
        assert_eq!(bucket.take(&mut state, 0, 20, 0).unwrap().units, 20);
        let denied = bucket.take(&mut state, 0, 5, 0).unwrap();
        assert_eq!((denied.units, denied.decision.retry_after_us), (0, 500_000));
    }

    #[test]
    fn a_fixed_window_gives_back_only_into_its_own_window() {
        let alg: Algorithm = FixedWindow::new(100, 1_000).unwrap().into();
        let mut state = alg.new_state();
        let grant = alg.take(&mut state, 5_100, 40, 1).unwrap();
        assert_eq!(grant.units, 40);
        assert_eq!(alg.give_back(&mut state, 5_900, 15, &grant), 15);
        assert_eq!(alg.decide(&state, 5_900, 0).remaining, 75);
        assert_eq!(
            alg.give_back(&mut state, 6_100, 15, &grant),
            0,
            "its window ended"
        );
        assert_eq!(alg.decide(&state, 6_100, 0).remaining, 100, "a new window");
        let mut other = alg.new_state();
        alg.admit(&mut other, 6_100, 3);
        assert_eq!(alg.give_back(&mut other, 6_100, 15, &grant), 0);
        assert_eq!(
            alg.decide(&other, 6_100, 0).remaining,
            97,
            "not the lease's window"
        );
    }

    #[test]
    fn a_bucket_lease_returned_whole_leaves_the_bucket_as_it_was() {
        let bucket = TokenBucket::new(10, 1_000_000, 20).unwrap();
        let alg: Algorithm = bucket.into();
        let mut state = alg.new_state();
        alg.admit(&mut state, 1_000_000, 5);
        let before = state.clone();
        let grant = alg.take(&mut state, 1_000_000, 8, 1).unwrap();
        assert_eq!(grant.units, 8);
        assert_eq!(grant.hold_us, 500_000, "5 tokens ahead at 10 per second");
        assert_eq!(grant.decision.remaining, 7);
        assert_eq!(alg.give_back(&mut state, 1_000_000, 8, &grant), 8);
        assert_eq!(state, before);
        // Returned later, what shrank is not given back: the bucket refilled it itself.
        let mut state = before.clone();
        let grant = alg.take(&mut state, 1_000_000, 8, 1).unwrap();
        let elapsed = 800_000;
        let shrunk = bucket_lease_shrunk(&bucket, grant.hold_us, elapsed, grant.units);
        assert_eq!(shrunk, 3, "0.3 s past the hold at 10 per second");
        let back = alg.give_back(&mut state, 1_000_000 + elapsed, grant.units, &grant);
        assert_eq!(
            back,
            grant.units - shrunk,
            "the give-back measures the shrink itself"
        );
        assert_eq!(
            alg.decide(&state, 1_800_000, 0),
            alg.decide(&before, 1_800_000, 0),
            "as if never taken"
        );
    }

    #[test]
    fn a_bucket_never_gets_back_more_than_full_nor_what_shrank() {
        let alg: Algorithm = TokenBucket::new(10, 1_000_000, 20).unwrap().into();
        let mut state = alg.new_state();
        let grant = alg.take(&mut state, 1_000_000, 5, 1).unwrap();
        alg.admit(&mut state, 2_000_000, 20);
        // 1.5 s later all 5 shrank (no hold, 10 per second): nothing goes back.
        assert_eq!(alg.give_back(&mut state, 2_500_000, 5, &grant), 0);
        let mut state = alg.new_state();
        assert_eq!(
            alg.give_back(&mut state, 1_000_000, 5, &grant),
            0,
            "already full"
        );
        alg.admit(&mut state, 1_000_000, 2);
        assert_eq!(alg.give_back(&mut state, 1_000_000, 5, &grant), 5);
        assert_eq!(
            alg.decide(&state, 1_000_000, 0).remaining,
            20,
            "never more than full"
        );
        assert!(!alg.decide(&state, 1_000_000, 21).allowed);
    }

    #[test]
    fn a_take_never_overwrites_another_algorithms_state() {
        let window: Algorithm = FixedWindow::new(10, 1_000_000).unwrap().into();
        let bucket: Algorithm = TokenBucket::new(10, 1_000_000, 10).unwrap().into();
        let mut state = window.new_state();
        window.admit(&mut state, 10, 7);
        let kept = state.clone();
        let grant = bucket.take(&mut state, 20, 5, 1).unwrap();
        assert_eq!((grant.units, &state), (0, &kept));
        let mut state = bucket.new_state();
        bucket.admit(&mut state, 10, 7);
        let kept = state.clone();
        let grant = window.take(&mut state, 20, 5, 1).unwrap();
        assert_eq!((grant.units, &state), (0, &kept));
    }

    #[test]
    fn a_sliding_log_is_never_leased_and_another_algorithms_state_is_left_alone() {
        let log: Algorithm = SlidingLog::new(10, 1_000).unwrap().into();
        assert!(!log.leasable());
        assert_eq!(log.take(&mut log.new_state(), 0, 5, 1), None);
        let window: Algorithm = FixedWindow::new(10, 1_000).unwrap().into();
        let bucket: Algorithm = TokenBucket::new(10, 1_000, 10).unwrap().into();
        let mut state = window.new_state();
        window.admit(&mut state, 10, 4);
        let kept = state.clone();
        let grant = bucket.take(&mut bucket.new_state(), 10, 4, 1).unwrap();
        assert_eq!(bucket.give_back(&mut state, 10, 4, &grant), 0);
        assert_eq!(state, kept);
    }
}

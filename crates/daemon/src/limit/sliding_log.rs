//! Sliding window log: remembers when each admitted unit was taken, so the cap of `limit` units
//! holds exactly in every rolling window `(t - period, t]`, not just in aligned ones.
//!
//! The price is memory: the state holds one run per distinct admission timestamp still inside
//! the window (at most `limit` runs), which suits small limits such as login attempts.

use std::collections::VecDeque;

use super::{check_rate, saturate, Decision, Micros, ParamError, NEVER};

/// Parameters: at most `limit` units in any rolling window of `period_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    period_us: Micros,
}

/// Per-key state: admitted units as `(timestamp, count)` runs in strictly increasing timestamp
/// order (an admission at the timestamp of the last run is merged into it). Empty when fresh.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// Runs of admitted units, oldest first.
    pub entries: VecDeque<(Micros, u64)>,
}

impl SlidingLog {
    /// Validates parameters: `limit` and `period_us` must be at least 1.
    pub fn new(limit: u64, period_us: Micros) -> Result<Self, ParamError> {
        check_rate(limit, period_us)?;
        Ok(SlidingLog { limit, period_us })
    }

    /// Most units admitted in any rolling window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Window length in µs.
    pub fn period_us(&self) -> Micros {
        self.period_us
    }

    /// Whether a unit taken at `ts` still counts at `now`: `ts + P > now`, computed without
    /// the `now - P` underflow.
    fn in_window(&self, ts: Micros, now: Micros) -> bool {
        u128::from(ts) + u128::from(self.period_us) > u128::from(now)
    }

    /// Time from `now` until a unit taken at `ts` leaves the window (0 if it already has).
    fn until_expiry(&self, ts: Micros, now: Micros) -> Micros {
        saturate((u128::from(ts) + u128::from(self.period_us)).saturating_sub(u128::from(now)))
    }

    /// The runs still in the window at `now`: a suffix, since timestamps are ordered.
    fn window<'a>(
        &self,
        state: &'a LogState,
        now: Micros,
    ) -> std::collections::vec_deque::Iter<'a, (Micros, u64)> {
        let start = state
            .entries
            .partition_point(|&(ts, _)| !self.in_window(ts, now));
        state.entries.range(start..)
    }

    /// Decides whether `cost` units may be taken at `now`, without changing anything.
    pub fn decide(&self, state: &LogState, now: Micros, cost: u64) -> Decision {
        let window = self.window(state, now);
        let newest = window.clone().next_back().map(|&(ts, _)| ts);
        let used: u128 = window.clone().map(|&(_, c)| u128::from(c)).sum();
        let l = u128::from(self.limit);
        let c = u128::from(cost);
        if used + c <= l {
            // The new run lands at `now`, or merges into a newer run if time went backwards.
            let newest_after = match newest {
                Some(ts) if cost > 0 => Some(ts.max(now)),
                None if cost > 0 => Some(now),
                other => other,
            };
            let reset = newest_after.map_or(0, |ts| self.until_expiry(ts, now));
            return Decision::allow(self.limit, saturate(l - used - c), reset);
        }
        let remaining = saturate(l.saturating_sub(used));
        let reset = newest.map_or(0, |ts| self.until_expiry(ts, now));
        let retry = if cost > self.limit {
            NEVER
        } else {
            // The request fits once enough of the oldest units have left the window.
            let excess = used + c - l;
            let mut freed = 0u128;
            let mut retry = NEVER; // unreachable: the whole window frees `used >= excess`
            for &(ts, count) in window {
                freed += u128::from(count);
                if freed >= excess {
                    retry = self.until_expiry(ts, now);
                    break;
                }
            }
            retry
        };
        Decision::deny(self.limit, remaining, reset, retry)
    }

    /// Records `cost` units at `now` and forgets runs that have left the window. Call only
    /// after [`SlidingLog::decide`] allowed the same `now`/`cost`.
    ///
    /// If `now` is older than the newest run (clock went backwards), the units are recorded at
    /// that newest timestamp instead, keeping the log ordered and the units counted at least as
    /// long as they should be.
    pub fn admit(&self, state: &mut LogState, now: Micros, cost: u64) {
        while let Some(&(ts, _)) = state.entries.front() {
            if self.in_window(ts, now) {
                break;
            }
            state.entries.pop_front();
        }
        if cost == 0 {
            return;
        }
        match state.entries.back_mut() {
            Some(last) if last.0 >= now => last.1 = last.1.saturating_add(cost),
            _ => state.entries.push_back((now, cost)),
        }
    }

    /// Records `cost` units at `now` whatever the log holds (a cost known only afterwards):
    /// what [`SlidingLog::decide`] allows is admitted as usual (and that decision returned);
    /// otherwise the units are recorded all the same and the log then keeps only its newest
    /// `limit` units. That loses nothing: a later request of cost `c >= 1` passes iff at most
    /// `limit - c` units are in its window, which depends on the newest `limit - c + 1` units
    /// only; and it keeps the log (a sorted set in Redis) within `limit` units. The answer is a
    /// request of 1 unit's: denied until enough units have left the window.
    pub fn spend(&self, state: &mut LogState, now: Micros, cost: u64) -> Decision {
        let decision = self.decide(state, now, cost);
        if decision.allowed {
            self.admit(state, now, cost);
            return decision;
        }
        self.admit(state, now, cost);
        let total: u128 = state.entries.iter().map(|&(_, c)| u128::from(c)).sum();
        let mut excess = total.saturating_sub(u128::from(self.limit));
        while excess > 0 {
            let Some(oldest) = state.entries.front_mut() else {
                break;
            };
            if u128::from(oldest.1) <= excess {
                excess -= u128::from(oldest.1);
                state.entries.pop_front();
            } else {
                oldest.1 -= saturate(excess);
                excess = 0;
            }
        }
        self.decide(state, now, 1)
    }

    /// The instant from which `state` behaves like an empty log: when the newest run expires.
    pub fn idle_at(&self, state: &LogState) -> Micros {
        state.entries.back().map_or(0, |&(ts, _)| {
            saturate(u128::from(ts) + u128::from(self.period_us))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Micros = 1_000_000;
    const MINUTE: Micros = 60 * SECOND;

    /// Ten login attempts per five minutes.
    fn login() -> SlidingLog {
        SlidingLog::new(10, 5 * MINUTE).unwrap()
    }

    fn hit(sl: &SlidingLog, s: &mut LogState, now: Micros, cost: u64) -> Decision {
        let d = sl.decide(s, now, cost);
        if d.allowed {
            sl.admit(s, now, cost);
        }
        d
    }

    #[test]
    fn login_ten_in_five_minutes_then_denied() {
        let sl = login();
        let mut s = LogState::default();
        for i in 0..10 {
            let d = hit(&sl, &mut s, i * 20 * SECOND, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, 9 - i);
            assert_eq!(d.reset_after_us, 5 * MINUTE);
        }
        let d = hit(&sl, &mut s, 200 * SECOND, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        // The attempt at t=0 leaves the window at 5:00.
        assert_eq!(d.retry_after_us, 100 * SECOND);
        assert_eq!(d.reset_after_us, 180 * SECOND + 5 * MINUTE - 200 * SECOND);
        assert!(sl.decide(&s, 5 * MINUTE, 1).allowed);
        assert!(!sl.decide(&s, 5 * MINUTE - 1, 1).allowed);
    }

    #[test]
    fn ten_at_4_59_and_ten_at_5_01_second_ten_denied() {
        let sl = login();
        let mut s = LogState::default();
        let t459 = 4 * MINUTE + 59 * SECOND;
        let t501 = 5 * MINUTE + SECOND;
        let t959 = 9 * MINUTE + 59 * SECOND;
        for _ in 0..10 {
            assert!(hit(&sl, &mut s, t459, 1).allowed);
        }
        assert_eq!(s.entries, [(t459, 10)]);
        for _ in 0..10 {
            let d = hit(&sl, &mut s, t501, 1);
            assert!(!d.allowed, "an aligned window would have let this through");
            assert_eq!(d.retry_after_us, t959 - t501);
        }
        assert!(!sl.decide(&s, t959 - 1, 1).allowed);
        for _ in 0..10 {
            assert!(hit(&sl, &mut s, t959, 1).allowed);
        }
        assert_eq!(s.entries, [(t959, 10)]);
    }

    #[test]
    fn rejected_attempts_are_not_recorded() {
        let sl = login();
        let mut s = LogState::default();
        assert!(hit(&sl, &mut s, 0, 10).allowed);
        let full = s.clone();
        for i in 1..=100 {
            assert!(!hit(&sl, &mut s, i * SECOND, 1).allowed);
        }
        assert_eq!(s, full);
        assert!(sl.decide(&s, 5 * MINUTE, 10).allowed);
    }

    #[test]
    fn cost_counts_as_that_many_entries() {
        let sl = login();
        let mut s = LogState::default();
        assert_eq!(hit(&sl, &mut s, 0, 4).remaining, 6);
        let d = hit(&sl, &mut s, SECOND, 7);
        assert!(!d.allowed);
        assert_eq!((d.remaining, d.retry_after_us), (6, 5 * MINUTE - SECOND));
        assert_eq!(hit(&sl, &mut s, SECOND, 6).remaining, 0);
        assert_eq!(s.entries, [(0, 4), (SECOND, 6)]);
        // At 5:00 the first 4 units leave; 5 would need the 6 taken at 0:01 to leave too.
        assert!(sl.decide(&s, 5 * MINUTE, 4).allowed);
        let d = sl.decide(&s, 5 * MINUTE, 5);
        assert_eq!(d.retry_after_us, SECOND);
        let d = sl.decide(&s, 0, 11);
        assert_eq!((d.allowed, d.retry_after_us), (false, NEVER));
    }

    #[test]
    fn expired_runs_are_dropped_on_admit() {
        let sl = SlidingLog::new(3, 10).unwrap();
        let mut s = LogState::default();
        for now in [0, 5, 9, 10, 15, 30] {
            hit(&sl, &mut s, now, 1);
        }
        assert_eq!(s.entries, [(30, 1)]);
        assert_eq!(sl.idle_at(&s), 40);
    }

    #[test]
    fn time_going_backwards_keeps_order() {
        let sl = SlidingLog::new(5, 100).unwrap();
        let mut s = LogState::default();
        assert!(hit(&sl, &mut s, 1_000, 1).allowed);
        let d = hit(&sl, &mut s, 10, 2);
        assert!(d.allowed);
        assert_eq!(d.reset_after_us, 1_090);
        assert_eq!(s.entries, [(1_000, 3)]);
        let d = sl.decide(&s, 0, 3);
        assert_eq!(d.retry_after_us, 1_100);
        assert!(sl.decide(&s, u64::MAX, 5).allowed);
    }
}

//! Fixed window counter: one counter per window aligned to multiples of `period_us` since
//! epoch 0, so every process (and every restart) agrees on where windows start.
//!
//! With a [`Calendar`] (`calendar: true`), windows are local days, weeks or months of a time zone
//! instead (see `calendar.rs`); the window's number is then its start in µs since the epoch, which
//! no window of a plain period ever has (those number from 0 up by one per period).
//!
//! Cheapest of the algorithms (two integers per key), but only aligned windows are capped:
//! up to `2 * limit` units can pass across a boundary — `limit` at the very end of one window
//! and `limit` again at the very start of the next. Use the sliding log or the token bucket
//! where that burst matters.

use super::{check_rate, Calendar, Decision, Micros, ParamError, NEVER};

/// Parameters: at most `limit` units per aligned window of `period_us`, or per window of a
/// calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    period_us: Micros,
    calendar: Option<Calendar>,
}

/// Per-key state: how many units were admitted in window number `window` (the window
/// `[window * period, (window + 1) * period)`; a calendar's window starting at `window` µs). The count only applies while `now` is in a window
/// of that number under the policy's period: a reload that changes the period is a window
/// boundary (the count starts afresh), as the Redis script does with the number it stores. A
/// fresh state has `count == 0`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowState {
    /// The number of the window the count belongs to (`now / period` when counted; a calendar
    /// window's start).
    pub window: u64,
    /// Units admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// Validates parameters: `limit` and `period_us` must be at least 1.
    pub fn new(limit: u64, period_us: Micros) -> Result<Self, ParamError> {
        check_rate(limit, period_us)?;
        Ok(FixedWindow {
            limit,
            period_us,
            calendar: None,
        })
    }

    /// At most `limit` units per window of `calendar` (its unit's nominal length is the period
    /// shown where one number is needed: `RateLimit-Policy`, per-pod shares).
    pub fn calendar(limit: u64, calendar: Calendar) -> Result<Self, ParamError> {
        let period_us = calendar.unit().nominal_us();
        check_rate(limit, period_us)?;
        Ok(FixedWindow {
            limit,
            period_us,
            calendar: Some(calendar),
        })
    }

    /// The calendar its windows follow, if any.
    pub fn calendar_of(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The same windows with another limit (a tier's, a pod's share).
    pub fn with_limit(&self, limit: u64) -> Result<Self, ParamError> {
        check_rate(limit, self.period_us)?;
        Ok(FixedWindow { limit, ..*self })
    }

    /// Most units admitted per aligned window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Window length in µs (a calendar's: its unit's nominal length).
    pub fn period_us(&self) -> Micros {
        self.period_us
    }

    /// The number of the window containing `now`.
    fn window_of(&self, now: Micros) -> u64 {
        match &self.calendar {
            None => now / self.period_us,
            Some(calendar) => calendar.window_at(now).0,
        }
    }

    /// The number of the window containing `now` and the µs from `now` to its end.
    fn window_and_rest(&self, now: Micros) -> (u64, Micros) {
        match &self.calendar {
            // Equals window start + P - now, without overflowing in the last window before
            // u64::MAX.
            None => (now / self.period_us, self.period_us - now % self.period_us),
            Some(calendar) => {
                let (start, end) = calendar.window_at(now);
                (start, end.saturating_sub(now).max(1))
            }
        }
    }

    /// Units already admitted in the window containing `now`.
    fn count_at(&self, state: &WindowState, now: Micros) -> u64 {
        if state.window == self.window_of(now) {
            state.count
        } else {
            0
        }
    }

    /// Decides whether `cost` units may be taken at `now`, without changing anything.
    pub fn decide(&self, state: &WindowState, now: Micros, cost: u64) -> Decision {
        let (window, to_next) = self.window_and_rest(now);
        let count = if state.window == window {
            state.count
        } else {
            0
        };
        match count.checked_add(cost) {
            Some(used) if used <= self.limit => {
                let reset = if used == 0 { 0 } else { to_next };
                Decision::allow(self.limit, self.limit - used, reset)
            }
            _ => {
                let reset = if count == 0 { 0 } else { to_next };
                let retry = if cost > self.limit { NEVER } else { to_next };
                Decision::deny(self.limit, self.limit.saturating_sub(count), reset, retry)
            }
        }
    }

    /// Counts `cost` units at `now`. Call only after [`FixedWindow::decide`] allowed the same
    /// `now`/`cost`.
    ///
    /// If the clock went back into an earlier window, that window starts from zero again (its
    /// count was already replaced), which may admit up to `limit` extra units once.
    pub fn admit(&self, state: &mut WindowState, now: Micros, cost: u64) {
        let window = self.window_of(now);
        if state.window == window {
            state.count = state.count.saturating_add(cost);
        } else {
            *state = WindowState {
                window,
                count: cost,
            };
        }
    }

    /// Counts `cost` units at `now` whatever the window holds (a cost known only afterwards):
    /// what [`FixedWindow::decide`] allows is admitted as usual (and that decision returned);
    /// otherwise the window's count becomes its limit (every later check in it is denied, as it
    /// would be with the whole cost counted; the count never moves back) and the answer is a
    /// request of 1 unit's: denied until the window ends. Nothing carries into the next window:
    /// a fixed window forgets everything at its boundary, by design.
    pub fn spend(&self, state: &mut WindowState, now: Micros, cost: u64) -> Decision {
        let decision = self.decide(state, now, cost);
        if decision.allowed {
            self.admit(state, now, cost);
            return decision;
        }
        *state = WindowState {
            window: self.window_of(now),
            count: self.count_at(state, now).max(self.limit),
        };
        self.decide(state, now, 1)
    }

    /// The instant from which `state` behaves like a fresh one: the end of its window
    /// (0 if it counts nothing).
    pub fn idle_at(&self, state: &WindowState) -> Micros {
        match &self.calendar {
            _ if state.count == 0 => 0,
            None => state
                .window
                .saturating_add(1)
                .saturating_mul(self.period_us),
            Some(calendar) => calendar.window_at(state.window).1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Micros = 1_000_000;

    fn hit(fw: &FixedWindow, s: &mut WindowState, now: Micros, cost: u64) -> Decision {
        let d = fw.decide(s, now, cost);
        if d.allowed {
            fw.admit(s, now, cost);
        }
        d
    }

    /// Documented weakness of aligned windows: `limit` at the end of one window plus `limit`
    /// at the start of the next means 2x the limit passes within a millisecond.
    #[test]
    fn boundary_admits_twice_the_limit() {
        let fw = FixedWindow::new(10, 60 * SECOND).unwrap();
        let mut s = WindowState::default();
        let mut passed = 0;
        for now in [60 * SECOND - 1_000, 60 * SECOND] {
            for _ in 0..10 {
                passed += u32::from(hit(&fw, &mut s, now, 1).allowed);
            }
        }
        assert_eq!(passed, 20);
    }

    #[test]
    fn eleventh_in_window_waits_for_the_next_window() {
        let fw = FixedWindow::new(10, 60 * SECOND).unwrap();
        let mut s = WindowState::default();
        let t = 125 * SECOND; // window [120 s, 180 s)
        for i in 0..10 {
            let d = hit(&fw, &mut s, t, 1);
            assert_eq!((d.allowed, d.remaining), (true, 9 - i));
            assert_eq!(d.reset_after_us, 55 * SECOND);
        }
        assert_eq!(s.window, 2);
        let d = fw.decide(&s, t, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_us),
            (false, 0, 55 * SECOND)
        );
        assert!(!fw.decide(&s, 180 * SECOND - 1, 1).allowed);
        assert!(fw.decide(&s, 180 * SECOND, 10).allowed);
        assert_eq!(fw.idle_at(&s), 180 * SECOND);
    }

    /// A reload that changes the period is a window boundary, even where the old and the new
    /// window start at the same instant: the count belongs to a window number under a period,
    /// as in the Redis script (which stores the number, not the start).
    #[test]
    fn a_changed_period_starts_the_window_afresh() {
        let hourly = FixedWindow::new(2, 3_600 * SECOND).unwrap();
        let two_hourly = FixedWindow::new(2, 7_200 * SECOND).unwrap();
        let mut s = WindowState::default();
        let t = 7_200 * SECOND; // starts an hourly and a two-hourly window
        assert!(hit(&hourly, &mut s, t, 2).allowed);
        assert!(!hourly.decide(&s, t + SECOND, 1).allowed);
        let d = two_hourly.decide(&s, t + SECOND, 2);
        assert_eq!((d.allowed, d.remaining), (true, 0));
        // Back to the hourly period within the same hour: the count is that window's again.
        assert!(!hourly.decide(&s, t + 2 * SECOND, 1).allowed);
    }

    #[test]
    fn cost_above_limit_is_never_admitted() {
        let fw = FixedWindow::new(10, 60 * SECOND).unwrap();
        let d = fw.decide(&WindowState::default(), 0, 11);
        assert_eq!(
            (d.allowed, d.retry_after_us, d.remaining),
            (false, NEVER, 10)
        );
        assert_eq!(d.reset_after_us, 0);
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let fw = FixedWindow::new(1_000_000_000, 7).unwrap();
        let mut s = WindowState::default();
        for now in [u64::MAX, 3, u64::MAX - 1] {
            let d = hit(&fw, &mut s, now, 1_000_000_000);
            assert!(d.reset_after_us <= 7);
        }
        assert_eq!(fw.idle_at(&s), u64::MAX);
    }
}

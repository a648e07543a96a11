//! Token bucket implemented as GCRA (generic cell rate algorithm), exact with rational time.
//!
//! The rate is `limit` tokens per `period_us`, so the emission interval `period_us / limit` is
//! usually not a whole number of microseconds (e.g. 3 per second). Rounding it would make the
//! bucket drift away from the configured rate, so all arithmetic happens in scaled time units of
//! `1 / limit` µs: there one token takes exactly `period_us` units, the burst tolerance is
//! `capacity * period_us` units and `now` is `now * limit` units. The only state is the
//! theoretical arrival time (TAT): the instant at which the bucket would be full again.

use std::num::NonZeroU64;

use super::{check_rate, saturate, Decision, Micros, ParamError, NEVER};

/// The furthest a spend regardless ([`TokenBucket::spend`]) puts the TAT past `now`, in 1/limit
/// µs: 2^52, so that the Lua twin's arithmetic on it (doubles, exact below 2^53, `ceil_div` adds
/// at most `limit` <= 1e9) stays exact. Config keeps `capacity * period_us <= 2^52`, so this is
/// never less than an empty bucket: 52 days of refill at 1000 per period, for example.
pub const MAX_AHEAD: u128 = 1 << 52;

/// Parameters of a token bucket: refills `limit` tokens per `period_us`, holds at most
/// `capacity` tokens (the burst a client that has been idle may spend at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    limit: u64,
    period_us: Micros,
    capacity: u64,
    /// The most periods a report may leave the next token waiting ([`TokenBucket::spend`]);
    /// `None`: only [`MAX_AHEAD`] bounds the debt. (Non-zero: the option costs no space in a
    /// type copied along the hot path.)
    report_debt: Option<NonZeroU64>,
}

/// Per-key state: TAT = `tat_us + tat_rem / limit` µs. A fresh (all-zero) state is a full bucket.
///
/// The split keeps the state in two `u64`s while staying exact. `tat_rem < limit` after
/// [`TokenBucket::admit`]; readers accept any value (e.g. after `limit` changed on reload), which
/// amounts to carrying `tat_rem / limit` into `tat_us`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketState {
    /// Whole microseconds of the theoretical arrival time.
    pub tat_us: u64,
    /// Fraction of a microsecond, in units of `1 / limit` µs.
    pub tat_rem: u64,
}

/// The scaled quantities that one request at `now` would produce.
struct Step {
    /// Current TAT, scaled.
    tat: u128,
    /// `now`, scaled.
    now_s: u128,
    /// TAT after admitting the request, scaled.
    new: u128,
}

impl TokenBucket {
    /// Validates parameters: `limit`, `period_us` and `capacity` must all be at least 1.
    pub fn new(limit: u64, period_us: Micros, capacity: u64) -> Result<Self, ParamError> {
        check_rate(limit, period_us)?;
        if capacity == 0 {
            return Err(ParamError::ZeroCapacity);
        }
        Ok(TokenBucket {
            limit,
            period_us,
            capacity,
            report_debt: None,
        })
    }

    /// The same bucket, with the debt a report may leave bounded to `periods` periods: after any
    /// spend the next check of 1 token waits at most `periods * period_us` (0 is read as 1).
    pub fn with_report_debt(mut self, periods: u64) -> Self {
        self.report_debt = NonZeroU64::new(periods.max(1));
        self
    }

    /// The debt bound in periods, if one was set ([`TokenBucket::with_report_debt`]).
    pub fn report_debt(&self) -> Option<u64> {
        self.report_debt.map(NonZeroU64::get)
    }

    /// The furthest a spend puts the TAT past `now`, in 1/limit µs: with a debt bound of `d`
    /// periods, `period_us * (capacity - 1 + d * limit)` (the next token then waits exactly
    /// `d` periods), never beyond [`MAX_AHEAD`]. The Lua twin receives this very number.
    pub fn max_ahead(&self) -> u128 {
        let Some(periods) = self.report_debt else {
            return MAX_AHEAD;
        };
        let p = u128::from(self.period_us);
        let tokens = u128::from(self.capacity - 1)
            .saturating_add(u128::from(periods.get()).saturating_mul(u128::from(self.limit)));
        p.saturating_mul(tokens).min(MAX_AHEAD)
    }

    /// Tokens refilled per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Length of the refill period in µs.
    pub fn period_us(&self) -> Micros {
        self.period_us
    }

    /// Most tokens the bucket holds; this is the `limit` reported in decisions.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn step(&self, state: &BucketState, now: Micros, cost: u64) -> Step {
        let l = u128::from(self.limit);
        // Fits: (2^64 - 1)^2 + (2^64 - 1) < 2^128. Also carries an oversized `tat_rem`.
        let tat = u128::from(state.tat_us) * l + u128::from(state.tat_rem);
        let now_s = u128::from(now) * l;
        let new = tat
            .max(now_s)
            .saturating_add(u128::from(cost) * u128::from(self.period_us));
        Step { tat, now_s, new }
    }

    /// Decides whether `cost` tokens may be taken at `now`, without changing anything.
    pub fn decide(&self, state: &BucketState, now: Micros, cost: u64) -> Decision {
        let Step { tat, now_s, new } = self.step(state, now, cost);
        let l = u128::from(self.limit);
        let p = u128::from(self.period_us);
        let b = u128::from(self.capacity);
        let tolerance = b * p;
        // `new >= now_s` because `new >= max(tat, now_s)`.
        let ahead_after = new - now_s;
        if ahead_after <= tolerance {
            // ceil(ahead_after / p) <= b because ahead_after <= b * p.
            let remaining = b - ahead_after.div_ceil(p);
            return Decision::allow(
                self.capacity,
                saturate(remaining),
                saturate(ahead_after.div_ceil(l)),
            );
        }
        let ahead = tat.max(now_s) - now_s;
        let remaining = tolerance.saturating_sub(ahead) / p;
        let retry = if cost > self.capacity {
            NEVER
        } else {
            // Earliest integer t with tat + cost*P - t*L <= B*P. Denied implies tat > now_s
            // (otherwise ahead_after = cost*P <= B*P), so t > now.
            let slack = (b - u128::from(cost)) * p;
            let t = tat.saturating_sub(slack).div_ceil(l);
            saturate(t.saturating_sub(u128::from(now)))
        };
        Decision::deny(
            self.capacity,
            saturate(remaining),
            saturate(ahead.div_ceil(l)),
            retry,
        )
    }

    /// Takes `cost` tokens at `now`. Call only after [`TokenBucket::decide`] allowed the same
    /// `now`/`cost`; otherwise the request is forced through and the bucket goes into debt.
    ///
    /// A TAT beyond `u64::MAX` µs (only with absurd parameters, ~585,000 years ahead) is
    /// saturated, which errs on the permissive side instead of wrapping.
    pub fn admit(&self, state: &mut BucketState, now: Micros, cost: u64) {
        let new = self.step(state, now, cost).new;
        let l = u128::from(self.limit);
        match u64::try_from(new / l) {
            Ok(us) => {
                state.tat_us = us;
                state.tat_rem = saturate(new % l);
            }
            Err(_) => {
                state.tat_us = u64::MAX;
                state.tat_rem = 0;
            }
        }
    }

    /// Spends `cost` tokens at `now` whatever the bucket holds (a cost known only afterwards):
    /// what [`TokenBucket::decide`] allows is admitted as usual (and that decision returned);
    /// otherwise the TAT is pushed `cost` tokens further, into debt, and the answer is a
    /// request of 1 token's at the new state: denied, `remaining` 0, `retry_after_us` the time
    /// the debt takes to refill. The debt is bounded: the TAT goes at most
    /// [`TokenBucket::max_ahead`] past `now` (the report debt bound, if set, and never beyond
    /// [`MAX_AHEAD`], which the Lua twin's doubles hold exactly), and never moves back.
    pub fn spend(&self, state: &mut BucketState, now: Micros, cost: u64) -> Decision {
        let decision = self.decide(state, now, cost);
        if decision.allowed {
            self.admit(state, now, cost);
            return decision;
        }
        let Step { tat, now_s, new } = self.step(state, now, cost);
        let ahead = tat.max(now_s) - now_s;
        let ahead_after = (new - now_s).min(self.max_ahead()).max(ahead);
        let target = now_s + ahead_after;
        let l = u128::from(self.limit);
        match u64::try_from(target / l) {
            Ok(us) => {
                state.tat_us = us;
                state.tat_rem = saturate(target % l);
            }
            Err(_) => {
                state.tat_us = u64::MAX;
                state.tat_rem = 0;
            }
        }
        self.decide(state, now, 1)
    }

    /// The instant from which `state` behaves like a fresh (full) bucket: ceil(TAT) in µs.
    pub fn idle_at(&self, state: &BucketState) -> Micros {
        let l = u128::from(self.limit);
        let tat = u128::from(state.tat_us) * l + u128::from(state.tat_rem);
        saturate(tat.div_ceil(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Micros = 1_000_000;

    /// 1000 requests per minute, bursts of 150: one token every 60 ms.
    fn api() -> TokenBucket {
        TokenBucket::new(1000, 60 * SECOND, 150).unwrap()
    }

    /// Decides and, if allowed, admits — the way the daemon uses a limiter.
    fn hit(tb: &TokenBucket, s: &mut BucketState, now: Micros, cost: u64) -> Decision {
        let d = tb.decide(s, now, cost);
        if d.allowed {
            tb.admit(s, now, cost);
        }
        d
    }

    #[test]
    fn idle_client_bursts_150_then_151st_denied() {
        let tb = api();
        let mut s = BucketState::default();
        // Some earlier traffic, then an hour of silence.
        for _ in 0..150 {
            assert!(hit(&tb, &mut s, SECOND, 1).allowed);
        }
        let t0 = 3600 * SECOND;
        for i in 0..150 {
            let d = hit(&tb, &mut s, t0, 1);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 149 - i);
            assert_eq!(d.retry_after_us, 0);
        }
        let d = tb.decide(&s, t0, 1);
        assert!(!d.allowed);
        assert_eq!(d.limit, 150);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_us, 60_000);
        assert_eq!(d.reset_after_us, 150 * 60_000);
        assert!(!tb.decide(&s, t0 + 59_999, 1).allowed);
        assert!(tb.decide(&s, t0 + 60_000, 1).allowed);
    }

    #[test]
    fn sustained_150_per_sec_settles_at_refill_rate() {
        let tb = api();
        let mut s = BucketState::default();
        let mut times = Vec::new();
        for k in 0..150 * 60 {
            let now = k * SECOND / 150;
            if hit(&tb, &mut s, now, 1).allowed {
                times.push(now);
            }
        }
        // Exact GCRA bound over the span of admissions: capacity + rate * elapsed.
        let span = times[times.len() - 1] - times[0];
        let bound = 150 + (u128::from(span) * 1000 / u128::from(60 * SECOND)) as usize;
        assert!(times.len() <= bound, "{} > {bound}", times.len());
        assert!(times.len() + 2 >= bound, "{} << {bound}", times.len());
        let late = times.iter().filter(|&&t| t >= 50 * SECOND).count();
        assert!((166..=167).contains(&late), "last 10 s admitted {late}");
    }

    #[test]
    fn denial_does_not_destroy_credit() {
        let tb = api();
        let mut s = BucketState::default();
        assert!(hit(&tb, &mut s, 0, 150).allowed);
        let drained = s;
        // An impatient client hammers every 100 µs for 59.9 ms: all denied, nothing recorded.
        for now in (0..60_000).step_by(100) {
            let d = hit(&tb, &mut s, now, 1);
            assert!(!d.allowed);
            assert_eq!(d.retry_after_us, 60_000 - now);
        }
        assert_eq!(s, drained);
        assert!(hit(&tb, &mut s, 60_000, 1).allowed);
        // Full again exactly 150 tokens' worth of time after the first burst.
        assert_eq!(tb.idle_at(&s), 151 * 60_000);
        assert!(tb.decide(&s, 151 * 60_000, 150).allowed);
        assert!(!tb.decide(&s, 151 * 60_000 - 1, 150).allowed);
    }

    #[test]
    fn cost_above_one_spends_that_many() {
        let tb = api();
        let mut s = BucketState::default();
        let d = hit(&tb, &mut s, 0, 10);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after_us), (140, 600_000));
        assert_eq!(hit(&tb, &mut s, 0, 140).remaining, 0);
        let d = hit(&tb, &mut s, 0, 5);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 5 * 60_000);
        assert!(tb.decide(&s, 5 * 60_000, 5).allowed);
        assert!(!tb.decide(&s, 5 * 60_000 - 1, 5).allowed);
    }

    #[test]
    fn cost_above_capacity_is_never_admitted() {
        let tb = api();
        let fresh = BucketState::default();
        for now in [0, SECOND, u64::MAX] {
            let d = tb.decide(&fresh, now, 151);
            assert!(!d.allowed);
            assert_eq!(d.retry_after_us, NEVER);
            assert_eq!((d.remaining, d.reset_after_us), (150, 0));
        }
        assert!(tb.decide(&fresh, 0, 150).allowed);
    }

    #[test]
    fn rational_rate_three_per_second_is_exact() {
        // Emission interval 333_333.3… µs: rounding it either way would drift by 10 s.
        let tb = TokenBucket::new(3, SECOND, 3).unwrap();
        let mut s = BucketState::default();
        let mut now = 0;
        let mut times = Vec::new();
        while now <= 10 * SECOND {
            let d = hit(&tb, &mut s, now, 1);
            if d.allowed {
                times.push(now);
            } else {
                now += d.retry_after_us;
            }
        }
        // Exactly the bound capacity + rate * elapsed, the last one landing on 10 s exactly.
        assert_eq!(times.len(), 3 + 30);
        assert_eq!(times.last(), Some(&(10 * SECOND)));
        for (k, &t) in times[3..].iter().enumerate() {
            assert_eq!(t, ((k as u64 + 1) * SECOND).div_ceil(3));
        }
    }

    #[test]
    fn time_going_backwards_neither_panics_nor_frees_tokens() {
        let tb = api();
        let mut s = BucketState::default();
        assert!(hit(&tb, &mut s, 10 * SECOND, 150).allowed);
        let d = tb.decide(&s, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_us, 10 * SECOND + 60_000);
        assert!(!tb.decide(&s, 0, 0).allowed);
    }

    #[test]
    fn extreme_parameters_do_not_overflow() {
        let year = 365 * 24 * 3600 * SECOND;
        let tb = TokenBucket::new(1, year, 1_000_000_000).unwrap();
        let mut s = BucketState::default();
        for now in [0, u64::MAX / 2, u64::MAX] {
            let d = hit(&tb, &mut s, now, 1_000_000_000);
            assert!(d.remaining <= d.limit);
            let _ = tb.idle_at(&s);
        }
        assert_eq!(s.tat_us, u64::MAX);
        assert!(TokenBucket::new(0, 1, 1).is_err());
        assert_eq!(TokenBucket::new(1, 0, 1), Err(ParamError::ZeroPeriod));
        assert_eq!(TokenBucket::new(1, 1, 0), Err(ParamError::ZeroCapacity));
    }

    #[test]
    fn oversized_remainder_is_carried() {
        let tb = TokenBucket::new(4, 100, 2).unwrap();
        let odd = BucketState {
            tat_us: 10,
            tat_rem: 9,
        };
        let norm = BucketState {
            tat_us: 12,
            tat_rem: 1,
        };
        assert_eq!(tb.decide(&odd, 5, 1), tb.decide(&norm, 5, 1));
        assert_eq!(tb.idle_at(&odd), 13);
    }
}

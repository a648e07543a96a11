//! One type over all limiter algorithms, so a policy can name any of them and the store can
//! keep any of their states without generics.

use super::{
    BucketState, Concurrency, Decision, FixedWindow, LogState, Micros, PermitState, SlidingLog,
    TokenBucket, WindowState,
};

/// A configured limiter of any kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Smooth rate with a burst allowance; see [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// Exact cap in every rolling window; see [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// Cheap aligned-window counter; see [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// Requests in flight, each holding a permit; see [`Concurrency`]. Checked by the store's
    /// acquire and release, never in a group of the others.
    Concurrency(Concurrency),
}

/// Per-key state for any [`Algorithm`].
///
/// A state of another variant than the algorithm's (the policy switched algorithm on reload) is
/// treated as fresh rather than as an error: the old history means nothing to the new algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// State of a [`TokenBucket`].
    Bucket(BucketState),
    /// State of a [`SlidingLog`].
    Log(LogState),
    /// State of a [`FixedWindow`].
    Window(WindowState),
    /// State of a [`Concurrency`] limit.
    Permits(PermitState),
}

impl From<TokenBucket> for Algorithm {
    fn from(a: TokenBucket) -> Self {
        Algorithm::TokenBucket(a)
    }
}

impl From<SlidingLog> for Algorithm {
    fn from(a: SlidingLog) -> Self {
        Algorithm::SlidingLog(a)
    }
}

impl From<Concurrency> for Algorithm {
    fn from(a: Concurrency) -> Self {
        Algorithm::Concurrency(a)
    }
}

impl From<FixedWindow> for Algorithm {
    fn from(a: FixedWindow) -> Self {
        Algorithm::FixedWindow(a)
    }
}

impl Algorithm {
    /// A fresh state of the matching variant (a key nobody has used, or one past `idle_at`).
    pub fn new_state(&self) -> State {
        match self {
            Algorithm::TokenBucket(_) => State::Bucket(BucketState::default()),
            Algorithm::SlidingLog(_) => State::Log(LogState::default()),
            Algorithm::FixedWindow(_) => State::Window(WindowState::default()),
            Algorithm::Concurrency(_) => State::Permits(PermitState::default()),
        }
    }

    /// Decides whether `cost` units may pass at `now`, without changing anything.
    pub fn decide(&self, state: &State, now: Micros, cost: u64) -> Decision {
        match (self, state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => a.decide(s, now, cost),
            (Algorithm::TokenBucket(a), _) => a.decide(&BucketState::default(), now, cost),
            (Algorithm::SlidingLog(a), State::Log(s)) => a.decide(s, now, cost),
            (Algorithm::SlidingLog(a), _) => a.decide(&LogState::default(), now, cost),
            (Algorithm::FixedWindow(a), State::Window(s)) => a.decide(s, now, cost),
            (Algorithm::FixedWindow(a), _) => a.decide(&WindowState::default(), now, cost),
            (Algorithm::Concurrency(a), State::Permits(s)) => a.decide(s, now, cost),
            (Algorithm::Concurrency(a), _) => a.decide(&PermitState::default(), now, cost),
        }
    }

    /// Records an admitted request; call only after [`Algorithm::decide`] allowed the same
    /// `now`/`cost`. A state of the wrong variant is replaced by a fresh one first.
    pub fn admit(&self, state: &mut State, now: Micros, cost: u64) {
        match (self, &mut *state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => a.admit(s, now, cost),
            (Algorithm::SlidingLog(a), State::Log(s)) => a.admit(s, now, cost),
            (Algorithm::FixedWindow(a), State::Window(s)) => a.admit(s, now, cost),
            (Algorithm::Concurrency(a), State::Permits(s)) => a.admit(s, now),
            (Algorithm::TokenBucket(a), _) => {
                let mut s = BucketState::default();
                a.admit(&mut s, now, cost);
                *state = State::Bucket(s);
            }
            (Algorithm::SlidingLog(a), _) => {
                let mut s = LogState::default();
                a.admit(&mut s, now, cost);
                *state = State::Log(s);
            }
            (Algorithm::FixedWindow(a), _) => {
                let mut s = WindowState::default();
                a.admit(&mut s, now, cost);
                *state = State::Window(s);
            }
            (Algorithm::Concurrency(a), _) => {
                let mut s = PermitState::default();
                a.admit(&mut s, now);
                *state = State::Permits(s);
            }
        }
    }

    /// Spends `cost` whatever the state holds (a report: the cost was known only afterwards);
    /// within the limit it is an ordinary admission (its decision returned), past it each
    /// algorithm records the overspend so that the next check is denied as long as the
    /// overspend requires (see each one's `spend`), and answers a request of 1 unit's at the new
    /// state. A state of the wrong variant is replaced by a fresh one first.
    pub fn spend(&self, state: &mut State, now: Micros, cost: u64) -> Decision {
        if !matches!(
            (self, &*state),
            (Algorithm::TokenBucket(_), State::Bucket(_))
                | (Algorithm::SlidingLog(_), State::Log(_))
                | (Algorithm::FixedWindow(_), State::Window(_))
                | (Algorithm::Concurrency(_), State::Permits(_))
        ) {
            *state = self.new_state();
        }
        match (self, state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => a.spend(s, now, cost),
            (Algorithm::SlidingLog(a), State::Log(s)) => a.spend(s, now, cost),
            (Algorithm::FixedWindow(a), State::Window(s)) => a.spend(s, now, cost),
            // A concurrency limit has nothing to spend after the fact: what is held, is held.
            // Unreachable: the state was made to match above.
            (_, state) => self.decide(state, now, cost),
        }
    }

    /// The answer to a check planned under a policy set older than the one that already wrote
    /// its counter (a reload came between planning and the store): denied, nothing spent, 0
    /// remaining, retry in 1 µs (the retry is planned under the set in force). Never an
    /// admission: the old quota no longer applies, and the new one is not this check's to read.
    pub fn superseded(&self) -> Decision {
        Decision::deny(self.limit(), 0, 1, 1)
    }

    /// The instant from which `state` is equivalent to a fresh one, i.e. when the store may
    /// drop it. A state of the wrong variant already counts as fresh, so this is 0 for it.
    pub fn idle_at(&self, state: &State) -> Micros {
        match (self, state) {
            (Algorithm::TokenBucket(a), State::Bucket(s)) => a.idle_at(s),
            (Algorithm::SlidingLog(a), State::Log(s)) => a.idle_at(s),
            (Algorithm::FixedWindow(a), State::Window(s)) => a.idle_at(s),
            (Algorithm::Concurrency(a), State::Permits(s)) => a.idle_at(s),
            _ => 0,
        }
    }

    /// The `limit` reported in decisions: the bucket's capacity, or the window's limit.
    pub fn limit(&self) -> u64 {
        match self {
            Algorithm::TokenBucket(a) => a.capacity(),
            Algorithm::SlidingLog(a) => a.limit(),
            Algorithm::FixedWindow(a) => a.limit(),
            Algorithm::Concurrency(a) => a.limit(),
        }
    }

    /// The configured period in µs (a concurrency limit's: its permits' time to live).
    pub fn period_us(&self) -> Micros {
        match self {
            Algorithm::TokenBucket(a) => a.period_us(),
            Algorithm::SlidingLog(a) => a.period_us(),
            Algorithm::FixedWindow(a) => a.period_us(),
            Algorithm::Concurrency(a) => a.ttl_us(),
        }
    }

    /// The advertised length in which [`Algorithm::limit`] units fit, for `RateLimit-Policy`:
    /// the period for the windows; for a bucket the time to refill from empty
    /// (`capacity * period / limit`), so that "capacity per length" is exactly the refill rate.
    pub fn advertised_us(&self) -> Micros {
        match self {
            Algorithm::TokenBucket(a) => super::saturate(
                u128::from(a.capacity()) * u128::from(a.period_us()) / u128::from(a.limit()),
            ),
            Algorithm::SlidingLog(a) => a.period_us(),
            Algorithm::FixedWindow(a) => a.period_us(),
            Algorithm::Concurrency(a) => a.ttl_us(),
        }
    }

    /// This pod's share of the quota while the shared store is unreachable: limit (and burst)
    /// less `margin_percent`, divided by `replicas`, at least 1; the period is unchanged.
    pub fn share(&self, replicas: u64, margin_percent: u64) -> Algorithm {
        let keep = u128::from(100 - margin_percent.min(99));
        let part = |n: u64| {
            let share = u128::from(n) * keep / 100 / u128::from(replicas.max(1));
            super::saturate(share).max(1)
        };
        let shared = match self {
            Algorithm::TokenBucket(a) => {
                TokenBucket::new(part(a.limit()), a.period_us(), part(a.capacity()))
                    .map(|b| a.report_debt().map_or(b, |d| b.with_report_debt(d)))
                    .map(Self::from)
            }
            Algorithm::SlidingLog(a) => {
                SlidingLog::new(part(a.limit()), a.period_us()).map(Self::from)
            }
            Algorithm::FixedWindow(a) => a.with_limit(part(a.limit())).map(Self::from),
            Algorithm::Concurrency(a) => {
                Concurrency::new(part(a.limit()), a.ttl_us()).map(Self::from)
            }
        };
        shared.unwrap_or(*self)
    }

    /// The same algorithm with a report's debt bounded to `periods` periods (see
    /// [`TokenBucket::with_report_debt`]). Only a token bucket carries debt: a sliding log keeps
    /// its newest `limit` units and a fixed window counts its limit, so after a report their next
    /// check never waits more than one period anyway.
    pub fn with_report_debt(self, periods: u64) -> Self {
        match self {
            Algorithm::TokenBucket(a) => Algorithm::TokenBucket(a.with_report_debt(periods)),
            other => other,
        }
    }

    /// Stable name for configuration, metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket(_) => "token_bucket",
            Algorithm::SlidingLog(_) => "sliding_log",
            Algorithm::FixedWindow(_) => "fixed_window",
            Algorithm::Concurrency(_) => "concurrency",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> [Algorithm; 4] {
        [
            TokenBucket::new(10, 1_000, 5).unwrap().into(),
            SlidingLog::new(5, 1_000).unwrap().into(),
            FixedWindow::new(5, 1_000).unwrap().into(),
            Concurrency::new(5, 1_000).unwrap().into(),
        ]
    }

    #[test]
    fn names_limits_and_periods() {
        let names: Vec<_> = all().iter().map(Algorithm::name).collect();
        assert_eq!(
            names,
            ["token_bucket", "sliding_log", "fixed_window", "concurrency"]
        );
        assert!(all()
            .iter()
            .all(|a| a.limit() == 5 && a.period_us() == 1_000));
    }

    #[test]
    fn a_share_divides_the_quota_after_the_margin() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(1000, 60_000_000, 150).unwrap());
        let Algorithm::TokenBucket(share) = bucket.share(3, 10) else {
            panic!("same algorithm");
        };
        assert_eq!(
            (share.limit(), share.capacity(), share.period_us()),
            (300, 45, 60_000_000)
        );
        let log = Algorithm::SlidingLog(SlidingLog::new(10, 1_000).unwrap());
        assert_eq!(log.share(100, 0).limit(), 1, "never below 1");
    }

    #[test]
    fn state_of_another_algorithm_is_treated_as_fresh() {
        let algs = all();
        for a in &algs {
            for b in &algs {
                // A used state of algorithm `b`, handed to `a` after a policy reload.
                let mut old = b.new_state();
                b.admit(&mut old, 100, 5);
                if a == b {
                    continue;
                }
                assert_eq!(a.decide(&old, 100, 5), a.decide(&a.new_state(), 100, 5));
                assert_eq!(a.idle_at(&old), 0);
                let mut replaced = old.clone();
                a.admit(&mut replaced, 100, 2);
                let mut fresh = a.new_state();
                a.admit(&mut fresh, 100, 2);
                assert_eq!(replaced, fresh);
            }
        }
    }
}

//! A policy's quota: one or more windows of the same algorithm, all checked together (a request
//! must fit every one: "10 per second and 1000 per hour"), and an optional per-pod local limit
//! checked before the store.

use super::{Algorithm, TokenBucket};

/// Most windows one policy may have: each is a counter (a Redis key) checked on every request.
pub const MAX_WINDOWS: usize = 8;

/// Why windows do not make a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// No window at all.
    #[error("needs at least one window")]
    Empty,
    /// More than [`MAX_WINDOWS`].
    #[error("at most {MAX_WINDOWS} windows, got {0}")]
    TooMany(usize),
    /// Two windows of one period would be one counter spent twice (or two counters that
    /// disagree): the period identifies a window's counter.
    #[error("two windows have the period of window {0}")]
    DuplicatePeriod(usize),
    /// Windows of different algorithms.
    #[error("every window must use the policy's algorithm")]
    MixedAlgorithms,
}

/// One or more windows (distinct periods, one algorithm) and an optional local limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    windows: Vec<Algorithm>,
    local: Option<TokenBucket>,
}

impl Quota {
    /// Validates the windows, in the order written.
    pub fn new(windows: Vec<Algorithm>, local: Option<TokenBucket>) -> Result<Self, QuotaError> {
        if windows.is_empty() {
            return Err(QuotaError::Empty);
        }
        if windows.len() > MAX_WINDOWS {
            return Err(QuotaError::TooMany(windows.len()));
        }
        for (i, window) in windows.iter().enumerate() {
            if windows[..i].iter().any(|w| w.name() != window.name()) {
                return Err(QuotaError::MixedAlgorithms);
            }
            if let Some(first) = windows[..i]
                .iter()
                .position(|w| w.period_us() == window.period_us())
            {
                return Err(QuotaError::DuplicatePeriod(first));
            }
        }
        Ok(Self { windows, local })
    }

    /// A quota of one window and no local limit.
    pub fn single(algorithm: Algorithm) -> Self {
        Self {
            windows: vec![algorithm],
            local: None,
        }
    }

    /// The windows, in the order written (the index is what answers call the window).
    pub fn windows(&self) -> &[Algorithm] {
        &self.windows
    }

    /// Whether there are several windows (then each window's counter is told apart by its
    /// period; a single window keeps the policy's plain counter).
    pub fn is_multi(&self) -> bool {
        self.windows.len() > 1
    }

    /// The per-pod token bucket checked before the store, if any.
    pub fn local(&self) -> Option<&TokenBucket> {
        self.local.as_ref()
    }

    /// The same quota with every token bucket's report debt (its windows' and the local
    /// limit's) bounded to `periods` periods (see [`Algorithm::with_report_debt`]).
    pub fn with_report_debt(mut self, periods: u64) -> Self {
        for window in &mut self.windows {
            *window = window.with_report_debt(periods);
        }
        self.local = self.local.map(|local| local.with_report_debt(periods));
        self
    }

    /// The largest cost a request may ever have: the smallest `limit` of any window (and of the
    /// local limit): a request must fit every one of them.
    pub fn max_cost(&self) -> u64 {
        let windows = self.windows.iter().map(Algorithm::limit);
        let local = self.local.iter().map(TokenBucket::capacity);
        windows.chain(local).min().unwrap_or(0)
    }
}

impl Quota {
    /// The windows that `replicas` pods, each held to the local limit, could never fill even
    /// with the traffic spread evenly: the local rate times `replicas` is below the window's
    /// rate (`limit / period`). Empty without a local limit.
    pub fn beyond_local_limit(&self, replicas: u64) -> Vec<&Algorithm> {
        let Some(local) = &self.local else {
            return Vec::new();
        };
        let pods = u128::from(local.limit()) * u128::from(replicas);
        self.windows
            .iter()
            .filter(|w| {
                pods * u128::from(w.period_us())
                    < u128::from(w.limit()) * u128::from(local.period_us())
            })
            .collect()
    }
}

impl From<Algorithm> for Quota {
    fn from(algorithm: Algorithm) -> Self {
        Self::single(algorithm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{FixedWindow, Micros, SlidingLog};

    fn window(limit: u64, period_us: Micros) -> Algorithm {
        FixedWindow::new(limit, period_us).expect("valid").into()
    }

    #[test]
    fn windows_must_be_distinct_same_kind_and_few() {
        assert_eq!(Quota::new(vec![], None), Err(QuotaError::Empty));
        let many = (1..=9).map(|i| window(i, i * 1_000)).collect();
        assert_eq!(Quota::new(many, None), Err(QuotaError::TooMany(9)));
        let twice = vec![window(1, 1_000), window(5, 2_000), window(9, 2_000)];
        assert_eq!(Quota::new(twice, None), Err(QuotaError::DuplicatePeriod(1)));
        let mixed = vec![
            window(1, 1_000),
            SlidingLog::new(5, 2_000).expect("valid").into(),
        ];
        assert_eq!(Quota::new(mixed, None), Err(QuotaError::MixedAlgorithms));
        let ok =
            Quota::new(vec![window(10, 1_000), window(1_000, 3_600_000)], None).expect("valid");
        assert!(ok.is_multi());
        assert_eq!(ok.windows()[1].period_us(), 3_600_000);
        assert!(!Quota::single(window(1, 1_000)).is_multi());
    }

    #[test]
    fn windows_beyond_the_pods_local_limits_are_found() {
        let windows = vec![window(10, 1_000_000), window(1_000, 3_600_000_000)];
        let local = TokenBucket::new(4, 1_000_000, 4).expect("valid");
        let quota = Quota::new(windows, Some(local)).expect("valid");
        // 2 pods x 4/s = 8/s < 10/s; the hour's 1000/h is far below 8/s.
        let short = quota.beyond_local_limit(2);
        assert_eq!(short.len(), 1);
        assert_eq!(short[0].period_us(), 1_000_000);
        assert!(quota.beyond_local_limit(3).is_empty(), "12/s covers 10/s");
        assert!(Quota::single(window(10, 1_000))
            .beyond_local_limit(1)
            .is_empty());
    }

    #[test]
    fn the_largest_cost_fits_every_window_and_the_local_limit() {
        let windows = vec![window(10, 1_000), window(1_000, 3_600_000)];
        assert_eq!(
            Quota::new(windows.clone(), None).expect("valid").max_cost(),
            10
        );
        let local = TokenBucket::new(100, 1_000, 4).expect("valid");
        assert_eq!(
            Quota::new(windows, Some(local)).expect("valid").max_cost(),
            4
        );
    }
}

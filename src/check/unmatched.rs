//! Checks that match no policy: answered 200 with `policy: null` (like Envoy's ratelimit for
//! unknown descriptors), but never invisible. Each is counted in
//! `sluice_decisions_total{policy="",outcome="unmatched"}`, and an operator may opt into a warn
//! line (`log_unmatched`), at most one per [`QUIET`], naming the descriptors sent (names only:
//! values are client data such as IPs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::CheckRequest;
use crate::telemetry::Metrics;

/// The `outcome` label of an unmatched check (its `policy` label is empty).
pub const UNMATCHED: &str = "unmatched";

/// Shortest time between two warn lines.
const QUIET: Duration = Duration::from_secs(10);

/// Counts (and optionally logs) unmatched checks.
pub struct Unmatched {
    log: bool,
    started: Instant,
    /// Milliseconds after `started` of the last line, plus one (0: never).
    last_logged_ms: AtomicU64,
}

impl Unmatched {
    /// Logs a warn line per [`QUIET`] when `log`.
    pub fn new(log: bool) -> Self {
        Self {
            log,
            started: Instant::now(),
            last_logged_ms: AtomicU64::new(0),
        }
    }

    /// Creates the series so that `rate()` sees the first one.
    pub fn register(metrics: &Metrics) {
        metrics.decisions.with_label_values(&["", UNMATCHED]);
    }

    /// Counts one unmatched check (not a dry run).
    pub fn note(&self, metrics: &Metrics, request: &CheckRequest) {
        metrics.decisions.with_label_values(&["", UNMATCHED]).inc();
        if !self.log {
            return;
        }
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.last_logged_ms.load(Ordering::Relaxed);
        let quiet = u64::try_from(QUIET.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < quiet {
            return;
        }
        if self
            .last_logged_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let names: Vec<&str> = request.descriptors.keys().map(String::as_str).collect();
            tracing::warn!(
                policy = request.policy.as_deref(),
                descriptors = ?names,
                "a check matched no policy and was allowed (log_unmatched; at most one line per 10 s)"
            );
        }
    }
}

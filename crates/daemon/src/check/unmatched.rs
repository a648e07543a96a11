//! Checks that match no policy: answered 200 with `policy: null` (like Envoy's ratelimit for
//! unknown descriptors), but never invisible. Each is counted in
//! `sluice_decisions_total{policy="",outcome="unmatched"}`, and an operator may opt into a warn
//! line (`log_unmatched`), at most one per [`QUIET`], naming the descriptors sent (names only:
//! values are client data such as IPs).

use std::time::Duration;

use super::{CheckRequest, DecisionOutcome};
use crate::logging::LogGate;
use crate::telemetry::Metrics;

/// The `outcome` label of an unmatched check (its `policy` label is empty).
const UNMATCHED: DecisionOutcome = DecisionOutcome::Unmatched;

/// Shortest time between two warn lines.
const QUIET: Duration = Duration::from_secs(10);

/// Counts (and optionally logs) unmatched checks.
pub struct Unmatched {
    log: bool,
    gate: LogGate,
}

impl Unmatched {
    /// Logs a warn line per [`QUIET`] when `log`.
    pub fn new(log: bool) -> Self {
        Self {
            log,
            gate: LogGate::new(QUIET),
        }
    }

    /// Creates the series so that `rate()` sees the first one.
    pub fn register(metrics: &Metrics) {
        metrics
            .decisions
            .with_label_values(&["", UNMATCHED.as_str()]);
    }

    /// Counts one unmatched check (not a dry run).
    pub fn note(&self, metrics: &Metrics, request: &CheckRequest) {
        metrics
            .decisions
            .with_label_values(&["", UNMATCHED.as_str()])
            .inc();
        if !self.log {
            return;
        }
        if let Some(held_back) = self.gate.pass() {
            let names: Vec<&str> = request.descriptors.keys().map(String::as_str).collect();
            tracing::warn!(
                policy = request.policy.as_deref(),
                descriptors = names.join(","),
                held_back,
                "a check matched no policy and was allowed (log_unmatched; at most one line per 10 s)"
            );
        }
    }
}

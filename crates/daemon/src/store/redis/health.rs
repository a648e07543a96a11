//! Redis health and the circuit breaker. Every call's outcome is reported here; enough
//! consecutive failures (or one that says the node cannot serve writes at all) open the circuit,
//! and while it is open checks skip Redis entirely, answered by their failure mode in
//! microseconds instead of after a timeout each. A single prober (see `prober.rs`) closes it.
//!
//! States: `healthy` -> `degraded` (failures, below the threshold) -> `open` (skip Redis) ->
//! `half_open` (the prober got through; real traffic tries) -> `healthy` on the first success, or
//! back to `open` on the first failure. Each transition is logged once.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use prometheus::IntGauge;
use tokio::sync::Notify;

use super::error::ErrorKind;

/// A breaker state, as exported in `sluice_redis_circuit_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Circuit {
    /// Calls succeed.
    Healthy = 0,
    /// Recent calls failed, not yet enough to open.
    Degraded = 1,
    /// Calls skip Redis.
    Open = 2,
    /// The prober got through; the next real call decides.
    HalfOpen = 3,
}

impl Circuit {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => Self::Healthy,
            1 => Self::Degraded,
            2 => Self::Open,
            _ => Self::HalfOpen,
        }
    }

    /// The name used in logs and `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// Why the circuit opened: the `cause` of its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitReason {
    /// A call failed with this kind (enough failures in a row, or one that opens at once).
    Failure(ErrorKind),
    /// Sentinel announced a new primary (`+switch-master`).
    Failover,
}

impl CircuitReason {
    /// The name used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failure(kind) => kind.as_str(),
            Self::Failover => "failover",
        }
    }
}

/// Shared health of one Redis target.
pub struct Health {
    state: AtomicU8,
    failures: AtomicU32,
    threshold: u32,
    gauge: IntGauge,
    up: IntGauge,
    /// Woken when the circuit opens, for the prober.
    pub opened: Notify,
}

impl Health {
    /// Starts in `initial` (open until a first connection is made); `threshold` consecutive
    /// failures open the circuit.
    pub fn new(initial: Circuit, threshold: u32, gauge: IntGauge, up: IntGauge) -> Self {
        gauge.set(initial as i64);
        up.set(i64::from(initial != Circuit::Open));
        Self {
            state: AtomicU8::new(initial as u8),
            failures: AtomicU32::new(0),
            threshold: threshold.max(1),
            gauge,
            up,
            opened: Notify::new(),
        }
    }

    /// The current state.
    pub fn circuit(&self) -> Circuit {
        Circuit::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether calls may go to Redis now.
    pub fn allows_calls(&self) -> bool {
        self.circuit() != Circuit::Open
    }

    /// A call succeeded.
    pub fn on_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.circuit() != Circuit::Healthy {
            self.transition(Circuit::Healthy, "Redis calls succeed again");
        }
    }

    /// A call failed with an error of `kind`; kinds that say Redis cannot serve this daemon
    /// (see [`ErrorKind::opens_at_once`]) open the circuit at once.
    pub fn on_failure(&self, kind: ErrorKind) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let circuit = self.circuit();
        if circuit == Circuit::Open {
            return;
        }
        if circuit == Circuit::HalfOpen || failures >= self.threshold || kind.opens_at_once() {
            self.open(CircuitReason::Failure(kind));
        } else if circuit == Circuit::Healthy {
            self.transition(Circuit::Degraded, "Redis calls failing");
        }
    }

    /// Opens the circuit (also used by the prober when a probe fails in half-open).
    pub fn open(&self, reason: CircuitReason) {
        if self.transition(Circuit::Open, reason.as_str()) {
            self.opened.notify_one();
        }
    }

    /// The prober got through: let real traffic try.
    pub fn half_open(&self) {
        self.transition(Circuit::HalfOpen, "probe succeeded");
    }

    /// Moves to `to`; returns whether the state changed (and logs it once).
    fn transition(&self, to: Circuit, cause: &str) -> bool {
        let from = Circuit::from_u8(self.state.swap(to as u8, Ordering::AcqRel));
        if from == to {
            return false;
        }
        self.gauge.set(to as i64);
        self.up.set(i64::from(to != Circuit::Open));
        match to {
            Circuit::Open => {
                tracing::warn!(
                    from = from.as_str(),
                    cause,
                    "Redis circuit open: checks use their failure modes"
                )
            }
            Circuit::Healthy => tracing::info!(from = from.as_str(), "Redis circuit closed"),
            _ => tracing::info!(
                from = from.as_str(),
                to = to.as_str(),
                cause,
                "Redis circuit state"
            ),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(threshold: u32) -> Health {
        Health::new(
            Circuit::Healthy,
            threshold,
            IntGauge::new("g", "g").expect("metric"),
            IntGauge::new("u", "u").expect("metric"),
        )
    }

    #[test]
    fn consecutive_failures_open_and_success_resets() {
        let h = health(3);
        h.on_failure(ErrorKind::Timeout);
        h.on_failure(ErrorKind::Timeout);
        assert_eq!(h.circuit(), Circuit::Degraded);
        h.on_success();
        assert_eq!(h.circuit(), Circuit::Healthy);
        for _ in 0..3 {
            h.on_failure(ErrorKind::Timeout);
        }
        assert_eq!(h.circuit(), Circuit::Open);
        assert!(!h.allows_calls());
        assert_eq!(h.gauge.get(), 2);
        assert_eq!(h.up.get(), 0);
    }

    #[test]
    fn fatal_kinds_open_at_once_and_half_open_fails_back() {
        let h = health(100);
        h.on_failure(ErrorKind::Readonly);
        assert_eq!(h.circuit(), Circuit::Open);
        h.half_open();
        assert!(h.allows_calls());
        h.on_failure(ErrorKind::Timeout);
        assert_eq!(
            h.circuit(),
            Circuit::Open,
            "one failure in half-open reopens"
        );
        h.half_open();
        h.on_success();
        assert_eq!(h.circuit(), Circuit::Healthy);
        assert_eq!(h.up.get(), 1);
    }
}

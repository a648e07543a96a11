//! Where "now" comes from: a trait so that stores read time through it and tests control it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::limit::Micros;

/// A source of the current time in microseconds since the Unix epoch.
///
/// Epoch-based (not process-relative) so that fixed windows line up with every other pod and with
/// Redis `TIME`.
pub trait Clock: Send + Sync + 'static {
    /// The current instant, in microseconds since the Unix epoch.
    fn now_us(&self) -> Micros;
}

/// Wall time read once at start, then advanced by the monotonic clock, so it never goes backwards
/// when NTP steps the system clock (a backwards step would hand out credit twice).
#[derive(Debug)]
pub struct SystemClock {
    epoch_at_start: Micros,
    start: Instant,
}

impl SystemClock {
    /// Anchors the clock at the current wall time.
    pub fn new() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            epoch_at_start: u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX),
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        let elapsed = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.epoch_at_start.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now_us`.
    pub fn new(now_us: Micros) -> Self {
        Self {
            now: AtomicU64::new(now_us),
        }
    }

    /// Moves the clock forward by `us` microseconds.
    pub fn advance(&self, us: Micros) {
        self.now.fetch_add(us, Ordering::SeqCst);
    }

    /// Sets the clock to `now_us`.
    pub fn set(&self, now_us: Micros) {
        self.now.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_epoch_based_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now_us();
        let b = clock.now_us();
        assert!(a > 1_600_000_000_000_000, "epoch microseconds expected");
        assert!(b >= a);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(10);
        assert_eq!(clock.now_us(), 10);
        clock.advance(5);
        assert_eq!(clock.now_us(), 15);
        clock.set(3);
        assert_eq!(clock.now_us(), 3);
    }
}

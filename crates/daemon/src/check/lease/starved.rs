//! A leased partition over its limit on this pod ("starved"): its counter had not a single unit
//! left. Instead of asking the counter per check (where each unit that refills is won by one
//! check and every other check costs a denial from the store), the pod answers what its lease
//! cannot cover as denied, here, and takes what refilled in one block once a block is due.
//!
//! - **Enters** on a take that got nothing while the counter could not admit even one unit, on
//!   the store's denial of a check (no lease covered it) that left not one unit, and, for a
//!   token bucket, on a take granted short of what it asked that lasts this pod less than the
//!   pace (below): a fleet is draining the bucket. A take that got nothing while a few units
//!   were left (fewer than `leases.fraction`) leaves them to per-check decisions as before: the
//!   last units are never held back.
//! - **Pace**: a token bucket's next take is due `burst / (4 × rate)` after the last (within
//!   ±25%, so that pods do not take in lockstep), and not before the counter will have
//!   [`STARVED_FRACTION`] units; a fixed window's when the window ends. Never later than
//!   `leases.idle` after the last (units other pods hold come back when their leases go idle).
//!   A starved take gets at most `1/`[`STARVED_FRACTION`] of what the counter has: pods share
//!   the refill (in the worst phase two pods get 2:1 of it, on average evenly). With one pod
//!   taking half of what the bucket holds at that pace, the bucket holds at most half its burst
//!   between takes, so nothing refills past full: the fleet admits the whole refill. A bucket
//!   whose burst refills in under 4 ms is not paced (per check, as before).
//! - **Leaves** on a take that got all it asked for (a token bucket refilled faster than this
//!   pod spends; a fixed window: any units, a new window), on a reset of the partition heard
//!   here, a reload that changes the policy, a take that failed, or `leases.idle` without a
//!   check.
//! - **Answers**: denied, `remaining` 0 (nothing this pod can admit now), `retry_after` until
//!   the next take is due (at least 1 ms while one is out: its block may cover the retry),
//!   `reset_after` the counter's as of the last take, counted down.
//! - **Exact**: nothing is admitted that was not taken at the counter first, so no pod admits
//!   over the limit; a starved pod only admits less than the counter would (what it holds back
//!   stays in the counter for the next block).

use std::time::Duration;

use super::{micros, Instant};
use crate::limit::{Algorithm, Decision, TokenBucket};

/// A starved take gets at most this fraction of what the counter has left (the other pods'
/// share stays there).
pub(super) const STARVED_FRACTION: u64 = 2;
/// The shortest pace: a bucket whose pace would be shorter is decided per check.
const PACE_MIN: Duration = Duration::from_millis(1);
/// The retry-after of a denial while a starved take is out.
const TAKING_RETRY: Duration = Duration::from_millis(1);

/// This pod's state of a starved partition.
#[derive(Debug, Clone, Copy)]
pub(super) struct Starved {
    /// No take before this.
    pub next: Instant,
    /// When the last take was sent, and the counter's answer for one unit then.
    sent: Instant,
    decision: Decision,
    /// The pace without jitter (what a take asks for is measured on it).
    pace: Duration,
}

impl Starved {
    /// The state after the counter of `algorithm`, asked at `sent`, answered `decision` (a take's
    /// figures, or a check's denial) and a fixed window has `hold_us` left (a take's `hold_us`);
    /// `jitter` is any number (it spreads the pace). `None`: the bucket is not paced.
    pub fn after(
        algorithm: &Algorithm,
        decision: &Decision,
        hold_us: u64,
        sent: Instant,
        idle: Duration,
        jitter: u64,
    ) -> Option<Self> {
        let (pace, wait) = match algorithm {
            Algorithm::TokenBucket(bucket) => {
                let pace = bucket_pace(bucket.capacity(), bucket.period_us(), bucket.limit())?;
                // The counter's wait until it has STARVED_FRACTION units (a take gets one).
                let unit = bucket.period_us().div_ceil(bucket.limit().max(1));
                let wait = if decision.allowed {
                    STARVED_FRACTION
                        .saturating_sub(decision.remaining)
                        .saturating_mul(unit)
                } else {
                    decision
                        .retry_after_us
                        .saturating_add((STARVED_FRACTION - 1).saturating_mul(unit))
                };
                // 0.75..1.25 of the pace.
                let spread = (micros(pace) / 2).saturating_mul(jitter % 1_000) / 1_000;
                let jittered = pace - pace / 4 + Duration::from_micros(spread);
                (pace, jittered.max(Duration::from_micros(wait)))
            }
            // Nothing comes back before the window ends (but what other pods give back).
            _ => (idle, Duration::from_micros(hold_us)),
        };
        Some(Self {
            next: sent + wait.min(idle),
            sent,
            decision: *decision,
            pace,
        })
    }

    /// What a starved take asks for at `demand` units a second: twice what the pod would use
    /// until the next (a grant of all of it means the counter has plenty again).
    pub fn want(&self, demand: u64) -> u64 {
        let pace = u128::from(micros(self.pace));
        u64::try_from(u128::from(demand) * pace * 2 / 1_000_000).unwrap_or(u64::MAX)
    }

    /// The answer to a check this pod's lease cannot cover at `now`.
    pub fn denial(&self, algorithm: &Algorithm, now: Instant) -> Decision {
        let elapsed = micros(now.saturating_duration_since(self.sent));
        let retry = self.next.saturating_duration_since(now).max(TAKING_RETRY);
        Decision {
            allowed: false,
            limit: algorithm.limit(),
            remaining: 0,
            reset_after_us: self.decision.reset_after_us.saturating_sub(elapsed),
            retry_after_us: micros(retry),
        }
    }
}

/// Whether a bucket over its limit is paced (its burst refills in 4 ms or more).
pub(super) fn paced(bucket: &TokenBucket) -> bool {
    bucket_pace(bucket.capacity(), bucket.period_us(), bucket.limit()).is_some()
}

/// Whether a block of `units` of a counter of `algorithm`, granted short of what was asked,
/// lasts a pod checking `demand` units a second less than the pace of blocks (a token bucket
/// only: a busy fleet is draining it, blocks would only shrink from here).
pub(super) fn outpaced(algorithm: &Algorithm, units: u64, demand: u64) -> bool {
    let Algorithm::TokenBucket(bucket) = algorithm else {
        return false;
    };
    bucket_pace(bucket.capacity(), bucket.period_us(), bucket.limit()).is_some_and(|pace| {
        u128::from(units) * 1_000_000 < u128::from(demand) * u128::from(micros(pace))
    })
}

/// A bucket's pace over its limit: the time its refill takes to fill a quarter of its burst
/// (`None` under [`PACE_MIN`]).
fn bucket_pace(capacity: u64, period_us: u64, limit: u64) -> Option<Duration> {
    let us = u128::from(capacity) * u128::from(period_us) / (4 * u128::from(limit.max(1)));
    let pace = Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX));
    (pace >= PACE_MIN).then_some(pace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::FixedWindow;

    fn denied(retry_after_us: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 100_000,
            remaining: 0,
            reset_after_us: 500_000,
            retry_after_us,
        }
    }

    #[test]
    fn a_bucket_is_paced_by_a_quarter_of_its_burst_and_by_what_the_counter_says() {
        // 100,000 a minute, burst 1,000: a quarter of the burst refills in 150 ms.
        let bucket: Algorithm = TokenBucket::new(100_000, 60_000_000, 1_000)
            .expect("valid")
            .into();
        let idle = Duration::from_secs(2);
        let sent = Instant::now();
        let low = Starved::after(&bucket, &denied(600), 0, sent, idle, 0).expect("paced");
        assert_eq!(
            low.next - sent,
            Duration::from_micros(112_500),
            "0.75 of 150 ms"
        );
        let high = Starved::after(&bucket, &denied(600), 0, sent, idle, 999).expect("paced");
        assert!(high.next - sent < Duration::from_micros(187_500));
        assert!(high.next - sent > Duration::from_micros(187_000));
        assert_eq!(low.want(1_650), 495, "twice 150 ms of demand");
        // Never before the counter can grant anything; never past `idle`.
        let slow: Algorithm = TokenBucket::new(10, 3_600_000_000, 3_000)
            .expect("valid")
            .into();
        let wait = Starved::after(&slow, &denied(1_000_000), 0, sent, idle, 0).expect("paced");
        assert_eq!(wait.next - sent, idle);
        // A burst that refills in under 4 ms is not paced.
        let small: Algorithm = TokenBucket::new(1_000, 1_000_000, 3).expect("valid").into();
        assert!(Starved::after(&small, &denied(1_000), 0, sent, idle, 0).is_none());
    }

    #[test]
    fn a_window_waits_for_its_end_and_a_denial_counts_down() {
        let window: Algorithm = FixedWindow::new(1_000, 60_000_000).expect("valid").into();
        let idle = Duration::from_secs(30);
        let sent = Instant::now();
        let starved =
            Starved::after(&window, &denied(0), 20_000_000, sent, idle, 7).expect("paced");
        assert_eq!(
            starved.next - sent,
            Duration::from_secs(20),
            "the window's end"
        );
        let denial = starved.denial(&window, sent + Duration::from_secs(5));
        assert!(!denial.allowed);
        assert_eq!(denial.retry_after_us, 15_000_000);
        assert_eq!((denial.limit, denial.remaining), (1_000, 0));
        let late = starved.denial(&window, sent + Duration::from_secs(25));
        assert_eq!(late.retry_after_us, 1_000, "a take is due or out");
        let capped = Starved::after(
            &window,
            &denied(0),
            20_000_000,
            sent,
            Duration::from_secs(2),
            7,
        )
        .expect("paced");
        assert_eq!(capped.next - sent, Duration::from_secs(2), "at most idle");
    }
}

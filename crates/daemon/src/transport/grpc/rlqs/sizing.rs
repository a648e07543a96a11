//! The assignment math, pure (time passed in as µs): how many requests one Envoy may admit on
//! a lease, for how long, and what may be given back afterwards.
//!
//! An assignment is a fresh Envoy token bucket that starts full with `max_tokens` and refills one
//! token a day, for `assignment_time_to_live` whole seconds, after which Envoy falls back to the
//! bucket's `no_assignment_behavior` (deny all). So within its life an Envoy admits at most
//! `max_tokens` requests on it. Each token is backed by `cost` units taken from the store before
//! the assignment is sent, and the assignment must end before the lease's terms do:
//! - a **fixed window**'s units belong to their window: the assignment (counted from before the
//!   take, plus [`DELIVERY_MARGIN_US`] for the answer to reach Envoy) ends before the window does;
//! - a **token bucket**'s lease shrinks at the refill rate from `hold_us` after the take on:
//!   only the units still held when the assignment can last be used are handed out.

use crate::limit::{bucket_lease_shrunk, Algorithm, Grant};

/// Longest an assignment is given for, in whole seconds (Envoy 1.40 reads only the seconds of
/// `assignment_time_to_live`; 0 would expire at once). Envoy 1.40 reports every 5 s, and a
/// running assignment is renewed (the same token bucket, a fresh time to live: Envoy keeps its
/// bucket) at each report while the lease's terms allow, so it must outlive one report
/// interval with room to spare: 9 s covers a 5 s interval and a late report.
pub const MAX_TTL_S: u64 = 9;

/// A renewal is sent only while the assignment it renews has at least this long left at Envoy
/// (counted from its earliest receipt): one arriving after the end would be a fresh, full
/// bucket at Envoy, not a renewal.
pub const RENEW_HEADROOM_US: u64 = 4 * DELIVERY_MARGIN_US;

/// Longest one Envoy bucket is kept by renewals, from its first assignment: far below
/// [`REFILL_INTERVAL_S`], so that it never refills a token.
pub const MAX_LIFE_S: u64 = 3_600;

/// Time allowed between sending an assignment and Envoy applying it (and its workers seeing
/// it), and for a report to travel back: Envoy counts the time to live from its own receipt.
pub const DELIVERY_MARGIN_US: u64 = 250_000;

/// The refill interval of an assignment's bucket: one token a day, far beyond any time to
/// live, so a drained bucket admits nothing more before it expires.
pub const REFILL_INTERVAL_S: i64 = 86_400;

const SECOND_US: u64 = 1_000_000;

/// What one Envoy is told for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// Requests it may admit (`max_tokens`).
    pub tokens: u64,
    /// Whole seconds it may admit them for.
    pub ttl_s: u64,
}

/// The assignment a lease `grant` of `algorithm` backs for requests of `cost` units, `spent_us`
/// after the instant just before the take was asked; `None` when it backs none (too few units,
/// or too little time left in the window).
pub fn assignment(
    algorithm: &Algorithm,
    grant: &Grant,
    cost: u64,
    spent_us: u64,
) -> Option<Assignment> {
    let cost = cost.max(1);
    let (usable, ttl_s) = match algorithm {
        Algorithm::FixedWindow(_) => {
            let left = grant
                .hold_us
                .saturating_sub(spent_us)
                .saturating_sub(DELIVERY_MARGIN_US);
            (grant.units, (left / SECOND_US).min(MAX_TTL_S))
        }
        Algorithm::TokenBucket(bucket) => {
            // The time to live that backs the most tokens (the longer one on a tie): a longer
            // one loses more of the lease to the refill.
            (1..=MAX_TTL_S)
                .map(|ttl_s| {
                    let until = spent_us + DELIVERY_MARGIN_US + ttl_s * SECOND_US;
                    let shrunk = bucket_lease_shrunk(bucket, grant.hold_us, until, grant.units);
                    ((grant.units - shrunk) / cost, ttl_s)
                })
                .max()
                .map(|(tokens, ttl_s)| (tokens * cost, ttl_s))?
        }
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => return None,
    };
    let tokens = (usable / cost).min(u64::from(u32::MAX));
    (tokens > 0 && ttl_s > 0).then_some(Assignment { tokens, ttl_s })
}

/// The time to live of a renewal of an assignment of `tokens` requests of `cost` on the lease
/// `grant`, sent `spent_us` after the instant just before the take: the longest (at most
/// [`MAX_TTL_S`]) at whose end, the margin included, the lease still backs every token (Envoy
/// keeps its bucket, so its admissions on it, past and to come, are at most `tokens`); `None`
/// when not even one second is backed.
pub fn renewal(
    algorithm: &Algorithm,
    grant: &Grant,
    cost: u64,
    tokens: u64,
    spent_us: u64,
) -> Option<u64> {
    let needed = tokens.saturating_mul(cost.max(1));
    if needed > grant.units {
        return None;
    }
    let ttl_s = match algorithm {
        Algorithm::FixedWindow(_) => {
            let left = grant
                .hold_us
                .saturating_sub(spent_us)
                .saturating_sub(DELIVERY_MARGIN_US);
            (left / SECOND_US).min(MAX_TTL_S)
        }
        Algorithm::TokenBucket(bucket) => (1..=MAX_TTL_S)
            .rev()
            .find(|ttl_s| {
                let until = spent_us + DELIVERY_MARGIN_US + ttl_s * SECOND_US;
                grant.units - bucket_lease_shrunk(bucket, grant.hold_us, until, grant.units)
                    >= needed
            })
            .unwrap_or(0),
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => 0,
    };
    (ttl_s > 0).then_some(ttl_s)
}

/// Units of a lease `grant` not admitted, once its assignment is over and every request it
/// admitted has been reported: what was taken, less what `admitted` requests of `cost` spent.
/// What a token bucket refilled by itself meanwhile is the store's to subtract, exactly and on
/// its own clock ([`crate::store::RateStore::give_back`]).
pub fn unused(grant: &Grant, cost: u64, admitted: u64) -> u64 {
    grant
        .units
        .saturating_sub(admitted.saturating_mul(cost.max(1)))
}

/// Requests to ask a lease for: enough for `rate_per_s` (recent demand) until two more reports
/// `interval_us` apart have come, plus a second, at least 1, at most what the quota allows at
/// once (an assignment used up is replaced at the next report; one lasting is renewed).
pub fn wanted(rate_per_s: u64, interval_us: u64, max_tokens: u64) -> u64 {
    let horizon_us = u128::from(interval_us) * 2 + u128::from(SECOND_US);
    let tokens = u128::from(rate_per_s)
        .saturating_mul(horizon_us)
        .div_ceil(u128::from(SECOND_US));
    u64::try_from(tokens)
        .unwrap_or(u64::MAX)
        .clamp(1, max_tokens.max(1))
}

/// One take's share of a limit: at most 1 / `FAIR_SHARE` of a fixed window's limit or of a
/// token bucket's burst (a token bucket's take adds what the bucket refills during the
/// assignment, [`ask_units`]), whatever demand a client reports.
pub const FAIR_SHARE: u64 = 4;

/// The most requests of `cost` one take asks for ([`FAIR_SHARE`]), at least 1: a client that
/// claims any demand still leaves three quarters of a limit to the others, and a stream that
/// ends loses at most a quarter with its assignment.
pub fn fair_share(algorithm: &Algorithm, cost: u64) -> u64 {
    let quota = match algorithm {
        Algorithm::FixedWindow(window) => window.limit(),
        Algorithm::TokenBucket(bucket) => bucket.capacity(),
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => 0,
    };
    (quota / FAIR_SHARE / cost.max(1)).max(1)
}

/// Units to take for `tokens` requests of `cost`: a token bucket's lease also loses what the
/// bucket refills while the assignment can last (from a full bucket, at once), so that much more
/// is asked; the store caps the take at what is left.
pub fn ask_units(algorithm: &Algorithm, tokens: u64, cost: u64) -> u64 {
    let units = tokens.saturating_mul(cost.max(1));
    match algorithm {
        Algorithm::TokenBucket(bucket) => {
            let life = u128::from(MAX_TTL_S * SECOND_US + 2 * DELIVERY_MARGIN_US);
            let refill =
                (life * u128::from(bucket.limit())).div_ceil(u128::from(bucket.period_us()).max(1));
            units.saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
        }
        _ => units,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Decision, FixedWindow, TokenBucket};

    fn grant(units: u64, hold_us: u64) -> Grant {
        Grant {
            units,
            decision: Decision {
                allowed: true,
                limit: 100,
                remaining: 0,
                reset_after_us: 0,
                retry_after_us: 0,
            },
            window: 0,
            hold_us,
            at_us: 0,
            epoch: 0,
        }
    }

    #[test]
    fn a_fixed_window_assignment_ends_before_the_window_with_the_margin() {
        let alg: Algorithm = FixedWindow::new(100, 60 * SECOND_US).unwrap().into();
        // 10 s left: the longest time to live.
        let a = assignment(&alg, &grant(40, 10 * SECOND_US), 1, 1_000).unwrap();
        assert_eq!(
            a,
            Assignment {
                tokens: 40,
                ttl_s: MAX_TTL_S
            }
        );
        // 1.9 s left, 0.1 s spent since the take was asked: 1.55 s after the margin, 1 s.
        let a = assignment(&alg, &grant(40, 1_900_000), 1, 100_000).unwrap();
        assert_eq!(a.ttl_s, 1);
        // 1.2 s left: not a whole second once the margin is off; nothing is assigned.
        assert_eq!(assignment(&alg, &grant(40, 1_200_000), 1, 0), None);
        // A cost of 3: 40 units back 13 requests.
        let a = assignment(&alg, &grant(40, 10 * SECOND_US), 3, 0).unwrap();
        assert_eq!(a.tokens, 13);
        assert_eq!(assignment(&alg, &grant(2, 10 * SECOND_US), 3, 0), None);
    }

    #[test]
    fn a_token_bucket_assignment_hands_out_only_what_is_still_held_when_it_ends() {
        // 10 per second, burst 20: a unit refills every 0.1 s.
        let bucket = TokenBucket::new(10, SECOND_US, 20).unwrap();
        let alg: Algorithm = bucket.into();
        // A full bucket (hold 0): over 2 s + 0.25 s margin + 0.05 s spent, 23 units would
        // refill (all 20); over 1 s, 13: the shorter time to live keeps 7.
        assert_eq!(
            assignment(&alg, &grant(20, 0), 1, 50_000),
            Some(Assignment {
                tokens: 7,
                ttl_s: 1
            })
        );
        // A bucket 3 s in debt: nothing shrinks before a 2 s assignment ends (0.05 s + 0.25 s
        // + 2 s); a longer one would back fewer.
        assert_eq!(
            assignment(&alg, &grant(20, 3 * SECOND_US), 1, 50_000),
            Some(Assignment {
                tokens: 20,
                ttl_s: 2
            })
        );
        // Too few units for even one second.
        assert_eq!(assignment(&alg, &grant(5, 0), 1, 0), None);
    }

    #[test]
    fn admissions_never_exceed_the_units_held_at_any_instant_of_the_assignment() {
        // Whatever the lease, the assignment's tokens fit in what the lease still holds at the
        // last instant Envoy may use them (the margin included), for every cost.
        let bucket = TokenBucket::new(7, 3 * SECOND_US, 40).unwrap();
        let alg: Algorithm = bucket.into();
        for units in [1, 5, 17, 40] {
            for hold_us in [0, 400_000, 1_700_000, 5 * SECOND_US] {
                for spent_us in [0, 90_000, 900_000] {
                    for cost in [1, 2, 5] {
                        let g = grant(units, hold_us);
                        let Some(a) = assignment(&alg, &g, cost, spent_us) else {
                            continue;
                        };
                        let end = spent_us + DELIVERY_MARGIN_US + a.ttl_s * SECOND_US;
                        let held = units - bucket_lease_shrunk(&bucket, hold_us, end, units);
                        assert!(
                            a.tokens * cost <= held,
                            "{units} {hold_us} {spent_us} {cost}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn what_is_given_back_is_what_was_not_admitted() {
        assert_eq!(unused(&grant(40, 0), 1, 15), 25);
        assert_eq!(unused(&grant(40, 0), 3, 15), 0, "45 > 40");
    }

    #[test]
    fn a_token_bucket_asks_for_what_refills_during_the_assignment_too() {
        let bucket: Algorithm = TokenBucket::new(2, SECOND_US, 10).unwrap().into();
        // 9.5 s (the longest time to live and two margins) at 2 a second: 19 more.
        assert_eq!(ask_units(&bucket, 3, 1), 22);
        assert_eq!(ask_units(&bucket, 3, 2), 25);
        let window: Algorithm = FixedWindow::new(100, SECOND_US).unwrap().into();
        assert_eq!(ask_units(&window, 3, 2), 6);
        // From a full bucket, the 8 units back 3 requests for 2 s (5 refill by 2.25 s), or 5
        // for 1 s (3 refill by 1.25 s): the most tokens win.
        assert_eq!(
            assignment(&bucket, &grant(8, 0), 1, 0),
            Some(Assignment {
                tokens: 5,
                ttl_s: 1
            })
        );
    }

    #[test]
    fn demand_sizes_the_ask_within_the_quota() {
        // Two report intervals and a second of demand.
        assert_eq!(wanted(0, SECOND_US, 50), 1);
        assert_eq!(wanted(4, SECOND_US, 50), 12);
        assert_eq!(wanted(4, 5 * SECOND_US, 50), 44);
        assert_eq!(wanted(400, 5 * SECOND_US, 50), 50);
        assert_eq!(wanted(u64::MAX, u64::MAX, 0), 1);
    }

    #[test]
    fn a_fixed_window_renewal_ends_before_the_window_with_the_margin() {
        let alg: Algorithm = FixedWindow::new(100, 60 * SECOND_US).unwrap().into();
        // 10 s of the window left at the take, 1 s spent: 8.75 s after the margin.
        assert_eq!(
            renewal(&alg, &grant(40, 10 * SECOND_US), 1, 40, SECOND_US),
            Some(8)
        );
        // 0.75 s left after the margin: no whole second.
        assert_eq!(
            renewal(&alg, &grant(40, 10 * SECOND_US), 1, 40, 9 * SECOND_US),
            None
        );
        // More tokens than the lease holds are never renewed.
        assert_eq!(renewal(&alg, &grant(40, 10 * SECOND_US), 1, 41, 0), None);
        assert_eq!(renewal(&alg, &grant(40, 10 * SECOND_US), 3, 14, 0), None);
    }

    #[test]
    fn a_token_bucket_renewal_lasts_only_while_the_lease_backs_every_token() {
        // Whatever the lease and the time spent, a renewal's tokens fit in what the lease
        // still holds at its last instant, and a second more would not.
        let bucket = TokenBucket::new(10, SECOND_US, 20).unwrap();
        let alg: Algorithm = bucket.into();
        let held = |units: u64, hold_us: u64, until: u64| {
            units - bucket_lease_shrunk(&bucket, hold_us, until, units)
        };
        let mut renewed = 0;
        for units in [5, 20] {
            for hold_us in [0, 3 * SECOND_US, 12 * SECOND_US] {
                for spent_us in [0, 400_000, 5 * SECOND_US] {
                    for tokens in [1, 5, 20] {
                        let g = grant(units, hold_us);
                        let Some(ttl_s) = renewal(&alg, &g, 1, tokens, spent_us) else {
                            continue;
                        };
                        renewed += 1;
                        let end = spent_us + DELIVERY_MARGIN_US + ttl_s * SECOND_US;
                        assert!(tokens <= held(units, hold_us, end));
                        assert!(
                            ttl_s == MAX_TTL_S || tokens > held(units, hold_us, end + SECOND_US),
                            "{units} {hold_us} {spent_us} {tokens}: {ttl_s} s"
                        );
                    }
                }
            }
        }
        assert!(renewed > 5, "some renewals were possible: {renewed}");
        // Deep in debt: the longest time to live.
        assert_eq!(
            renewal(&alg, &grant(20, 12 * SECOND_US), 1, 20, 0),
            Some(MAX_TTL_S)
        );
        // A full bucket's lease shrinks at once: nothing backs 20 tokens for a second.
        assert_eq!(renewal(&alg, &grant(20, 0), 1, 20, 0), None);
    }
}

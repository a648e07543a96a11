//! The assignment math, pure (times as µs on one base): what Envoy 1.40's filter may admit on
//! an assignment, whether the units a bucket holds back all of it, and what a steady client's
//! demand asks for.
//!
//! An assignment is an Envoy token bucket of `max_tokens` **m** that refills **f** tokens a
//! second (`tokens_per_fill: f`, `fill_interval: 1s`), for `assignment_time_to_live` whole
//! seconds. Envoy's bucket refills continuously, never holds more than m, and carries its level
//! over to a replacement (in proportion) or a renewal (the same settings: the same bucket): from
//! any instant `s` to the assignment's end `E`, Envoy admits at most `m + f (E - s)`.
//!
//! A bucket's units are the grants it holds ([`Held`]), each spent at the counter before any
//! assignment it backs was sent, each usable until it **expires**: a fixed window's at the end
//! of its window, a token bucket's one unit at a time at the refill rate from `hold_us` after
//! its take on (`limit::bucket_lease_shrunk`). Every admission must be matched to a unit not yet
//! used and not yet expired. With `used` the units already used or expired (reported
//! admissions, counted conservatively), an assignment from `t` to `E` is backed when
//! (1) `held - used >= m + f (E - t)` (every admission to come has a unit), and
//! (2) `expired(v) + m + f (E - v) <= held` at every instant `v` of `[t, E]` (the admissions
//! after `v` still find units that have not expired by then); piecewise linear, so checked at
//! `t`, `E` and every grant's kinks between.

use crate::limit::{bucket_lease_shrunk, Algorithm, TokenBucket};

/// Longest an assignment is given for, in whole seconds (Envoy 1.40 reads only the seconds of
/// `assignment_time_to_live`; 0 would expire at once).
pub const MAX_TTL_S: u64 = 9;

/// Time allowed between sending an assignment and Envoy applying it (and its workers seeing
/// it), and for a report to travel back: Envoy counts the time to live from its own receipt.
pub const DELIVERY_MARGIN_US: u64 = 250_000;

/// A steady client's refill is its reported rate with this much more (in quarters), and one
/// token a second: room for jitter between reports.
const HEADROOM_QUARTERS: u64 = 5;

const SECOND_US: u64 = 1_000_000;

/// What one Envoy is told for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Requests its bucket holds at most (`max_tokens`), at least 1.
    pub tokens: u64,
    /// Requests it refills a second (`tokens_per_fill` per a 1 s `fill_interval`); 0: none.
    pub per_s: u64,
    /// Whole seconds it may admit for.
    pub ttl_s: u64,
}

/// One grant a bucket holds: `units` taken at the counter, `asked_us` just before the take was
/// asked, and the grant's `hold_us` (see `limit::Grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub units: u64,
    pub asked_us: u64,
    pub hold_us: u64,
}

fn token_bucket(algorithm: &Algorithm) -> Option<&TokenBucket> {
    match algorithm {
        Algorithm::TokenBucket(bucket) => Some(bucket),
        _ => None,
    }
}

/// Units of `held` expired at `at_us`: a token bucket's refilled, a fixed window's past its end
/// (counted from before the take: never later than at the counter). A sliding log is never held.
pub fn expired(algorithm: &Algorithm, held: &[Held], at_us: u64) -> u64 {
    held.iter()
        .map(|h| match algorithm {
            Algorithm::TokenBucket(bucket) => {
                bucket_lease_shrunk(bucket, h.hold_us, at_us.saturating_sub(h.asked_us), h.units)
            }
            Algorithm::FixedWindow(_) if at_us < h.asked_us.saturating_add(h.hold_us) => 0,
            _ => h.units,
        })
        .fold(0, u64::saturating_add)
}

/// Units of `held` used or expired at `now_us`: the earliest to expire first, `before` at
/// `last_us` (the last report) and `admitted` since, Envoy's bucket holding at most `tokens`
/// and refilling `per_s` units a second meanwhile, until `end_us` (its assignment over) (so what it admitted after any instant `u` is
/// at most its tokens and its refill since `u`: admissions spread out use units that were to
/// expire anyway).
pub fn used_after(
    algorithm: &Algorithm,
    held: &[Held],
    before: u64,
    (last_us, now_us): (u64, u64),
    admitted: u64,
    (tokens, per_s, end_us): (u64, u64, u64),
) -> u64 {
    // Nothing is admitted once the last assignment is over (`end_us`).
    let since = |u: u64| {
        let refilled = refill(per_s, end_us.min(now_us).saturating_sub(u));
        if u >= end_us {
            0
        } else {
            admitted.min(tokens.saturating_add(refilled))
        }
    };
    let mut at = kinks(algorithm, held, last_us, now_us);
    if per_s > 0 && admitted > tokens {
        let span = u128::from(admitted - tokens) * u128::from(SECOND_US) / u128::from(per_s);
        let meet = end_us
            .min(now_us)
            .saturating_sub(u64::try_from(span).unwrap_or(u64::MAX));
        if meet > last_us {
            at.push(meet);
        }
    }
    if (last_us..now_us).contains(&end_us) {
        at.push(end_us);
    }
    at.into_iter()
        .map(|u| expired(algorithm, held, u).saturating_add(since(u)))
        .fold(before.saturating_add(admitted), u64::max)
}

/// Where `expired` changes slope between `from_us` and `to_us`.
fn kinks(algorithm: &Algorithm, held: &[Held], from_us: u64, to_us: u64) -> Vec<u64> {
    let mut at = vec![from_us, to_us];
    for h in held {
        let start = h.asked_us.saturating_add(h.hold_us);
        at.push(start);
        if let Some(bucket) = token_bucket(algorithm) {
            let drain = u128::from(h.units) * u128::from(bucket.period_us())
                / u128::from(bucket.limit().max(1));
            at.push(start.saturating_add(u64::try_from(drain).unwrap_or(u64::MAX)));
        }
    }
    at.retain(|v| (from_us..=to_us).contains(v));
    at
}

/// Requests `per_s` a second admit over `span_us` (rounded up).
pub fn refill(per_s: u64, span_us: u64) -> u64 {
    let n = (u128::from(per_s) * u128::from(span_us)).div_ceil(u128::from(SECOND_US));
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// What a bucket holds, as the math sees it: its grants, the units of them used or expired
/// (`used`), its algorithm and requests' cost.
pub struct Backing<'a> {
    pub algorithm: &'a Algorithm,
    pub held: &'a [Held],
    pub used: u64,
    pub cost: u64,
}

impl Backing<'_> {
    /// Units short of backing an Envoy bucket of `tokens` refilling `per_s` requests a second
    /// from `from_us` to `end_us`: 0 when backed.
    pub fn shortfall(&self, tokens: u64, per_s: u64, from_us: u64, end_us: u64) -> u64 {
        let (algorithm, held) = (self.algorithm, self.held);
        let cost = self.cost.max(1);
        let total: u64 = held.iter().map(|h| h.units).fold(0, u64::saturating_add);
        let burst = tokens.saturating_mul(cost);
        let admits = |from: u64| {
            burst.saturating_add(refill(per_s, end_us.saturating_sub(from)).saturating_mul(cost))
        };
        let count = self
            .used
            .saturating_add(admits(from_us))
            .saturating_sub(total);
        let lasting = kinks(algorithm, held, from_us, end_us)
            .into_iter()
            .map(|v| {
                expired(algorithm, held, v)
                    .saturating_add(admits(v))
                    .saturating_sub(total)
            })
            .max()
            .unwrap_or(0);
        count.max(lasting)
    }

    /// The terms closest to `want` that `held` backs from `from_us` (with `carried` tokens the most
    /// Envoy's running bucket may hold meanwhile), for an assignment sent at
    /// `send_us` (it may admit until `send_us` + the margin + its time to live): the full refill for
    /// the longest time to live down to `min_ttl_s`, else the most refill (the longer time to
    /// live on a tie; lasting past the next report if any does), else the most tokens (up to
    /// all the units held) any time to live backs, without refill. `None` when not even one token is
    /// backed for a second.
    pub fn backed(
        &self,
        want: Terms,
        carried: u64,
        min_ttl_s: u64,
        from_us: u64,
        send_us: u64,
    ) -> Option<Terms> {
        let end = |ttl_s: u64| send_us + DELIVERY_MARGIN_US + ttl_s * SECOND_US;
        // Envoy's running bucket may hold up to `carried` until this one lands.
        let ok = |tokens: u64, per_s: u64, ttl_s: u64| {
            let burst = tokens.max(carried);
            self.shortfall(burst, per_s, from_us, end(ttl_s)) == 0
        };
        let want_ttl = want.ttl_s.clamp(1, MAX_TTL_S);
        let tokens = want.tokens.max(1);
        for ttl_s in (min_ttl_s.clamp(1, want_ttl)..=want_ttl).rev() {
            if ok(tokens, want.per_s, ttl_s) {
                return Some(Terms {
                    tokens,
                    per_s: want.per_s,
                    ttl_s,
                });
            }
        }
        // Less refill: the most, the longer time to live on a tie, lasting past the next
        // report if any does.
        let low = min_ttl_s.clamp(1, want_ttl);
        for ttls in [low..=want_ttl, 1..=low.saturating_sub(1)] {
            let best = ttls
                .filter(|&ttl_s| ok(tokens, 1, ttl_s))
                .map(|ttl_s| (most(1, want.per_s, |f| ok(tokens, f, ttl_s)), ttl_s))
                .max();
            if let Some((per_s, ttl_s)) = best {
                return Some(Terms {
                    tokens,
                    per_s,
                    ttl_s,
                });
            }
        }
        // Nothing lasts past the next report (a token bucket that refills fast, its burst
        // under the span): the most tokens any time to live backs, no refill, the longer on a
        // tie.
        let held: u64 = self
            .held
            .iter()
            .map(|h| h.units)
            .fold(0, u64::saturating_add);
        let cap = tokens.max(held / self.cost.max(1));
        (1..=want_ttl)
            .filter(|&ttl_s| ok(1, 0, ttl_s))
            .map(|ttl_s| (most(1, cap, |m| ok(m, 0, ttl_s)), ttl_s))
            .max()
            .map(|(tokens, ttl_s)| Terms {
                tokens,
                per_s: 0,
                ttl_s,
            })
    }
}

/// The largest value in `[low, high]` for which `fits` holds, given it holds at `low` and
/// fails from some value on.
fn most(low: u64, high: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut low, mut high) = (low, high);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if fits(mid) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

/// What a client's demand asks for, from the requests a second it was allowed and it claimed
/// (denied, counted at most at the fair rate), and whether any was denied (`held_back`): a refill of its rate and a quarter more, plus
/// one; twice what it was allowed while it is denied too (its assignment held it back: it
/// grows fast, within what its takes get); as many tokens as half a second of it; a time to live
/// that outlives the report interval ([`ttl_for`]).
pub fn wanted(allowed_per_s: u64, claimed_per_s: u64, held_back: bool, interval_us: u64) -> Terms {
    let allowed = u128::from(allowed_per_s);
    let grown = if held_back {
        allowed * 2
    } else {
        (allowed * u128::from(HEADROOM_QUARTERS)).div_ceil(4)
    };
    let claimed = (u128::from(claimed_per_s) * u128::from(HEADROOM_QUARTERS)).div_ceil(4);
    let per_s = u64::try_from(grown + claimed + 1)
        .unwrap_or(u64::MAX)
        .min(u64::from(u32::MAX));
    Terms {
        tokens: per_s / 2 + 1,
        per_s,
        ttl_s: ttl_for(interval_us),
    }
}

/// The time to live for reports `interval_us` apart: the interval (to the nearest second) and
/// a second, so that the next report's renewal lands before it ends (a longer one holds more
/// of a token bucket's rate ahead).
pub fn ttl_for(interval_us: u64) -> u64 {
    (interval_us.saturating_add(SECOND_US / 2) / SECOND_US + 1).clamp(2, MAX_TTL_S)
}

/// The first assignment of a bucket, before any rate is known (a burst from idle): its share of
/// the policy's burst ([`fair_share`]) and of its rate, for requests of `cost`.
pub fn first(algorithm: &Algorithm, cost: u64, interval_us: u64) -> Terms {
    Terms {
        tokens: fair_share(algorithm, cost),
        per_s: fair_rate(algorithm, cost),
        ttl_s: ttl_for(interval_us),
    }
}

/// One take's share of a limit: at most 1 / `FAIR_SHARE` of a fixed window's limit or of a
/// token bucket's burst as tokens, and of the policy's rate as refill, on demand a client only
/// claims (denied, or admitted past what its units backed).
pub const FAIR_SHARE: u64 = 4;

/// The tokens of a first assignment and the most a claim may add ([`FAIR_SHARE`]), at least 1.
pub fn fair_share(algorithm: &Algorithm, cost: u64) -> u64 {
    let quota = match algorithm {
        Algorithm::FixedWindow(window) => window.limit(),
        Algorithm::TokenBucket(bucket) => bucket.capacity(),
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => 0,
    };
    (quota / FAIR_SHARE / cost.max(1)).clamp(1, u64::from(u32::MAX))
}

/// Requests a second of the policy's rate one claim may add ([`FAIR_SHARE`]).
pub fn fair_rate(algorithm: &Algorithm, cost: u64) -> u64 {
    // A token bucket's refill rate, not its capacity (`Algorithm::limit`).
    let limit = token_bucket(algorithm).map_or(algorithm.limit(), TokenBucket::limit);
    let per_s = u128::from(limit) * u128::from(SECOND_US)
        / u128::from(algorithm.period_us().max(1))
        / u128::from(FAIR_SHARE * cost.max(1));
    u64::try_from(per_s)
        .unwrap_or(u64::MAX)
        .min(u64::from(u32::MAX))
}

#[cfg(test)]
#[path = "sizing_tests.rs"]
mod tests;

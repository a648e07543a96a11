//! The assignment math: what backs an Envoy bucket, checked against a brute-force matching of
//! Envoy's worst admissions to the units held.

use super::*;
use crate::limit::{FixedWindow, TokenBucket};

const S: u64 = SECOND_US;

fn backing<'a>(algorithm: &'a Algorithm, held: &'a [Held], used: u64) -> Backing<'a> {
    Backing {
        algorithm,
        held,
        used,
        cost: 1,
    }
}

#[test]
fn a_fixed_window_backs_the_burst_and_the_refill_until_its_end() {
    let alg: Algorithm = FixedWindow::new(1_000, 3_600 * S).unwrap().into();
    // 40 units, the window ends 10 s after the take was asked.
    let held = [Held {
        units: 40,
        asked_us: 0,
        hold_us: 10 * S,
    }];
    let b = backing(&alg, &held, 0);
    // 10 tokens and 5 a second for 6 s: 40 units exactly.
    assert_eq!(b.shortfall(10, 5, 0, 6 * S), 0);
    assert_eq!(b.shortfall(10, 5, 0, 6 * S + 1), 1);
    // 10 used already: 10 short.
    assert_eq!(backing(&alg, &held, 10).shortfall(10, 5, 0, 6 * S), 10);
    // Past the window's end nothing is usable.
    assert_eq!(b.shortfall(1, 0, 0, 11 * S), 1);
    // The closest terms: the full refill for a time to live that ends in time.
    let want = Terms {
        tokens: 10,
        per_s: 5,
        ttl_s: 9,
    };
    let terms = b.backed(want, 0, 2, 0, 0).unwrap();
    assert_eq!(
        terms,
        Terms {
            tokens: 10,
            per_s: 5,
            ttl_s: 5
        },
        "5 s + the margin: 10 + 5 x 5.25 <= 40"
    );
}

#[test]
fn a_token_bucket_grant_backs_only_what_it_still_holds_when_each_admission_comes() {
    // 10 a second, burst 40: a unit refills every 0.1 s.
    let bucket = TokenBucket::new(10, S, 40).unwrap();
    let alg: Algorithm = bucket.into();
    // From a full bucket (hold 0) the grant shrinks at once: 40 units back 10 tokens only
    // while 30 have not refilled, 3 s.
    let held = [Held {
        units: 40,
        asked_us: 0,
        hold_us: 0,
    }];
    let b = backing(&alg, &held, 0);
    assert_eq!(b.shortfall(10, 0, 0, 3 * S), 0);
    assert!(b.shortfall(10, 0, 0, 3 * S + 100_000) > 0);
    // Behind 4 s of debt, it lasts: 10 tokens and 5 a second for 6 s.
    let held = [Held {
        units: 40,
        asked_us: 0,
        hold_us: 4 * S,
    }];
    assert_eq!(backing(&alg, &held, 0).shortfall(10, 5, 0, 6 * S), 0);
}

/// Whether every admission Envoy may make on `terms` from `from` to `end` (any timing within
/// its bucket) finds a unit of `held` not used and not expired, by the earliest-expiring-first
/// matching, on a 10 ms grid: the worst timing admits the bucket's tokens as late as possible.
fn matches(alg: &Algorithm, held: &[Held], used: u64, terms: Terms, from: u64, end: u64) -> bool {
    // Units by expiry (µs), the first `used` gone.
    let mut units: Vec<u64> = Vec::new();
    for h in held {
        for k in 0..h.units {
            let one = Held { units: k + 1, ..*h };
            // The instant the k-th unit of this grant expires.
            let mut at = h.asked_us;
            while expired(alg, std::slice::from_ref(&one), at) <= k && at < 1_000 * S {
                at += 10_000;
            }
            units.push(at);
        }
    }
    units.sort_unstable();
    let mut units: std::collections::VecDeque<u64> =
        units.into_iter().skip(used as usize).collect();
    // Worst case: the refill admitted as it comes, the full bucket at the very end.
    let step = 10_000;
    let mut owed = 0.0f64;
    let mut t = from;
    while t < end {
        owed += terms.per_s as f64 * step as f64 / S as f64;
        while owed >= 1.0 {
            owed -= 1.0;
            while units.front().is_some_and(|&e| e <= t) {
                units.pop_front();
            }
            if units.pop_front().is_none() {
                return false;
            }
        }
        t += step;
    }
    while units.front().is_some_and(|&e| e <= end) {
        units.pop_front();
    }
    units.len() as u64 >= terms.tokens
}

#[test]
fn whatever_is_held_the_chosen_terms_are_matched_by_units() {
    let bucket: Algorithm = TokenBucket::new(20, S, 60).unwrap().into();
    let window: Algorithm = FixedWindow::new(500, 30 * S).unwrap().into();
    let mut checked = 0;
    for alg in [&bucket, &window] {
        for units in [5, 30, 60] {
            for hold_us in [0, 800_000, 2 * S] {
                for used in [0, 4] {
                    let held = [Held {
                        units,
                        asked_us: 0,
                        hold_us,
                    }];
                    let want = Terms {
                        tokens: 6,
                        per_s: 8,
                        ttl_s: 3,
                    };
                    let b = backing(alg, &held, used);
                    let Some(terms) = b.backed(want, 0, 2, 0, 50_000) else {
                        continue;
                    };
                    checked += 1;
                    let end = 50_000 + DELIVERY_MARGIN_US + terms.ttl_s * S;
                    assert!(
                        matches(alg, &held, used, terms, 0, end),
                        "{units} {hold_us} {used}: {terms:?}"
                    );
                }
            }
        }
    }
    assert!(checked > 8, "{checked}");
}

#[test]
fn demand_asks_for_its_rate_and_a_quarter_for_longer_than_a_report_interval() {
    assert_eq!(
        wanted(0, 0, false, S),
        Terms {
            tokens: 1,
            per_s: 1,
            ttl_s: 2
        }
    );
    assert_eq!(wanted(40, 0, false, 5 * S).per_s, 51);
    assert_eq!(
        wanted(40, 4, true, 5 * S).per_s,
        86,
        "denied too: twice, and the claim"
    );
    assert_eq!(wanted(40, 0, false, 5 * S).ttl_s, 6);
    assert_eq!(wanted(u64::MAX, u64::MAX, true, u64::MAX).ttl_s, MAX_TTL_S);
    // A burst from idle: a quarter of the burst and of the rate.
    let bucket: Algorithm = TokenBucket::new(1_000, 60 * S, 150).unwrap().into();
    assert_eq!(
        first(&bucket, 1, 5 * S),
        Terms {
            tokens: 37,
            per_s: 4,
            ttl_s: 6
        }
    );
}

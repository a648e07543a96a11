//! Property tests of the spend regardless (`Algorithm::spend`, a cost known afterwards): within
//! the limit it is an ordinary admission; past it the next checks are denied exactly as long as
//! recording the whole overspend would deny them (the reference: `admit` forced through, which
//! puts a bucket into debt, counts a window past its limit, keeps every unit of a log), while the
//! state stays bounded (a log holds at most `limit` units).

use proptest::prelude::*;

use super::*;

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1u64..30, 1u64..=10_000, 1u64..30)
            .prop_map(|(l, p, b)| TokenBucket::new(l, p, b).unwrap().into()),
        (1u64..30, 1u64..=10_000).prop_map(|(l, p)| SlidingLog::new(l, p).unwrap().into()),
        (1u64..30, 1u64..=10_000).prop_map(|(l, p)| FixedWindow::new(l, p).unwrap().into()),
    ]
}

/// Steps of (time advance, cost, report?): reports go to 4x the limit.
fn scenario() -> impl Strategy<Value = (Algorithm, Vec<(Micros, u64, bool)>)> {
    algorithm().prop_flat_map(|alg| {
        let p = alg.period_us();
        let dt = prop_oneof![2 => Just(0), 5 => 0..=p, 1 => 0..=3 * p];
        let step = (dt, 1..=4 * alg.limit(), prop::bool::weighted(0.4));
        (Just(alg), prop::collection::vec(step, 1..120))
    })
}

fn units(state: &State) -> u64 {
    match state {
        State::Log(log) => log.entries.iter().map(|&(_, c)| c).sum(),
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_spend_denies_exactly_as_long_as_the_whole_overspend_would(
        (alg, steps) in scenario()
    ) {
        let mut spent = alg.new_state();
        let mut reference = alg.new_state();
        let mut now = 1_000_000;
        for (dt, cost, report) in steps {
            now += dt;
            if report {
                let before = alg.decide(&spent, now, cost);
                let d = alg.spend(&mut spent, now, cost);
                alg.admit(&mut reference, now, cost);
                if before.allowed {
                    prop_assert_eq!(d, before, "within the limit: an ordinary admission");
                } else {
                    prop_assert!(!d.allowed && d.remaining == 0, "{:?}", d);
                    // What is left is a request of 1 unit's: exact retry.
                    prop_assert!(alg.decide(&spent, now + d.retry_after_us, 1).allowed);
                    prop_assert!(!alg.decide(&spent, now + d.retry_after_us - 1, 1).allowed);
                }
                prop_assert!(units(&spent) <= alg.limit(), "a log keeps at most limit units");
            } else {
                let cost = cost.min(alg.limit());
                let d = alg.decide(&spent, now, cost);
                let r = alg.decide(&reference, now, cost);
                prop_assert_eq!(d, r, "a check after spends at {}", now);
                if d.allowed {
                    alg.admit(&mut spent, now, cost);
                    alg.admit(&mut reference, now, cost);
                }
            }
            // Every later check of any cost answers as the reference does.
            for later in [now, now + alg.period_us() / 2, now + alg.period_us()] {
                for c in [1, alg.limit()] {
                    prop_assert_eq!(alg.decide(&spent, later, c), alg.decide(&reference, later, c));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// With a report debt bound of `d` periods, no sequence of spends and checks leaves the
    /// next check of 1 unit waiting more than `d` periods, and within the bound a spend is
    /// counted whole (as without one).
    #[test]
    fn a_report_debt_bound_caps_every_wait_at_its_periods(
        (alg, steps) in scenario(),
        periods in 1u64..4,
    ) {
        let bounded = alg.with_report_debt(periods);
        let mut state = bounded.new_state();
        let mut now = 1_000_000;
        for (dt, cost, report) in steps {
            now += dt;
            if report {
                let mut whole = state.clone();
                alg.spend(&mut whole, now, cost);
                let d = bounded.spend(&mut state, now, cost);
                let most = periods * alg.period_us();
                prop_assert!(d.allowed || d.retry_after_us <= most, "{:?} past {} µs", d, most);
                prop_assert!(bounded.decide(&state, now + most, 1).allowed);
                if d.allowed || d.retry_after_us < most {
                    prop_assert_eq!(&state, &whole, "within the bound: the whole cost");
                }
            } else {
                let cost = cost.min(alg.limit());
                if bounded.decide(&state, now, cost).allowed {
                    bounded.admit(&mut state, now, cost);
                }
            }
        }
    }
}

#[test]
fn a_report_of_the_largest_cost_leaves_a_5_per_hour_bucket_one_period_in_debt() {
    const HOUR: Micros = 3_600_000_000;
    let tb = TokenBucket::new(5, HOUR, 5).unwrap();
    let mut s = BucketState::default();
    let d = tb.with_report_debt(1).spend(&mut s, 0, 1_000_000);
    assert_eq!(d.retry_after_us, HOUR, "one period, not 22.8 years");
    assert_eq!(tb.with_report_debt(1).idle_at(&s), HOUR * 9 / 5);
    let mut s = BucketState::default();
    let d = tb.with_report_debt(24).spend(&mut s, 0, 1_000_000);
    assert_eq!(d.retry_after_us, 24 * HOUR);
    let mut s = BucketState::default();
    let d = tb.spend(&mut s, 0, 1_000_000);
    assert_eq!(
        d.retry_after_us,
        (1_000_000 - 4) * HOUR / 5,
        "no bound: the whole cost (22.8 years)"
    );
}

#[test]
fn a_bucket_in_debt_waits_for_the_debt_to_refill() {
    // 10 per second, burst 10: a report of 30 on a full bucket owes 20 tokens, 2 s.
    let tb = TokenBucket::new(10, 1_000_000, 10).unwrap();
    let mut s = BucketState::default();
    let d = tb.spend(&mut s, 0, 30);
    assert_eq!((d.allowed, d.remaining), (false, 0));
    assert_eq!(d.retry_after_us, 2_100_000, "20 owed, then 1 to spend");
    assert!(!tb.decide(&s, 2_099_999, 1).allowed);
    assert!(tb.decide(&s, 2_100_000, 1).allowed);
}

#[test]
fn a_bucket_debt_is_bounded_and_never_moves_back() {
    let tb = TokenBucket::new(1, 1_000_000_000, 1).unwrap();
    let mut s = BucketState::default();
    for _ in 0..10 {
        tb.spend(&mut s, 5, 1_000_000);
    }
    let ahead = u128::from(s.tat_us - 5) + u128::from(s.tat_rem);
    assert_eq!(ahead, MAX_AHEAD, "limit 1: 1/limit µs are µs");
    let held = s;
    tb.spend(&mut s, 5, 1);
    assert_eq!(s, held);
}

#[test]
fn a_window_spent_past_its_limit_is_denied_until_it_ends_and_not_after() {
    let fw = FixedWindow::new(10, 1_000).unwrap();
    let mut s = WindowState::default();
    let d = fw.spend(&mut s, 2_100, 25);
    assert_eq!((d.allowed, d.remaining, d.retry_after_us), (false, 0, 900));
    assert_eq!(s.count, 10);
    assert!(
        fw.decide(&s, 3_000, 10).allowed,
        "no carry into the next window"
    );
}

#[test]
fn a_log_spent_past_its_limit_keeps_its_newest_units() {
    let sl = SlidingLog::new(5, 100).unwrap();
    let mut s = LogState::default();
    assert!(sl.spend(&mut s, 0, 3).allowed);
    let d = sl.spend(&mut s, 10, 1_000_000);
    assert_eq!((d.allowed, d.retry_after_us), (false, 100));
    assert_eq!(s.entries, [(10, 5)]);
}

//! The spend regardless (a report) exists twice, like the rest of the math: `Algorithm::spend`
//! in Rust (the embedded store's `spend_now`) and the batch script's commit 2 in Lua. This feeds
//! both the same random histories of checks and reports (reports up to 3x the limit, on several
//! algorithms at once, token buckets with or without a report debt bound) with the script's
//! test-only `now`, and requires identical answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use sluice::clock::ManualClock;
use sluice::limit::{Algorithm, FixedWindow, Key, Micros, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::oracle::{parse_group_reply, ScriptCalls};
use sluice::store::redis::scripts::{Commit, Scripts};
use sluice::store::{MemoryStore, Spend, StoreCheck};

use crate::redis::differential::{eval, with_redis, START};

/// Steps of (time advance, cost, report?).
fn compare(algorithms: &[Algorithm], history: &[(u64, u64, bool)]) -> Result<(), TestCaseError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = format!("spend{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let clock = Arc::new(ManualClock::new(START));
    let memory = MemoryStore::new(1_000, clock.clone(), None);
    with_redis(|conn| {
        let mut now = START;
        for (step_no, &(step, cost, report)) in history.iter().enumerate() {
            now += step;
            clock.set(now);
            let group: Vec<StoreCheck> = algorithms
                .iter()
                .enumerate()
                .map(|(i, algorithm)| StoreCheck {
                    key: Key::new(Arc::from("r"), [format!("{base}-{i}").as_str()]),
                    algorithm: *algorithm,
                    // A check's cost is within every limit (the daemon refuses others); a
                    // report's is not.
                    cost: if report {
                        cost
                    } else {
                        cost.min(algorithm.limit())
                    },
                    enforce: true,
                    generation: 0,
                })
                .collect();
            let (rust, commit) = if report {
                (memory.spend_now(&group), Commit::Report)
            } else {
                (memory.check_now(&group, Spend::Record), Commit::IfAllowed)
            };
            let keyed: Vec<(String, &StoreCheck)> = group
                .iter()
                .map(|c| (format!("{{{base}}}{}", c.key.partition()), c))
                .collect();
            let call = Scripts::default().group_call(&keyed, commit, Some(now));
            let lua = parse_group_reply(&eval(conn, &call), keyed.len()).expect("reply parses");
            prop_assert_eq!(
                rust,
                lua,
                "step {}: now {} cost {} report {}",
                step_no,
                now,
                cost,
                report
            );
        }
        Ok(())
    })
}

/// Token buckets, logs and windows in turn; the buckets' report debt bounded to `debt` periods.
fn algorithms(limits: &[u64], period: Micros, debt: Option<u64>) -> Vec<Algorithm> {
    limits
        .iter()
        .enumerate()
        .map(|(i, &limit)| match i % 3 {
            0 => {
                let bucket = TokenBucket::new(limit, period, limit).expect("valid");
                debt.map_or(bucket, |d| bucket.with_report_debt(d)).into()
            }
            1 => SlidingLog::new(limit, period).expect("valid").into(),
            _ => FixedWindow::new(limit, period).expect("valid").into(),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_batch_script_spends_as_the_embedded_store_does(
        debt in prop::option::of(1u64..4),
        (limits, period, history) in (prop::collection::vec(1u64..12, 1..4), 1u64..20_000)
            .prop_flat_map(|(limits, p)| {
                let max = limits.iter().copied().max().unwrap_or(1);
                let dt = prop_oneof![2 => Just(0u64), 5 => 0..=p, 1 => 0..=3 * p];
                let step = (dt, 1..=3 * max, prop::bool::weighted(0.4));
                (Just(limits), Just(p), prop::collection::vec(step, 1..60))
            }),
    ) {
        compare(&algorithms(&limits, period, debt), &history)?;
    }
}

#[test]
fn a_report_at_the_shipped_scale_agrees() {
    // public_api (1000/min, burst 150) and login (10 per 5 min): reports of 400 units.
    let algorithms = [
        Algorithm::from(TokenBucket::new(1000, 60_000_000, 150).expect("valid")),
        Algorithm::from(SlidingLog::new(10, 300_000_000).expect("valid")),
        Algorithm::from(FixedWindow::new(1000, 60_000_000).expect("valid")),
    ];
    let steps: Vec<(u64, u64, bool)> = (0..300)
        .map(|i| (250_000, if i % 7 == 0 { 400 } else { 1 }, i % 7 == 0))
        .collect();
    compare(&algorithms, &steps).expect("agrees");
}

#[test]
fn the_largest_report_on_an_hourly_bucket_agrees_within_its_debt_bound() {
    // 5 per hour, burst 5: cost 1,000,000 reported twice, with the default bound (1 period),
    // 24 periods and none (2^52 units: what Lua's doubles hold exactly), then checks an hour on.
    const HOUR: Micros = 3_600_000_000;
    let bucket = TokenBucket::new(5, HOUR, 5).expect("valid");
    let algorithms = [
        Algorithm::from(bucket.with_report_debt(1)),
        Algorithm::from(bucket.with_report_debt(24)),
        Algorithm::from(bucket),
    ];
    let steps = [
        (0, 1_000_000, true),
        (1, 1_000_000, true),
        (HOUR - 1, 1, false),
        (1, 1, false),
        (HOUR, 5, false),
    ];
    compare(&algorithms, &steps).expect("agrees");
}

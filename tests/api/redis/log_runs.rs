//! A sliding log's Redis work does not grow with cost (issue 36 item 5): a check or report of
//! cost N writes one member (a run of N units), not N members, so 100 checks of cost 100 or one
//! report of 1,000,000 units cost Redis what checks of cost 1 cost. And a log written by the
//! previous layout (one member per unit, which pods of the previous version keep writing during a
//! rolling upgrade) is still read exactly: the twins agree on histories whose admissions are
//! written in either layout, in any order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use sluice::limit::{Algorithm, Key, Micros, SlidingLog};
use sluice::store::redis::scripts::oracle::{parse_group_reply, parse_reply, ScriptCalls};
use sluice::store::redis::scripts::{Commit, Scripts};
use sluice::store::{Spend, StoreCheck};

use crate::redis::differential::{eval, with_redis, START};

fn fresh_key() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("runs:{{k{}}}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn zcard(conn: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD")
}

/// Calls of `command` Redis has counted since the last `CONFIG RESETSTAT` (scripts' calls
/// included), from `INFO commandstats`.
fn calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("RESETSTAT");
}

#[test]
fn a_check_of_cost_100_is_one_member_and_one_zadd() {
    let log = Algorithm::SlidingLog(SlidingLog::new(10_000, 3_600_000_000).expect("valid"));
    with_redis(|conn| {
        let key = fresh_key();
        reset_stats(conn);
        for i in 0..100 {
            let call =
                Scripts::default().call(&log, key.clone(), 100, Spend::Record, Some(START + i));
            let decision = parse_reply(&eval(conn, &call)).expect("reply parses");
            assert!(decision.allowed, "check {i}: {decision:?}");
            assert_eq!(decision.remaining, 10_000 - 100 * (i + 1), "check {i}");
        }
        assert_eq!(
            calls(conn, "zadd"),
            100,
            "one ZADD per check, not one per unit"
        );
        assert_eq!(zcard(conn, &key), 100, "one member per check of cost 100");
        // The log is full: the next unit is denied until the first run leaves the window.
        let call = Scripts::default().call(&log, key.clone(), 1, Spend::Record, Some(START + 100));
        let denied = parse_reply(&eval(conn, &call)).expect("reply parses");
        assert_eq!(
            (denied.allowed, denied.remaining, denied.retry_after_us),
            (false, 0, 3_600_000_000 - 100)
        );
        // Checks at the same microsecond merge into one run, as the Rust twin merges them.
        let other = fresh_key();
        for _ in 0..3 {
            let call =
                Scripts::default().call(&log, other.clone(), 100, Spend::Record, Some(START));
            assert!(parse_reply(&eval(conn, &call)).expect("parses").allowed);
        }
        assert_eq!(zcard(conn, &other), 1, "one run of 300 units");
    });
}

#[test]
fn a_report_of_a_million_on_a_limit_of_10_000_is_one_zadd() {
    let log = Algorithm::SlidingLog(SlidingLog::new(10_000, 3_600_000_000).expect("valid"));
    let check = StoreCheck {
        key: Key::new(Arc::from("r"), ["huge"]),
        algorithm: log,
        cost: 1_000_000,
        enforce: true,
        generation: 0,
    };
    with_redis(|conn| {
        let key = fresh_key();
        // A log already holding units at an earlier time: the report keeps the newest 10,000,
        // all its own.
        let call = Scripts::default().call(&log, key.clone(), 40, Spend::Record, Some(START));
        assert!(parse_reply(&eval(conn, &call)).expect("parses").allowed);
        reset_stats(conn);
        let keyed = [(key.clone(), &check)];
        let call = Scripts::default().group_call(&keyed, Commit::Report, Some(START + 1));
        let reply = parse_group_reply(&eval(conn, &call), 1).expect("reply parses");
        assert_eq!(
            (reply[0].allowed, reply[0].remaining),
            (false, 0),
            "{reply:?}"
        );
        assert_eq!(calls(conn, "zadd"), 1, "one ZADD, not one per unit");
        assert_eq!(zcard(conn, &key), 1, "the newest 10,000 units: one run");
        // The earlier run left the log: once the report's run leaves, the quota is whole.
        let call = Scripts::default().call(
            &log,
            key.clone(),
            10_000,
            Spend::DryRun,
            Some(START + 3_600_000_001),
        );
        assert!(parse_reply(&eval(conn, &call)).expect("parses").allowed);
        let call = Scripts::default().call(
            &log,
            key.clone(),
            1,
            Spend::DryRun,
            Some(START + 3_600_000_000),
        );
        assert!(!parse_reply(&eval(conn, &call)).expect("parses").allowed);
    });
}

/// Writes `cost` units at `ts` as the previous layout did: one member per unit.
fn legacy_admit(conn: &mut redis::Connection, key: &str, ts: Micros, cost: u64, serial: &mut u64) {
    let mut cmd = redis::cmd("ZADD");
    cmd.arg(key);
    for _ in 0..cost {
        *serial += 1;
        cmd.arg(ts).arg(format!("{}.{serial}", ts % 1_000_000));
    }
    let _: () = cmd.query(conn).expect("ZADD");
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(600_000)
        .query(conn)
        .expect("PEXPIRE");
}

/// Steps of (time advance, cost, dry run, written in the legacy layout).
type Step = (u64, u64, bool, bool);

fn mixed_history(limit: u64, period: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => Just(0u64),
        5 => 0..=period / 4 + 1,
        2 => 0..=period * 3,
    ];
    prop::collection::vec(
        (
            step,
            0..=limit + 2,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.3),
        ),
        1..80,
    )
}

/// Replays `history` on the Rust twin and on Redis, where each admission is written either by
/// this script (a run) or in the legacy layout (what a pod of the previous version wrote), and
/// compares every decision of the script.
fn compare_mixed(limit: u64, period: u64, history: &[Step]) -> Result<(), TestCaseError> {
    let log = SlidingLog::new(limit, period).expect("valid");
    let algorithm = Algorithm::SlidingLog(log);
    let key = fresh_key();
    let mut state = algorithm.new_state();
    let mut serial = 0;
    let mut newest = 0;
    with_redis(|conn| {
        let mut now = START;
        for (i, &(step, cost, dry_run, legacy)) in history.iter().enumerate() {
            now += step;
            let dry_run = dry_run || cost == 0;
            let rust = algorithm.decide(&state, now, cost);
            if rust.allowed && !dry_run {
                algorithm.admit(&mut state, now, cost);
            }
            if legacy && !dry_run {
                // A unit written at the newest run's time if the clock stepped back.
                if rust.allowed {
                    newest = newest.max(now);
                    legacy_admit(conn, &key, newest, cost, &mut serial);
                }
                continue;
            }
            let call = Scripts::default().call(
                &algorithm,
                key.clone(),
                cost,
                Spend::from_dry_run(dry_run),
                Some(now),
            );
            let lua = parse_reply(&eval(conn, &call)).expect("reply parses");
            if lua.allowed && !dry_run {
                newest = newest.max(now);
            }
            prop_assert_eq!(
                rust,
                lua,
                "step {}: now {} cost {} dry {}",
                i,
                now,
                cost,
                dry_run
            );
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn legacy_and_run_members_read_alike(
        (limit, period, history) in (1u64..40, 1u64..20_000)
            .prop_flat_map(|(l, p)| (Just(l), Just(p), mixed_history(l, p))),
    ) {
        compare_mixed(limit, period, &history)?;
    }
}

#[test]
fn a_legacy_log_is_rewritten_as_runs_once() {
    let log = Algorithm::SlidingLog(SlidingLog::new(10_000, 3_600_000_000).expect("valid"));
    with_redis(|conn| {
        let key = fresh_key();
        // 3,000 units in the previous layout, at 1,000 distinct times (3 a time).
        let mut serial = 0;
        for t in 0..1_000 {
            legacy_admit(conn, &key, START + t, 3, &mut serial);
        }
        let call =
            Scripts::default().call(&log, key.clone(), 1, Spend::Record, Some(START + 1_000));
        let first = parse_reply(&eval(conn, &call)).expect("reply parses");
        assert_eq!((first.allowed, first.remaining), (true, 10_000 - 3_001));
        assert_eq!(zcard(conn, &key), 1_001, "one run per distinct time");
        // Rewritten once: from now on a check is O(log n), a few commands whatever the log holds.
        reset_stats(conn);
        let call =
            Scripts::default().call(&log, key.clone(), 2, Spend::Record, Some(START + 1_001));
        let next = parse_reply(&eval(conn, &call)).expect("reply parses");
        assert_eq!((next.allowed, next.remaining), (true, 10_000 - 3_003));
        assert_eq!((calls(conn, "zrange"), calls(conn, "zadd")), (2, 1));
        // A pod of the previous version adds units above: only those are rewritten.
        legacy_admit(conn, &key, START + 1_002, 4, &mut serial);
        reset_stats(conn);
        let call =
            Scripts::default().call(&log, key.clone(), 1, Spend::DryRun, Some(START + 1_003));
        let read = parse_reply(&eval(conn, &call)).expect("reply parses");
        assert_eq!((read.allowed, read.remaining), (true, 10_000 - 3_008));
        assert!(calls(conn, "zrange") <= 5, "{}", calls(conn, "zrange"));
        assert_eq!(zcard(conn, &key), 1_003);
    });
}

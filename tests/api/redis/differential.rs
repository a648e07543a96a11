//! The math exists twice on purpose (Rust in `limit/`, Lua in `lua/`): this feeds both the same
//! random histories, using the scripts' test-only `now`, and requires identical decisions. A cost
//! of 0 is a read (what `GET /v1/counters` asks, never recorded): histories include it.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use sluice::clock::ManualClock;
use sluice::limit::Key;
use sluice::limit::{Algorithm, Decision, FixedWindow, Micros, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::oracle::{
    parse_group_reply, parse_reply, ScriptCall, ScriptCalls,
};
use sluice::store::redis::scripts::Scripts;
use sluice::store::{MemoryStore, Spend, StoreCheck};

use crate::redis_server::RedisServer;

pub(crate) const START: Micros = 1_700_000_000_000_000;

thread_local! {
    /// This test thread's server and connection (each test has its own, killed when it ends;
    /// a process-wide static would never be dropped and leak the process).
    static REDIS: std::cell::RefCell<Option<(RedisServer, redis::Connection)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this test's connection, starting its server on first use.
pub(crate) fn with_redis<T>(f: impl FnOnce(&mut redis::Connection) -> T) -> T {
    REDIS.with(|cell| {
        let mut slot = cell.borrow_mut();
        let (_, conn) = slot.get_or_insert_with(|| {
            let server = RedisServer::start();
            let conn = server.connection();
            (server, conn)
        });
        f(conn)
    })
}

fn fresh_key() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("diff:{{k{}}}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn run_lua(
    conn: &mut redis::Connection,
    algorithm: &Algorithm,
    key: &str,
    now: Micros,
    cost: u64,
    spend: Spend,
) -> Decision {
    let call = Scripts::default().call(algorithm, key.to_owned(), cost, spend, Some(now));
    parse_reply(&eval(conn, &call)).expect("script reply parses")
}

/// One `EVAL` of a script call (its source, keys and arguments).
pub fn eval(conn: &mut redis::Connection, call: &ScriptCall) -> redis::Value {
    redis::cmd("EVAL")
        .arg(&*call.script.source)
        .arg(call.keys.len())
        .arg(&call.keys)
        .arg(&call.args)
        .query(conn)
        .expect("script runs")
}

/// Replays `history` (time step, cost, dry run) on both twins and compares every decision; a
/// cost of 0 is always a dry run (a read).
fn compare(
    algorithm: Algorithm,
    start: Micros,
    history: &[(u64, u64, bool)],
) -> Result<(), TestCaseError> {
    with_redis(|conn| compare_on(conn, algorithm, start, history))
}

fn compare_on(
    conn: &mut redis::Connection,
    algorithm: Algorithm,
    start: Micros,
    history: &[(u64, u64, bool)],
) -> Result<(), TestCaseError> {
    compare_through_reload(conn, algorithm, (history.len(), algorithm), start, history)
}

/// As `compare_on`, with `then.1` in force from step `then.0` on: a reload that changed the
/// policy's parameters (not its algorithm), over the state the steps before it left.
fn compare_through_reload(
    conn: &mut redis::Connection,
    first: Algorithm,
    then: (usize, Algorithm),
    start: Micros,
    history: &[(u64, u64, bool)],
) -> Result<(), TestCaseError> {
    let key = fresh_key();
    let mut state = first.new_state();
    let mut now = start;
    for (i, &(step, cost, dry_run)) in history.iter().enumerate() {
        let algorithm = if i < then.0 { first } else { then.1 };
        now += step;
        let dry_run = dry_run || cost == 0;
        let rust = algorithm.decide(&state, now, cost);
        if rust.allowed && !dry_run {
            algorithm.admit(&mut state, now, cost);
        }
        let lua = run_lua(
            conn,
            &algorithm,
            &key,
            now,
            cost,
            Spend::from_dry_run(dry_run),
        );
        prop_assert_eq!(
            rust,
            lua,
            "step {} of {:?}: now {} cost {} dry {}",
            i,
            algorithm,
            now,
            cost,
            dry_run
        );
    }
    Ok(())
}

fn history(limit: u64, period: u64) -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    let step = prop_oneof![
        3 => Just(0u64),
        5 => 0..=period / 4 + 1,
        2 => 0..=period * 3,
    ];
    prop::collection::vec((step, 0..=limit + 2, prop::bool::weighted(0.15)), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket_twins_agree(
        (limit, period, capacity, history) in (1u64..60, 1u64..20_000, 1u64..40)
            .prop_flat_map(|(l, p, c)| (Just(l), Just(p), Just(c), history(c, p))),
        offset in 0u64..1_000_000,
    ) {
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(limit, period, capacity).expect("valid"));
        compare(algorithm, START + offset, &history)?;
    }

    #[test]
    fn sliding_log_twins_agree(
        (limit, period, history) in (1u64..30, 1u64..20_000)
            .prop_flat_map(|(l, p)| (Just(l), Just(p), history(l, p))),
        offset in 0u64..1_000_000,
    ) {
        let algorithm = Algorithm::SlidingLog(SlidingLog::new(limit, period).expect("valid"));
        compare(algorithm, START + offset, &history)?;
    }

    #[test]
    fn fixed_window_twins_agree(
        (limit, period, history) in (1u64..30, 1u64..20_000)
            .prop_flat_map(|(l, p)| (Just(l), Just(p), history(l, p))),
        offset in 0u64..1_000_000,
    ) {
        let algorithm = Algorithm::FixedWindow(FixedWindow::new(limit, period).expect("valid"));
        compare(algorithm, START + offset, &history)?;
    }
}

/// A history through a reload: limit before and after, period before and after, the steps, and
/// the step from which the new parameters apply.
type Reloaded = (u64, u64, u64, u64, Vec<(u64, u64, bool)>, usize);

/// Limits lowered (or raised) over live state: the limit, a bucket's burst and, for the
/// algorithms whose state is times rather than a window's number, the period change mid-history.
/// A count above the new limit is denied with `remaining` 0, never a negative figure the daemon
/// would refuse as a protocol error (which gave the partition its failure mode).
fn reloaded(max_limit: u64) -> impl Strategy<Value = Reloaded> {
    (1u64..max_limit, 1u64..max_limit, 1u64..20_000, 1u64..20_000).prop_flat_map(
        |(before, after, period, period_after)| {
            (
                Just(before),
                Just(after),
                Just(period),
                Just(period_after),
                history(before.max(after), period),
                0usize..80,
            )
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_twins_agree_through_a_reload(
        (before, after, period, _, history, at) in reloaded(30),
    ) {
        let first = Algorithm::FixedWindow(FixedWindow::new(before, period).expect("valid"));
        let then = Algorithm::FixedWindow(FixedWindow::new(after, period).expect("valid"));
        with_redis(|conn| compare_through_reload(conn, first, (at, then), START, &history))?;
    }

    #[test]
    fn sliding_log_twins_agree_through_a_reload(
        (before, after, period, period_after, history, at) in reloaded(30),
    ) {
        let first = Algorithm::SlidingLog(SlidingLog::new(before, period).expect("valid"));
        let then = Algorithm::SlidingLog(SlidingLog::new(after, period_after).expect("valid"));
        with_redis(|conn| compare_through_reload(conn, first, (at, then), START, &history))?;
    }

    #[test]
    fn token_bucket_twins_agree_through_a_reload(
        (before, after, period, period_after, history, at) in reloaded(60),
        (burst, burst_after) in (1u64..40, 1u64..40),
    ) {
        let first = Algorithm::TokenBucket(TokenBucket::new(before, period, burst).expect("valid"));
        let then =
            Algorithm::TokenBucket(TokenBucket::new(after, period_after, burst_after).expect("valid"));
        with_redis(|conn| compare_through_reload(conn, first, (at, then), START, &history))?;
    }
}

/// A bucket's TAT remainder is in 1/limit µs: written under a limit of 60, it is 7 units, which
/// under a limit of 1 carry 7 µs into the TAT (the Rust twin's reading). The script once read a
/// TAT whole microseconds behind `now` as a full bucket whatever its remainder.
#[test]
fn a_remainder_written_under_a_higher_limit_carries_into_the_tat() {
    let first = Algorithm::TokenBucket(TokenBucket::new(60, 7, 40).expect("valid"));
    let then = Algorithm::TokenBucket(TokenBucket::new(1, 7, 1).expect("valid"));
    let history = [(0, 1, false), (1, 1, true), (6, 1, true), (1, 1, false)];
    with_redis(|conn| compare_through_reload(conn, first, (1, then), START, &history))
        .expect("the twins agree");
}

/// The group script against the embedded store's group semantics (decide all; record the allowed
/// ones only if every enforced one allowed), on the same histories.
fn compare_group(
    algorithms: &[(Algorithm, bool)],
    start: Micros,
    history: &[(u64, u64, bool)],
) -> Result<(), TestCaseError> {
    with_redis(|conn| compare_group_on(conn, algorithms, start, history))
}

fn compare_group_on(
    conn: &mut redis::Connection,
    algorithms: &[(Algorithm, bool)],
    start: Micros,
    history: &[(u64, u64, bool)],
) -> Result<(), TestCaseError> {
    let clock = std::sync::Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(1_000, clock.clone(), None);
    let base = fresh_key();
    let checks = |cost: u64| -> Vec<StoreCheck> {
        algorithms
            .iter()
            .enumerate()
            .map(|(i, (algorithm, enforce))| StoreCheck {
                key: Key::new(std::sync::Arc::from("g"), [format!("{base}{i}").as_str()]),
                algorithm: *algorithm,
                cost: cost.min(algorithm.limit()),
                enforce: *enforce,
                generation: 0,
            })
            .collect()
    };
    let mut now = start;
    for (step_no, &(step, cost, dry_run)) in history.iter().enumerate() {
        now += step;
        let dry_run = dry_run || cost == 0;
        clock.set(now);
        let group = checks(cost);
        let rust = memory.check_now(&group, Spend::from_dry_run(dry_run));
        let keyed: Vec<(String, &StoreCheck)> = group
            .iter()
            .map(|c| (format!("{{{base}}}{}", c.key.partition()), c))
            .collect();
        let call = Scripts::default().group_call(&keyed, Spend::from_dry_run(dry_run), Some(now));
        let lua = parse_group_reply(&eval(conn, &call), keyed.len()).expect("group reply parses");
        prop_assert_eq!(
            rust,
            lua,
            "step {}: now {} cost {} dry {}",
            step_no,
            now,
            cost,
            dry_run
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn group_script_agrees_with_the_embedded_group(
        (limits, period, history) in (prop::collection::vec(1u64..12, 2..4), 1u64..20_000)
            .prop_flat_map(|(limits, p)| {
                let max = limits.iter().copied().max().unwrap_or(1);
                (Just(limits), Just(p), history(max, p))
            }),
        shadow in prop::bool::weighted(0.3),
    ) {
        let algorithms: Vec<(Algorithm, bool)> = limits
            .iter()
            .enumerate()
            .map(|(i, &limit)| {
                let algorithm = match i % 3 {
                    0 => Algorithm::TokenBucket(TokenBucket::new(limit, period, limit).expect("valid")),
                    1 => Algorithm::SlidingLog(SlidingLog::new(limit, period).expect("valid")),
                    _ => Algorithm::FixedWindow(FixedWindow::new(limit, period).expect("valid")),
                };
                (algorithm, !(shadow && i == 1))
            })
            .collect();
        compare_group(&algorithms, START, &history)?;
    }
}

#[test]
fn the_shipped_routes_agree_at_their_real_scale() {
    // 1000/min with a burst of 150, and 10 per 5 min: a minute of traffic at 200/s and 1/s.
    let bucket = Algorithm::TokenBucket(TokenBucket::new(1000, 60_000_000, 150).expect("valid"));
    let steps: Vec<(u64, u64, bool)> = (0..2_000).map(|i| (5_000, 1 + i % 3, false)).collect();
    compare(bucket, START, &steps).expect("bucket agrees");
    let log = Algorithm::SlidingLog(SlidingLog::new(10, 300_000_000).expect("valid"));
    let steps: Vec<(u64, u64, bool)> = (0..600).map(|_| (1_000_000, 1, false)).collect();
    compare(log, START, &steps).expect("log agrees");
}

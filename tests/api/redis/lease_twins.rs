//! Quota leases exist twice, like the algorithms (`limit/lease.rs` and `lua/lease.lua`): random
//! histories of checks, takes and give-backs on both twins, with the scripts' test-only `now`,
//! must give identical decisions and grants, and leave identical state (the next check agrees).
//! Takes include a reservation's (fraction 0: all or nothing).

use proptest::prelude::*;
use sluice::limit::{Algorithm, FixedWindow, Grant, Micros, TokenBucket};
use sluice::store::redis::scripts::oracle::{parse_reply, ScriptCalls};
use sluice::store::redis::scripts::Scripts;
use sluice::store::Spend;

use super::differential::{eval, with_redis, START};

#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Take {
        want: u64,
        fraction: u64,
    },
    /// Gives back this many of the last take's units (never more than it got).
    Back(u64),
}

fn op(limit: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=limit.div_ceil(3)).prop_map(Op::Check),
        3 => (1..=limit * 2, 1u64..=8).prop_map(|(want, fraction)| Op::Take { want, fraction }),
        // A reservation's take: all of `want` or nothing (a check's cost: at most the limit).
        2 => (1..=limit).prop_map(|want| Op::Take { want, fraction: 0 }),
        2 => (0..=limit).prop_map(Op::Back),
    ]
}

fn lua_take(
    conn: &mut redis::Connection,
    alg: &Algorithm,
    key: &str,
    now: Micros,
    want: u64,
    fraction: u64,
) -> Grant {
    let call =
        Scripts::default().lease_call(alg, key.to_owned(), "take", want, fraction, 0, Some(now));
    let figures: Vec<i64> = redis::from_redis_value(eval(conn, &call)).expect("nine integers");
    let n = |i: usize| u64::try_from(figures[i]).unwrap_or(u64::MAX);
    Grant {
        units: n(0),
        decision: sluice::limit::Decision {
            allowed: figures[0] > 0 || figures[4] == 0,
            limit: n(1),
            remaining: n(2),
            reset_after_us: n(3),
            retry_after_us: n(4),
        },
        window: n(5),
        hold_us: n(6),
        at_us: n(7),
        epoch: n(8),
    }
}

fn replay(alg: Algorithm, key: &str, steps: &[(u64, Op)]) -> Result<(), TestCaseError> {
    with_redis(|conn| {
        let mut state = alg.new_state();
        let mut now = START;
        let mut last: Option<Grant> = None;
        for (i, &(step, op)) in steps.iter().enumerate() {
            now += step;
            match op {
                Op::Check(cost) => {
                    let rust = alg.decide(&state, now, cost);
                    if rust.allowed {
                        alg.admit(&mut state, now, cost);
                    }
                    let call = Scripts::default().call(
                        &alg,
                        key.to_owned(),
                        cost,
                        Spend::Record,
                        Some(now),
                    );
                    let lua = parse_reply(&eval(conn, &call)).expect("reply");
                    prop_assert_eq!(rust, lua, "step {} check {} at {}", i, cost, now);
                }
                Op::Take { want, fraction } => {
                    let rust = alg.take(&mut state, now, want, fraction).expect("leasable");
                    let lua = lua_take(conn, &alg, key, now, want, fraction);
                    // The pure twin knows no epochs (its stores set them): the script's is
                    // kept for the give-back, and is set exactly when units are granted.
                    prop_assert_eq!(lua.units > 0, lua.epoch > 0, "step {} epoch", i);
                    prop_assert_eq!(
                        rust,
                        Grant { epoch: 0, ..lua },
                        "step {} take {}/{} at {}",
                        i,
                        want,
                        fraction,
                        now
                    );
                    last = Some(Grant {
                        epoch: lua.epoch,
                        ..rust
                    });
                }
                Op::Back(units) => {
                    let Some(grant) = last.take() else { continue };
                    let units = units.min(grant.units);
                    let rust = alg.give_back(&mut state, now, units, &grant);
                    let extra = match alg {
                        Algorithm::TokenBucket(_) => grant.at_us + grant.hold_us,
                        _ => grant.window,
                    };
                    let call = Scripts::default().lease_call(
                        &alg,
                        key.to_owned(),
                        "back",
                        units,
                        extra,
                        grant.epoch,
                        Some(now),
                    );
                    let lua: Vec<u64> =
                        redis::from_redis_value(eval(conn, &call)).expect("one integer");
                    prop_assert_eq!(vec![rust], lua, "step {} back {} at {}", i, units, now);
                }
            }
            // The state both left behind reads alike.
            let rust = alg.decide(&state, now, 1);
            let call = Scripts::default().call(&alg, key.to_owned(), 1, Spend::DryRun, Some(now));
            let lua = parse_reply(&eval(conn, &call)).expect("reply");
            prop_assert_eq!(rust, lua, "after step {} ({:?}) at {}", i, op, now);
        }
        Ok(())
    })
}

fn steps(limit: u64, period: u64) -> impl Strategy<Value = Vec<(u64, Op)>> {
    let step = prop_oneof![3 => Just(0u64), 5 => 0..=period / 4 + 1, 2 => 0..=period * 2];
    proptest::collection::vec((step, op(limit)), 1..40)
}

fn fresh_key() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("lease:{{k{}}}", NEXT.fetch_add(1, Ordering::Relaxed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket_lease_twins_agree(
        (limit, period, capacity, history) in (1u64..50, 1_000u64..5_000_000, 1u64..60)
            .prop_flat_map(|(l, p, c)| (Just(l), Just(p), Just(c), steps(c.max(l), p)))
    ) {
        let alg: Algorithm = TokenBucket::new(limit, period, capacity).unwrap().into();
        replay(alg, &fresh_key(), &history)?;
    }

    #[test]
    fn fixed_window_lease_twins_agree(
        (limit, period, history) in (1u64..60, 1_000u64..5_000_000)
            .prop_flat_map(|(l, p)| (Just(l), Just(p), steps(l, p)))
    ) {
        let alg: Algorithm = FixedWindow::new(limit, period).unwrap().into();
        replay(alg, &fresh_key(), &history)?;
    }
}

/// A take sent before a reload switched algorithm must not overwrite the new algorithm's live
/// count: both twins grant nothing and leave the value as it is.
#[test]
fn a_take_never_overwrites_the_other_algorithms_count() {
    let window: Algorithm = FixedWindow::new(10, 1_000_000).unwrap().into();
    let bucket: Algorithm = TokenBucket::new(10, 1_000_000, 10).unwrap().into();
    for (writer, taker) in [(window, bucket), (bucket, window)] {
        with_redis(|conn| {
            let key = fresh_key();
            let now = START + 10;
            let call = Scripts::default().call(&writer, key.clone(), 7, Spend::Record, Some(now));
            eval(conn, &call);
            let before: String = redis::cmd("GET").arg(&key).query(conn).expect("get");
            let lua = lua_take(conn, &taker, &key, now + 5, 5, 1);
            let after: String = redis::cmd("GET").arg(&key).query(conn).expect("get");
            assert_eq!(
                (lua.units, &after),
                (0, &before),
                "{taker:?} on {writer:?}'s value"
            );
            let mut state = writer.new_state();
            writer.admit(&mut state, now, 7);
            let rust = taker.take(&mut state, now + 5, 5, 1).expect("leasable");
            assert_eq!(rust, lua);
        });
    }
}

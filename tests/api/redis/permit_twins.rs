//! The concurrency twins agree: `lua/concurrency.lua` on a real Redis and `limit::Concurrency`
//! in Rust give identical decisions, release answers and expiries for the same operations at the
//! same instants (the script's test-only `now_us`), over generated sequences of acquires, dry
//! runs, releases (held, released already, expired, never taken) and time steps around permits'
//! expiries.

use sluice::limit::{Concurrency, PermitState};
use sluice::store::redis::scripts::Scripts;

use crate::redis_server::RedisServer;

/// A small xorshift, so every sequence is replayable from its seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn call(
    conn: &mut redis::Connection,
    source: &str,
    key: &str,
    mode: &str,
    limit: &Concurrency,
    permit: u128,
    now: u64,
) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(source)
        .arg(1)
        .arg(key)
        .arg(mode)
        .arg(limit.limit())
        .arg(limit.ttl_us())
        .arg(format!("{permit:032x}"))
        .arg(now)
        .query(conn)
        .expect("script reply")
}

#[test]
fn lua_and_rust_concurrency_agree() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let scripts = Scripts::default();
    let source = scripts.concurrency().source.to_string();
    for seed in 1..=24u64 {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let limit = Concurrency::new(1 + next(&mut rng) % 4, 1_000 + next(&mut rng) % 5_000)
            .expect("valid");
        let key = format!("twins:{{{seed}}}");
        let mut state = PermitState::default();
        // Some instant well past 0, as Redis' clock is.
        let mut now = 1_700_000_000_000_000 + seed * 1_000_000;
        let mut issued: Vec<u128> = Vec::new();
        for step in 0..300 {
            now += match next(&mut rng) % 4 {
                0 => 0,
                1 => next(&mut rng) % 200,
                2 => next(&mut rng) % limit.ttl_us(),
                // Exactly onto the earliest permit's expiry, when there is one.
                _ => state
                    .permits
                    .iter()
                    .map(|&(expires, _)| expires)
                    .filter(|&e| e > now)
                    .min()
                    .map_or(1, |e| e - now),
            };
            let what = format!("seed {seed} step {step} at {now}");
            match next(&mut rng) % 3 {
                0 | 1 => {
                    let peek = next(&mut rng).is_multiple_of(5);
                    let id = u128::from(next(&mut rng)) << 64 | u128::from(next(&mut rng));
                    let expected_expired = if peek {
                        state.permits.iter().filter(|(e, _)| *e <= now).count()
                    } else {
                        state.expire(now)
                    };
                    let decision = if peek {
                        let mut copy = state.clone();
                        copy.expire(now);
                        // The script drops expired permits in a dry run too.
                        state = copy;
                        limit.decide(&state, now, 1)
                    } else {
                        limit.acquire(&mut state, now, id)
                    };
                    if decision.allowed && !peek {
                        issued.push(id);
                    }
                    let mode = if peek { "peek" } else { "acquire" };
                    let got = call(&mut conn, &source, &key, mode, &limit, id, now);
                    let want = vec![
                        i64::from(decision.allowed),
                        decision.limit as i64,
                        decision.remaining as i64,
                        decision.reset_after_us as i64,
                        decision.retry_after_us as i64,
                        expected_expired as i64,
                    ];
                    assert_eq!(got, want, "{mode}: {what}");
                }
                _ => {
                    // A permit issued (held, released or expired) or one never taken.
                    let id = match issued.len() {
                        0 => 7,
                        n if !next(&mut rng).is_multiple_of(4) => {
                            issued[next(&mut rng) as usize % n]
                        }
                        _ => 7,
                    };
                    let expired = state.expire(now) as i64;
                    let released = state.release(now, id);
                    let got = call(&mut conn, &source, &key, "release", &limit, id, now);
                    assert_eq!(got, vec![i64::from(released), expired], "release: {what}");
                }
            }
        }
    }
}

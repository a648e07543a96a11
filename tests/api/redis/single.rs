//! The lean path: the daemon sends a batch of one check of one counter as its algorithm's own
//! script instead of the batch script (Redis spends about half as much on it). The two must be
//! indistinguishable: for every algorithm, whatever the key holds (nothing, each algorithm's
//! value, today's and older layouts, values no algorithm writes, other types, values beyond any
//! sluice state), with and without commit, the algorithm script answers exactly what a batch of
//! that one check answers (figures, or the error code and the item it names) and leaves the key
//! exactly as the batch leaves it (type, value or members, whether it expires).

use redis::Value;
use sluice::limit::{Algorithm, FixedWindow, Micros, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::oracle::ScriptCalls;
use sluice::store::redis::scripts::{Item, Scripts};
use sluice::store::Spend;

use crate::redis::batch::run_batch;
use crate::redis::differential::{with_redis, START};

/// Puts a state into a key.
type Prepare = Box<dyn Fn(&mut redis::Connection, &str)>;

/// What a key can hold when a check arrives: a name for the failure message and how to make it.
fn stored_states() -> Vec<(&'static str, Prepare)> {
    fn set(value: &'static str) -> Prepare {
        Box::new(move |conn, key| {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query(conn)
                .expect("SET");
        })
    }
    fn log(members: usize) -> Prepare {
        Box::new(move |conn, key| {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(key);
            for i in 0..members {
                // Scores inside every test window (START minus up to 1 ms).
                cmd.arg(START - i as u64).arg(format!("m{i}"));
            }
            let _: () = cmd.query(conn).expect("ZADD");
        })
    }
    let long: &'static str = Box::leak("7".repeat(64).into_boxed_str());
    let tat_ahead: &'static str = Box::leak((START + 30_000_000).to_string().into_boxed_str());
    let tat_rem: &'static str = Box::leak(format!("{}:3", START + 1_000_000).into_boxed_str());
    vec![
        ("absent", Box::new(|_: &mut redis::Connection, _: &str| {})),
        ("token bucket TAT", set(tat_ahead)),
        ("token bucket TAT:rem", set(tat_rem)),
        // -(count * 2^20 + window tag), the tag of no test window: an old window's count.
        ("fixed window (negative)", set("-3145731")),
        ("fixed window before the negative layout", set("3145731")),
        ("sliding log of 3", log(3)),
        ("sliding log at its bound", log(10_000)),
        ("sorted set beyond any log", log(10_001)),
        ("value beyond any state", set(long)),
        ("empty string", set("")),
        ("foreign number 1e15", set("1e15")),
        ("foreign number 0x10", set("0x10")),
        ("foreign text", set("hello")),
        (
            "hash",
            Box::new(|conn: &mut redis::Connection, key: &str| {
                let _: () = redis::cmd("HSET")
                    .arg(key)
                    .arg("f")
                    .arg("1")
                    .query(conn)
                    .expect("HSET");
            }),
        ),
        (
            "list",
            Box::new(|conn: &mut redis::Connection, key: &str| {
                let _: () = redis::cmd("RPUSH")
                    .arg(key)
                    .arg("1")
                    .query(conn)
                    .expect("RPUSH");
            }),
        ),
    ]
}

fn algorithms() -> [Algorithm; 3] {
    [
        Algorithm::TokenBucket(TokenBucket::new(5, 60_000_000, 5).expect("valid")),
        Algorithm::SlidingLog(SlidingLog::new(5, 60_000_000).expect("valid")),
        Algorithm::FixedWindow(FixedWindow::new(5, 60_000_000).expect("valid")),
    ]
}

/// A reply as comparable text: the figures, or the error's code and the item it names.
fn reply_text(value: &Value) -> String {
    match value {
        Value::ServerError(error) => {
            let item = error
                .details()
                .and_then(|d| d.rsplit_once("[item "))
                .map_or("no item", |(_, rest)| rest);
            format!("error {} [item {item}", error.code())
        }
        other => format!("{other:?}"),
    }
}

/// The key as it is left: its type, its value or members with scores, and whether it expires.
fn key_state(conn: &mut redis::Connection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(conn).expect("PTTL");
    let content = match kind.as_str() {
        "string" => {
            let value: String = redis::cmd("GET").arg(key).query(conn).expect("GET");
            value
        }
        "zset" => {
            let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .expect("ZRANGE");
            // Test keys differ only in their tag; members and scores must match exactly.
            format!(
                "{} members {:?}",
                members.len(),
                &members[..members.len().min(8)]
            )
        }
        _ => String::new(),
    };
    format!("{kind} {content} expires: {}", pttl > 0)
}

/// The algorithm script's own call for one check, as the batcher sends it (plus the test `now`).
fn run_single(conn: &mut redis::Connection, item: &Item, spend: Spend, now: Micros) -> Value {
    let call = Scripts::default().call(
        &item.algorithm,
        item.key.clone(),
        item.cost,
        spend,
        Some(now),
    );
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(&*call.script.source)
        .arg(call.keys.len())
        .arg(&call.keys)
        .arg(&call.args);
    redis::ConnectionLike::req_command(conn, &cmd).expect("the script runs")
}

#[test]
fn an_algorithm_script_answers_and_writes_exactly_as_a_batch_of_one() {
    with_redis(|conn| {
        let mut compared = 0;
        for (a, algorithm) in algorithms().into_iter().enumerate() {
            for (s, (state, prepare)) in stored_states().iter().enumerate() {
                for (commit, cost) in [(true, 1), (true, 5), (true, 6), (false, 1), (false, 0)] {
                    let keys = [true, false]
                        .map(|single| format!("single:{{{a}.{s}.{commit}.{cost}.{single}}}"));
                    let item = |key: &str| Item {
                        key: key.to_owned(),
                        algorithm,
                        cost,
                        enforce: true,
                    };
                    for key in &keys {
                        prepare(conn, key);
                    }
                    // Twice in a row at the same instant: the second sees what the first left.
                    let mut answers = [Vec::new(), Vec::new()];
                    for round in 0..2 {
                        let now = START + round;
                        let spend = if commit { Spend::Record } else { Spend::DryRun };
                        let single = run_single(conn, &item(&keys[0]), spend, now);
                        let batch = run_batch(conn, &[(spend, vec![item(&keys[1])])], now);
                        answers[0].push(reply_text(&single));
                        answers[1].push(reply_text(&batch[0]));
                    }
                    let label = format!("{algorithm:?} on {state}, commit {commit}, cost {cost}");
                    assert_eq!(answers[0], answers[1], "answers: {label}");
                    assert_eq!(
                        key_state(conn, &keys[0]),
                        key_state(conn, &keys[1]),
                        "stored state: {label}"
                    );
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 3 * 15 * 5);
    });
}

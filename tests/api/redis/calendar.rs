//! Calendar windows on Redis: the batch script (`lua/batch.lua`, kind CALENDAR_WINDOW) against
//! the Rust twin (the embedded store) at the same instants, using the scripts' test-only `now`:
//! local days, ISO weeks and months in Europe/Berlin and America/New_York around both daylight
//! saving changes of 2026, in the lean loop and in the general one; the store's clock picks the
//! window among the boundaries the daemon sent, and one outside them fails its check (CLOCK).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use redis::Value;
use sluice::clock::ManualClock;
use sluice::limit::{Algorithm, Calendar, CalendarUnit, Decision, FixedWindow, Key, Micros};
use sluice::store::redis::scripts::oracle::batch_arguments_near;
use sluice::store::redis::scripts::{split_batch_reply, Item, Scripts};
use sluice::store::{MemoryStore, Spend, StoreCheck};

use crate::calendar::utc;
use crate::redis::batch::{decisions, run_batch, Check};
use crate::redis::differential::with_redis;

const HOUR: Micros = 3_600_000_000;

fn fresh_key() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("cal:{{k{}}}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn calendar_window(limit: u64, unit: CalendarUnit, zone: &str) -> Algorithm {
    let calendar = Calendar::new(unit, zone).expect("a known zone");
    Algorithm::FixedWindow(FixedWindow::calendar(limit, calendar).expect("valid"))
}

/// Every calendar the done-when names: day, week and month in Berlin and New York.
fn calendars(limit: u64) -> Vec<Algorithm> {
    let mut all = Vec::new();
    for zone in ["Europe/Berlin", "America/New_York"] {
        for unit in [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month] {
            all.push(calendar_window(limit, unit, zone));
        }
    }
    all
}

/// The daylight saving changes of 2026 (UTC): Berlin's (March 29 01:00, October 25 01:00) and New
/// York's (March 8 07:00, November 1 06:00), and the local midnights that start their days.
fn instants() -> Vec<Micros> {
    [
        "2026-03-29T01:00:00Z",
        "2026-03-28T23:00:00Z",
        "2026-03-29T22:00:00Z",
        "2026-10-25T01:00:00Z",
        "2026-10-24T22:00:00Z",
        "2026-10-25T23:00:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T05:00:00Z",
        "2026-03-09T04:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T04:00:00Z",
        "2026-11-02T05:00:00Z",
        "2026-03-31T22:00:00Z",
        "2026-10-31T23:00:00Z",
        "2026-12-01T05:00:00Z",
    ]
    .iter()
    .map(|text| utc(text))
    .collect()
}

/// Replays `steps` (µs after `start`, cost, dry run) of one counter under `algorithm` through the
/// batch script (`pair`: each check twice in one call, the general loop; else the lean loop) and
/// the embedded store; every decision must be the same.
fn compare(
    algorithm: Algorithm,
    start: Micros,
    steps: &[(Micros, u64, bool)],
    pair: bool,
) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(1_000, clock.clone(), None);
    let redis_key = fresh_key();
    let check = |cost: u64| StoreCheck {
        key: Key::new(Arc::from("cal"), [redis_key.as_str()]),
        algorithm,
        cost,
        enforce: true,
        generation: 0,
    };
    with_redis(|conn| {
        for (i, &(at, cost, dry_run)) in steps.iter().enumerate() {
            let now = start + at;
            clock.set(now);
            let spend = Spend::from_dry_run(dry_run || cost == 0);
            let item = Item {
                key: redis_key.clone(),
                algorithm,
                cost,
                enforce: true,
            };
            let calls: Vec<Check> = if pair {
                vec![(spend, vec![item.clone()]), (spend, vec![item])]
            } else {
                vec![(spend, vec![item])]
            };
            let replies = run_batch(conn, &calls, now);
            for reply in &replies {
                let rust = memory.check_now(&[check(cost)], spend);
                let lua = decisions(reply, 1);
                prop_assert_eq!(rust, lua, "step {} at {} of {:?}", i, now, algorithm);
            }
        }
        Ok(())
    })
}

/// At each change and each local midnight around it: the limit spent just before, then checks
/// just after and an hour on; the twins agree and the boundary is where the window turns.
#[test]
fn the_twins_agree_across_every_change_and_midnight() {
    for algorithm in calendars(3) {
        for (n, &instant) in instants().iter().enumerate() {
            let start = instant - 2 * HOUR;
            let steps = [
                (0, 2, false),
                (HOUR, 1, false),
                (2 * HOUR - 1, 1, false),
                (2 * HOUR - 1, 0, true),
                (2 * HOUR, 1, false),
                (2 * HOUR, 3, false),
                (3 * HOUR, 1, false),
                (3 * HOUR, 0, true),
            ];
            for pair in [false, true] {
                compare(algorithm, start, &steps, pair)
                    .unwrap_or_else(|e| panic!("instant {n}, pair {pair}: {e}"));
            }
        }
    }
}

/// A decision of a limit of 3.
fn decision(
    allowed: bool,
    remaining: u64,
    reset_after_us: Micros,
    retry_after_us: Micros,
) -> Decision {
    Decision {
        allowed,
        limit: 3,
        remaining,
        reset_after_us,
        retry_after_us,
    }
}

/// On Redis, the 23-hour day in Berlin: its limit spent at its first µs waits 23 hours; a denial
/// one µs before its end waits 1 µs; the end starts afresh. (The embedded store's answers, the
/// same figures, are in `calendar.rs`.)
#[test]
fn the_23_hour_day_on_redis() {
    let day = calendar_window(3, CalendarUnit::Day, "Europe/Berlin");
    let (start, end) = (utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z"));
    let key = fresh_key();
    let check = |cost| {
        let item = Item {
            key: key.clone(),
            algorithm: day,
            cost,
            enforce: true,
        };
        vec![(Spend::Record, vec![item])]
    };
    with_redis(|conn| {
        let spent = decisions(&run_batch(conn, &check(3), start)[0], 1);
        assert_eq!(spent[0], decision(true, 0, 23 * HOUR, 0));
        let denied = decisions(&run_batch(conn, &check(1), start)[0], 1);
        assert_eq!(denied[0], decision(false, 0, 23 * HOUR, 23 * HOUR));
        let last = decisions(&run_batch(conn, &check(1), end - 1)[0], 1);
        assert_eq!(last[0], decision(false, 0, 1, 1));
        let next = decisions(&run_batch(conn, &check(1), end)[0], 1);
        assert_eq!(next[0], decision(true, 2, 24 * HOUR, 0));
    });
}

/// The daemon's clock half an hour behind or ahead of Redis' across a boundary: the boundaries
/// are drawn around the daemon's instant, and Redis' clock picks the window (the one before or
/// after the daemon's), as the Rust twin at Redis' instant decides.
#[test]
fn the_store_clock_picks_the_window_among_the_boundaries() {
    let half_hour = HOUR / 2;
    for algorithm in calendars(2) {
        for &instant in &instants() {
            for (daemon, store) in [
                (instant - half_hour, instant + half_hour),
                (instant + half_hour, instant - half_hour),
            ] {
                let clock = Arc::new(ManualClock::new(store));
                let memory = MemoryStore::new(1_000, clock, None);
                let key = fresh_key();
                let check = StoreCheck {
                    key: Key::new(Arc::from("cal"), [key.as_str()]),
                    algorithm,
                    cost: 1,
                    enforce: true,
                    generation: 0,
                };
                let item = Item {
                    key: key.clone(),
                    algorithm,
                    cost: 1,
                    enforce: true,
                };
                let calls: Vec<Check> = vec![(Spend::Record, vec![item])];
                for round in 0..3 {
                    let (keys, args) = batch_arguments_near(
                        calls.iter().map(|(spend, items)| (*spend, &items[..])),
                        Some(store),
                        Some(daemon),
                    );
                    let reply = with_redis(|conn| {
                        let mut cmd = redis::cmd("EVAL");
                        cmd.arg(&*Scripts::default().batch().source)
                            .arg(keys.len())
                            .arg(&keys)
                            .arg(&args);
                        redis::ConnectionLike::req_command(conn, &cmd).expect("runs")
                    });
                    let Value::Array(flat) = reply else {
                        panic!("unexpected reply {reply:?}");
                    };
                    let lua = decisions(&Value::Array(flat), 1);
                    let rust = memory.check_now(std::slice::from_ref(&check), Spend::Record);
                    assert_eq!(
                        rust, lua,
                        "{algorithm:?}: daemon {daemon}, store {store}, round {round}"
                    );
                }
            }
        }
    }
}

/// A Redis clock outside the three windows the daemon sent (here: the daemon draws them around a
/// day two days earlier) fails the check with CLOCK, and writes nothing.
#[test]
fn a_store_clock_outside_the_boundaries_fails_the_check() {
    let day = calendar_window(3, CalendarUnit::Day, "Europe/Berlin");
    let key = fresh_key();
    let now = utc("2026-03-29T12:00:00Z");
    let item = Item {
        key: key.clone(),
        algorithm: day,
        cost: 1,
        enforce: true,
    };
    for pair in [false, true] {
        let calls: Vec<Check> = if pair {
            vec![
                (Spend::Record, vec![item.clone()]),
                (Spend::Record, vec![item.clone()]),
            ]
        } else {
            vec![(Spend::Record, vec![item.clone()])]
        };
        let (keys, args) = batch_arguments_near(
            calls.iter().map(|(spend, items)| (*spend, &items[..])),
            Some(now),
            Some(now - 48 * HOUR),
        );
        with_redis(|conn| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(&*Scripts::default().batch().source)
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
            let reply = redis::ConnectionLike::req_command(conn, &cmd).expect("runs");
            let Value::Array(flat) = reply else {
                panic!("unexpected reply {reply:?}");
            };
            let parts = split_batch_reply(&flat, calls.iter().map(|(_, items)| items.len()))
                .expect("one entry per check");
            for part in parts {
                let error = part.expect_err("refused");
                assert_eq!(error.code(), "CLOCK", "{error:?}");
            }
            let exists: bool = redis::cmd("EXISTS").arg(&key).query(conn).expect("EXISTS");
            assert!(!exists, "nothing written");
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random histories starting within a day of a change or a midnight, steps of up to a day.
    #[test]
    fn random_histories_agree(
        which in 0usize..6,
        instant in 0usize..15,
        before in 0u64..(24 * HOUR),
        steps in prop::collection::vec(
            (prop_oneof![3 => 0u64..HOUR, 1 => 0u64..(24 * HOUR)], 0u64..5, prop::bool::weighted(0.15)),
            1..30,
        ),
        pair in any::<bool>(),
    ) {
        let algorithm = calendars(3)[which];
        let start = instants()[instant] - before;
        let mut at = 0;
        let steps: Vec<(Micros, u64, bool)> = steps
            .into_iter()
            .map(|(step, cost, dry)| {
                at += step;
                (at, cost, dry)
            })
            .collect();
        compare(algorithm, start, &steps, pair)?;
    }
}

/// Wall time in µs (what the daemon and a local Redis read).
fn wall_now() -> Micros {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_micros()).expect("fits")
}

/// A real daemon on a real Redis (one node, and a Cluster), on the real clocks: a calendar
/// policy's denial through `POST /v1/check` waits until the end of the local day or month that
/// holds Redis' time, measured between wall-clock reads taken before and after the request (a
/// boundary passing in between leaves the figures unchecked). The daemon's own path: boundaries
/// drawn from its clock, the batch script (never the fixed window's own), Redis' TIME.
async fn denied_until_the_local_boundary(backend: crate::stores::Backend) {
    const POLICIES: &str = "
policies:
  - {name: berlin_day, key: [tenant], algorithm: fixed_window, limit: 2, period: 1d, calendar: true, time_zone: Europe/Berlin, failure_mode: closed}
  - {name: ny_month, key: [tenant], algorithm: fixed_window, limit: 2, period: 1mo, calendar: true, time_zone: America/New_York, failure_mode: closed}
";
    let prefix = crate::stores::prefix_of(&format!("{}-{backend:?}", module_path!()));
    let app = crate::stores::spawn_on(backend, POLICIES, &prefix).await;
    for (policy, unit, zone) in [
        ("berlin_day", CalendarUnit::Day, "Europe/Berlin"),
        ("ny_month", CalendarUnit::Month, "America/New_York"),
    ] {
        let calendar = Calendar::new(unit, zone).expect("a zone");
        let body = serde_json::json!({"policy": policy, "descriptors": {"tenant": "acme"}});
        for _ in 0..2 {
            let reply = app.check_tcp(&body).await;
            assert_eq!(reply.status, 200, "{}", crate::helpers::json_of(&reply));
        }
        let before = wall_now();
        let denied = app.check_tcp(&body).await;
        let after = wall_now();
        let answer = crate::helpers::json_of(&denied);
        assert_eq!(denied.status, 429, "{policy}: {answer}");
        let (start, end) = calendar.window_at(before);
        if calendar.window_at(after) != (start, end) {
            eprintln!("{policy}: a boundary passed during the request; figures not checked");
            continue;
        }
        let retry_ms = answer["retry_after_ms"].as_u64().expect("retry_after_ms");
        // Redis' clock is this host's: its instant lies between the two reads.
        let (least, most) = ((end - after) / 1_000, (end - before).div_ceil(1_000));
        assert!(
            (least..=most).contains(&retry_ms),
            "{policy}: retry {retry_ms} ms, expected {least}..={most} (window {start}..{end})"
        );
    }
}

#[tokio::test]
async fn a_daemon_on_redis_waits_for_the_local_boundary() {
    denied_until_the_local_boundary(crate::stores::Backend::Redis).await;
}

#[tokio::test]
async fn a_daemon_on_a_cluster_waits_for_the_local_boundary() {
    denied_until_the_local_boundary(crate::stores::Backend::Cluster).await;
}

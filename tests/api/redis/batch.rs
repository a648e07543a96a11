//! The batch script (`lua/batch.lua`): a whole batch of checks in one call, against the Rust
//! twin. Checks on the same counter within one batch must be answered exactly as if they had
//! arrived one by one at the batch's instant; a bad key fails only its own check; the daemon
//! sends a batch as one call and survives NOSCRIPT in the middle of traffic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use redis::Value;
use serde_json::json;
use sluice::clock::ManualClock;
use sluice::limit::{Algorithm, Decision, FixedWindow, Key, Micros, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::oracle::{batch_arguments, parse_check_reply};
use sluice::store::redis::scripts::{split_batch_reply, Item, Scripts};
use sluice::store::{MemoryStore, Spend, StoreCheck};

use crate::helpers::{json_of, metric_value, spawn_app_in, test_settings};
use crate::redis::differential::{with_redis, START};
use crate::redis_server::RedisServer;

fn fresh_base() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("batch:{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// One check of a batch: (spend, items).
pub(crate) type Check = (Spend, Vec<Item>);

/// Runs `checks` as one batch script call at `now`; one entry per check (its figures as one array,
/// or its error), split from the script's flat reply as the daemon splits it.
pub(crate) fn run_batch(conn: &mut redis::Connection, checks: &[Check], now: Micros) -> Vec<Value> {
    let (keys, args) = batch_arguments(
        checks.iter().map(|(commit, items)| (*commit, &items[..])),
        Some(now),
    );
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(&*Scripts::default().batch().source)
        .arg(keys.len())
        .arg(&keys)
        .arg(args);
    // The raw reply: `query` would turn one check's error entry into an error for the whole.
    let reply = redis::ConnectionLike::req_command(conn, &cmd).expect("the batch script runs");
    let Value::Array(flat) = reply else {
        panic!("unexpected batch reply {reply:?}");
    };
    split_batch_reply(&flat, checks.iter().map(|(_, items)| items.len()))
        .expect("the reply holds each check's figures or its error")
        .into_iter()
        .map(|part| match part {
            Ok(figures) => Value::Array(figures.to_vec()),
            Err(error) => Value::ServerError(error.clone()),
        })
        .collect()
}

pub(crate) fn decisions(entry: &Value, items: usize) -> Vec<Decision> {
    parse_check_reply(entry, items).expect("a check's reply parses")
}

/// Counter `i` of the test: its algorithm is fixed per counter.
fn counter_algorithm(kind: u8, limit: u64, period: u64) -> Algorithm {
    match kind % 3 {
        0 => Algorithm::TokenBucket(TokenBucket::new(limit, period, limit).expect("valid")),
        1 => Algorithm::SlidingLog(SlidingLog::new(limit, period).expect("valid")),
        _ => Algorithm::FixedWindow(FixedWindow::new(limit, period).expect("valid")),
    }
}

/// A batch: its time step, then checks of (first counter, second counter or none, cost, dry run,
/// second counter enforced).
type Batch = (u64, Vec<(usize, Option<usize>, u64, bool, bool)>);

fn batches(counters: usize, limit: u64, period: u64) -> impl Strategy<Value = Vec<Batch>> {
    let step = prop_oneof![2 => Just(0u64), 5 => 0..=period / 3 + 1, 1 => 0..=period * 2];
    let check = (
        0..counters,
        prop::option::weighted(0.3, 0..counters),
        1..=limit + 1,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.8),
    );
    prop::collection::vec((step, prop::collection::vec(check, 1..12)), 1..12)
}

/// Fewer than `counters` counters (each an algorithm with one quota) and batches on them.
fn histories(counters: usize) -> impl Strategy<Value = (Vec<Algorithm>, Vec<Batch>)> {
    (
        prop::collection::vec(0u8..3, 1..counters),
        1u64..12,
        1u64..20_000,
    )
        .prop_flat_map(|(kinds, limit, period)| {
            let algorithms: Vec<Algorithm> = kinds
                .iter()
                .map(|&k| counter_algorithm(k, limit, period))
                .collect();
            (Just(algorithms), batches(kinds.len(), limit, period))
        })
}

/// Replays `batches` through the batch script and, check by check, through the embedded store
/// (the Rust twin) at the same instant; every decision must be identical.
fn compare(
    algorithms: &[Algorithm],
    history: &[Batch],
    start: Micros,
) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(start));
    let memory = MemoryStore::new(1_000, clock.clone(), None);
    let base = fresh_base();
    let store_check = |i: usize, cost: u64, enforce: bool| StoreCheck {
        key: Key::new(Arc::from("b"), [format!("{base}-{i}").as_str()]),
        algorithm: algorithms[i],
        cost: cost.min(algorithms[i].limit()),
        enforce,
        generation: 0,
    };
    let item = |check: &StoreCheck, i: usize| Item {
        key: format!("{{{base}}}:{i}"),
        algorithm: check.algorithm,
        cost: check.cost,
        enforce: check.enforce,
    };
    let mut now = start;
    with_redis(|conn| {
        for (batch_no, (step, checks)) in history.iter().enumerate() {
            now += step;
            clock.set(now);
            let mut planned: Vec<(Vec<StoreCheck>, Check)> = Vec::new();
            for &(first, second, cost, dry_run, enforce_second) in checks {
                let mut group = vec![store_check(first, cost, true)];
                let mut items = vec![item(&group[0], first)];
                if let Some(second) = second.filter(|&s| s != first) {
                    let check = store_check(second, cost, enforce_second);
                    items.push(item(&check, second));
                    group.push(check);
                }
                planned.push((group, (Spend::from_dry_run(dry_run), items)));
            }
            let calls: Vec<Check> = planned.iter().map(|(_, call)| call.clone()).collect();
            let replies = run_batch(conn, &calls, now);
            for (n, ((group, (commit, items)), reply)) in planned.iter().zip(&replies).enumerate() {
                let rust = memory.check_now(group, *commit);
                let lua = decisions(reply, items.len());
                prop_assert_eq!(rust, lua, "batch {} check {} at {}", batch_no, n, now);
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn batches_agree_with_checks_one_by_one(
        (algorithms, history) in histories(4),
        offset in 0u64..1_000_000,
    ) {
        compare(&algorithms, &history, START + offset)?;
    }

    /// Batches the daemon sends through the lean loop (one counter per check, each counter
    /// once, no report) agree with the Rust twin too.
    #[test]
    fn lean_batches_agree_with_checks_one_by_one(
        (algorithms, history) in histories(9),
        offset in 0u64..1_000_000,
    ) {
        let lean: Vec<Batch> = history
            .into_iter()
            .map(|(step, checks)| {
                let mut seen = Vec::new();
                let checks = checks
                    .into_iter()
                    .filter(|&(first, ..)| !seen.contains(&first) && { seen.push(first); true })
                    .map(|(first, _, cost, dry_run, enforce)| (first, None, cost, dry_run, enforce))
                    .collect();
                (step, checks)
            })
            .collect();
        compare(&algorithms, &lean, START + offset)?;
    }
}

/// Whether the daemon would send `checks` through the batch script's lean loop.
fn is_lean(checks: &[Check]) -> bool {
    let (_, args) = batch_arguments(
        checks.iter().map(|(commit, items)| (*commit, &items[..])),
        None,
    );
    args.len() == 3
}

#[test]
fn only_one_counter_per_check_each_once_is_lean() {
    let bucket = Algorithm::TokenBucket(TokenBucket::new(10, 1_000_000, 10).expect("valid"));
    let item = |name: &str| Item {
        key: format!("{{lean}}:{name}"),
        algorithm: bucket,
        cost: 1,
        enforce: true,
    };
    let one = |name: &str| (Spend::Record, vec![item(name)]);
    assert!(is_lean(&[
        one("a"),
        one("b"),
        (Spend::DryRun, vec![item("c")])
    ]));
    assert!(!is_lean(&[one("a"), one("a")]), "a counter twice");
    assert!(
        !is_lean(&[(Spend::Record, vec![item("a"), item("b")])]),
        "two counters"
    );
}

#[test]
fn a_hot_key_in_one_batch_is_read_and_written_once() {
    let bucket = Algorithm::TokenBucket(TokenBucket::new(5, 1_000_000, 5).expect("valid"));
    let base = fresh_base();
    let item = Item {
        key: format!("{{{base}}}:hot"),
        algorithm: bucket,
        cost: 1,
        enforce: true,
    };
    let checks: Vec<Check> = (0..8)
        .map(|_| (Spend::Record, vec![item.clone()]))
        .collect();
    with_redis(|conn| {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(conn)
            .expect("RESETSTAT");
        let replies = run_batch(conn, &checks, START);
        let allowed: Vec<bool> = replies.iter().map(|r| decisions(r, 1)[0].allowed).collect();
        assert_eq!(allowed, [true, true, true, true, true, false, false, false]);
        let remaining: Vec<u64> = replies
            .iter()
            .map(|r| decisions(r, 1)[0].remaining)
            .collect();
        assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 0, 0]);
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .expect("INFO");
        let calls = |command: &str| -> u64 {
            stats
                .lines()
                .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        // Read with GETRANGE (bounded: a foreign oversized value cannot cost O(bytes)).
        assert_eq!(calls("getrange") + calls("get"), 1, "{stats}");
        assert_eq!(calls("set"), 1, "{stats}");
    });
}

/// A check of cost 1 on the one counter `key`.
fn recorded(key: String, algorithm: Algorithm) -> Check {
    let item = Item {
        key,
        algorithm,
        cost: 1,
        enforce: true,
    };
    (Spend::Record, vec![item])
}

/// A token bucket, a fixed window and a sliding log, each 10 per second.
fn ten_per_second() -> [Algorithm; 3] {
    [
        Algorithm::TokenBucket(TokenBucket::new(10, 1_000_000, 10).expect("valid")),
        Algorithm::FixedWindow(FixedWindow::new(10, 1_000_000).expect("valid")),
        Algorithm::SlidingLog(SlidingLog::new(10, 1_000_000).expect("valid")),
    ]
}

#[test]
fn a_bad_key_fails_only_its_own_check() {
    let [bucket, window, log] = ten_per_second();
    let base = fresh_base();
    let key = |name: &str| format!("{{{base}}}:{name}");
    let item = |name: &str, algorithm: Algorithm| Item {
        key: key(name),
        algorithm,
        cost: 1,
        enforce: true,
    };
    with_redis(|conn| {
        let _: () = redis::cmd("RPUSH")
            .arg(key("list"))
            .arg("x")
            .query(conn)
            .expect("RPUSH");
        let _: () = redis::cmd("SET")
            .arg(key("foreign"))
            .arg("not a number")
            .query(conn)
            .expect("SET");
        let checks: Vec<Check> = vec![
            (Spend::Record, vec![item("good", bucket)]),
            (Spend::Record, vec![item("list", bucket)]),
            (Spend::Record, vec![item("good", bucket)]),
            (Spend::Record, vec![item("foreign", window)]),
            (Spend::Record, vec![item("list", log)]),
            (
                Spend::Record,
                vec![item("good", bucket), item("list", window)],
            ),
            (Spend::Record, vec![item("good", bucket)]),
        ];
        let replies = run_batch(conn, &checks, START);
        assert!(!is_lean(&checks));
        let code = |value: &Value| match value {
            Value::ServerError(error) => error.code().to_owned(),
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(code(&replies[1]), "WRONGTYPE");
        assert_eq!(code(&replies[3]), "BADSTATE");
        assert_eq!(code(&replies[4]), "WRONGTYPE");
        assert_eq!(code(&replies[5]), "WRONGTYPE");
        // The good key's checks before and after are answered, and the failed group spent
        // nothing from it: 10, then 9 and 8 remain after three admissions.
        let remaining: Vec<u64> = [0, 2, 6]
            .iter()
            .map(|&i| decisions(&replies[i], 1)[0].remaining)
            .collect();
        assert_eq!(remaining, [9, 8, 7]);
        let list_len: u64 = redis::cmd("LLEN")
            .arg(key("list"))
            .query(conn)
            .expect("LLEN");
        assert_eq!(list_len, 1, "the foreign key is untouched");
    });
}

/// The lean loop fails a bad key's check alone too, with the same error codes.
#[test]
fn a_bad_key_fails_only_its_own_check_in_the_lean_loop() {
    let [bucket, window, log] = ten_per_second();
    let base = fresh_base();
    let key = |name: &str| format!("{{{base}}}:{name}");
    let check = |name: &str, algorithm: Algorithm| recorded(key(name), algorithm);
    with_redis(|conn| {
        for (name, value) in [
            ("list", None),
            ("foreign", Some("not a number")),
            ("text", Some("x")),
        ] {
            let command = match value {
                None => redis::cmd("RPUSH").arg(key(name)).arg("x").clone(),
                Some(value) => redis::cmd("SET").arg(key(name)).arg(value).clone(),
            };
            let _: () = command.query(conn).expect("setup");
        }
        let checks: Vec<Check> = vec![
            check("good", bucket),
            check("list", bucket),
            check("foreign", window),
            check("text", log),
            check("good window", window),
            check("good log", log),
        ];
        assert!(is_lean(&checks));
        let replies = run_batch(conn, &checks, START);
        let code = |value: &Value| match value {
            Value::ServerError(error) => error.code().to_owned(),
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(code(&replies[1]), "WRONGTYPE");
        assert_eq!(code(&replies[2]), "BADSTATE");
        assert_eq!(code(&replies[3]), "BADSTATE");
        for i in [0, 4, 5] {
            assert_eq!(decisions(&replies[i], 1)[0].remaining, 9, "check {i}");
        }
        let list_len: u64 = redis::cmd("LLEN")
            .arg(key("list"))
            .query(conn)
            .expect("LLEN");
        assert_eq!(list_len, 1, "the foreign key is untouched");
    });
}

const POLICIES: &str = "
policies:
  - {name: api, key: [k], algorithm: token_bucket, limit: 1000, period: 1h, failure_mode: open}
  - {name: login, key: [ip], algorithm: sliding_log, limit: 5, period: 1h, failure_mode: closed}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_answers_a_bad_key_alone_and_stays_healthy() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(server.url());
    // Bad keys, not deadlines, are under test: under the whole suite's load a 5 ms deadline
    // expired now and then and counted `deadline` instead of `bad_key`.
    settings.redis.timeout = sluice::config::HumanDuration(200_000);
    let prefix = settings.redis.key_prefix.clone();
    let app = spawn_app_in(dir, settings, POLICIES).await;
    let api = |k: &str| json!({"policy": "api", "descriptors": {"k": k}});
    app.wait_for_store().await;
    let mut conn = server.connection();
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{prefix}:{{api:poisoned}}"))
        .arg("x")
        .query(&mut conn)
        .expect("RPUSH");
    // Many checks on the poisoned key in a row, interleaved with good ones: the bad key is
    // answered by its failure mode, the others stay enforced, and the circuit never opens.
    for i in 0..20 {
        let bad = json_of(&app.check_tcp(&api("poisoned")).await);
        assert_eq!(bad["mode"], "fail_open", "{bad}");
        let good = json_of(&app.check_tcp(&api(&format!("good-{i}"))).await);
        assert_eq!(good["mode"], "enforced", "{good}");
    }
    let ready = json_of(&app.admin_get("/readyz").await);
    assert_eq!(ready["redis"], "healthy", "{ready}");
    let metrics = app.metrics().await;
    let bad_keys = metric_value(
        &metrics,
        "sluice_redis_errors_total",
        &[("kind", "bad_key")],
    );
    assert!(bad_keys >= 20.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_mid_batch_costs_no_check_and_no_double_spend() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(server.url());
    // A debug build compiling the batch script after each flush, on a small shared machine.
    settings.redis.timeout = sluice::config::HumanDuration(2_000_000);
    let app = Arc::new(spawn_app_in(dir, settings, POLICIES).await);
    let login = |ip: &str| json!({"policy": "login", "descriptors": {"ip": ip}});
    app.wait_for_store().await;
    let mut conn = server.connection();
    // Concurrent checks on 4 IPs (5 allowed each) while the script cache is flushed repeatedly:
    // every answer is enforced, and exactly 5 per IP pass.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let app = Arc::clone(&app);
        tasks.spawn(async move {
            let reply = json_of(&app.check_tcp(&login(&format!("ip-{}", i % 4))).await);
            (i % 4, reply)
        });
        if i % 16 == 0 {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut conn)
                .expect("SCRIPT FLUSH");
        }
    }
    let mut allowed = [0; 4];
    while let Some(done) = tasks.join_next().await {
        let (ip, reply) = done.expect("check");
        if reply["mode"] != "enforced" {
            panic!("{reply}\n{}", app.metrics().await);
        }
        if reply["allowed"] == true {
            allowed[ip] += 1;
        }
    }
    assert_eq!(allowed, [5, 5, 5, 5]);
    let metrics = app.metrics().await;
    assert!(
        metric_value(
            &metrics,
            "sluice_redis_errors_total",
            &[("kind", "noscript")]
        ) >= 1.0
    );
}

/// A daemon on `cluster` (node calls on or off), once it answers from Redis.
async fn cluster_daemon(
    cluster: &crate::redis_server::RedisCluster,
    node_calls: bool,
) -> Arc<crate::helpers::TestApp> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.cluster = cluster.urls();
    settings.redis.cluster_node_calls = node_calls;
    settings.redis.timeout = sluice::config::HumanDuration(2_000_000);
    let app = Arc::new(spawn_app_in(dir, settings, POLICIES).await);
    app.wait_for_store().await;
    app
}

fn login(ip: &str) -> serde_json::Value {
    json!({"policy": "login", "descriptors": {"ip": ip}})
}

/// `per` concurrent checks on each of 16 partitions (16 slots over 3 nodes): how many each
/// admitted. Every answer must come from Redis.
async fn admitted_per_partition(app: &Arc<crate::helpers::TestApp>, per: usize) -> [u32; 16] {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 * per {
        let app = Arc::clone(app);
        tasks.spawn(async move {
            let reply = json_of(&app.check_tcp(&login(&format!("10.0.0.{}", i % 16))).await);
            (i % 16, reply)
        });
    }
    let mut allowed = [0; 16];
    while let Some(done) = tasks.join_next().await {
        let (ip, reply) = done.expect("check");
        assert_eq!(reply["mode"], "enforced", "{reply}");
        if reply["allowed"] == true {
            allowed[ip] += 1;
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_batches_spanning_slots_and_nodes_stay_exact() {
    // Node calls (one call per node, Redis >= 7.0) and, switched off, one call per slot (what
    // Redis 6 gets): 8 concurrent checks on each of 16 partitions, limit 5: batches span several
    // slots and nodes, and exactly 5 per partition pass either way.
    for node_calls in [true, false] {
        let cluster = crate::redis_server::RedisCluster::start();
        let app = cluster_daemon(&cluster, node_calls).await;
        assert_eq!(admitted_per_partition(&app, 8).await, [5; 16]);
        let metrics = app.metrics().await;
        let node = metric_value(&metrics, "sluice_redis_calls_total", &[("scope", "node")]);
        let slot = metric_value(&metrics, "sluice_redis_calls_total", &[("scope", "slot")]);
        if node_calls {
            assert!(node > 0.0, "no node call:\n{metrics}");
        } else {
            assert!(
                node == 0.0 && slot > 0.0,
                "node calls while off:\n{metrics}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_calls_survive_a_resharding() {
    // A slot moves to another node under the daemon's feet: its slot map is stale, a node call
    // naming the moved partition is refused by the old node before anything is written, resent
    // per slot (redis-rs follows MOVED) and the map is read again. No check is lost, double
    // spent or answered by a failure mode.
    let cluster = crate::redis_server::RedisCluster::start();
    let app = cluster_daemon(&cluster, true).await;
    assert_eq!(admitted_per_partition(&app, 3).await, [3; 16]);
    let moved = sluice::store::redis::keys::slot("{login:10.0.0.0}");
    cluster.move_slot(moved);
    let mut admitted = admitted_per_partition(&app, 4).await;
    assert_eq!(admitted, [2; 16], "each partition had 2 left of 5");
    // The refusal needs the moved partition in a call with another slot of its old node: more
    // rounds (all denied now) until one happened, bounded.
    let refused = |metrics: &str| {
        metric_value(
            metrics,
            "sluice_redis_errors_total",
            &[("kind", "slot_map")],
        )
    };
    let mut metrics = app.metrics().await;
    for _ in 0..20 {
        if refused(&metrics) > 0.0 {
            break;
        }
        admitted = admitted_per_partition(&app, 4).await;
        assert_eq!(admitted, [0; 16]);
        metrics = app.metrics().await;
    }
    assert!(
        refused(&metrics) > 0.0,
        "no stale node call seen:\n{metrics}"
    );
    // Every attempt after the limit is denied, wherever the partition lives now.
    assert_eq!(admitted_per_partition(&app, 2).await, [0; 16]);
}

/// A policy that changed algorithm on a reload meets its old counters in the lean loop too: each
/// other algorithm's value reads as absent (the partition starts afresh under the new one) and
/// the first commit replaces it.
#[test]
fn the_lean_loop_reads_another_algorithms_counter_as_absent() {
    let [bucket, window, log] = ten_per_second();
    let base = fresh_base();
    let key = |name: &str| format!("{{{base}}}:{name}");
    let check = |name: &str, algorithm: Algorithm| recorded(key(name), algorithm);
    with_redis(|conn| {
        let _: () = redis::cmd("ZADD")
            .arg(key("was log"))
            .arg(START)
            .arg("m")
            .query(conn)
            .expect("ZADD");
        for (name, value) in [
            ("was bucket", format!("{START}:3")),
            ("was window", "-5".into()),
        ] {
            let _: () = redis::cmd("SET")
                .arg(key(name))
                .arg(value)
                .query(conn)
                .expect("SET");
        }
        let checks: Vec<Check> = vec![
            check("was log", bucket),
            check("was bucket", log),
            check("was window", bucket),
            check("was bucket too", window),
        ];
        assert!(is_lean(&checks));
        let replies = run_batch(conn, &checks, START);
        for (i, reply) in replies.iter().enumerate() {
            let decided = decisions(reply, 1)[0];
            assert!(
                decided.allowed && decided.remaining == 9,
                "check {i}: {decided:?}"
            );
        }
        let mut kind =
            |name: &str| -> String { redis::cmd("TYPE").arg(key(name)).query(conn).expect("TYPE") };
        assert_eq!(kind("was log"), "string", "the bucket replaced the log");
        assert_eq!(kind("was bucket"), "zset", "the log replaced the bucket");
    });
}

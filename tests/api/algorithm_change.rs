//! A policy that changes algorithm on a hot reload, under load, on every store (embedded, single
//! Redis, Redis Cluster): every ordered pair of token_bucket, sliding_log and fixed_window (with
//! a period and limit change too), and a policy of several windows. Checks run while the policy
//! file is swapped; every answer before, during and after is enforced (never `fail_open` or
//! 503), and each partition admits exactly the new limit after the swap: its state of the old
//! algorithm reads as absent (afresh), never as a failure and never as a count.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::config::HumanDuration;
use sluice::limit::{Algorithm, FixedWindow, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::Item;
use sluice::store::Spend;

use crate::helpers::{json_of, spawn_served, test_settings, TestApp};
use crate::redis::batch::{decisions, run_batch, Check};
use crate::redis::differential::{with_redis, START};
use crate::redis_server::{RedisCluster, RedisServer};

const ALGORITHMS: [&str; 3] = ["token_bucket", "sliding_log", "fixed_window"];
/// Limit of every policy before the swap: never reached by the test (no denial of the old
/// policy is answered, so none is remembered by the local layer).
const OLD_LIMIT: u64 = 1000;
/// Limit of every single-window policy after the swap (7 days: no refill, no window boundary
/// within a test run in practice).
const NEW_LIMIT: u64 = 5;
/// The several-window policy after the swap admits the smaller of its windows.
const MULTI_NEW_LIMIT: u64 = 4;
const IPS: [&str; 3] = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];
const LOADERS: usize = 4;
/// Most checks one loader sends.
const LOADER_MAX: usize = 400;
const WAIT: Duration = Duration::from_secs(30);

/// Every ordered pair of different algorithms.
fn pairs() -> Vec<(&'static str, &'static str)> {
    let mut pairs = Vec::new();
    for from in ALGORITHMS {
        for to in ALGORITHMS {
            if from != to {
                pairs.push((from, to));
            }
        }
    }
    pairs
}

fn pair_name(from: &str, to: &str) -> String {
    format!("{from}_to_{to}")
}

/// The policy file before (`after` false) or after the swap. Each pair's policy uses its `from`
/// algorithm (1000 per hour) before and its `to` algorithm (5 per 7 days) after; failure modes
/// alternate closed and open. `multi` has two windows (1h and 7d: the same counters before and
/// after), sliding_log before and token_bucket after.
fn policies(after: bool) -> String {
    let mut yaml = String::from("policies:\n");
    for (i, (from, to)) in pairs().into_iter().enumerate() {
        let mode = if i % 2 == 0 { "closed" } else { "open" };
        let (algorithm, limit, period) = if after {
            (to, NEW_LIMIT, "7d")
        } else {
            (from, OLD_LIMIT, "1h")
        };
        let burst = if algorithm == "token_bucket" {
            format!(", burst: {limit}")
        } else {
            String::new()
        };
        let _ = writeln!(
            yaml,
            "  - {{name: {}, key: [ip], algorithm: {algorithm}, limit: {limit}, period: {period}{burst}, failure_mode: {mode}}}",
            pair_name(from, to)
        );
    }
    if after {
        yaml.push_str("  - {name: multi, key: [ip], algorithm: token_bucket, failure_mode: closed, limits: [{limit: 5, period: 1h, burst: 5}, {limit: 4, period: 7d, burst: 4}]}\n");
    } else {
        yaml.push_str("  - {name: multi, key: [ip], algorithm: sliding_log, failure_mode: closed, limits: [{limit: 1000, period: 1h}, {limit: 2000, period: 7d}]}\n");
    }
    yaml
}

fn policy_names() -> Vec<String> {
    let mut names: Vec<String> = pairs().iter().map(|(f, t)| pair_name(f, t)).collect();
    names.push("multi".into());
    names
}

fn new_limit(policy: &str) -> u64 {
    if policy == "multi" {
        MULTI_NEW_LIMIT
    } else {
        NEW_LIMIT
    }
}

/// One answer: policy, ip, status, mode, allowed, limit.
type Answer = (String, String, u16, String, bool, u64);

async fn ask(app: &TestApp, policy: &str, ip: &str) -> Answer {
    let reply = app
        .check_tcp(&json!({"policy": policy, "descriptors": {"ip": ip}}))
        .await;
    let body: Value = json_of(&reply);
    (
        policy.to_owned(),
        ip.to_owned(),
        reply.status.as_u16(),
        body["mode"].as_str().unwrap_or("none").to_owned(),
        body["allowed"].as_bool().unwrap_or(false),
        body["limit"].as_u64().unwrap_or(0),
    )
}

/// Writes `text` to `path` by renaming a complete file over it (what a ConfigMap update does).
fn swap_file(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write the new policy file");
    std::fs::rename(&next, path).expect("swap the policy file");
}

async fn spawn(redis: impl FnOnce(&mut sluice::config::Settings), prefix: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, policies(false)).expect("write policies");
    let mut settings = test_settings(dir.path());
    settings.policies = file;
    settings.policies_poll = HumanDuration(20_000);
    settings.redis.key_prefix = prefix.into();
    // Generous: small shared CI machines; timing is the benchmark's job, not this test's.
    settings.redis.timeout = HumanDuration(2_000_000);
    redis(&mut settings);
    let app = spawn_served(dir, settings).await;
    crate::wait::until("the daemon enforces", WAIT, || async {
        let (_, _, _, mode, _, _) = ask(&app, "multi", "warmup").await;
        match mode == "enforced" {
            true => Ok(()),
            false => Err(mode),
        }
    })
    .await;
    app
}

/// Whether the daemon serves the policies after the swap.
async fn swapped(app: &TestApp) -> bool {
    let dump = json_of(&app.admin_get("/v1/policies").await);
    dump["policies"].as_array().is_some_and(|policies| {
        policies
            .iter()
            .any(|p| p["name"] == "multi" && p["algorithm"] == "token_bucket")
    })
}

/// Builds state under the old policies, swaps the file while loaders check, then checks each
/// partition past the new limit; asserts every answer was enforced and the new limit exact.
async fn change_under_load(app: TestApp) {
    let app = Arc::new(app);
    let names = policy_names();
    let mut answers: Vec<Answer> = Vec::new();
    for policy in &names {
        for ip in IPS {
            for _ in 0..3 {
                answers.push(ask(&app, policy, ip).await);
            }
        }
    }
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let during = Arc::new(Mutex::new(Vec::new()));
    let mut loaders = Vec::new();
    for loader in 0..LOADERS {
        let (app, sent, stop, during, names) = (
            Arc::clone(&app),
            Arc::clone(&sent),
            Arc::clone(&stop),
            Arc::clone(&during),
            names.clone(),
        );
        loaders.push(tokio::spawn(async move {
            let started = Instant::now();
            for n in 0..LOADER_MAX {
                if stop.load(Ordering::Relaxed) || started.elapsed() > WAIT {
                    break;
                }
                let policy = &names[(n + loader) % names.len()];
                let ip = IPS[(n / names.len() + loader) % IPS.len()];
                let answer = ask(&app, policy, ip).await;
                during.lock().expect("answers").push(answer);
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let wait_sent = |at_least: usize| {
        let sent = Arc::clone(&sent);
        async move {
            let started = Instant::now();
            while sent.load(Ordering::Relaxed) < at_least && started.elapsed() < WAIT {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    wait_sent(40).await;
    swap_file(&app.dir.path().join("policies.yaml"), &policies(true));
    crate::wait::eventually_within("the new policy file is loaded", WAIT, || async {
        swapped(&app).await
    })
    .await;
    let at_swap = sent.load(Ordering::Relaxed);
    wait_sent(at_swap + 80).await;
    stop.store(true, Ordering::Relaxed);
    for loader in loaders {
        loader.await.expect("loader");
    }
    answers.extend(during.lock().expect("answers").drain(..));
    for policy in &names {
        for ip in IPS {
            for _ in 0..new_limit(policy) + 2 {
                answers.push(ask(&app, policy, ip).await);
            }
        }
    }

    let unenforced: Vec<&Answer> = answers
        .iter()
        .filter(|(_, _, status, mode, _, _)| !matches!(status, 200 | 429) || mode != "enforced")
        .collect();
    assert!(
        unenforced.is_empty(),
        "{} of {} answers not enforced, e.g. {:?}",
        unenforced.len(),
        answers.len(),
        &unenforced[..unenforced.len().min(5)]
    );
    for policy in &names {
        for ip in IPS {
            // Answers of the new policy carry its (small) limit; the old one's are 1000 or more.
            let admitted = answers
                .iter()
                .filter(|(p, i, _, _, allowed, limit)| {
                    p == policy && i == ip && *allowed && *limit < 100
                })
                .count() as u64;
            assert_eq!(
                admitted,
                new_limit(policy),
                "{policy} {ip}: admitted after the swap (a fresh partition admits exactly the new limit)"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithm_changes_start_afresh_on_the_embedded_store() {
    let app = spawn(|_| {}, "rl").await;
    change_under_load(app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithm_changes_start_afresh_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let app = spawn(|s| s.redis.url = Some(url), "algo").await;
    change_under_load(app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithm_changes_start_afresh_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let app = spawn(|s| s.redis.cluster = urls, "algo").await;
    change_under_load(app).await;
}

/// A token bucket, sliding log and fixed window of 10 per 10 s (a token is 1 s).
fn script_algorithms() -> [Algorithm; 3] {
    [
        Algorithm::TokenBucket(TokenBucket::new(10, 10_000_000, 10).expect("valid")),
        Algorithm::SlidingLog(SlidingLog::new(10, 10_000_000).expect("valid")),
        Algorithm::FixedWindow(FixedWindow::new(10, 10_000_000).expect("valid")),
    ]
}

fn one(key: &str, algorithm: Algorithm) -> Check {
    let item = Item {
        key: key.to_owned(),
        algorithm,
        cost: 1,
        enforce: true,
    };
    (Spend::Record, vec![item])
}

fn remaining(conn: &mut redis::Connection, checks: &[Check], now: u64) -> Vec<u64> {
    run_batch(conn, checks, now)
        .iter()
        .map(|reply| decisions(reply, 1)[0].remaining)
        .collect()
}

#[test]
fn another_algorithms_value_reads_as_absent_and_todays_values_keep_counting() {
    let now = START;
    with_redis(|conn| {
        // Every ordered pair: 3 units spent under `from`, then `to` sees a fresh partition.
        for (i, from) in script_algorithms().into_iter().enumerate() {
            for (j, to) in script_algorithms().into_iter().enumerate() {
                let key = format!("{{change:{i}:{j}}}");
                let spent = remaining(conn, &vec![one(&key, from); 3], now);
                assert_eq!(spent, [9, 8, 7]);
                let expected = if i == j { 6 } else { 9 };
                assert_eq!(
                    remaining(conn, &[one(&key, to)], now),
                    [expected],
                    "{i} -> {j}"
                );
            }
        }
        // Values written before fixed windows were negative: a positive packed count of the
        // current window still counts; a token bucket's TAT, bare or with a remainder, too.
        let [bucket, _, window] = script_algorithms();
        let tag = (now / 10_000_000) % (1 << 20);
        let set = |conn: &mut redis::Connection, key: &str, value: String| {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query::<()>(conn)
                .expect("SET");
        };
        set(
            conn,
            "{legacy}:window",
            (3 * (1u64 << 20) + tag).to_string(),
        );
        assert_eq!(remaining(conn, &[one("{legacy}:window", window)], now), [6]);
        set(conn, "{legacy}:bucket", (now + 3_000_000).to_string());
        assert_eq!(remaining(conn, &[one("{legacy}:bucket", bucket)], now), [6]);
        set(conn, "{legacy}:rem", format!("{}:5", now + 3_000_000));
        assert_eq!(remaining(conn, &[one("{legacy}:rem", bucket)], now), [5]);
    });
}

#[test]
fn one_key_under_two_algorithms_in_one_batch_runs_as_one_by_one() {
    let [bucket, log, window] = script_algorithms();
    let sequence = |key: &str| {
        vec![
            one(key, bucket),
            one(key, log),
            one(key, log),
            one(key, window),
            one(key, bucket),
            one(key, log),
        ]
    };
    with_redis(|conn| {
        let together = remaining(conn, &sequence("{mixed}:batch"), START);
        let apart: Vec<u64> = sequence("{mixed}:apart")
            .into_iter()
            .flat_map(|check| remaining(conn, &[check], START))
            .collect();
        assert_eq!(together, [9, 9, 8, 9, 9, 9]);
        assert_eq!(together, apart);
        let kind: String = redis::cmd("TYPE")
            .arg("{mixed}:batch")
            .query(conn)
            .expect("TYPE");
        assert_eq!(kind, "zset", "the last check's algorithm holds the key");
    });
}

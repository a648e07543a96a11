//! `sluice bench --systems permits`: concurrency permits (acquire through `/v1/check`, then
//! `/v1/release`) beside plain checks of a fixed window, on the bench's own Redis and one
//! daemon, interleaved run by run. Each row gives operations per second (a permit is one
//! acquire and its release), Redis script calls per operation (`INFO commandstats`) and the
//! ratio to the plain checks measured in the same run. The concurrency limit is far above the
//! callers, so every acquire is admitted: the row measures the steady cost, not denials.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use sluice::client::{Connection, Target};

use super::procs::{Daemon, Redis};
use super::report;

const POLICIES: &str = "
policies:
  - {name: permits, key: [k], match: {op: permit}, algorithm: concurrency, limit: 10000, failure_mode: closed}
  - {name: plain, key: [k], match: {op: plain}, algorithm: fixed_window, limit: 1000000000, period: 1h, failure_mode: closed}
";

/// Whether `--systems` asks for the permit rows.
pub fn wanted(systems: Option<&Vec<String>>) -> bool {
    systems.is_some_and(|names| names.iter().any(|name| name == "permits"))
}

/// One run of one system.
struct Figures {
    /// Operations a second (a permit: acquire and release; a plain check: one check).
    rate: f64,
    /// Redis script calls per operation.
    calls: f64,
}

/// `callers` loop for `duration`: each operation a permit taken and given back (`permit`) or
/// one plain check.
async fn run(
    redis: &Redis,
    target: &Target,
    permit: bool,
    callers: usize,
    duration: Duration,
    tag: &str,
) -> Result<Figures> {
    let before = report::script_stats(&redis.url())?;
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let (target, done) = (target.clone(), Arc::clone(&done));
        let op = if permit { "permit" } else { "plain" };
        let ask = json!({"descriptors": {"op": op, "k": format!("{tag}-{caller}")}});
        tasks.spawn(async move {
            let mut conn = Connection::open(&target).await.context("connect")?;
            while Instant::now() < until {
                let reply = conn.post_json("/v1/check", &ask).await?;
                anyhow::ensure!(reply.status.as_u16() == 200, "check: {}", reply.json());
                if permit {
                    let token = reply.json()["permit"].as_str().unwrap_or("").to_owned();
                    let back = conn
                        .post_json("/v1/release", &json!({ "permit": token }))
                        .await?;
                    anyhow::ensure!(back.json()["released"] == true, "release: {}", back.json());
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    let started = Instant::now();
    while let Some(task) = tasks.join_next().await {
        task??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = report::script_stats(&redis.url())?;
    let ops = done.load(Ordering::Relaxed) as f64;
    Ok(Figures {
        rate: ops / elapsed.max(1e-9),
        calls: after.calls_since(&before) / ops.max(1.0),
    })
}

/// Runs the permit rows `runs` times (interleaved with the plain checks) and prints them.
pub async fn bench(threads: usize, quick: bool, runs: usize) -> Result<()> {
    let redis = Redis::start()?;
    let daemon = Daemon::start(Some(&redis.url()), POLICIES, threads, "")?;
    let target = Target::Tcp(daemon.http);
    let duration = Duration::from_secs(if quick { 1 } else { 5 });
    println!("\nConcurrency permits (acquire + release) beside plain checks, one daemon on Redis");
    println!(
        "{:>8} {:>4} {:>14} {:>12} {:>14} {:>12} {:>10}",
        "callers", "run", "permits/s", "calls/perm", "checks/s", "calls/chk", "ratio"
    );
    for callers in [1usize, 16] {
        for run_index in 0..runs {
            let tag = format!("r{run_index}c{callers}");
            let plain = run(&redis, &target, false, callers, duration, &tag).await?;
            let held = run(&redis, &target, true, callers, duration, &tag).await?;
            println!(
                "{callers:>8} {run_index:>4} {:>14.0} {:>12.2} {:>14.0} {:>12.2} {:>10.2}",
                held.rate,
                held.calls,
                plain.rate,
                plain.calls,
                held.rate / plain.rate.max(1e-9),
            );
        }
    }
    println!(
        "(ratio: permits/s over plain checks/s in the same run; a permit is two HTTP calls, \
         each one script call)"
    );
    Ok(())
}

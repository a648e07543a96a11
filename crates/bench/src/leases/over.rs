//! The over-the-limit rows: one hot key whose demand is twice its rate, on two daemons sharing
//! one Redis, 16 callers at a fixed 3,300 checks a second (open loop), with and without
//! `lease: true`: Redis script calls per check, and admitted against the most the limit allows
//! over the run (a token bucket's burst plus its refill, a fixed window's limit per window the
//! run touched). A FAIL line if ever more was admitted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use sluice::client::Target;

use super::super::load::{self, KeyMix};
use super::super::procs::{Daemon, Redis};
use super::super::report;
use super::{checkers, range, section, Tally};

/// 100,000 a minute with a burst of 1,000 (the hot key), and a fixed window of the same
/// rate (10,000 per 6 s), each with and without leases.
const POLICIES: &str = "
policies:
  - {name: tb, key: [k], algorithm: token_bucket, limit: 100000, period: 1m, burst: 1000, failure_mode: closed}
  - {name: tbl, key: [k], algorithm: token_bucket, limit: 100000, period: 1m, burst: 1000, lease: true, failure_mode: closed}
  - {name: fw, key: [k], algorithm: fixed_window, limit: 10000, period: 6s, failure_mode: closed}
  - {name: fwl, key: [k], algorithm: fixed_window, limit: 10000, period: 6s, lease: true, failure_mode: closed}
";

const DAEMONS: usize = 2;
const CALLERS: usize = 16;
/// Twice the refill of 1,666.7 a second.
const RATE: f64 = 3_300.0;
const RUN: Duration = Duration::from_secs(8);

/// One run's figures.
struct Over {
    rate: f64,
    calls: f64,
    admitted: u64,
    most: u64,
}

/// Redis' clock, µs.
fn redis_now_us(url: &str) -> Result<u64> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn)?;
    Ok(secs * 1_000_000 + micros)
}

/// Every over-the-limit row, `runs` times each, interleaved; false if any admitted more than
/// the limit allows.
pub async fn all(variants: &[String], runs: usize, threads: usize) -> Result<bool> {
    let mut ok = true;
    println!(
        "\nQuota leases over the limit (hot key, {DAEMONS} daemons on one Redis, {CALLERS} callers, {RATE:.0} checks/s open loop: twice the rate; {}s runs)",
        RUN.as_secs()
    );
    println!("(tb: 100,000/min, burst 1,000; fw: 10,000 per 6 s; `most`: burst + refill over the run, or the limit per window touched)");
    println!("| setting | policy | lease | checks/s | admitted | most | Redis calls per check | verdict |");
    println!("|---|---|---|---|---|---|---|---|");
    for variant in variants {
        let redis = Redis::start()?;
        let fleet = (0..DAEMONS)
            .map(|_| {
                Daemon::start_full(
                    Some(&redis.url()),
                    POLICIES,
                    threads,
                    "",
                    false,
                    &section(variant),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let targets: Vec<Target> = fleet.iter().map(|d| Target::Tcp(d.http)).collect();
        let policies = ["tb", "tbl", "fw", "fwl"];
        let mut samples: Vec<Vec<Over>> = policies.iter().map(|_| Vec::new()).collect();
        for run in 0..runs {
            for (at, policy) in policies.iter().enumerate() {
                let over = one(&redis, &targets, policy, &format!("o{run}")).await?;
                println!(
                    "leases over the limit: run {} {policy}: {:.0}/s, {} admitted (most {}), {:.4} calls",
                    run + 1,
                    over.rate,
                    over.admitted,
                    over.most,
                    over.calls
                );
                if over.admitted > over.most {
                    ok = false;
                    println!(
                        "FAIL: {policy} run {}: admitted {} over the most {}",
                        run + 1,
                        over.admitted,
                        over.most
                    );
                }
                samples[at].push(over);
            }
        }
        for (policy, outcomes) in policies.iter().zip(&samples) {
            let col = |f: &dyn Fn(&Over) -> f64| outcomes.iter().map(f).collect::<Vec<f64>>();
            let over = outcomes.iter().any(|o| o.admitted > o.most);
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                if variant.is_empty() {
                    "defaults"
                } else {
                    variant
                },
                &policy[..2],
                if policy.ends_with('l') { "on" } else { "off" },
                range(&col(&|o| o.rate), 0),
                range(&col(&|o| o.admitted as f64), 0),
                range(&col(&|o| o.most as f64), 0),
                range(&col(&|o| o.calls), 4),
                if over { "FAIL" } else { "ok" },
            );
        }
    }
    Ok(ok)
}

/// One run on a fresh key of `policy`.
async fn one(redis: &Redis, targets: &[Target], policy: &str, tag: &str) -> Result<Over> {
    let tally = Arc::new(Tally::default());
    let factory = checkers(targets.to_vec(), policy, tag, 1, Arc::clone(&tally));
    let url = redis.url();
    let stats = report::script_stats(&url)?;
    let first = redis_now_us(&url)?;
    let started = Instant::now();
    let run = load::open(
        &factory,
        CALLERS,
        RATE,
        &KeyMix::Hot,
        (Duration::ZERO, RUN),
        false,
    )
    .await?;
    let elapsed = started.elapsed();
    let last = redis_now_us(&url)?;
    let after = report::script_stats(&url)?;
    let (admitted, answers) = tally.get();
    let most = if policy.starts_with("tb") {
        let refill = (elapsed.as_micros() * 100_000).div_ceil(60_000_000);
        1_000 + u64::try_from(refill).unwrap_or(u64::MAX)
    } else {
        10_000 * (last / 6_000_000 - first / 6_000_000 + 1)
    };
    Ok(Over {
        rate: run.rate(),
        calls: after.calls_since(&stats) / (answers.max(1) as f64),
        admitted,
        most,
    })
}

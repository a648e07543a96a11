//! The throughput rows: leased against non-leased policies far from their limits (the steady
//! state leases are for), and the no-op floor, interleaved run by run.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;

use super::super::load::{self, Factory, KeyMix};
use super::super::procs::{cpu_seconds, Daemon, Redis};
use super::super::{report, Plan};
use super::{checkers, range, section, Floor, Tally};
use sluice::client::Target;

/// Limits no run comes near: every row measures the steady state. A token bucket's lease lasts
/// while the bucket would still be short of full (its hold), so its refill is slow (1,000 a
/// second) and its burst large; at a refill of a billion a second a lease would shrink away
/// within microseconds and the row would measure nothing.
pub const POLICIES: &str = "
policies:
  - {name: tb, key: [k], algorithm: token_bucket, limit: 1000, period: 1s, burst: 1000000000, failure_mode: closed}
  - {name: tbl, key: [k], algorithm: token_bucket, limit: 1000, period: 1s, burst: 1000000000, lease: true, failure_mode: closed}
  - {name: fw, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1h, failure_mode: closed}
  - {name: fwl, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1h, lease: true, failure_mode: closed}
";

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    /// Answers per second (measured part).
    pub rate: f64,
    /// Latency percentiles, microseconds.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 200 answers over warm-up and measurement.
    pub admitted: u64,
    /// EVAL/EVALSHA calls per answer.
    pub calls: f64,
    /// Redis process CPU per answer, microseconds.
    pub redis_cpu: f64,
    /// Redis script time per answer (`commandstats` usec), microseconds.
    pub redis_usec: f64,
    /// CPU of the processes under test per answer, microseconds.
    pub daemon_cpu: f64,
}

/// Runs `factory` closed-loop with `clients` callers and measures it; `pids` are the processes
/// under test.
pub async fn measure(
    redis: &Redis,
    pids: &[u32],
    factory: &Factory,
    tally: &Tally,
    mix: &KeyMix,
    clients: usize,
    plan: &Plan,
) -> Result<Figures> {
    let stats = report::script_stats(&redis.url())?;
    let cpu = |pids: &[u32]| pids.iter().map(|&pid| cpu_seconds(pid)).sum::<f64>();
    let (daemon_before, redis_before) = (cpu(pids), cpu_seconds(redis.pid()));
    let (admitted_before, answers_before) = tally.get();
    let run = load::closed(factory, clients, mix, plan.warmup, plan.duration).await?;
    let after = report::script_stats(&redis.url())?;
    let (admitted, answers) = tally.get();
    let (admitted, answers) = (admitted - admitted_before, answers - answers_before);
    let per = |x: f64| x / (answers.max(1) as f64);
    let calls = after.calls_since(&stats);
    Ok(Figures {
        rate: run.rate(),
        p50: run.latency.value_at_quantile(0.5),
        p99: run.latency.value_at_quantile(0.99),
        admitted,
        calls: per(calls),
        redis_cpu: per((cpu_seconds(redis.pid()) - redis_before) * 1e6),
        redis_usec: per(after.usec_per_call(&stats) * calls),
        daemon_cpu: per((cpu(pids) - daemon_before) * 1e6),
    })
}

/// Rows keyed by (mix, algorithm, callers, system), one sample per run.
type Samples = BTreeMap<(String, &'static str, usize, String), Vec<Figures>>;

/// The throughput rows for every variant of `[leases]`, `runs` times, then prints them.
pub async fn throughput(
    plan: &Plan,
    variants: &[String],
    runs: usize,
    threads: usize,
) -> Result<()> {
    let redis = Redis::start()?;
    let daemons = variants
        .iter()
        .map(|v| Daemon::start_full(Some(&redis.url()), POLICIES, threads, "", true, &section(v)))
        .collect::<Result<Vec<_>>>()?;
    let floor = Floor::start(threads.max(1))?;
    let mut samples = Samples::new();
    for run in 0..runs {
        for mix in &plan.mixes {
            let keys = match mix {
                KeyMix::Hot => 1,
                KeyMix::Zipf(cdf) => cdf.len(),
            };
            for &clients in &plan.clients {
                // Fresh keys per run: no lease or counter carried over from an earlier row.
                let tag = format!("r{run}c{clients}");
                let mut systems: Vec<(String, &'static str, Target, u32, &str)> = vec![
                    (
                        "floor".into(),
                        "-",
                        Target::Tcp(floor.http),
                        floor.pid(),
                        "tb",
                    ),
                    (
                        "per check".into(),
                        "tb",
                        Target::Tcp(daemons[0].http),
                        daemons[0].pid(),
                        "tb",
                    ),
                    (
                        "per check".into(),
                        "fw",
                        Target::Tcp(daemons[0].http),
                        daemons[0].pid(),
                        "fw",
                    ),
                ];
                for (variant, daemon) in variants.iter().zip(&daemons) {
                    for (algorithm, policy) in [("tb", "tbl"), ("fw", "fwl")] {
                        let name = format!("leased {variant}").trim().to_owned();
                        systems.push((
                            name,
                            algorithm,
                            Target::Tcp(daemon.http),
                            daemon.pid(),
                            policy,
                        ));
                    }
                }
                for (system, algorithm, target, pid, policy) in systems {
                    let tally = Arc::new(Tally::default());
                    let factory = checkers(vec![target], policy, &tag, keys, Arc::clone(&tally));
                    let figures =
                        measure(&redis, &[pid], &factory, &tally, mix, clients, plan).await?;
                    eprintln!(
                        "leases: run {} {} {algorithm} {clients} {system}: {:.0}/s, {:.4} calls, {:.1} us daemon",
                        run + 1,
                        mix.name(),
                        figures.rate,
                        figures.calls,
                        figures.daemon_cpu
                    );
                    samples
                        .entry((mix.name(), algorithm, clients, system))
                        .or_default()
                        .push(figures);
                }
            }
        }
    }
    print(&samples);
    Ok(())
}

fn print(samples: &Samples) {
    println!("\nQuota leases, throughput (far from the limit; ranges over runs; CPU and calls per check)");
    println!(
        "| keys | alg | callers | system | checks/s | p50 us | p99 us | Redis calls | Redis CPU us | script us | daemon CPU us | vs floor | vs per check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let floor_of = |mix: &str, clients: usize| -> Vec<f64> {
        samples
            .get(&(mix.to_owned(), "-", clients, "floor".to_owned()))
            .map(|v| v.iter().map(|f| f.daemon_cpu).collect())
            .unwrap_or_default()
    };
    for ((mix, algorithm, clients, system), figures) in samples {
        let col = |f: fn(&Figures) -> f64| figures.iter().map(f).collect::<Vec<f64>>();
        let cpu = col(|f| f.daemon_cpu);
        // Ratios run by run: each sample against the same run's floor and per-check row.
        let ratio = |base: Vec<f64>| -> String {
            let r: Vec<f64> = cpu
                .iter()
                .zip(&base)
                .map(|(c, b)| c / b.max(1e-9))
                .collect();
            if r.is_empty() || system == "floor" {
                "-".into()
            } else {
                format!("{}x", range(&r, 2))
            }
        };
        let plain = samples
            .get(&(mix.clone(), *algorithm, *clients, "per check".to_owned()))
            .map(|v| v.iter().map(|f| f.daemon_cpu).collect())
            .unwrap_or_default();
        println!(
            "| {mix} | {algorithm} | {clients} | {system} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            range(&col(|f| f.rate), 0),
            range(&col(|f| f.p50 as f64), 0),
            range(&col(|f| f.p99 as f64), 0),
            range(&col(|f| f.calls), 4),
            range(&col(|f| f.redis_cpu), 3),
            range(&col(|f| f.redis_usec), 2),
            range(&cpu, 1),
            ratio(floor_of(mix, *clients)),
            if system.starts_with("leased") { ratio(plain) } else { "-".into() },
        );
    }
}

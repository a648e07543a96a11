//! `sluice bench`: the project's benchmark. It starts its own `redis-server` and daemon, drives
//! load through the daemon (TCP and Unix socket) and, in the same run, through the baselines an
//! app without sluice would use (the same Lua script by unpipelined EVALSHA, and a naive
//! token-bucket script), then reports checks/s, latency percentiles, CPU and Redis time per
//! check, ratios to the baselines, and Redis memory per key. Figures, not assertions.

mod clients;
mod envoy;
mod grpc;
mod leases;
mod load;
mod memory;
mod naive_sidecar;
mod overload;
mod permits;
mod procs;
mod rates;
mod report;
mod targets;
mod trace_sink;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use self::load::{Factory, KeyMix, Run};
pub use self::naive_sidecar::{run as run_naive_sidecar, NaiveArgs};
use self::procs::{cpu_seconds, cpu_wait_seconds, pin, Daemon, NaiveSidecar, Redis};
use self::report::{Report, Row};
use sluice::client::Target;
use sluice::limit::{Algorithm, FixedWindow, SlidingLog, TokenBucket};

/// Options of `sluice bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A small run in seconds (a smoke test: one key mix, one client count, short runs).
    #[arg(long)]
    quick: bool,
    /// Concurrent clients of the closed-loop runs (default 1, 4, 64, 256; quick: 16).
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Seconds measured per run, after a warm-up (default 3; quick: 1).
    #[arg(long)]
    seconds: Option<f64>,
    /// Keys for the Zipf mix and for the memory measurement (default 100000; quick: 10000).
    #[arg(long)]
    keys: Option<usize>,
    /// Worker threads of the daemon under test (0: its default).
    #[arg(long, default_value_t = 0)]
    daemon_threads: usize,
    /// Extra `[redis]` settings for the daemon under test, TOML lines (e.g. `pipelines_in_flight = 1`).
    #[arg(long, default_value = "")]
    redis_settings: String,
    /// Only these algorithms' policies (tb, sl, fw; default all).
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// Only these key mixes (hot, zipf; default both, quick: hot).
    #[arg(long, value_delimiter = ',')]
    mixes: Option<Vec<String>>,
    /// Only the systems whose name contains one of these (e.g. `grpc,tcp,naive`; default all):
    /// a short run of the rows a change is judged by, or one system to profile (`overload`: only
    /// the overload runs). The memory run is left out, and the overload runs unless `overload`
    /// is named. `envoy` adds the opt-in "through Envoy" rows (a real Envoy 1.40 in front of a
    /// trivial upstream: no filter, the rate limit filter over TCP and the Unix socket, ext_authz,
    /// the rate limit quota filter on sluice's RLQS over TCP and the socket, and an RLQS fleet
    /// run: Envoys sharing a limit they reach). `permits` runs only the concurrency permit rows
    /// (acquire and release beside plain checks: permits/s and Redis calls per permit). `floor`
    /// adds the no-op HTTP floor's rows (named only: `--systems tcp,naive,floor`).
    #[arg(long, value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// Pin the load generator and Redis to the first CPU and the processes under test (daemons,
    /// the naive sidecar, Envoy) to the others, so that CPU per check measures them and not the
    /// load generator's share of the same cores (`taskset`; needs 2 CPUs or more).
    #[arg(long)]
    pin: bool,
    /// Fixed offered rates in checks/s (e.g. `1000,5000,10000`): open loop at each, latency from
    /// when each call was due, on the Unix socket, TCP and gRPC and the naive sidecar at the same
    /// rates, 64 callers (or the largest of `--clients`), the token bucket on a Zipf mix unless
    /// `--policies`/`--mixes` say otherwise; only these rows (and `overload` if named). Pins the
    /// load generator and Redis to a core of their own where there are 2 or more (`--no-pin`).
    #[arg(long, value_delimiter = ',', value_parser = rates::parse_rate)]
    rate: Option<Vec<f64>>,
    /// With `--rate`: leave the processes unpinned.
    #[arg(long)]
    no_pin: bool,
    /// Busy threads that keep the host's CPUs loaded for the whole run: a deliberately loaded
    /// host, as a sidecar on a busy node sees it (0: none).
    #[arg(long, default_value_t = 0)]
    hog: usize,
    /// Only measure Redis memory per key.
    #[arg(long)]
    memory_only: bool,
    /// Also run a second daemon with `[tracing]` on (every trace sampled, OTLP/HTTP to a local
    /// sink) and add its rows as `traced tcp`, to compare with `sluice tcp` (tracing off).
    #[arg(long)]
    tracing: bool,
    /// The quota lease rows (`--systems leases`).
    #[command(flatten)]
    leases: leases::LeaseArgs,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/latest.json")]
    json: PathBuf,
}

/// The policies the daemon runs: limits high enough that every check goes to Redis and passes,
/// so that sluice and the raw script do the same work.
const POLICIES: &str = "
policies:
  - {name: tb, key: [k], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
  - {name: sl, key: [k], algorithm: sliding_log, limit: 10000, period: 100ms, failure_mode: closed}
  - {name: fw, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1s, failure_mode: closed}
";

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    let ok = "valid parameters";
    vec![
        (
            "tb",
            Algorithm::TokenBucket(
                TokenBucket::new(1_000_000_000, 1_000_000, 1_000_000_000).expect(ok),
            ),
        ),
        (
            "sl",
            Algorithm::SlidingLog(SlidingLog::new(10_000, 100_000).expect(ok)),
        ),
        (
            "fw",
            Algorithm::FixedWindow(FixedWindow::new(1_000_000_000, 1_000_000).expect(ok)),
        ),
    ]
}

/// Runs the benchmark; exit code 1 if it could not run.
pub fn run(args: BenchArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice bench: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice bench: {error:#}");
            ExitCode::from(1)
        }
    }
}

struct Plan {
    clients: Vec<usize>,
    warmup: Duration,
    duration: Duration,
    mixes: Vec<KeyMix>,
    keys: usize,
    open_loop: bool,
    /// Open-loop latency from when each call was due (`--rate`), not from its hand-over.
    from_due: bool,
}

async fn bench(args: BenchArgs) -> Result<()> {
    if let Some(unknown) = args.policies.iter().flatten().find(|name| {
        !algorithms()
            .iter()
            .any(|(policy, _)| policy == &name.as_str())
    }) {
        anyhow::bail!("unknown policy {unknown:?} (tb, sl, fw)");
    }
    let keys = args
        .keys
        .unwrap_or(if args.quick { 10_000 } else { 100_000 });
    let plan = Plan {
        clients: args.clients.clone().unwrap_or(if args.rate.is_some() {
            vec![64]
        } else if args.quick {
            vec![16]
        } else {
            vec![1, 4, 64, 256]
        }),
        warmup: Duration::from_millis(if args.quick { 300 } else { 1_000 }),
        duration: Duration::from_secs_f64(args.seconds.unwrap_or(if args.quick {
            1.0
        } else {
            3.0
        })),
        mixes: match &args.mixes {
            Some(names) => names
                .iter()
                .map(|name| match name.as_str() {
                    "hot" => Ok(KeyMix::Hot),
                    "zipf" => Ok(KeyMix::zipf(keys)),
                    other => Err(anyhow::anyhow!("unknown key mix {other:?} (hot, zipf)")),
                })
                .collect::<Result<_>>()?,
            None if args.quick && args.rate.is_none() => vec![KeyMix::Hot],
            None if args.rate.is_some() => vec![KeyMix::zipf(keys)],
            None => vec![KeyMix::Hot, KeyMix::zipf(keys)],
        },
        keys,
        open_loop: !args.quick,
        from_due: args.rate.is_some(),
    };
    let _hog = Hog::start(args.hog);
    if permits::wanted(args.systems.as_ref()) {
        let runs = if args.quick { 1 } else { 3 };
        return permits::bench(args.daemon_threads, args.quick, runs).await;
    }
    if leases::wanted(args.systems.as_ref()) {
        let exact = leases::bench(&args.leases, &plan, args.daemon_threads, args.quick).await?;
        anyhow::ensure!(exact, "a lease row admitted more than the limit");
        return Ok(());
    }
    let mut report = Report::new(machine());
    if args.memory_only {
        report.memory = memory::measure(plan.keys)?;
        report.print();
        return report.write_json(&args.json);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin_rates = args.rate.is_some() && !args.no_pin && cpus >= 2;
    let pinning = Pinning::new(args.pin || pin_rates)?;
    let redis = Redis::start()?;
    pinning.generator(redis.pid())?;
    let policies = format!("{POLICIES}{}{}", grpc::POLICIES, envoy::POLICIES);
    let daemon = Daemon::start(
        Some(&redis.url()),
        &policies,
        args.daemon_threads,
        &format!("{}\n", args.redis_settings.replace(';', "\n")),
    )?;
    // The same daemon with tracing on, exporting every span: what tracing costs a check.
    let sink = match args.tracing {
        true => Some(trace_sink::TraceSink::start().await?),
        false => None,
    };
    let traced = match &sink {
        Some(sink) => Some(Daemon::start_full(
            Some(&redis.url()),
            &policies,
            args.daemon_threads,
            &format!("{}\n", args.redis_settings.replace(';', "\n")),
            true,
            &sink.settings(),
        )?),
        None => None,
    };
    // The same daemon on its embedded store: what HTTP and the check path cost without Redis.
    let embedded = Daemon::start(None, &policies, args.daemon_threads, "")?;
    for pid in [daemon.pid(), embedded.pid()]
        .into_iter()
        .chain(traced.as_ref().map(Daemon::pid))
    {
        pinning.tested(pid)?;
    }
    // What a team writes in an afternoon, with as many worker threads as the daemon.
    let threads = match args.daemon_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 4)),
        n => n,
    };
    let naive = NaiveSidecar::start(&redis.url(), threads)?;
    pinning.tested(naive.pid())?;
    // The no-op HTTP floor (an axum server that reads the check body and answers a fixed
    // decision), when named: what HTTP and JSON cost with no limiter, beside `/v1/check`.
    let floor = match args.systems.iter().flatten().any(|name| name == "floor") {
        true => Some(leases::Floor::start(threads)?),
        false => None,
    };
    if let Some(floor) = &floor {
        pinning.tested(floor.pid())?;
    }
    let wanted = |policy: &str| match &args.policies {
        Some(names) => names.iter().any(|name| name == policy),
        None => args.rate.is_none() || policy == "tb",
    };
    report.rates = args.rate.clone().unwrap_or_default();
    for (policy, algorithm) in algorithms().into_iter().filter(|(p, _)| wanted(p)) {
        for mix in &plan.mixes {
            let keys = if matches!(mix, KeyMix::Hot) {
                1
            } else {
                plan.keys
            };
            let raw = clients::raw_evalsha(&redis.url(), policy, &algorithm, keys).await?;
            let mut systems: Vec<(String, Factory)> = vec![
                (
                    "sluice tcp".into(),
                    clients::sluice(Target::Tcp(daemon.http), policy, keys),
                ),
                (
                    "sluice uds".into(),
                    clients::sluice(Target::Unix(daemon.socket.clone()), policy, keys),
                ),
                (
                    "sluice grpc".into(),
                    grpc::sluice(daemon.grpc, policy, keys),
                ),
                ("raw EVALSHA".into(), raw),
            ];
            if let Some(traced) = &traced {
                systems.push((
                    "traced tcp".into(),
                    clients::sluice(Target::Tcp(traced.http), policy, keys),
                ));
            }
            systems.extend([(
                "naive sidecar".into(),
                clients::sluice(Target::Tcp(naive.http), policy, keys),
            )]);
            if let Some(floor) = &floor {
                systems.push((
                    "noop floor".into(),
                    clients::sluice(Target::Tcp(floor.http), policy, keys),
                ));
            }
            if policy == "tb" {
                systems.push((
                    "embedded uds".into(),
                    clients::sluice(Target::Unix(embedded.socket.clone()), policy, keys),
                ));
                systems.push((
                    "naive script".into(),
                    clients::naive(&redis.url(), keys, 1_000_000_000, 1_000_000_000).await?,
                ));
            }
            systems.retain(|(system, _)| {
                args.systems
                    .as_ref()
                    .is_none_or(|names| names.iter().any(|name| system.contains(name.as_str())))
            });
            if let Some(rates) = &args.rate {
                let mut fixed = Vec::new();
                for name in rates::SYSTEMS {
                    let Some((_, factory)) = systems.iter().find(|(s, _)| s == name) else {
                        continue;
                    };
                    let pid = match name {
                        "naive sidecar" => naive.pid(),
                        _ => daemon.pid(),
                    };
                    fixed.push((name, factory, pid));
                }
                let clients = plan.clients.iter().copied().max().unwrap_or(64);
                rates::run(
                    &mut report,
                    &redis,
                    &fixed,
                    rates,
                    clients,
                    policy,
                    mix,
                    &plan,
                )
                .await?;
                continue;
            }
            for &clients in &plan.clients {
                for (system, factory) in &systems {
                    let process = match system.as_str() {
                        s if s.starts_with("embedded") => Some(embedded.pid()),
                        "traced tcp" => traced.as_ref().map(Daemon::pid),
                        s if s.starts_with("sluice") => Some(daemon.pid()),
                        "naive sidecar" => Some(naive.pid()),
                        "noop floor" => floor.as_ref().map(leases::Floor::pid),
                        _ => None,
                    };
                    let row = measure(
                        &redis, process, system, policy, mix, clients, None, factory, &plan,
                    )
                    .await?;
                    report.push(row);
                }
            }
            if plan.open_loop {
                // Open loop at half the 64-caller closed-loop rate of each transport (and of the
                // naive sidecar, for comparison), with 64 callers.
                let open_loop = |s: &str| s.starts_with("sluice") || s == "naive sidecar";
                for (system, factory) in systems.iter().filter(|(s, _)| open_loop(s)) {
                    let clients = if plan.clients.contains(&64) {
                        64
                    } else {
                        plan.clients.iter().copied().max().unwrap_or(64)
                    };
                    let best = report.closed_rate(system, policy, &mix.name(), clients);
                    let process = if system == "naive sidecar" {
                        naive.pid()
                    } else {
                        daemon.pid()
                    };
                    let row = measure(
                        &redis,
                        Some(process),
                        system,
                        policy,
                        mix,
                        clients,
                        Some(best / 2.0),
                        factory,
                        &plan,
                    )
                    .await?;
                    report.push(row);
                }
            }
        }
    }
    if let Some(sink) = &sink {
        println!(
            "tracing: {} OTLP export requests reached the sink",
            sink.exports()
        );
    }
    drop((daemon, embedded, naive, traced, sink));
    if envoy::wanted(args.systems.as_deref()) && args.rate.is_none() {
        envoy::rows::run(&mut report, &redis, &args, &plan, &pinning).await?;
    }
    // Past saturation on one hot key with a real limit: bounded admission, no fail-open.
    let storm_clients = if args.quick { 64 } else { 256 };
    let whole = args.systems.is_none() && args.rate.is_none();
    let storms = whole || args.systems.iter().flatten().any(|s| s == "overload");
    let runs = [
        (overload::Storm::Hot, storm_clients),
        (overload::Storm::HotLocal, storm_clients),
        (overload::Storm::Wide, 1),
        (overload::Storm::Wide, 32),
    ];
    for (storm, clients) in runs.into_iter().filter(|_| storms) {
        report.overload.push(
            overload::measure(
                &redis,
                clients,
                args.daemon_threads,
                plan.duration * 2,
                storm,
            )
            .await?,
        );
    }
    drop(redis);
    if whole {
        report.memory = memory::measure(plan.keys)?;
    }
    // The fixed-rate rows are judged in their own table (against the 2 ms budget); the targets'
    // open-loop bound is for the runs at half the closed-loop maximum.
    let scored: Vec<Row> = report
        .rows
        .iter()
        .filter(|r| !r.offered_rate.is_some_and(|o| report.rates.contains(&o)))
        .cloned()
        .collect();
    report.targets = targets::compute(&scored);
    report
        .targets
        .extend(targets::envoy(&report.rows, report.rlqs_fleet.as_ref()));
    report.print();
    report.write_json(&args.json)?;
    println!("\nJSON report: {}", args.json.display());
    if let Some(fleet) = report.rlqs_fleet.as_ref().filter(|f| !f.exact()) {
        anyhow::bail!(
            "the RLQS fleet admitted {} where the limit allows {}",
            fleet.admitted,
            fleet.bound
        );
    }
    Ok(())
}

/// `--pin`: the load generator (this process) and Redis on the first CPU, what is measured on
/// the others.
struct Pinning {
    tested: Option<String>,
}

impl Pinning {
    fn new(on: bool) -> Result<Self> {
        if !on {
            return Ok(Self { tested: None });
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            anyhow::bail!("--pin needs at least 2 CPUs ({cpus} available)");
        }
        pin(std::process::id(), "0")?;
        Ok(Self {
            tested: Some(format!("1-{}", cpus - 1)),
        })
    }

    /// Pins a load-side process (Redis) with the load generator.
    fn generator(&self, pid: u32) -> Result<()> {
        match self.tested {
            Some(_) => pin(pid, "0"),
            None => Ok(()),
        }
    }

    /// Pins a process under test away from the load generator.
    fn tested(&self, pid: u32) -> Result<()> {
        match &self.tested {
            Some(cpus) => pin(pid, cpus),
            None => Ok(()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    redis: &Redis,
    process: Option<u32>,
    system: &str,
    policy: &str,
    mix: &KeyMix,
    clients: usize,
    rate: Option<f64>,
    factory: &Factory,
    plan: &Plan,
) -> Result<Row> {
    let stats_before = report::script_stats(&redis.url())?;
    let daemon_cpu = process.map(cpu_seconds);
    let redis_cpu = cpu_seconds(redis.pid());
    let waited = || cpu_wait_seconds(redis.pid()) + process.map_or(0.0, cpu_wait_seconds);
    let waited_before = waited();
    let process_waited_before = process.map(cpu_wait_seconds);
    let run: Run = match rate {
        None => load::closed(factory, clients, mix, plan.warmup, plan.duration).await?,
        Some(rate) => {
            let times = (plan.warmup, plan.duration);
            load::open(factory, clients, rate, mix, times, plan.from_due).await?
        }
    };
    let waited = waited() - waited_before;
    let process_waited = process
        .zip(process_waited_before)
        .map(|(pid, before)| cpu_wait_seconds(pid) - before);
    let stats_after = report::script_stats(&redis.url())?;
    let total_time = (plan.warmup + plan.duration).as_secs_f64() / plan.duration.as_secs_f64();
    // CPU over warm-up and measurement, attributed to the measured share of the checks.
    let checks_all = run.checks as f64 * total_time;
    let per_check = |cpu: f64| cpu / checks_all.max(1.0) * 1e6;
    let mut row = Row::new(
        system,
        policy,
        &mix.name(),
        clients,
        rate,
        &run,
        process
            .zip(daemon_cpu)
            .map(|(pid, before)| per_check(cpu_seconds(pid) - before)),
        per_check(cpu_seconds(redis.pid()) - redis_cpu),
        (
            stats_after.usec_per_call(&stats_before),
            checks_all / stats_after.calls_since(&stats_before).max(1.0),
        ),
        waited / (plan.warmup + plan.duration).as_secs_f64() * 100.0,
    );
    row.process_wait_percent =
        process_waited.map(|w| w / (plan.warmup + plan.duration).as_secs_f64() * 100.0);
    Ok(row)
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find(|w| w.starts_with("v="))
                .map(|w| w[2..].to_owned())
        })
        .unwrap_or_default();
    format!("{cores} cores, {cpu}, Redis {redis}")
}

/// `--hog`: threads spinning until dropped, each keeping one CPU busy.
struct Hog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hog {
    fn start(threads: usize) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut spin = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        spin = std::hint::black_box(spin.wrapping_add(1));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

//! The benchmark's report: one row per run, ratios to the baselines measured in the same run,
//! Redis memory per key, printed as a table and written as JSON for comparing runs.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::load::Run;
use super::memory::Footprint;
use super::overload::Overload;

/// Redis' own accounting of script calls (`INFO commandstats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptStats {
    calls: f64,
    usec: f64,
}

impl ScriptStats {
    /// Redis time per script call since `before`, in microseconds.
    pub fn usec_per_call(&self, before: &ScriptStats) -> f64 {
        let calls = self.calls - before.calls;
        if calls <= 0.0 {
            0.0
        } else {
            (self.usec - before.usec) / calls
        }
    }

    /// Script calls since `before`.
    pub fn calls_since(&self, before: &ScriptStats) -> f64 {
        self.calls - before.calls
    }
}

/// EVAL and EVALSHA calls and time so far.
pub fn script_stats(url: &str) -> Result<ScriptStats> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn)?;
    let mut stats = ScriptStats::default();
    for line in info.lines() {
        let Some(fields) = line
            .strip_prefix("cmdstat_evalsha:")
            .or_else(|| line.strip_prefix("cmdstat_eval:"))
        else {
            continue;
        };
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => stats.calls += v.parse::<f64>().unwrap_or(0.0),
                Some(("usec", v)) => stats.usec += v.parse::<f64>().unwrap_or(0.0),
                _ => {}
            }
        }
    }
    Ok(stats)
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `sluice tcp`, `sluice uds`, `raw EVALSHA`, `naive sidecar`, `naive script`, `embedded uds`.
    pub system: String,
    /// `tb`, `sl`, `fw`.
    pub algorithm: String,
    /// `hot key` or `zipf N`.
    pub keys: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Offered rate of an open-loop run.
    pub offered_rate: Option<f64>,
    /// Answers per second.
    pub rate: f64,
    /// Latency percentiles and maximum, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest.
    pub max_us: u64,
    /// Failed or wrong answers.
    pub errors: u64,
    /// CPU per check of the process answering (sluice or the naive sidecar), microseconds.
    pub daemon_cpu_us: Option<f64>,
    /// Redis CPU per check (the `redis-server` process' utime + stime / checks), microseconds.
    pub redis_cpu_us: f64,
    /// Redis' own time per script call (`INFO commandstats`), microseconds.
    pub redis_usec_per_call: f64,
    /// Checks per script call (sluice sends a batch as one call).
    pub checks_per_call: f64,
    /// Share of the run's time the answering process and Redis spent runnable but waiting for
    /// a CPU (`/proc/<pid>/task/*/schedstat`), percent: the machine's own contention, which a
    /// tail includes.
    pub cpu_wait_percent: f64,
    /// The answering process' own share of `cpu_wait_percent` (summed over its threads).
    pub process_wait_percent: Option<f64>,
    /// The through-Envoy rows: sluice's own CPU per request (Envoy's is `daemon_cpu_us`).
    pub sluice_cpu_us: Option<f64>,
    /// The RLQS rows: the share of the answers, in percent, that were Envoy's 429 for want of an
    /// assignment; counted in `rate`, neither in `errors` nor in the latencies (which are the
    /// admitted requests').
    pub denied_percent: Option<f64>,
}

impl Row {
    /// A row from a run.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        system: &str,
        algorithm: &str,
        keys: &str,
        clients: usize,
        offered_rate: Option<f64>,
        run: &Run,
        daemon_cpu_us: Option<f64>,
        redis_cpu_us: f64,
        (redis_usec_per_call, checks_per_call): (f64, f64),
        cpu_wait_percent: f64,
    ) -> Self {
        let q = |p: f64| run.latency.value_at_quantile(p);
        Self {
            system: system.into(),
            algorithm: algorithm.into(),
            keys: keys.into(),
            clients,
            offered_rate,
            rate: run.rate(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: run.latency.max(),
            errors: run.errors,
            daemon_cpu_us,
            redis_cpu_us,
            redis_usec_per_call,
            checks_per_call,
            cpu_wait_percent,
            process_wait_percent: None,
            sluice_cpu_us: None,
            denied_percent: None,
        }
    }
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: String,
    /// Every run.
    pub rows: Vec<Row>,
    /// Redis memory per key.
    pub memory: Vec<Footprint>,
    /// The overload runs (one hot key past saturation), without and with a local limit.
    pub overload: Vec<Overload>,
    /// The targets, computed from the rows.
    pub targets: Vec<super::targets::Target>,
    /// The RLQS fleet run of the through-Envoy rows (Envoys sharing a limit they reach).
    pub rlqs_fleet: Option<super::envoy::rlqs::Fleet>,
    /// What was asked for and not run, and why.
    pub notes: Vec<String>,
    /// The fixed rates of `--rate` (their rows are printed on their own, against the budget).
    pub rates: Vec<f64>,
}

impl Report {
    /// An empty report.
    pub fn new(machine: String) -> Self {
        Self {
            machine,
            rows: Vec::new(),
            memory: Vec::new(),
            overload: Vec::new(),
            targets: Vec::new(),
            rlqs_fleet: None,
            notes: Vec::new(),
            rates: Vec::new(),
        }
    }

    /// Adds a run and prints it as it comes.
    pub fn push(&mut self, row: Row) {
        eprintln!(
            "  {:<13} {:<3} {:<11} c={:<4} {:>9.0}/s p50 {:>6} us p99 {:>6} us{}",
            row.system,
            row.algorithm,
            row.keys,
            row.clients,
            row.rate,
            row.p50_us,
            row.p99_us,
            row.offered_rate
                .map_or(String::new(), |r| format!(" (open loop at {r:.0}/s)")),
        );
        self.rows.push(row);
    }

    /// The closed-loop rate of `system` on this algorithm and key mix with `clients` callers.
    pub fn closed_rate(&self, system: &str, algorithm: &str, keys: &str, clients: usize) -> f64 {
        self.rows
            .iter()
            .filter(|r| {
                r.system == system
                    && r.algorithm == algorithm
                    && r.keys == keys
                    && r.clients == clients
                    && r.offered_rate.is_none()
            })
            .map(|r| r.rate)
            .fold(0.0, f64::max)
    }

    /// The closed-loop row of `system` with the same algorithm, keys and clients as `row`.
    fn baseline(&self, row: &Row, system: &str) -> Option<&Row> {
        self.rows.iter().find(|r| {
            r.system == system
                && r.algorithm == row.algorithm
                && r.keys == row.keys
                && r.clients == row.clients
                && r.offered_rate.is_none()
        })
    }

    /// Prints the table: every row, and for sluice's closed-loop rows the ratios to the naive
    /// sidecar (throughput, daemon CPU) and to raw EVALSHA (throughput, Redis CPU per check).
    pub fn print(&self) {
        println!("\nsluice bench on {}\n", self.machine);
        println!(
            "| system | alg | keys | clients | mode | checks/s | p50 us | p99 us | p99.9 us | max us | vs naive sidecar | vs raw EVALSHA | daemon CPU us/check | CPU vs naive sidecar | Redis CPU us/check | Redis CPU vs raw | Redis us/call | checks/call | waited for a CPU |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let x = |ratio: Option<f64>| ratio.map_or("-".into(), |r| format!("{r:.2}x"));
        for row in &self.rows {
            let compared = row.system.starts_with("sluice") && row.offered_rate.is_none();
            let against = |system: &str, figure: fn(&Row) -> Option<f64>| {
                let base = self.baseline(row, system).filter(|_| compared)?;
                Some(figure(row)? / figure(base)?.max(1e-9))
            };
            let mode = row
                .offered_rate
                .map_or("closed".into(), |r| format!("open {r:.0}/s"));
            println!(
                "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.0}% |",
                row.system,
                row.algorithm,
                row.keys,
                row.clients,
                mode,
                row.rate,
                row.p50_us,
                row.p99_us,
                row.p999_us,
                row.max_us,
                x(against("naive sidecar", |r| Some(r.rate))),
                x(against("raw EVALSHA", |r| Some(r.rate))),
                row.daemon_cpu_us.map_or("-".into(), |c| format!("{c:.1}")),
                x(against("naive sidecar", |r| r.daemon_cpu_us)),
                row.redis_cpu_us,
                x(against("raw EVALSHA", |r| Some(r.redis_cpu_us))),
                row.redis_usec_per_call,
                row.checks_per_call,
                row.cpu_wait_percent,
            );
        }
        if !self.memory.is_empty() {
            println!("\n| Redis layout | keys | used_memory / key | MEMORY USAGE |");
            println!("|---|---|---|---|");
        }
        for f in &self.memory {
            println!(
                "| {} | {} | {:.0} B | {:.0} B |",
                f.layout, f.keys, f.used_memory_per_key, f.memory_usage
            );
        }
        for o in &self.overload {
            println!(
                "\nOverload ({}): {} clients on {} (token bucket 1000/min, burst 150, fail open, the default Redis deadline) for {:.1} s: {:.0} answers/s, {} enforced, {} fail_open, {} admitted (the limit allows at most {}), {} transport errors; Redis errors: {:?}; {:.0} answered by the local layer, {:.0} by the local limit, {:.0} checks reached Redis in {:.0} script calls ({:.4} calls per answer)",
                o.policy, o.clients, if o.policy == "wide" { "a fresh key per check" } else { "one key" }, o.seconds, o.rate, o.enforced, o.fail_open, o.admitted, o.bound, o.errors, o.redis_errors, o.local_layer_hits, o.local_limit_denied, o.reached_redis, o.redis_calls, o.calls_per_check
            );
        }
        self.print_envoy();
        super::rates::print(self);
        super::targets::print(&self.targets);
        for note in &self.notes {
            println!("\n{note}");
        }
        let errors: u64 = self.rows.iter().map(|r| r.errors).sum();
        println!("\n{errors} failed or wrong answers in all runs");
    }

    /// The "through Envoy" rows against the no-filter baseline of the same run and client
    /// count: what a check adds to each request as Envoy's users see it; then the RLQS fleet.
    fn print_envoy(&self) {
        let rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.system.starts_with("envoy"))
            .collect();
        if rows.is_empty() {
            return;
        }
        println!("\nThrough Envoy (one worker), against Envoy with no filter in the same run (RLQS rows: latencies of the admitted requests; denied: answered 429 by Envoy while it held no assignment):\n");
        println!("| system | connections | requests/s | vs no filter | denied | p50 us | p99 us | added p50 us | added p99 us | Envoy CPU us/request | sluice CPU us/request |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for row in rows {
            let base = self.baseline(row, "envoy");
            let added = |figure: fn(&Row) -> u64| {
                base.map_or("-".into(), |b| {
                    format!("{:+}", figure(row) as i64 - figure(b) as i64)
                })
            };
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.system,
                row.clients,
                row.rate,
                base.map_or("-".into(), |b| format!(
                    "{:.2}x",
                    row.rate / b.rate.max(1e-9)
                )),
                row.denied_percent
                    .map_or("-".into(), |d| format!("{d:.0}%")),
                row.p50_us,
                row.p99_us,
                added(|r| r.p50_us),
                added(|r| r.p99_us),
                row.daemon_cpu_us.map_or("-".into(), |c| format!("{c:.1}")),
                row.sluice_cpu_us.map_or("-".into(), |c| format!("{c:.1}")),
            );
        }
        if let Some(f) = &self.rlqs_fleet {
            println!(
                "\nRLQS fleet: {} Envoys on one bucket (fixed window of {} per hour, on Redis), {} requests in {:.1} s: {} admitted (at most {} allowed: {}), {} denied, {} failed; 95% of the limit was admitted after {}",
                f.envoys,
                f.limit,
                f.requests,
                f.seconds,
                f.admitted,
                f.bound,
                if f.exact() { "exact" } else { "OVER THE LIMIT" },
                f.denied,
                f.failed,
                f.reached_s.map_or("- (never)".into(), |s| format!("{s:.1} s")),
            );
        }
    }

    /// Writes the JSON report (creating its directory).
    pub fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}

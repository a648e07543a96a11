//! `sluice bench --systems leases`: quota leases (policies with `lease: true`) against the same
//! policies without, on the bench's own Redis. Throughput rows (a hot key and a Zipf mix, token
//! bucket and fixed window, 1/4/64 callers, interleaved and repeated) report Redis script calls,
//! Redis CPU and daemon CPU per check, checks/s and p50/p99, next to the no-op HTTP floor (an axum
//! server that parses the check body and answers without a limiter). Exactness rows run limits
//! the load exceeds, on one daemon and on a fleet of daemons sharing one Redis, and print FAIL
//! if ever more than the limit was admitted, then the under-admission once leases are given back.
//! Over-the-limit rows put a hot key's demand at twice its rate on two daemons and count Redis
//! calls per check with and without leases.

mod exact;
mod over;
mod rows;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;

use super::load::{CallFuture, Client, Factory};
use super::procs::free_addr;
use super::Plan;
use sluice::client::{Connection, Target};

/// Options of the lease rows (`--systems leases`).
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// `[leases]` settings to compare, as TOML lines joined by `;`, variants split by `|`
    /// (e.g. `span="1s"|span="200ms";max_units=100000`; default: the daemon's defaults).
    #[arg(long, value_delimiter = '|')]
    lease_settings: Option<Vec<String>>,
    /// Repetitions of every lease row, interleaved (default 3; quick: 1).
    #[arg(long)]
    lease_runs: Option<usize>,
    /// Daemons sharing one Redis in the fleet rows.
    #[arg(long, default_value_t = 6)]
    lease_fleet: usize,
    /// The limit of the exactness rows (per hour: the load exceeds it within the run).
    #[arg(long, default_value_t = 5_000)]
    lease_limit: u64,
    /// Only the exactness and fleet rows (no throughput rows).
    #[arg(long)]
    lease_exact_only: bool,
    /// Only the over-the-limit rows (a hot key at twice its rate on two daemons).
    #[arg(long)]
    lease_over_only: bool,
}

/// Whether `--systems` asks for the lease rows.
pub fn wanted(systems: Option<&Vec<String>>) -> bool {
    systems.is_some_and(|names| names.iter().any(|name| name == "leases"))
}

/// Runs the lease rows and prints them. Returns whether every exactness row held.
pub async fn bench(args: &LeaseArgs, plan: &Plan, threads: usize, quick: bool) -> Result<bool> {
    let variants = args
        .lease_settings
        .clone()
        .unwrap_or_else(|| vec![String::new()]);
    let runs = args.lease_runs.unwrap_or(if quick { 1 } else { 3 });
    if args.lease_over_only {
        return over::all(&variants, runs, threads).await;
    }
    if !args.lease_exact_only {
        rows::throughput(plan, &variants, runs, threads).await?;
    }
    let exact = exact::all(args, plan, &variants, runs, threads).await?;
    let over = over::all(&variants, runs, threads).await?;
    Ok(exact && over)
}

/// What the clients of one run saw, over warm-up and measurement.
#[derive(Default)]
pub struct Tally {
    /// 200 answers.
    pub admitted: AtomicU64,
    /// Every answer (200, 429 and others).
    pub answers: AtomicU64,
}

impl Tally {
    fn get(&self) -> (u64, u64) {
        (
            self.admitted.load(Ordering::Relaxed),
            self.answers.load(Ordering::Relaxed),
        )
    }
}

struct Checker {
    conn: Connection,
    bodies: Arc<Vec<Bytes>>,
    tally: Arc<Tally>,
}

impl Client for Checker {
    fn call(&mut self, key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let body = self.bodies[key % self.bodies.len()].clone();
            let reply = self.conn.post_bytes("/v1/check", body).await?;
            let status = reply.status.as_u16();
            self.tally.answers.fetch_add(1, Ordering::Relaxed);
            self.tally
                .admitted
                .fetch_add(u64::from(status == 200), Ordering::Relaxed);
            Ok(matches!(status, 200 | 429))
        })
    }
}

/// Clients checking `policy` for keys `{tag}-0..keys`, spread over `targets` in turn, counted
/// in `tally`.
pub fn checkers(
    targets: Vec<Target>,
    policy: &str,
    tag: &str,
    keys: usize,
    tally: Arc<Tally>,
) -> Factory {
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..keys.max(1))
            .map(|k| {
                Bytes::from(format!(
                    r#"{{"policy":"{policy}","descriptors":{{"k":"{tag}-{k}"}}}}"#
                ))
            })
            .collect(),
    );
    let targets = Arc::new(targets);
    let next = Arc::new(AtomicU64::new(0));
    Arc::new(move || {
        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
        let target = targets[i % targets.len()].clone();
        let (bodies, tally) = (Arc::clone(&bodies), Arc::clone(&tally));
        Box::pin(async move {
            let conn = Connection::open(&target).await?;
            Ok(Box::new(Checker {
                conn,
                bodies,
                tally,
            }) as Box<dyn Client>)
        })
    })
}

/// The `[leases]` table of a variant (`;`-separated TOML lines).
pub fn section(variant: &str) -> String {
    format!("[leases]\n{}\n", variant.replace(';', "\n"))
}

/// The no-op HTTP floor: `sluice bench-naive-sidecar --noop` in its own process, killed on drop.
pub struct Floor {
    child: Child,
    /// Its TCP address.
    pub http: SocketAddr,
}

impl Floor {
    /// Starts it with `threads` workers and waits until it accepts.
    pub fn start(threads: usize) -> Result<Self> {
        let http = free_addr()?;
        let exe = std::env::current_exe().context("locating this executable")?;
        let child = Command::new(exe)
            .arg("bench-naive-sidecar")
            .args(["--redis", "redis://unused", "--listen", &http.to_string()])
            .args(["--threads", &threads.to_string(), "--noop"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the no-op floor")?;
        let floor = Self { child, http };
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(http).is_err() {
            anyhow::ensure!(
                started.elapsed().as_secs() < 20,
                "the no-op floor did not come up"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(floor)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor's handler: parses the check body as the naive sidecar does and answers a fixed
/// decision, so that it costs what HTTP, axum and JSON cost and nothing else.
pub async fn serve_floor(listen: SocketAddr) -> Result<()> {
    use axum::routing::post;
    async fn check(
        axum::Json(body): axum::Json<serde_json::Value>,
    ) -> axum::Json<serde_json::Value> {
        let policy = body.get("policy").cloned().unwrap_or_default();
        axum::Json(serde_json::json!({"allowed": true, "policy": policy, "remaining": 1}))
    }
    let router = axum::Router::new().route("/v1/check", post(check));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, router).await?;
    Ok(())
}

/// `lo-hi` of `values` with `digits` decimals (one value: itself).
pub fn range(values: &[f64], digits: usize) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        "-".into()
    } else if format!("{lo:.digits$}") == format!("{hi:.digits$}") {
        format!("{lo:.digits$}")
    } else {
        format!("{lo:.digits$}-{hi:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::{range, section, wanted};

    #[test]
    fn ranges_span_the_runs_and_collapse_when_equal() {
        assert_eq!(range(&[3.0, 1.25, 2.0], 1), "1.2-3.0");
        assert_eq!(range(&[0.00031, 0.00034], 3), "0.000");
        assert_eq!(range(&[5.0], 0), "5");
        assert_eq!(range(&[], 2), "-");
    }

    #[test]
    fn a_variant_becomes_a_leases_table_and_only_the_name_leases_asks_for_the_rows() {
        assert_eq!(
            section("span=\"1s\";min_units=64"),
            "[leases]\nspan=\"1s\"\nmin_units=64\n"
        );
        assert!(wanted(Some(&vec!["tcp".into(), "leases".into()])));
        assert!(!wanted(Some(&vec!["lease".into()])));
        assert!(!wanted(None));
    }
}

//! The processes a benchmark runs: a `redis-server` and the daemon (this very binary, as
//! `sluice serve`), each on free loopback ports in its own temporary directory, stopped on drop;
//! and their CPU time, read from `/proc`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new empty directory under the system temporary directory.
    pub fn new(label: &str) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "sluice-bench-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port free right now.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while !ready() {
        if started.elapsed() > Duration::from_secs(20) {
            bail!("{what} did not come up within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A child process killed on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `redis-server` for the benchmark.
pub struct Redis {
    child: Guard,
    /// Its port.
    pub port: u16,
    _dir: Scratch,
}

impl Redis {
    /// Starts one (no persistence) and waits until it answers.
    pub fn start() -> Result<Self> {
        let dir = Scratch::new("redis")?;
        let port = free_addr()?.port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (is it installed?)")?;
        let redis = Self {
            child: Guard(child),
            port,
            _dir: dir,
        };
        let url = redis.url();
        wait_until("redis-server", || {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        })?;
        Ok(redis)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// The daemon under test.
pub struct Daemon {
    child: Guard,
    /// The check API over TCP.
    pub http: SocketAddr,
    /// The check API's Unix socket.
    pub socket: PathBuf,
    /// The admin listener.
    pub admin: SocketAddr,
    /// Envoy's rate limit service (gRPC).
    pub grpc: SocketAddr,
    /// Envoy's rate limit service over a Unix socket.
    pub grpc_socket: PathBuf,
    _dir: Scratch,
}

impl Daemon {
    /// Starts `sluice serve` (this executable) with `policies`, against `redis_url` (or on the
    /// embedded store).
    pub fn start(
        redis_url: Option<&str>,
        policies: &str,
        threads: usize,
        extra_redis: &str,
    ) -> Result<Self> {
        Self::start_with(redis_url, policies, threads, extra_redis, true)
    }

    /// As [`Daemon::start`]; `bench_settings` false keeps the daemon's own deadline (5 ms) and
    /// local layer instead of the throughput runs' 1 s deadline without a local layer.
    pub fn start_with(
        redis_url: Option<&str>,
        policies: &str,
        threads: usize,
        extra_redis: &str,
        bench_settings: bool,
    ) -> Result<Self> {
        Self::start_full(
            redis_url,
            policies,
            threads,
            extra_redis,
            bench_settings,
            "",
        )
    }

    /// As [`Daemon::start`], with `sections` (TOML tables such as `[tracing]`) added. The free
    /// ports are picked before the daemon binds them, so another process may take one first: a
    /// daemon that exits before it is up is started again on fresh ports (three tries).
    pub fn start_full(
        redis_url: Option<&str>,
        policies: &str,
        threads: usize,
        extra_redis: &str,
        bench_settings: bool,
        sections: &str,
    ) -> Result<Self> {
        for attempt in 1..=3 {
            let started = Self::try_start(
                redis_url,
                policies,
                threads,
                extra_redis,
                bench_settings,
                sections,
            )?;
            if let Some(daemon) = started {
                return Ok(daemon);
            }
            eprintln!(
                "the daemon exited before it was up (a port taken meanwhile?): try {attempt} of 3"
            );
        }
        bail!("the daemon exited before it was up, three times")
    }

    /// One start: `None` when the daemon exited before it was up.
    fn try_start(
        redis_url: Option<&str>,
        policies: &str,
        threads: usize,
        extra_redis: &str,
        bench_settings: bool,
        sections: &str,
    ) -> Result<Option<Self>> {
        let dir = Scratch::new("daemon")?;
        let (http, admin, grpc) = (free_addr()?, free_addr()?, free_addr()?);
        let socket = dir.0.join("sluice.sock");
        let grpc_socket = dir.0.join("rls.sock");
        let policy_file = dir.0.join("policies.yaml");
        std::fs::write(&policy_file, policies)?;
        let settings = dir.0.join("sluice.toml");
        std::fs::write(
            &settings,
            format!(
                "policies = {policy_file:?}\nworker_threads = {threads}\n[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\nsocket = {socket:?}\ngrpc = \"{grpc}\"\ngrpc_socket = {grpc_socket:?}\n\
                 [redis]\n{redis}{extra_redis}{bench}[log]\nlevel = \"warn\"\n{sections}",
                redis = redis_url.map_or(String::new(), |url| format!("url = \"{url}\"\n")),
                bench = if bench_settings {
                    "timeout = \"1s\"\n[local_layer]\nenabled = false\n"
                } else {
                    ""
                },
            ),
        )?;
        let exe = std::env::current_exe().context("locating this executable")?;
        let child = Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(&settings)
            .current_dir(&dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the daemon")?;
        let mut daemon = Self {
            child: Guard(child),
            http,
            socket,
            admin,
            grpc,
            grpc_socket,
            _dir: dir,
        };
        let mut exited = false;
        wait_until("the daemon's Redis connection", || {
            exited = matches!(daemon.child.0.try_wait(), Ok(Some(_)));
            exited || daemon.redis_healthy()
        })?;
        Ok((!exited).then_some(daemon))
    }

    fn redis_healthy(&self) -> bool {
        let Ok(mut stream) = std::net::TcpStream::connect(self.admin) else {
            return false;
        };
        use std::io::{Read, Write};
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream
            .write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        let embedded =
            response.contains("\"store\":\"memory\"") && response.contains("\"ready\":true");
        embedded
            || response.contains("\"redis\":\"healthy\"")
            || response.contains("\"redis\":\"half_open\"")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// The naive-sidecar baseline (this very binary, as `sluice bench-naive-sidecar`).
pub struct NaiveSidecar {
    child: Guard,
    /// Its TCP address.
    pub http: SocketAddr,
}

impl NaiveSidecar {
    /// Starts it against `redis_url` with `threads` workers and waits until it accepts.
    pub fn start(redis_url: &str, threads: usize) -> Result<Self> {
        let http = free_addr()?;
        let exe = std::env::current_exe().context("locating this executable")?;
        let child = Command::new(exe)
            .arg("bench-naive-sidecar")
            .args(["--redis", redis_url, "--listen", &http.to_string()])
            .args(["--threads", &threads.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the naive sidecar")?;
        let sidecar = Self {
            child: Guard(child),
            http,
        };
        wait_until("the naive sidecar", || {
            std::net::TcpStream::connect(http).is_ok()
        })?;
        Ok(sidecar)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// CPU time (user + system) a process has used, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
    else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// Seconds the threads of process `pid` have spent runnable but waiting for a CPU (the second
/// field of each thread's `/proc/<pid>/task/<tid>/schedstat`); 0 when unknown.
pub fn cpu_wait_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().nth(1)?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Pins process `pid`, every thread of it (and so the threads it starts later), to `cpus` (a
/// `taskset` list such as `0` or `1-3`).
pub fn pin(pid: u32, cpus: &str) -> Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .context("running taskset (util-linux) for --pin")?;
    if !status.success() {
        bail!("taskset could not pin process {pid} to CPUs {cpus}");
    }
    Ok(())
}

//! A real `sluice serve` process for an attack: its own ports and temp dir, its RSS read from
//! `/proc`, and a well-behaved client that keeps asking (gRPC and `/v1/check`) while the
//! attack runs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::raw::{Conn, Outcome, OK};

/// Longest the daemon may take to start.
const START: Duration = Duration::from_secs(30);

/// A `sluice serve` child process, killed on drop.
pub struct Daemon {
    child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Daemon {
    /// Starts the daemon with the shipped policies, gRPC on TCP, and `extra` settings lines
    /// (TOML, under `[limits]`).
    pub fn start(limits: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (http, admin, grpc) = (free_port(), free_port(), free_port());
        let policies = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/policies.yaml");
        let config = dir.path().join("sluice.toml");
        std::fs::write(
            &config,
            format!(
                "policies = {policies:?}\n\
                 [listen]\nhttp = \"127.0.0.1:{http}\"\nadmin = \"127.0.0.1:{admin}\"\n\
                 grpc = \"127.0.0.1:{grpc}\"\nsocket = {socket:?}\n\
                 [limits]\n{limits}\n",
                socket = dir.path().join("sluice.sock"),
            ),
        )
        .expect("settings written");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .args(["serve", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", "warn");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLUICE_") {
                command.env_remove(&name);
            }
        }
        let child = command.spawn().expect("sluice serve starts");
        let daemon = Self {
            child,
            grpc: ([127, 0, 0, 1], grpc).into(),
            http: ([127, 0, 0, 1], http).into(),
            admin: ([127, 0, 0, 1], admin).into(),
            _dir: dir,
        };
        let by = Instant::now() + START;
        while Instant::now() < by {
            if http_get(daemon.admin, "/livez").is_some_and(|(status, _)| status == 200)
                && TcpStream::connect(daemon.grpc).is_ok()
            {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the daemon did not start within {START:?}");
    }

    /// The daemon's resident set, in bytes.
    pub fn rss(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/<pid>/status");
        let kib: usize = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("VmRSS");
        kib * 1024
    }

    /// One metric's value (the first series whose line starts with `series`).
    pub fn metric(&self, series: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics").expect("/metrics answered");
        body.lines()
            .find_map(|line| line.strip_prefix(series))
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request over HTTP/1.1 on a fresh connection, every read and write bounded in time: the
/// status and body, or `None` when it could not be done.
fn http_request(addr: SocketAddr, head: &str, body: &str) -> Option<(u16, String)> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    tcp.set_write_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        tcp,
        "{head} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = Vec::new();
    tcp.take(1 << 20).read_to_end(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_request(addr, &format!("GET {path}"), "")
}

/// What the well-behaved client saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub grpc: Vec<Duration>,
    pub http: Vec<Duration>,
    /// Calls that got no answer (an error, a timeout, anything but an OK answer or a 200).
    pub failed: Vec<String>,
}

impl Seen {
    fn summary(times: &[Duration]) -> String {
        let mut sorted = times.to_vec();
        sorted.sort();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        format!(
            "{} calls, p50 {:?}, p99 {:?}, max {:?}",
            sorted.len(),
            at(0.5),
            at(0.99),
            sorted.last().copied().unwrap_or_default()
        )
    }

    /// Every call answered, and at least `min` of each kind made.
    pub fn assert_served(&self, min: usize) {
        eprintln!(
            "well-behaved client: gRPC {}; /v1/check {}",
            Self::summary(&self.grpc),
            Self::summary(&self.http)
        );
        assert!(self.failed.is_empty(), "unanswered: {:?}", self.failed);
        assert!(
            self.grpc.len() >= min && self.http.len() >= min,
            "too few calls made: {} gRPC, {} HTTP",
            self.grpc.len(),
            self.http.len()
        );
    }
}

/// A client asking over gRPC (one connection, kept) and `/v1/check` every 50 ms until stopped
/// (at most 2,000 rounds).
pub struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
}

impl Monitor {
    pub async fn start(daemon: &Daemon) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (grpc, http) = (daemon.grpc, daemon.http);
        let mut conn = Conn::open(grpc).await;
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Seen::default();
            for round in 0..2_000 {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let started = Instant::now();
                match tokio::time::timeout(Duration::from_secs(10), conn.check()).await {
                    Ok(Outcome::Code(OK)) => seen.grpc.push(started.elapsed()),
                    other => seen.failed.push(format!("gRPC round {round}: {other:?}")),
                }
                let started = Instant::now();
                let body =
                    format!(r#"{{"descriptors":{{"tenant":"monitor","api_key":"m{round}"}}}}"#);
                let answer = tokio::task::spawn_blocking(move || {
                    http_request(http, "POST /v1/check", &body)
                })
                .await
                .expect("joined");
                match answer {
                    Some((200, _)) => seen.http.push(started.elapsed()),
                    other => seen.failed.push(format!("HTTP round {round}: {other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the monitor ends")
            .expect("joined")
    }
}

/// The highest RSS seen while `attack` runs (sampled every 20 ms).
pub async fn peak_rss<T>(
    daemon: &Daemon,
    attack: impl std::future::Future<Output = T>,
) -> (usize, T) {
    tokio::pin!(attack);
    let mut peak = daemon.rss();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            out = &mut attack => return (peak.max(daemon.rss()), out),
            _ = tick.tick() => peak = peak.max(daemon.rss()),
        }
    }
}

pub const MIB: usize = 1024 * 1024;

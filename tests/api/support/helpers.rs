//! A real daemon on loopback and a temporary Unix socket, with a manual clock, plus small helpers
//! to ask it things and to run the real binary with a time limit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::{json, Value};
use sluice::app::App;
use sluice::client::{self, Connection, Reply, Target};
use sluice::clock::ManualClock;
use sluice::config::{parse_policies, HumanDuration, Settings};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The policies shipped in `config/policies.yaml`.
pub const SHIPPED_POLICIES: &str = include_str!("../../../config/policies.yaml");

/// Where the manual clock starts: an ordinary epoch instant (2023-11-14), in microseconds.
pub const START_US: u64 = 1_700_000_000_000_000;

/// One second, in microseconds (the clock's unit).
pub const SEC_US: u64 = 1_000_000;

/// Longest a test waits for the daemon to stop or a process to exit.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The rate-limit headers a check answer may carry.
pub const RATE_LIMIT_HEADERS: [&str; 6] = [
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

/// A daemon serving in this test's runtime.
pub struct TestApp {
    /// The check API over TCP.
    pub tcp: Target,
    /// The check API over the Unix socket.
    pub uds: Target,
    /// The admin listener.
    pub admin: SocketAddr,
    /// The daemon's clock; advance it instead of sleeping.
    pub clock: Arc<ManualClock>,
    /// Resolves the daemon's shutdown future when sent (or dropped).
    pub shutdown: Option<oneshot::Sender<()>>,
    /// The task running `App::run`.
    pub handle: JoinHandle<()>,
    /// Holds the socket directory.
    pub dir: TempDir,
}

/// Settings for a test daemon: every listener on loopback port 0 / in `dir`.
pub fn test_settings(dir: &Path) -> Settings {
    let mut settings = Settings::default();
    settings.listen.http = "127.0.0.1:0".into();
    settings.listen.admin = "127.0.0.1:0".into();
    settings.listen.socket = Some(dir.join("sluice.sock"));
    settings.policies = dir.join("unused-policies.yaml");
    settings.shutdown_grace = HumanDuration(5 * SEC_US);
    settings
}

/// A daemon enforcing the shipped policies.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(SHIPPED_POLICIES).await
}

/// A daemon enforcing the policies in `policies_yaml`.
pub async fn spawn_app_with(policies_yaml: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = test_settings(dir.path());
    spawn_app_in(dir, settings, policies_yaml).await
}

/// A daemon with the given settings (its socket, if any, should live in `dir`).
pub async fn spawn_app_in(dir: TempDir, settings: Settings, policies_yaml: &str) -> TestApp {
    let policies =
        parse_policies(Path::new("test-policies.yaml"), policies_yaml).expect("valid policies");
    let clock = Arc::new(ManualClock::new(START_US));
    let app = App::build_with(&settings, policies, clock.clone())
        .await
        .expect("daemon builds");
    run_app(app, clock, dir)
}

/// A daemon built like `sluice serve` builds it: policies read from `settings.policies` (and the
/// file watched), on the system clock (the returned `clock` is not the daemon's).
pub async fn spawn_served(dir: TempDir, settings: Settings) -> TestApp {
    let app = App::build(&settings).await.expect("daemon builds");
    run_app(app, Arc::new(ManualClock::new(START_US)), dir)
}

/// Runs a built daemon in this test's runtime until the [`TestApp`] stops or is dropped.
pub fn run_app(app: App, clock: Arc<ManualClock>, dir: TempDir) -> TestApp {
    let tcp = Target::Tcp(app.http_addr().expect("TCP listener enabled"));
    let uds = Target::Unix(
        app.socket_path()
            .expect("Unix socket enabled")
            .to_path_buf(),
    );
    let admin = app.admin_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    TestApp {
        tcp,
        uds,
        admin,
        clock,
        shutdown: Some(tx),
        handle,
        dir,
    }
}

impl TestApp {
    /// The Unix socket's path.
    pub fn socket_path(&self) -> PathBuf {
        match &self.uds {
            Target::Unix(path) => path.clone(),
            Target::Tcp(_) => unreachable!("uds is a Unix target"),
        }
    }

    /// `POST /v1/check` with `body` on `target`, on a new connection.
    pub async fn check(&self, target: &Target, body: &Value) -> Reply {
        post(target, "/v1/check", body.to_string().into_bytes()).await
    }

    /// `POST /v1/check` over TCP.
    pub async fn check_tcp(&self, body: &Value) -> Reply {
        self.check(&self.tcp, body).await
    }

    /// `POST /v1/check/batch` with `{"checks": checks}` over TCP.
    pub async fn batch(&self, checks: &[Value]) -> Reply {
        let body = json!({ "checks": checks });
        post(&self.tcp, "/v1/check/batch", body.to_string().into_bytes()).await
    }

    /// A dry run of `body` over TCP: what a real check would see now, spending nothing.
    pub async fn dry_run(&self, body: &Value) -> Reply {
        let mut body = body.clone();
        body["dry_run"] = Value::Bool(true);
        self.check_tcp(&body).await
    }

    /// `GET path` on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Reply {
        get(&Target::Tcp(self.admin), path).await
    }

    /// The admin `/metrics` text.
    pub async fn metrics(&self) -> String {
        let reply = self.admin_get("/metrics").await;
        assert_eq!(reply.status, 200, "/metrics");
        String::from_utf8(reply.body.to_vec()).expect("metrics are UTF-8")
    }

    /// Waits (bounded) until the reloader has looked at its policy file `more` more times than
    /// it had when called (`sluice_policy_file_polls_total`): with `more` of 2 or above, at least
    /// one whole look began after the call, so whatever the file held then has been seen.
    pub async fn wait_policy_polls(&self, more: f64) {
        let polls = |metrics: &str| metric_value(metrics, "sluice_policy_file_polls_total", &[]);
        let from = polls(&self.metrics().await);
        crate::wait::eventually(&format!("{more} more looks at the policy file"), || async {
            polls(&self.metrics().await) >= from + more
        })
        .await;
    }

    /// Moves the daemon's clock forward.
    pub fn advance(&self, us: u64) {
        self.clock.advance(us);
    }

    /// Resolves the shutdown future and waits (bounded) for `run` to return.
    pub async fn stop(&mut self) {
        self.trigger_shutdown();
        tokio::time::timeout(STOP_TIMEOUT, &mut self.handle)
            .await
            .expect("run returns within the timeout")
            .expect("run task did not panic");
    }

    /// Resolves the shutdown future without waiting.
    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.trigger_shutdown();
        self.handle.abort();
    }
}

/// POSTs raw bytes on a new connection.
pub async fn post(target: &Target, path: &str, body: Vec<u8>) -> Reply {
    client::request(target, Method::POST, path, Some(body))
        .await
        .unwrap_or_else(|e| panic!("POST {path} on {target}: {e}"))
}

/// GETs on a new connection.
pub async fn get(target: &Target, path: &str) -> Reply {
    client::request(target, Method::GET, path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path} on {target}: {e}"))
}

/// A keep-alive connection for long sequences of checks.
pub async fn connect(target: &Target) -> Connection {
    Connection::open(target)
        .await
        .unwrap_or_else(|e| panic!("connect {target}: {e}"))
}

/// POSTs `body` to `/v1/check` on an open connection.
pub async fn check_on(conn: &mut Connection, body: &Value) -> Reply {
    conn.post_json("/v1/check", body)
        .await
        .expect("check exchange")
}

/// The body of a reply as JSON, failing loudly when it is not.
pub fn json_of(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): {}",
            String::from_utf8_lossy(&reply.body)
        )
    })
}

/// A header's value, failing loudly when absent.
pub fn header<'a>(reply: &'a Reply, name: &str) -> &'a str {
    reply
        .header(name)
        .unwrap_or_else(|| panic!("header {name} missing; headers: {:?}", reply.headers))
}

/// Asserts a 4xx/5xx JSON error body with this status and `error` code; returns the `reason`.
pub fn assert_error(reply: &Reply, status: u16, code: &str) -> String {
    assert_eq!(
        reply.status.as_u16(),
        status,
        "status; body: {}",
        String::from_utf8_lossy(&reply.body)
    );
    let content_type = reply.header("content-type").unwrap_or("");
    assert!(
        content_type.starts_with("application/json"),
        "error content-type {content_type:?}"
    );
    let body = json_of(reply);
    assert_eq!(body["error"], code, "error code; body: {body}");
    let reason = body["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("`reason` is a string; body: {body}"));
    assert!(!reason.is_empty(), "`reason` is not empty");
    reason.to_owned()
}

/// `remaining` of a reply's JSON body.
pub fn remaining(reply: &Reply) -> u64 {
    json_of(reply)["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("remaining is a number: {}", json_of(reply)))
}

/// The sum of the samples of `metric` whose labels include every `labels` pair (label order
/// in the text does not matter); 0 when there is none.
pub fn metric_value(metrics: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let (labels_text, value) = match rest.strip_prefix('{') {
                Some(inner) => inner.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let all = labels
                .iter()
                .all(|(k, v)| labels_text.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.trim().parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// The binary under test.
pub fn sluice_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

/// The repository root (where `config/` is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's documentation: README.md, then every `docs/*.md` in name order.
pub fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// A `sluice` command with no inherited `SLUICE_*` variables, run in `cwd`.
pub fn sluice_command(cwd: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(sluice_bin());
    command.args(args).current_dir(cwd);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLUICE_") {
            command.env_remove(&name);
        }
    }
    command.env_remove("RUST_LOG");
    command
}

/// A child process that is killed (and reaped) when dropped.
pub struct ChildGuard(pub Option<Child>);

/// A child started as the leader of a process group of its own, the whole group killed (and the
/// leader reaped) when dropped: for programs that fork workers (nginx), whose workers would
/// outlive a leader killed alone.
#[allow(dead_code, reason = "only the deploy binary uses it")]
pub struct GroupGuard(ChildGuard);

#[allow(dead_code, reason = "only the deploy binary uses it")]
impl GroupGuard {
    /// Spawns `command` in a new process group.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let child = command.process_group(0).spawn()?;
        Ok(Self(ChildGuard(Some(child))))
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let leader = self.0 .0.as_ref().map(Child::id);
        let group = leader.and_then(|id| rustix::process::Pid::from_raw(i32::try_from(id).ok()?));
        if let Some(group) = group {
            // The leader is still unreaped here, so the group id is not reused yet.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        // The leader is reaped by the inner guard.
    }
}

impl ChildGuard {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Waits at most `timeout` for the process to exit, polling; `None` if it is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.0.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.0 = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `command` to completion with output captured in files (no pipe can fill up), killing it
/// if it runs longer than [`STOP_TIMEOUT`]. Blocking: call from `spawn_blocking` in async tests.
pub fn run(mut command: Command) -> Outcome {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out_path = out_dir.path().join("stdout");
    let err_path = out_dir.path().join("stderr");
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut guard = ChildGuard(Some(command.spawn().expect("spawn sluice")));
    let status = guard
        .wait_timeout(STOP_TIMEOUT)
        .unwrap_or_else(|| panic!("{command:?} did not finish within {STOP_TIMEOUT:?}"));
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// [`run`] off the async runtime, so a daemon served by this runtime can answer the command.
pub async fn run_async(command: Command) -> Outcome {
    tokio::task::spawn_blocking(move || run(command))
        .await
        .expect("command runner did not panic")
}

/// Whether `bytes` hold a whole response with a Content-Length body.
pub fn is_complete(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    length.is_some_and(|length| body.len() >= length)
}

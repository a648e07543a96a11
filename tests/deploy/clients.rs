//! The client libraries in `clients/` (Python, Node.js, Go) run their own test suites
//! (`python3 -m unittest`, `node --test`, `go test`) against real daemons started here: the
//! daemon on the embedded store, or two daemons sharing one Redis; and, in both runs, a daemon
//! whose Redis is down (so a fail-closed policy answers 503). The addresses reach the suites in
//! `SLUICE_TEST_*` variables. The live daemons serve the shipped policies and `slots`, a
//! concurrency limit of one permit per `tenant` that only a release gives back within the run (its
//! `permit_ttl` is an hour): the middlewares' permit scenarios read it. Also: the CLI and the three example programs take one flag set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice::client::Target;

use crate::helpers::{
    repo_root, run_async, sluice_command, spawn_app, spawn_app_in, spawn_app_with, test_settings,
    ChildGuard, Outcome, TestApp, SHIPPED_POLICIES,
};
use crate::redis_server::free_port;
use crate::stores::{spawn_on_with, Store};
use crate::tools::{self, example};

/// How long one language's whole suite may take (Go compiles it first, on a cold cache).
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);

fn tcp_url(app: &TestApp) -> String {
    match &app.tcp {
        Target::Tcp(addr) => format!("http://{addr}"),
        Target::Unix(_) => unreachable!("tcp is a TCP target"),
    }
}

/// The shipped policies and `slots`: one request in flight per tenant, a permit held for an hour
/// unless released.
fn client_policies() -> String {
    format!(
        "{SHIPPED_POLICIES}\n  - {{name: slots, match: {{route: slots}}, key: [tenant], \
         algorithm: concurrency, limit: 1, permit_ttl: 1h, failure_mode: closed}}\n"
    )
}

/// A token that keeps this run's partitions apart from any other run's on a shared Redis.
fn run_token(store: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{store}{}x{nanos}", std::process::id())
}

/// Runs `command` to completion (at most [`SUITE_TIMEOUT`]), output captured in files.
pub fn run_long(mut command: Command) -> Outcome {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let (out_path, err_path) = (out_dir.path().join("out"), out_dir.path().join("err"));
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut guard = ChildGuard(Some(command.spawn().expect("spawn a test runner")));
    let status = guard
        .wait_timeout(SUITE_TIMEOUT)
        .unwrap_or_else(|| panic!("{command:?} did not finish within {SUITE_TIMEOUT:?}"));
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Settings for Go that need nothing outside `dir`: no module proxy, no toolchain download.
fn go_env(command: &mut Command, dir: &Path) {
    command
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPATH", dir.join("gopath"))
        .env("GOCACHE", dir.join("gocache"));
}

/// One language's suite: its program and arguments, run in `clients/<lang>`.
#[derive(Clone, Copy)]
enum Suite {
    Python,
    Node,
    Go,
}

impl Suite {
    fn tool(self) -> &'static str {
        match self {
            Self::Python => "python3",
            Self::Node => "node",
            Self::Go => "go",
        }
    }

    /// The names of the 429 scenario and of the shared-state scenario in the suite.
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::Python => (
                "test_login_is_denied_with_the_documented_429",
                "test_redis_state_is_shared_between_daemons",
            ),
            Self::Node => (
                "login is denied with the documented 429",
                "Redis state is shared between daemons",
            ),
            Self::Go => (
                "TestLoginIsDeniedWithTheDocumented429",
                "TestRedisStateIsSharedBetweenDaemons",
            ),
        }
    }

    /// The name shared by the scenarios through real servers (uvicorn and wsgiref; Express;
    /// net/http) and how many of them must pass: a client's address taken as docs/api.md says.
    fn real_servers(self) -> (&'static str, usize) {
        match self {
            Self::Python => ("test_real_server_", 4),
            Self::Node => ("real Express server:", 2),
            Self::Go => ("TestRealServer", 2),
        }
    }

    /// The name shared by the permit scenarios (a concurrency policy's permit released on every
    /// path of a request, through real servers, and the plain release call) and how many pass.
    fn permits(self) -> (&'static str, usize) {
        match self {
            Self::Python => ("test_permit_", 13),
            Self::Node => ("permit:", 13),
            Self::Go => ("TestPermit", 7),
        }
    }

    /// How many middlewares run each scenario (ASGI and WSGI; Express and fetch; net/http).
    fn middlewares(self) -> usize {
        match self {
            Self::Python | Self::Node => 2,
            Self::Go => 1,
        }
    }

    /// How many tests whose name holds `name` passed (not skipped), from the runner's output.
    fn passed(self, output: &str, name: &str) -> usize {
        output
            .lines()
            .map(str::trim)
            .filter(|line| line.contains(name))
            .filter(|line| match self {
                Self::Python => line.ends_with("... ok"),
                Self::Node => line.starts_with("ok ") && !line.contains("# SKIP"),
                Self::Go => line.starts_with("--- PASS:"),
            })
            .count()
    }

    fn command(self, scratch: &Path) -> Command {
        let (dir, args): (&str, &[&str]) = match self {
            Self::Python => (
                "python",
                &["-m", "unittest", "discover", "-s", "tests", "-v"],
            ),
            Self::Node => ("node", &["--test", "test/"]),
            Self::Go => ("go", &["test", "-count=1", "-v", "./..."]),
        };
        let mut command = example(self.tool(), args);
        command.current_dir(repo_root().join("clients").join(dir));
        if let Self::Go = self {
            go_env(&mut command, scratch);
        }
        command
    }
}

/// A daemon whose Redis never answers: `login` (fail closed) answers 503, `public_api` fails open.
async fn daemon_with_redis_down() -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(format!("redis://127.0.0.1:{}", free_port()));
    spawn_app_in(dir, settings, SHIPPED_POLICIES).await
}

/// A daemon (embedded store) whose policy `llm` takes reservations (1000 per 365 days, so no
/// window ends under a suite), beside a concurrency policy `slots` of one slot.
async fn daemon_with_reservations() -> TestApp {
    spawn_app_with(
        "policies:\n  - {name: llm, key: [tenant], algorithm: fixed_window, limit: 1000, period: 365d, reservations: true, failure_mode: closed}\n  - {name: slots, key: [tenant], match: {route: both}, algorithm: concurrency, limit: 1, failure_mode: closed}\n",
    )
    .await
}

/// Runs `suite` against `a` (and `b`, a second daemon on the same Redis); fails with its output.
async fn run_suite(suite: Suite, store: &str, a: &TestApp, b: Option<&TestApp>) {
    let down = daemon_with_redis_down().await;
    let reserving = daemon_with_reservations().await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let mut command = suite.command(scratch.path());
    command
        .env("SLUICE_TEST_URL", tcp_url(a))
        .env("SLUICE_TEST_SOCKET", a.socket_path())
        .env("SLUICE_TEST_DOWN_URL", tcp_url(&down))
        .env("SLUICE_TEST_RESERVE_URL", tcp_url(&reserving))
        .env("SLUICE_TEST_STORE", store)
        .env("SLUICE_TEST_RUN", run_token(store));
    if let Some(b) = b {
        command.env("SLUICE_TEST_URL_B", tcp_url(b));
    }
    let out = tokio::task::spawn_blocking(move || run_long(command))
        .await
        .expect("join");
    assert_eq!(
        out.code,
        Some(0),
        "{} suite on {store}:\n{}\n{}",
        suite.tool(),
        out.stdout,
        out.stderr
    );
    // A suite that ran nothing would pass: insist that the middleware scenarios ran, and on
    // Redis the shared-state one (skipped on the embedded store).
    let all = format!("{}{}", out.stdout, out.stderr);
    let (denied, shared) = suite.markers();
    assert_eq!(
        suite.passed(&all, denied),
        suite.middlewares(),
        "{denied}: {all}"
    );
    let shared_runs = if b.is_some() { suite.middlewares() } else { 0 };
    assert_eq!(suite.passed(&all, shared), shared_runs, "{shared}: {all}");
    let (real, runs) = suite.real_servers();
    assert_eq!(suite.passed(&all, real), runs, "{real}: {all}");
    let (permits, runs) = suite.permits();
    assert_eq!(suite.passed(&all, permits), runs, "{permits}: {all}");
    // Reserve, then settle, through a real server (the Python ASGI helper so far).
    if let Suite::Python = suite {
        assert_eq!(
            suite.passed(&all, "test_reserve_"),
            5,
            "test_reserve_: {all}"
        );
    }
}

async fn on_memory(suite: Suite) {
    if !tools::required(suite.tool()) {
        return;
    }
    let app = spawn_app_with(&client_policies()).await;
    run_suite(suite, "memory", &app, None).await;
}

async fn on_redis(suite: Suite) {
    if !tools::required(suite.tool()) || !tools::required("redis-server") {
        return;
    }
    let store = Store::shared(crate::stores::Backend::Redis);
    let prefix = format!("clients-{}", run_token(suite.tool()));
    let policies = client_policies();
    let a = spawn_on_with(store.clone(), &policies, &prefix, |_| {}).await;
    let b = spawn_on_with(store, &policies, &prefix, |_| {}).await;
    run_suite(suite, "redis", &a, Some(&b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_suite_on_the_embedded_store() {
    on_memory(Suite::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_suite_on_redis() {
    on_redis(Suite::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client_suite_on_the_embedded_store() {
    on_memory(Suite::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_client_suite_on_redis() {
    on_redis(Suite::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_client_suite_on_the_embedded_store() {
    on_memory(Suite::Go).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_client_suite_on_redis() {
    on_redis(Suite::Go).await;
}

/// Builds examples/go into `dir` (standard library and clients/go only: no download).
pub async fn build_go_example(dir: &Path) -> PathBuf {
    let binary = dir.join("sluice-check");
    let mut build = Command::new("go");
    build
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(repo_root().join("examples/go"));
    go_env(&mut build, dir);
    let out = tokio::task::spawn_blocking(move || run_long(build))
        .await
        .expect("join");
    assert_eq!(out.code, Some(0), "go build examples/go: {out:?}");
    binary
}

/// `sluice check` and the three examples, given the same arguments, exit the same way: help 0,
/// allowed 0, bad usage 64 (with a message, never a trace), unreachable 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_every_example_take_one_flag_set() {
    let tools_here = ["python3", "node", "go"].map(tools::required);
    let app = spawn_app().await;
    let socket = app.socket_path().display().to_string();
    let url = tcp_url(&app);
    let missing = app.dir.path().join("missing.sock").display().to_string();
    let scratch = tempfile::tempdir().expect("tempdir");
    let mut programs: Vec<(String, Vec<String>)> = vec![(
        env!("CARGO_BIN_EXE_sluice").to_owned(),
        vec!["check".to_owned()],
    )];
    if tools_here[0] {
        programs.push(("python3".into(), vec!["examples/python/check.py".into()]));
    }
    if tools_here[1] {
        programs.push(("node".into(), vec!["examples/node/check.js".into()]));
    }
    if tools_here[2] {
        let binary = build_go_example(scratch.path()).await;
        programs.push((binary.display().to_string(), vec![]));
    }
    let url_eq = format!("--url={url}");
    let cases: Vec<(i32, Vec<&str>)> = vec![
        (0, vec!["-h"]),
        (0, vec!["--help"]),
        (0, vec!["-p", "login", "-d", "ip=IP", "--socket", &socket]),
        (
            0,
            vec!["--policy=login", "--descriptor=ip=IP", "--url", &url],
        ),
        (
            0,
            vec!["-p", "login", "-d", "ip=IP", "--http", &url, "--dry-run"],
        ),
        (
            0,
            vec![
                "-p", "login", "-d", "ip=IP", &url_eq, "--cost", "2", "--json",
            ],
        ),
        (64, vec!["--no-such-flag", "--url", &url]),
        (64, vec!["-d", "ip", "--url", &url]),
        (64, vec!["-p", "login", "-d", "ip=IP", "--url"]),
        (64, vec!["--url", &url, "-p"]),
        (
            64,
            vec!["-p", "login", "-d", "ip=IP", "--url", &url, "--cost", "x"],
        ),
        (
            64,
            vec!["-p", "login", "-d", "ip=IP", "--url", &url, "--cost", "0"],
        ),
        (
            64,
            vec![
                "-p", "login", "-d", "ip=IP", "--socket", &socket, "--url", &url,
            ],
        ),
        (
            64,
            vec![
                "-p",
                "login",
                "-d",
                "ip=IP",
                "--url",
                "https://127.0.0.1:7070",
            ],
        ),
        (
            64,
            vec!["-p", "login", "-d", "ip=IP", "--url", &url, "extra"],
        ),
        (64, vec!["-p", "nope", "-d", "ip=IP", "--url", &url]),
        (69, vec!["-p", "login", "-d", "ip=IP", "--socket", &missing]),
    ];
    for (n, (program, prefix)) in programs.iter().enumerate() {
        for (code, args) in &cases {
            // Each program spends from a partition of its own.
            let ip = format!("ip=192.0.2.{n}");
            let args: Vec<&str> = prefix
                .iter()
                .map(String::as_str)
                .chain(args.iter().map(|a| if *a == "ip=IP" { &ip } else { *a }))
                .collect();
            let out = if n == 0 {
                run_async(sluice_command(&repo_root(), &args)).await
            } else {
                run_async(example(program, &args)).await
            };
            assert_eq!(out.code, Some(*code), "{program} {args:?}: {out:?}");
            if *code == 64 {
                // Why: a usage error on stderr; the daemon's reason for a rejected check on
                // stderr (the examples) or with the answer on stdout (the CLI).
                let why = format!("{}{}", out.stdout, out.stderr);
                assert!(!why.trim().is_empty(), "{program} {args:?}: says why");
                assert!(
                    !out.stderr.contains("Traceback") && !out.stderr.contains("    at "),
                    "{program} {args:?}: {out:?}"
                );
            }
            if args.contains(&"-h") || args.contains(&"--help") {
                assert!(out.stdout.contains("--policy"), "{program} help: {out:?}");
            }
        }
    }
}

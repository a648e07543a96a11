//! Real `redis-server` processes for tests: a single node or a 3-primary Cluster, each on free
//! loopback ports in a temporary directory, killed on drop. Never touches a Redis on 6379.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server gets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A port that is free now, with its Cluster bus port (+10000) free too.
fn free_port() -> u16 {
    for _ in 0..200 {
        let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

fn spawn_server(dir: &TempDir, port: u16, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (install redis-server)")
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < START_TIMEOUT, "{what} did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ping(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

/// One `redis-server`.
pub struct RedisServer {
    child: Child,
    /// Its port.
    pub port: u16,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let child = spawn_server(&dir, port, &[]);
        wait_until("redis-server", || ping(port));
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A synchronous connection, for inspecting state.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to test redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three primaries, no replicas.
pub struct RedisCluster {
    children: Vec<Child>,
    /// The nodes' ports.
    pub ports: Vec<u16>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, creates the cluster, waits for `cluster_state:ok`.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 3 {
            let port = free_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let children: Vec<Child> = ports
            .iter()
            .map(|port| {
                let conf = format!("nodes-{port}.conf");
                spawn_server(
                    &dir,
                    *port,
                    &["--cluster-enabled", "yes", "--cluster-config-file", &conf],
                )
            })
            .collect();
        let cluster = Self {
            children,
            ports: ports.clone(),
            _dir: dir,
        };
        for port in &ports {
            wait_until("cluster node", || ping(*port));
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs (install redis-tools)");
        assert!(status.success(), "redis-cli --cluster create failed");
        for port in &ports {
            wait_until("cluster_state:ok", || cluster_ok(*port));
        }
        cluster
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// A synchronous connection to each node, for inspecting state.
    pub fn connections(&self) -> Vec<redis::Connection> {
        self.ports
            .iter()
            .map(|p| {
                redis::Client::open(format!("redis://127.0.0.1:{p}"))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
                    .expect("connect to cluster node")
            })
            .collect()
    }
}

fn cluster_ok(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
        .is_ok_and(|info| info.contains("cluster_state:ok"))
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

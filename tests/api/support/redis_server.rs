//! Real `redis-server` processes for tests: a single node or a 3-primary Cluster, each on free
//! loopback ports in a temporary directory, killed on drop. Never touches a Redis on 6379.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server gets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A port that is free now, with its Cluster bus port (+10000) free too. Picked at random in
/// 20000-22767, so that both stay below the kernel's ephemeral range (32768-60999 here): a port
/// the kernel handed out (`bind 0`) and gave back can be handed to a client connection of
/// another test before the server binds it, and the server then exits at once.
///
/// A port handed out is not handed out again for a minute: two tests drawing at the same moment
/// would otherwise get the same free port, and the second to bind it fails (seen: a daemon
/// process exited at start, "connection refused" for 20 s).
pub fn free_port() -> u16 {
    use std::collections::HashMap;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, PoisonError};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    static HANDED: Mutex<Option<HashMap<u16, Instant>>> = Mutex::new(None);
    const HELD: Duration = Duration::from_secs(60);
    let seed = std::collections::hash_map::RandomState::new();
    for _ in 0..500 {
        let mut hasher = seed.build_hasher();
        hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
        let port = 20_000 + (hasher.finish() % 2_768) as u16;
        let mut handed = HANDED.lock().unwrap_or_else(PoisonError::into_inner);
        let handed = handed.get_or_insert_with(HashMap::new);
        if handed.get(&port).is_some_and(|at| at.elapsed() < HELD) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            handed.insert(port, Instant::now());
            return port;
        }
    }
    panic!("no free port pair found");
}

/// Starts a Sentinel on `port` with the configuration file `conf` (which it rewrites).
pub fn spawn_sentinel(conf: &std::path::Path) -> Child {
    Command::new("redis-server")
        .arg(conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs in Sentinel mode")
}

/// The `redis-server` on PATH (the machine's version).
pub const DEFAULT_BINARY: &str = "redis-server";

/// Starts `redis-server` in `dir`.
pub fn spawn_server(dir: &TempDir, port: u16, extra: &[&str]) -> Child {
    spawn_server_from(Path::new(DEFAULT_BINARY), dir, port, extra)
}

/// Starts the `redis-server` at `binary` (another version than PATH's) in `dir`.
pub fn spawn_server_from(binary: &Path, dir: &TempDir, port: u16, extra: &[&str]) -> Child {
    Command::new(binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{} runs (install redis-server): {e}", binary.display()))
}

/// Spawns a server with `spawn` on a free port (not one of `taken`) and waits until it answers
/// PING (with the password `spawn` returns); a server that exits first (its port was taken
/// between the draw and its bind) is spawned again on another port, up to 5 times.
fn spawn_on_a_free_port(
    mut spawn: impl FnMut(u16) -> (Child, Option<String>),
    taken: &[u16],
) -> (Child, u16) {
    for _ in 0..5 {
        let port = loop {
            let port = free_port();
            if !taken.contains(&port) {
                break port;
            }
        };
        let (mut child, password) = spawn(port);
        let started = Instant::now();
        loop {
            if ping_auth(port, password.as_deref()) {
                return (child, port);
            }
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "redis-server on {port} did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.wait();
    }
    panic!("redis-server exited at start on 5 ports in a row");
}

/// Waits (bounded by [`START_TIMEOUT`]) until `ready` holds, blocking the thread (this file is
/// also `tests/alloc.rs`'s, so it has no use of the `wait` module).
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < START_TIMEOUT, "{what} did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ping_auth(port: u16, password: Option<&str>) -> bool {
    let url = match password {
        Some(password) => format!("redis://:{password}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    };
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

/// One `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    dir: TempDir,
    extra: Vec<String>,
    binary: PathBuf,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts the `redis-server` at `binary` (another Redis version) and waits for PING.
    pub fn start_from(binary: &Path) -> Self {
        Self::first_start(binary, &[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::first_start(Path::new(DEFAULT_BINARY), extra)
    }

    /// Starts on a free port (drawn again if the server exits at start: see
    /// [`spawn_on_a_free_port`]) and waits until it answers.
    fn first_start(binary: &Path, extra: &[&str]) -> Self {
        let mut server = Self::stopped(0, extra);
        server.binary = binary.to_owned();
        let password = server.password();
        let (child, port) = spawn_on_a_free_port(
            |port| {
                let child = spawn_server_from(binary, &server.dir, port, extra);
                (child, password.clone())
            },
            &[],
        );
        server.child = Some(child);
        server.port = port;
        server
    }

    /// A server that is not running yet (start it with [`RedisServer::restart`]); its port is
    /// free now.
    pub fn stopped(port: u16, extra: &[&str]) -> Self {
        Self {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            binary: PathBuf::from(DEFAULT_BINARY),
        }
    }

    /// A free port for a server started later.
    pub fn free_port() -> u16 {
        free_port()
    }

    /// (Re)starts the server on its port, with no data, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = Some(spawn_server_from(
            &self.binary,
            &self.dir,
            self.port,
            &extra,
        ));
        let port = self.port;
        let password = self.password();
        wait_until("redis-server", || ping_auth(port, password.as_deref()));
    }

    /// `kill -9`: no goodbye, no persistence.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal (`STOP`, `CONT`) to the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Waits for the process to exit by itself (after `SHUTDOWN`).
    pub fn wait_exit(&mut self) {
        if let Some(mut child) = self.child.take() {
            let started = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if started.elapsed() > START_TIMEOUT {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.wait();
        }
    }

    fn password(&self) -> Option<String> {
        let at = self.extra.iter().position(|a| a == "--requirepass")?;
        self.extra.get(at + 1).cloned()
    }

    /// Its data directory (`--dir`: where `SHUTDOWN SAVE` writes `dump.rdb`, read at start).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A synchronous connection, for inspecting state.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection().expect("connect to test redis")
    }

    /// [`Self::connection`], or why not (a server restarting or resyncing may refuse one).
    pub fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let url = match self.password() {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        redis::Client::open(url).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            // A stopped process cannot die until continued.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
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
        Self::start_from(Path::new(DEFAULT_BINARY))
    }

    /// [`RedisCluster::start`] with the `redis-server` at `binary` (another Redis version).
    pub fn start_from(binary: &Path) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cluster = Self {
            children: Vec::new(),
            ports: Vec::new(),
            _dir: dir,
        };
        // A node whose port was taken between the draw and its bind exits at once: drawn again.
        for _ in 0..3 {
            let (child, port) = spawn_on_a_free_port(
                |port| {
                    let conf = format!("nodes-{port}.conf");
                    let extra = ["--cluster-enabled", "yes", "--cluster-config-file", &conf];
                    (spawn_server_from(binary, &cluster._dir, port, &extra), None)
                },
                &cluster.ports,
            );
            cluster.children.push(child);
            cluster.ports.push(port);
        }
        let ports = cluster.ports.clone();
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

    /// Moves hash slot `slot` (which must hold keys) and its keys from the node serving it to the
    /// next node: IMPORTING and MIGRATING, `MIGRATE` of every key, then the new owner announced
    /// to every node.
    pub fn move_slot(&self, slot: u16) {
        self.begin_migration(slot).complete(self);
    }

    /// Starts moving hash slot `slot` (which must hold keys) from the node serving it to the
    /// next node: the target IMPORTING, the source MIGRATING; no key moved yet.
    pub fn begin_migration(&self, slot: u16) -> Migration {
        let mut conns = self.connections();
        let ids: Vec<String> = conns
            .iter_mut()
            .map(|c| {
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query(c)
                    .expect("CLUSTER MYID")
            })
            .collect();
        // Only the owner holds the slot's keys.
        let from = (0..conns.len())
            .find(|&i| {
                redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(slot)
                    .query::<usize>(&mut conns[i])
                    .expect("COUNTKEYSINSLOT")
                    > 0
            })
            .expect("the slot holds keys");
        let to = (from + 1) % conns.len();
        let migration = Migration {
            slot,
            from,
            to,
            ids,
        };
        migration.setslot(&mut conns[to], &["IMPORTING", &migration.ids[from]]);
        migration.setslot(&mut conns[from], &["MIGRATING", &migration.ids[to]]);
        migration
    }

    /// A synchronous connection to each node, for inspecting state.
    pub fn connections(&self) -> Vec<redis::Connection> {
        (0..self.ports.len()).map(|i| self.connection(i)).collect()
    }

    /// A synchronous connection to node `i`.
    pub fn connection(&self, i: usize) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.ports[i]))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to cluster node")
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

/// A hash slot on its way from one Cluster node to another ([`RedisCluster::begin_migration`]).
pub struct Migration {
    slot: u16,
    from: usize,
    to: usize,
    ids: Vec<String>,
}

impl Migration {
    fn setslot(&self, conn: &mut redis::Connection, args: &[&str]) {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg(args)
            .query(conn)
            .expect("CLUSTER SETSLOT");
    }

    /// The slot's keys still on the source node (at most 100).
    pub fn keys_left(&self, cluster: &RedisCluster) -> Vec<String> {
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(100)
            .query(&mut cluster.connections()[self.from])
            .expect("GETKEYSINSLOT")
    }

    /// Moves `keys` (of the slot) to the target node, in one `MIGRATE`.
    pub fn migrate(&self, cluster: &RedisCluster, keys: &[String]) {
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(cluster.ports[self.to])
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(&mut cluster.connection(self.from))
            .expect("MIGRATE");
    }

    /// Moves the keys left (100 at a time, bounded) and announces the new owner.
    pub fn complete(&self, cluster: &RedisCluster) {
        for _ in 0..100 {
            let keys = self.keys_left(cluster);
            if keys.is_empty() {
                break;
            }
            self.migrate(cluster, &keys);
        }
        self.finish(cluster);
    }

    /// Announces the target as the slot's owner to every node (the source's keys must have
    /// moved).
    pub fn finish(&self, cluster: &RedisCluster) {
        let mut conns = cluster.connections();
        let n = conns.len();
        for i in [self.to, self.from, (self.to + 1) % n] {
            self.setslot(&mut conns[i], &["NODE", &self.ids[self.to]]);
        }
    }
}

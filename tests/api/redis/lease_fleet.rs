//! The real side of the lease simulator ([`super::lease_changes`]): real `sluice serve` processes
//! (leases on, short `idle`) on one Redis server or Cluster, and what a sequence does to them:
//! bursts of checks from concurrent clients, reloads by SIGHUP, SIGKILL and SIGTERM of a pod
//! and its restart, counter resets, and the lease gauges the runner waits on. Every wait is
//! bounded; every port is a free loopback one; every file is in a temporary directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::{json, Value};
use sluice::client::{Connection, Target};

use crate::helpers::{metric_value, sluice_command, ChildGuard};
use crate::redis_server::{RedisCluster, RedisServer};
use crate::wait::{until, wait_enforced, wait_for_store};

/// The store's deadline (`redis.timeout`): a pause shorter than this is a slow call, a longer
/// one an outage.
pub const DEADLINE_MS: u64 = 400;
/// `leases.idle`: short, so leases are given back within a sequence.
pub const IDLE: Duration = Duration::from_millis(500);
/// Longest a request may go unanswered (well past the deadline).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// Longest the runner waits for the fleet to settle (a reload, leases dropped or given back).
const SETTLE_WITHIN: Duration = Duration::from_secs(15);

/// The store a fleet shares.
pub enum Store {
    /// One `redis-server`.
    Single(RedisServer),
    /// A 3-primary Cluster.
    Cluster(RedisCluster),
}

impl Store {
    fn settings(&self) -> String {
        match self {
            Store::Single(server) => format!("url = \"{}\"\n", server.url()),
            Store::Cluster(cluster) => {
                let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
                format!("cluster = [{}]\n", nodes.join(", "))
            }
        }
    }

    /// The store's clock (`TIME`, µs; a Cluster's nodes share this host's clock).
    pub fn now_us(&self) -> u64 {
        let mut conn = match self {
            Store::Single(server) => server.connection(),
            Store::Cluster(cluster) => cluster.connections().swap_remove(0),
        };
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
        secs * 1_000_000 + micros
    }

    /// The single server (pauses and restarts are for it only).
    pub fn single(&mut self) -> &mut RedisServer {
        match self {
            Store::Single(server) => server,
            Store::Cluster(_) => unreachable!("faults of the server are generated for one node"),
        }
    }

    /// Whether server faults (pause, restart) apply: one node.
    pub fn is_single(&self) -> bool {
        matches!(self, Store::Single(_))
    }
}

/// A free loopback address below the kernel's ephemeral range (see
/// [`crate::redis_server::free_port`]): a port `bind 0` handed out and gave back can go to a
/// client connection of another test before the daemon binds it (seen: a Cluster sequence's
/// daemon exited at start, "connection refused" for 20 s, with four simulators running).
fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::redis_server::free_port()))
}

/// One `sluice serve` process.
struct Daemon {
    child: ChildGuard,
    http: Target,
    admin: Target,
}

/// What a burst's answers were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    /// Units admitted (200s times their cost).
    pub admitted: u64,
    /// 429s.
    pub denied: u64,
    /// 503s (the store unavailable: `failure_mode: closed`).
    pub unavailable: u64,
}

impl Answers {
    fn add(&mut self, other: Answers) {
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.unavailable += other.unavailable;
    }
}

/// A sequence's daemons on the shared store.
pub struct Fleet {
    dir: tempfile::TempDir,
    store_settings: String,
    daemons: Vec<Daemon>,
}

impl Fleet {
    /// Writes `policies` and starts `n` daemons on `store`, waiting until each reaches it.
    pub async fn start(store: &Store, n: usize, policies: &str) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("policies.yaml"), policies).expect("write policies");
        let mut fleet = Fleet {
            dir,
            store_settings: store.settings(),
            daemons: Vec::new(),
        };
        for index in 0..n {
            let daemon = fleet.spawn(index);
            fleet.daemons.push(daemon);
        }
        for daemon in &fleet.daemons {
            wait_for_store(&daemon.admin).await;
        }
        fleet
    }

    /// How many daemons.
    pub fn len(&self) -> usize {
        self.daemons.len()
    }

    fn spawn(&self, index: usize) -> Daemon {
        let (http, admin) = (free_addr(), free_addr());
        let dir = self.dir.path();
        let settings = dir.join(format!("sluice-{index}.toml"));
        let text = format!(
            "policies = {policies:?}\npolicies_poll = \"60s\"\n[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\nsocket = \"\"\n[redis]\n{store}timeout = \"{DEADLINE_MS}ms\"\n[leases]\nmin_units = 2\nidle = \"{idle}ms\"\n[log]\nlevel = \"warn\"\n",
            policies = dir.join("policies.yaml").display().to_string(),
            store = self.store_settings,
            idle = IDLE.as_millis(),
        );
        std::fs::write(&settings, text).expect("write settings");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(index))
            .expect("daemon log");
        let child = sluice_command(dir, &["serve", "--config", &settings.display().to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sluice serve");
        Daemon {
            child: ChildGuard(Some(child)),
            http: Target::Tcp(http),
            admin: Target::Tcp(admin),
        }
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("sluice-{index}.log"))
    }

    /// The last lines each daemon logged (for a failure's report).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for index in 0..self.daemons.len() {
            let text = std::fs::read_to_string(self.log_path(index)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(8)..];
            out.push_str(&format!("\n--- daemon {index}:\n{}", tail.join("\n")));
        }
        out
    }

    fn signal(&self, index: usize, signal: &str) {
        let pid = self.daemons[index].child.id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Stops daemon `index` (SIGKILL: its leases are lost; SIGTERM: it gives them back and
    /// exits), then starts it again and waits until it reaches the store.
    pub async fn restart(&mut self, index: usize, graceful: bool) {
        if graceful {
            self.signal(index, "TERM");
            let child = &mut self.daemons[index].child;
            let status = tokio::task::block_in_place(|| child.wait_timeout(SETTLE_WITHIN));
            assert!(status.is_some(), "daemon {index} did not exit on SIGTERM");
        } else {
            let mut child = self.daemons[index].child.0.take().expect("running");
            let _ = child.kill();
            let _ = child.wait();
        }
        self.daemons[index] = self.spawn(index);
        wait_for_store(&self.daemons[index].admin).await;
    }

    /// Rewrites the policy file (atomically), sends SIGHUP to every daemon and waits until each
    /// serves the new file.
    pub async fn reload(&self, policies: &str) {
        let file = self.dir.path().join("policies.yaml");
        let next = file.with_extension("next");
        std::fs::write(&next, policies).expect("write the new policy file");
        std::fs::rename(&next, &file).expect("swap the policy file");
        let version = i64::from(sluice::config::policy_file_version(policies));
        for index in 0..self.daemons.len() {
            self.signal(index, "HUP");
        }
        for daemon in &self.daemons {
            until("the reload is served", SETTLE_WITHIN, || async {
                let reply =
                    sluice::client::request(&daemon.admin, Method::GET, "/v1/policies", None)
                        .await
                        .map_err(|e| e.to_string())?;
                let served = reply.json()["version"].as_i64();
                (served == Some(version))
                    .then_some(())
                    .ok_or(format!("version {served:?}, file {version}"))
            })
            .await;
        }
    }

    /// Waits until every daemon's checks are decided by the store again (a dry run: nothing
    /// spent): a circuit that opened has closed, and a connection Redis dropped (a restart)
    /// was found broken and made again.
    pub async fn reach_store(&self) {
        let probe = json!({"descriptors": {"route": "solo", "user": "probe"}});
        for daemon in &self.daemons {
            wait_enforced(&daemon.http, &probe).await;
        }
    }

    /// Units of `policy` the fleet holds in leases (`sluice_lease_units_held`, refreshed every
    /// 100 ms; units being given back count as held).
    pub async fn held(&self, policy: &str) -> f64 {
        let mut sum = 0.0;
        for daemon in &self.daemons {
            let reply = sluice::client::request(&daemon.admin, Method::GET, "/metrics", None)
                .await
                .expect("metrics");
            let text = String::from_utf8_lossy(&reply.body);
            sum += metric_value(&text, "sluice_lease_units_held", &[("policy", policy)]);
        }
        sum
    }

    /// A metric summed over the fleet (since each daemon's last start).
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let mut sum = 0.0;
        for daemon in &self.daemons {
            let reply = sluice::client::request(&daemon.admin, Method::GET, "/metrics", None)
                .await
                .expect("metrics");
            sum += metric_value(&String::from_utf8_lossy(&reply.body), metric, labels);
        }
        sum
    }

    /// Waits until no daemon holds a lease of any of `policies`; `Err` names what is still held.
    pub async fn settle(&self, policies: &[&str], why: &str) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let mut held = Vec::new();
            for policy in policies {
                let units = self.held(policy).await;
                if units > 0.0 {
                    held.push(format!("{policy}: {units}"));
                }
            }
            if held.is_empty() {
                return Ok(());
            }
            if started.elapsed() > SETTLE_WITHIN {
                return Err(format!(
                    "{why}: leases still held after {SETTLE_WITHIN:?}: {}",
                    held.join(", ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resets `policy`'s counter of partition `user` (requests with `route`) through daemon
    /// `via`'s admin listener.
    pub async fn reset(&self, via: usize, policy: &str, route: &str, user: &str) {
        let path = format!("/v1/counters?policy={policy}&d.route={route}&d.user={user}");
        let admin = &self.daemons[via % self.daemons.len()].admin;
        let reply = sluice::client::request(admin, Method::DELETE, &path, None)
            .await
            .expect("reset answers");
        assert!(
            reply.status.is_success(),
            "reset {policy}: {} {}",
            reply.status,
            reply.json()
        );
    }

    /// `clients` concurrent clients on each daemon of `via` send `checks` checks of `body`
    /// (`cost` units each) one after another; what they were answered.
    pub async fn burst(
        &self,
        via: &[usize],
        clients: usize,
        checks: usize,
        body: &Value,
        cost: u64,
    ) -> Answers {
        let mut set = tokio::task::JoinSet::new();
        for &index in via {
            for _ in 0..clients {
                let target = self.daemons[index % self.daemons.len()].http.clone();
                let body = body.clone();
                set.spawn(client(target, body, checks, cost));
            }
        }
        let mut answers = Answers::default();
        while let Some(done) = set.join_next().await {
            answers.add(done.expect("client task"));
        }
        answers
    }

    /// One client per daemon checks `body` until it is refused 3 times in a row (at most
    /// `most` checks each): the last units the fleet can still admit.
    pub async fn drain(&self, body: &Value, most: usize) -> Answers {
        let mut set = tokio::task::JoinSet::new();
        for daemon in &self.daemons {
            let (target, body) = (daemon.http.clone(), body.clone());
            set.spawn(async move {
                let mut answers = Answers::default();
                let mut refused = 0;
                for _ in 0..most {
                    let one = client(target.clone(), body.clone(), 1, 1).await;
                    refused = if one.admitted > 0 { 0 } else { refused + 1 };
                    answers.add(one);
                    if refused == 3 {
                        break;
                    }
                }
                answers
            });
        }
        let mut answers = Answers::default();
        while let Some(done) = set.join_next().await {
            answers.add(done.expect("drain task"));
        }
        answers
    }
}

/// One client: `checks` checks one after another on one connection.
async fn client(target: Target, mut body: Value, checks: usize, cost: u64) -> Answers {
    body["cost"] = json!(cost);
    let mut conn = Connection::open(&target).await.expect("connect");
    let mut answers = Answers::default();
    for _ in 0..checks {
        let reply = tokio::time::timeout(ANSWER_WITHIN, conn.post_json("/v1/check", &body))
            .await
            .unwrap_or_else(|_| panic!("no answer within {ANSWER_WITHIN:?}"))
            .expect("answer");
        let json = reply.json();
        match reply.status.as_u16() {
            200 => {
                assert_eq!(
                    json["mode"], "enforced",
                    "an admission not enforced: {json}"
                );
                answers.admitted += cost;
            }
            429 => answers.denied += 1,
            503 => answers.unavailable += 1,
            other => panic!("status {other}: {json}"),
        }
    }
    answers
}

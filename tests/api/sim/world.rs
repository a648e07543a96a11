//! The real side of the simulator: a store (the embedded one, or a Redis, Valkey or Cluster
//! server shared by a test's sequences), the daemons of one sequence on it (keys under a prefix of
//! their own), and one operation carried out against them and checked against the model.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};
use sluice::app::App;
use sluice::client::Target;
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::config::{load_policies, HumanDuration};
use sluice::reload::Reloader;
use sluice::telemetry::Metrics;
use tempfile::TempDir;

use super::envoy::Envoy;
use super::lane::{Holder, Ledger, PARTS};
use super::model::{orders, Expect, Model};
use super::ops::{Item, Op, ACL_COMMANDS, SESSIONS};
use super::store_state;
use super::wire::{agrees, body, delete, explain, get, post, read, read_batch, Actual};
use crate::helpers::{run_app, test_settings, TestApp, START_US};
use crate::redis_server::{RedisCluster, RedisServer};

/// The server a test's sequences share.
pub enum Server {
    /// The embedded store (each daemon has its own, on the manual clock).
    Memory,
    /// One server (Redis 7, Redis 6.2 or Valkey 9).
    Single(RedisServer),
    /// A 3-primary Redis Cluster.
    Cluster(RedisCluster),
}

impl Server {
    /// How many daemons a sequence runs on this store (the embedded store is per daemon).
    pub fn daemons(&self) -> usize {
        match self {
            Server::Memory => 1,
            Server::Single(_) | Server::Cluster(_) => 2,
        }
    }

    fn primaries(&self) -> Vec<redis::Connection> {
        match self {
            Server::Memory => Vec::new(),
            Server::Single(server) => vec![server.connection()],
            Server::Cluster(cluster) => cluster.connections(),
        }
    }
}

/// A daemon of the sequence, with a reloader of its own on the policy file: a reload is the
/// daemon's real reload path (read the file, validate, swap), run when the step says so.
struct Daemon {
    app: TestApp,
    reloader: Reloader,
    /// Its gRPC listener (the RLQS service).
    grpc: std::net::SocketAddr,
}

/// Envoy's report interval (1.40 reports every 5 s whatever the bucket says).
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The system clock in µs: the leased lane's clock (Redis `TIME` reads the same one).
fn wall_us() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_micros()).expect("µs fit")
}

/// One sequence's daemons on the store.
pub struct World<'s> {
    server: &'s mut Server,
    prefix: String,
    file: PathBuf,
    daemons: Vec<Daemon>,
    clock: Arc<ManualClock>,
    /// After a restart without persistence, the state before it: a daemon's local layer may
    /// still deny what it denied then (an under-admission the data loss causes, never more).
    ghost: Option<Model>,
    /// On the embedded store, the leased lane's own daemon, on the system clock (the lane's
    /// leases and RLQS assignments follow the daemon's real time; the others' manual clock
    /// would move its store apart from it). On Redis the lane runs on the sequence's daemons.
    extra: Option<Daemon>,
    /// The simulated Envoys, each on lane daemon `session % lane daemons`, and when each last
    /// reported on its timer.
    envoys: Vec<(Envoy, std::time::Instant)>,
    /// The leased lane's bound.
    ledger: Ledger,
    _dir: TempDir,
}

impl<'s> World<'s> {
    /// Writes the model's policies and starts the sequence's daemons on `server`.
    pub async fn start(server: &'s mut Server, prefix: String, model: &Model) -> World<'s> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("policies.yaml");
        std::fs::write(&file, model.yaml()).expect("write policies");
        let clock = Arc::new(ManualClock::new(START_US));
        if let Server::Single(single) = &*server {
            grant(single, &prefix);
        }
        let mut daemons = Vec::new();
        for _ in 0..server.daemons() {
            daemons.push(spawn(server, &prefix, &file, &clock, false).await);
        }
        let extra = match server {
            Server::Memory => Some(spawn(server, &prefix, &file, &clock, true).await),
            _ => None,
        };
        let lane: Vec<std::net::SocketAddr> = match &extra {
            Some(daemon) => vec![daemon.grpc],
            None => daemons.iter().map(|d| d.grpc).collect(),
        };
        let envoys = (0..SESSIONS)
            .map(|s| (Envoy::new(lane[s % lane.len()]), std::time::Instant::now()))
            .collect();
        World {
            server,
            prefix,
            file,
            daemons,
            clock,
            ghost: None,
            extra,
            envoys,
            ledger: Ledger::new(model.lane, wall_us()),
            _dir: dir,
        }
    }

    /// Carries out `op` and checks every answer against `model` (which it advances), then the
    /// store's state.
    pub async fn step(&mut self, model: &mut Model, op: &Op) -> Result<(), String> {
        let Err(why) = self.carry_out(model, op).await else {
            return Ok(());
        };
        // Where an answer came from a failure mode, its cause: each daemon's Redis errors.
        let mut causes = String::new();
        for (at, daemon) in self.daemons.iter().enumerate() {
            let metrics = daemon.app.metrics().await;
            for line in metrics.lines().filter(|line| {
                line.starts_with("sluice_redis_errors_total{") && !line.ends_with(" 0")
            }) {
                causes.push_str(&format!("\n  daemon {at}: {line}"));
            }
        }
        Err(format!("{why}{causes}"))
    }

    async fn carry_out(&mut self, model: &mut Model, op: &Op) -> Result<(), String> {
        self.tick().await?;
        match op {
            Op::Leased { via, part, n } => self.leased(*via, *part, *n).await?,
            Op::Rlqs { session, part, n } => self.rlqs(*session, *part, *n).await?,
            Op::RlqsSteady {
                session,
                part,
                n,
                reports,
            } => {
                for _ in 0..*reports {
                    self.rlqs(*session, *part, *n).await?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let at = session % self.envoys.len();
                    self.envoys[at].0.breaks = self.ledger.breaks.clone();
                    self.envoys[at].0.report_all().await?;
                    self.envoys[at].1 = std::time::Instant::now();
                }
            }
            Op::RlqsReport { session } => {
                let at = session % self.envoys.len();
                self.envoys[at].0.breaks = self.ledger.breaks.clone();
                self.envoys[at].0.report_all().await?;
                self.envoys[at].1 = std::time::Instant::now();
            }
            Op::RlqsEnd { session } => {
                let at = session % self.envoys.len();
                self.envoys[at].0.end_stream();
            }
            Op::Sleep { ms } => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                self.tick().await?;
            }
            Op::Reset { part } => {
                let remaining = self.lane_remaining(*part).await;
                let reply = delete(
                    Target::Tcp(self.lane_daemons()[0].app.admin),
                    &counter_path(*part),
                )
                .await?;
                if reply.status.as_u16() != 200 {
                    return Err(format!("reset: status {}: {}", reply.status, reply.json()));
                }
                self.ledger
                    .break_part(*part, model.lane, wall_us(), "a reset", remaining);
                // The reset channel's announcement reaches every pod (they drop their leases).
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            Op::LaneReload { change } => {
                let next = model.lane.apply(*change);
                if next != model.lane {
                    let mut remaining = Vec::new();
                    for part in 0..PARTS {
                        remaining.push(self.lane_remaining(part).await);
                    }
                    model.lane = next;
                    self.rewrite(model).await;
                    self.ledger
                        .break_all(next, wall_us(), "a reload", &remaining);
                    self.served(model).await?;
                }
            }
            Op::Check { via, item } => {
                let target = self.target(*via);
                let (nows, reply) = self
                    .timed(post(target, "/v1/check", body(item, true)))
                    .await;
                let actual = read(&reply?, "allowed");
                self.settle(model, &nows, &[actual], |m, now| {
                    vec![m.check(*via, item, now, true)]
                })?;
            }
            Op::Batch { via, items } => {
                let target = self.target(*via);
                let checks: Vec<Value> = items.iter().map(|i| body(i, true)).collect();
                let (nows, reply) = self
                    .timed(post(target, "/v1/check/batch", json!({"checks": checks})))
                    .await;
                let actual = read_batch(&reply?);
                // The checks of a batch are independent (docs/api.md): each is atomic, in an
                // order the store picks (a Cluster runs a group across slots after the rest).
                self.settle_in_any_order(model, &nows, &actual, |m, now, order| {
                    m.batch(*via, items, order, now)
                })?;
            }
            Op::Concurrent { calls } => {
                let requests = calls
                    .iter()
                    .map(|(via, item)| post(self.target(*via), "/v1/check", body(item, true)));
                let (nows, replies) = self.timed(join_all(requests)).await;
                let mut actual = Vec::new();
                for reply in replies {
                    actual.push(read(&reply?, "allowed"));
                }
                // Each check is atomic; the store serves them in some order.
                self.settle_in_any_order(model, &nows, &actual, |m, now, order| {
                    let mut expected = vec![Expect::TooCostly; calls.len()];
                    for &at in order {
                        let (via, item) = &calls[at];
                        expected[at] = m.check(*via, item, now, calls.len() == 1);
                    }
                    expected
                })?;
            }
            Op::Report {
                via,
                pick,
                part,
                cost,
            } => {
                let target = self.target(*via);
                let item = Item {
                    pick: *pick,
                    part: *part,
                    cost: *cost,
                    dry_run: false,
                };
                let (nows, reply) = self
                    .timed(post(target, "/v1/report", body(&item, false)))
                    .await;
                let actual = read(&reply?, "within_limit");
                self.settle(model, &nows, &[actual], |m, now| {
                    vec![m.report(*via, *pick, *part, *cost, now)]
                })?;
            }
            Op::Reload { policy, change } => {
                let spec = change.apply(&model.specs[*policy]);
                model.reload(*policy, spec);
                self.rewrite(model).await;
                self.ghost = None;
                self.served(model).await?;
            }
            Op::Advance { us } => self.clock.advance(*us),
            Op::Restart { persist } => self.restart(model, *persist).await,
            Op::Pause { ms, item } => {
                let Server::Single(server) = &*self.server else {
                    unreachable!("pauses are generated for single servers only")
                };
                let target = self.target(0);
                let before = self.now();
                server.signal("STOP");
                let check = tokio::spawn(post(target, "/v1/check", body(item, true)));
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                server.signal("CONT");
                let reply = check.await.map_err(|e| e.to_string())?;
                self.settle_check(model, before, item, read(&reply?, "allowed"))?;
            }
            Op::AclRevoke { command, item } => {
                let Server::Single(server) = &*self.server else {
                    unreachable!("ACL changes are generated for single servers only")
                };
                let command = ACL_COMMANDS[command % ACL_COMMANDS.len()];
                let acl = |change: String| {
                    tokio::task::block_in_place(|| {
                        redis::cmd("ACL")
                            .arg("SETUSER")
                            .arg("sim")
                            .arg(change)
                            .query::<()>(&mut server.connection())
                            .map_err(|e| e.to_string())
                    })
                };
                let refused = |metrics: &str| {
                    crate::helpers::metric_value(
                        metrics,
                        "sluice_redis_errors_total",
                        &[("kind", "auth")],
                    )
                };
                let before = refused(&self.daemons[0].app.metrics().await);
                let before_now = self.now();
                acl(format!("-{command}"))?;
                let reply = post(self.target(0), "/v1/check", body(item, true)).await;
                acl(format!("+{command}"))?;
                let actual = read(&reply?, "allowed");
                if matches!(actual, Actual::Failure(_)) {
                    // The script path needed the command: the failure mode answered, the cause
                    // counted as `auth`, and nothing of the check was spent (the model stays).
                    let after = refused(&self.daemons[0].app.metrics().await);
                    if after <= before {
                        return Err(format!(
                            "without +{command}: a failure-mode answer with no auth error \
                             counted: {actual:?}"
                        ));
                    }
                    // A refusal of the call itself (EVALSHA) opens the circuit: wait until the
                    // store answers again.
                    let probe = json!({"policy": "p0", "descriptors": {"user": "probe"}});
                    crate::wait::wait_enforced(&self.daemons[0].app.tcp, &probe).await;
                } else {
                    self.settle_check(model, before_now, item, actual)?;
                }
            }
            Op::Reshard { node, item } => {
                let Server::Cluster(cluster) = &*self.server else {
                    unreachable!("reshards are generated for a Cluster only")
                };
                let mut conn = cluster.connections().swap_remove(node % 3);
                let key: Option<String> = redis::cmd("RANDOMKEY")
                    .query(&mut conn)
                    .map_err(|e| e.to_string())?;
                let Some(key) = key else {
                    return self.store_invariants();
                };
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&key)
                    .query(&mut conn)
                    .map_err(|e| e.to_string())?;
                let target = self.target(0);
                let before = self.now();
                let migration = tokio::task::block_in_place(|| {
                    let migration = cluster.begin_migration(slot);
                    let keys = migration.keys_left(cluster);
                    migration.migrate(cluster, &keys[..1]);
                    migration
                });
                let check = tokio::spawn(post(target, "/v1/check", body(item, true)));
                tokio::time::sleep(Duration::from_millis(5)).await;
                tokio::task::block_in_place(|| migration.complete(cluster));
                let reply = check.await.map_err(|e| e.to_string())?;
                self.settle_check(model, before, item, read(&reply?, "allowed"))?;
            }
        }
        self.store_invariants()
    }

    /// Writes the model's policy file and reloads every daemon.
    async fn rewrite(&mut self, model: &Model) {
        let next = self.file.with_extension("next");
        std::fs::write(&next, model.yaml()).expect("write the new policy file");
        std::fs::rename(&next, &self.file).expect("swap the policy file");
        for daemon in self.daemons.iter_mut().chain(self.extra.as_mut()) {
            daemon.reloader.reload(true).await;
        }
    }

    /// The daemons the leased lane runs on.
    fn lane_daemons(&self) -> Vec<&Daemon> {
        match &self.extra {
            Some(daemon) => vec![daemon],
            None => self.daemons.iter().collect(),
        }
    }

    /// `n` `lease: true` checks of `part` at once through lane daemon `via`.
    async fn leased(&mut self, via: usize, part: u8, n: u64) -> Result<(), String> {
        let lane = self.lane_daemons();
        let at = via % lane.len();
        let target = lane[at].app.tcp.clone();
        let body = json!({"policy": "q", "descriptors": {"lane": "q", "user": format!("u{part}")}});
        let requests = (0..n).map(|_| post(target.clone(), "/v1/check", body.clone()));
        let replies = join_all(requests).await;
        let now = wall_us();
        let mut admitted = 0;
        for reply in replies {
            let reply = reply?;
            if reply.status.as_u16() == 200 && reply.json()["allowed"] == json!(true) {
                admitted += 1;
            }
        }
        self.ledger
            .admit(part, now, admitted, Holder::Lease(at), None)
    }

    /// `n` requests of `part` at Envoy `session`, each admission held to the ledger.
    async fn rlqs(&mut self, session: usize, part: u8, n: u64) -> Result<(), String> {
        let at = session % self.envoys.len();
        self.envoys[at].0.breaks = self.ledger.breaks.clone();
        let decided = self.envoys[at].0.requests(part, n).await?;
        let now = wall_us();
        for one in decided.iter().filter(|d| d.allowed) {
            self.ledger
                .admit(part, now, 1, Holder::Envoy(at), one.since)
                .map_err(|why| {
                    let how = if one.blanket { " (on ALLOW_ALL)" } else { "" };
                    format!("{why}{how}")
                })?;
        }
        Ok(())
    }

    /// Every Envoy whose report interval passed reports (its timer fires).
    async fn tick(&mut self) -> Result<(), String> {
        let breaks = self.ledger.breaks.clone();
        for (envoy, last) in &mut self.envoys {
            if last.elapsed() >= REPORT_EVERY {
                envoy.breaks = breaks.clone();
                envoy.report_all().await?;
                *last = std::time::Instant::now();
            }
        }
        Ok(())
    }

    /// The leased lane's `remaining` for `part` (`None` when the store does not answer).
    async fn lane_remaining(&self, part: u8) -> Option<u64> {
        let admin = Target::Tcp(self.lane_daemons()[0].app.admin);
        let reply = get(admin, &counter_path(part)).await.ok()?;
        (reply.status.as_u16() == 200)
            .then(|| reply.json()["remaining"].as_u64())
            .flatten()
    }

    /// What the leased lane admitted (by `lease: true` checks, by Envoys) and the assignments
    /// the Envoys received.
    pub fn lane_tally(&self) -> ((u64, u64), std::collections::BTreeMap<&'static str, u64>) {
        let mut kinds = std::collections::BTreeMap::new();
        for (envoy, _) in &self.envoys {
            for (kind, n) in &envoy.received {
                *kinds.entry(*kind).or_default() += n;
            }
        }
        (self.ledger.admitted, kinds)
    }

    /// Settles the answer `actual` to daemon 0's check of `item`, sent after the store's time
    /// `before` and answered by now (either instant's answer agrees).
    fn settle_check(
        &self,
        model: &mut Model,
        before: u64,
        item: &Item,
        actual: Actual,
    ) -> Result<(), String> {
        let nows = [before, self.now()];
        self.settle(model, &nows, &[actual], |m, now| {
            vec![m.check(0, item, now, true)]
        })
    }

    fn target(&self, via: usize) -> Target {
        self.daemons[via % self.daemons.len()].app.tcp.clone()
    }

    /// The store's time: the manual clock, or the server's `TIME` (one node: a Cluster's nodes
    /// share this host's clock).
    fn now(&self) -> u64 {
        match &*self.server {
            Server::Memory => self.clock.now_us(),
            _ => tokio::task::block_in_place(|| {
                let mut conn = self.server.primaries().swap_remove(0);
                let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
                secs * 1_000_000 + micros
            }),
        }
    }

    /// Runs `request`, returning the instants the store's clock read just before and after (the
    /// script read `TIME` in between).
    async fn timed<T>(&self, request: impl std::future::Future<Output = T>) -> (Vec<u64>, T) {
        let before = self.now();
        let out = request.await;
        let after = self.now();
        let nows = if before == after {
            vec![before]
        } else {
            vec![before, after]
        };
        (nows, out)
    }

    /// Accepts the answers if the model, at one of `nows`, gives them; the model then moves on
    /// from that instant's state. After a data loss a denial the lost state gives is accepted
    /// too (a local layer's memory), leaving the model as it is.
    fn settle(
        &self,
        model: &mut Model,
        nows: &[u64],
        actual: &[Actual],
        apply: impl Fn(&mut Model, u64) -> Vec<Expect>,
    ) -> Result<(), String> {
        let mut first = None;
        for &now in nows {
            let mut next = model.clone();
            let expected = apply(&mut next, now);
            if agrees(&expected, actual) {
                *model = next;
                return Ok(());
            }
            first.get_or_insert(expected);
        }
        let expected = first.unwrap_or_default();
        if let Some(ghost) = &self.ghost {
            let denials = actual
                .iter()
                .all(|a| matches!(a, Actual::Answer { allowed: false, .. }));
            let mut ghost = ghost.clone();
            if denials
                && nows
                    .iter()
                    .any(|&now| agrees(&apply(&mut ghost, now), actual))
            {
                return Ok(());
            }
        }
        Err(explain(&expected, actual))
    }

    /// [`Self::settle`] for answers the store may have given in any order: `apply` runs the
    /// requests in the order given and places each expectation where its request was.
    fn settle_in_any_order(
        &self,
        model: &mut Model,
        nows: &[u64],
        actual: &[Actual],
        apply: impl Fn(&mut Model, u64, &[usize]) -> Vec<Expect>,
    ) -> Result<(), String> {
        let mut first = None;
        for order in orders(actual.len()) {
            match self.settle(model, nows, actual, |m, now| apply(m, now, &order)) {
                Ok(()) => return Ok(()),
                Err(why) => drop(first.get_or_insert(why)),
            }
        }
        Err(first.unwrap_or_default())
    }

    /// Checks that every daemon serves the model's policies (the reload swapped them in):
    /// `/v1/policies` names each one's algorithm and limit.
    async fn served(&self, model: &Model) -> Result<(), String> {
        let mut written: Vec<(String, u64)> = model
            .specs
            .iter()
            .map(|s| (s.algorithm().name().to_owned(), s.limit))
            .collect();
        let lane = match model.lane.alg {
            super::lane::LaneAlg::TokenBucket => "token_bucket",
            super::lane::LaneAlg::FixedWindow => "fixed_window",
        };
        written.push((lane.to_owned(), model.lane.limit));
        for daemon in self.daemons.iter().chain(self.extra.as_ref()) {
            let reply = get(Target::Tcp(daemon.app.admin), "/v1/policies").await?;
            let served: Vec<(String, u64)> = reply.json()["policies"]
                .as_array()
                .map(|policies| {
                    let figures = |p: &Value| {
                        let algorithm = p["algorithm"].as_str().unwrap_or("?").to_owned();
                        (algorithm, p["limit"].as_u64().unwrap_or(0))
                    };
                    policies.iter().map(figures).collect()
                })
                .unwrap_or_default();
            if served != written {
                return Err(format!("reload not served: {served:?}, file {written:?}"));
            }
        }
        Ok(())
    }

    /// A restart of the single server: with its data (`SHUTDOWN SAVE`, loaded back at start)
    /// or without (`kill -9`, no data file); then every daemon decides by the store again.
    async fn restart(&mut self, model: &mut Model, persist: bool) {
        let mut remaining = Vec::new();
        if !persist {
            for part in 0..PARTS {
                remaining.push(self.lane_remaining(part).await);
            }
        }
        let Server::Single(server) = &mut *self.server else {
            unreachable!("restarts are generated for single servers only")
        };
        tokio::task::block_in_place(|| {
            if persist {
                let mut conn = server.connection();
                let _ = redis::cmd("SHUTDOWN").arg("SAVE").query::<()>(&mut conn);
                server.wait_exit();
            } else {
                server.kill();
                let _ = std::fs::remove_file(server.dir().join("dump.rdb"));
            }
            server.restart();
            // ACL users live in memory (no ACL file): the daemons' user is created again.
            grant(server, &self.prefix);
        });
        if !persist {
            self.ghost = Some(model.clone());
            model.forget();
            self.ledger
                .break_all(model.lane, wall_us(), "a data loss", &remaining);
        }
        let probe = json!({"policy": "p0", "descriptors": {"user": "probe"}});
        for daemon in &self.daemons {
            crate::wait::wait_enforced(&daemon.app.tcp, &probe).await;
        }
    }

    /// On Redis: every key under the sequence's prefix expires (`PTTL` > 0) and holds what a
    /// script writes: a sorted set (a sliding log) or a short string `<int>` or `<int>:<int>`.
    fn store_invariants(&self) -> Result<(), String> {
        if matches!(self.server, Server::Memory) {
            return Ok(());
        }
        tokio::task::block_in_place(|| {
            for mut conn in self.server.primaries() {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{}:*", self.prefix))
                    .query(&mut conn)
                    .map_err(|e| e.to_string())?;
                for key in keys {
                    store_state::key_invariants(&mut conn, &key)?;
                }
            }
            Ok(())
        })
    }
}

/// The daemons' ACL user on a single server, as `redis://<user>:<password>@`.
const ACL_USER: &str = "redis://sim:sim-password@";

/// Creates (or resets) the daemons' ACL user: the line docs/redis.md gives, for `prefix`'s keys
/// and reset channel instead of the default `rl`.
fn grant(server: &RedisServer, prefix: &str) {
    let mut args = crate::redis::acl::documented_acl("sim", "sim-password");
    for arg in &mut args {
        if arg == "~rl:*" {
            *arg = format!("~{prefix}:*");
        } else if arg == "&rl:resets" {
            *arg = format!("&{prefix}:resets");
        }
    }
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&args)
        .query(&mut server.connection())
        .expect("ACL SETUSER");
}

/// A daemon of the sequence; `real_time`: the embedded store on the system clock (the leased
/// lane's own daemon).
async fn spawn(
    server: &Server,
    prefix: &str,
    file: &Path,
    clock: &Arc<ManualClock>,
    real_time: bool,
) -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.policies = file.to_owned();
    // The RLQS service on loopback; leases in small blocks, given back soon when idle.
    settings.listen.grpc = "127.0.0.1:0".into();
    settings.leases.min_units = 2;
    settings.leases.idle = HumanDuration(100_000);
    let store_clock: Arc<dyn Clock> = match server {
        Server::Memory if real_time => Arc::new(SystemClock::new()),
        Server::Memory => clock.clone(),
        Server::Single(single) => {
            settings.redis.url = Some(single.url().replacen("redis://", ACL_USER, 1));
            Arc::new(SystemClock::new())
        }
        Server::Cluster(cluster) => {
            settings.redis.cluster = cluster.urls();
            Arc::new(SystemClock::new())
        }
    };
    settings.redis.key_prefix = prefix.into();
    // Generous: a budget a busy CI machine meets; a slow call within it must still be enforced.
    settings.redis.timeout = HumanDuration(2_000_000);
    let (policies, version) = load_policies(file, &settings.files).expect("valid policies");
    let app = App::build_with(&settings, policies, store_clock)
        .await
        .expect("daemon builds");
    let reloader = Reloader::new(
        file.to_owned(),
        app.service(),
        Metrics::new(),
        version,
        settings.files,
        false,
    );
    let grpc = app.grpc_addr().expect("gRPC TCP on");
    let app = run_app(app, clock.clone(), dir);
    app.wait_for_store().await;
    Daemon {
        app,
        reloader,
        grpc,
    }
}

/// The admin path of the leased lane's counter of `part`.
fn counter_path(part: u8) -> String {
    format!("/v1/counters?policy=q&d.lane=q&d.user=u{part}")
}

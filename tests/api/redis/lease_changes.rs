//! Quota leases through every change (issue 38): generated, seeded operation sequences against
//! real `sluice serve` processes (`[leases] min_units = 2`, `idle = 500ms`) sharing one Redis
//! (Redis 7 single node and Cluster, Redis 6.2, Valkey 9), on leased policies (`solo`, and the group `g1` + `g2` that one
//! request checks all or nothing), each a token bucket or a fixed window, `failure_mode:
//! closed`. Operations: bursts of checks from concurrent clients on one daemon or several;
//! reloads (SIGHUP) that lower or raise a limit or a burst, change a period, switch the
//! algorithm, turn `lease` off and on; a daemon killed (SIGKILL: its leases are lost) or stopped
//! (SIGTERM: it gives them back) and started again; a counter reset (admin `DELETE
//! /v1/counters`); on the single node, Redis paused (SIGSTOP, CONT) within and beyond the
//! deadline with a burst in flight, and Redis restarted without its data (with a burst while
//! it is down). Every sequence ends with the leases given back and the last units drained.
//!
//! The invariant: the fleet never admits more than the policy in force allows, account by
//! account ([`super::lease_ledger`] states the bounds and why they hold). Every change and
//! fault is met with leases in hand (a short burst through every daemon just before it).
//! After a reset the counter starts afresh and every pod drops its lease of it on the
//! announcement: the next account opens once that had time to arrive ([`ANNOUNCED`]), and
//! checks go on at once, so a lease that outlived the reset is over-admission. After a data
//! loss each pod drops its leases when it resubscribes to the reset channel: until then the
//! units it holds (spent in the old account, which they are held to) may still be admitted, so
//! across a data loss the fleet admits at most the old account's bound plus a fresh quota; the
//! runner waits until no pod holds a lease before the new account opens. Under-admission (how
//! much of the last account's bound the drained fleet reached) is reported, not asserted.
//!
//! Bounded: [`cases`] sequences per store (3 by default), each of at most 12 operations, no new
//! sequence after 80 s (an hour in a soak run). Reproducible: sequence `i` uses seed `base + i`.
//! A soak run: `SLUICE_LEASE_SIM_CASES=100 cargo test --release --test api lease_changes --
//! --nocapture`; one seed again: `SLUICE_LEASE_SIM_SEED=<seed> SLUICE_LEASE_SIM_CASES=1`, with
//! `SLUICE_LEASE_SIM_VERBOSE=1` to print each operation and what it was answered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::lease_fleet::{Answers, Fleet, Store, IDLE};
use super::lease_ledger::{Closed, Ledger};
use super::lease_ops::{route_of, sequence, Op, Route, DAEMONS, NAMES};
use crate::redis_server::{RedisCluster, RedisServer};

/// How long the runner gives a reset's announcement to reach every pod.
const ANNOUNCED: Duration = Duration::from_millis(100);

/// Sequences per store: `SLUICE_LEASE_SIM_CASES`, else 3.
fn cases() -> u64 {
    std::env::var("SLUICE_LEASE_SIM_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

/// The first sequence's seed: `SLUICE_LEASE_SIM_SEED`, else a fixed one.
fn base_seed() -> u64 {
    std::env::var("SLUICE_LEASE_SIM_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x1ea5e)
}

/// Per kind of change or fault: how many met leases in hand, of how many.
#[derive(Default, Debug)]
struct Primed(BTreeMap<&'static str, (u32, u32)>);

impl Primed {
    fn note(&mut self, op: &'static str, held: bool) {
        let entry = self.0.entry(op).or_default();
        entry.0 += u32::from(held);
        entry.1 += 1;
    }

    fn add(&mut self, other: &Primed) {
        for (op, (held, of)) in &other.0 {
            let entry = self.0.entry(op).or_default();
            entry.0 += held;
            entry.1 += of;
        }
    }
}

/// The checks right after a change: a drain through every daemon, or a short burst.
async fn at_once(fleet: &Fleet, body: &serde_json::Value, drain: bool) -> Answers {
    if drain {
        fleet.drain(body, 1000 / fleet.len() + 10).await
    } else {
        let via: Vec<usize> = (0..fleet.len()).collect();
        fleet.burst(&via, 1, 15, body, 1).await
    }
}

fn policy_file(ledgers: &[Ledger]) -> String {
    let mut text = String::from("policies:\n");
    for (at, ledger) in ledgers.iter().enumerate() {
        let route = if at == 0 { "solo" } else { "grp" };
        text.push_str(&ledger.spec.yaml(NAMES[at], route));
    }
    text
}

/// What one sequence did.
struct Outcome {
    accounts: Vec<(usize, Closed)>,
    primed: Primed,
    answers: BTreeMap<&'static str, Answers>,
    leased_checks: f64,
    admitted_checks: u64,
}

/// Runs the sequence of `seed` against a fresh fleet on `store`, partition `user`.
async fn run(store: &mut Store, seed: u64, user: &str) -> Result<Outcome, String> {
    let (specs, ops) = sequence(seed, store.is_single());
    let start = store.now_us();
    let mut ledgers: Vec<Ledger> = specs.iter().map(|s| Ledger::new(*s, start)).collect();
    let mut fleet = Fleet::start(store, DAEMONS, &policy_file(&ledgers)).await;
    let mut answers: BTreeMap<&'static str, Answers> = BTreeMap::new();
    let body = |route: Route| json!({"descriptors": {"route": route.name(), "user": user}});
    let mut admitted_checks = 0;
    let mut tally = |op: &'static str, got: Answers, route: Route, ledgers: &mut [Ledger]| {
        for &p in route.policies() {
            ledgers[p].admit(got.admitted);
        }
        if std::env::var_os("SLUICE_LEASE_SIM_VERBOSE").is_some() {
            eprintln!("  {op} {route:?}: {got:?}");
        }
        let entry = answers.entry(op).or_default();
        entry.admitted += got.admitted;
        entry.denied += got.denied;
        entry.unavailable += got.unavailable;
        got.admitted
    };
    let mut primed = Primed::default();
    for op in &ops {
        // A change or a fault meets leases in hand: a short burst through every daemon just
        // before it (the partition busy enough for takes), then a look at what is held.
        if std::env::var_os("SLUICE_LEASE_SIM_VERBOSE").is_some() {
            eprintln!("{op:?}");
        }
        if let Some(route) = op.primes() {
            let (via, checked): (Vec<usize>, _) = ((0..DAEMONS).collect(), body(route));
            let got = fleet.burst(&via, 1, 15, &checked, 1).await;
            admitted_checks += tally("prime", got, route, &mut ledgers);
            tokio::time::sleep(Duration::from_millis(110)).await;
            let mut held = 0.0;
            for &p in route.policies() {
                held += fleet.held(NAMES[p]).await;
            }
            primed.note(op.name(), held > 0.0);
        }
        match op {
            Op::Burst {
                route,
                via,
                clients,
                checks,
                cost,
            } => {
                let got = fleet
                    .burst(via, *clients, *checks, &body(*route), *cost)
                    .await;
                admitted_checks += tally("burst", got, *route, &mut ledgers) / cost;
            }
            Op::Reload {
                policy,
                change,
                drain,
            } => {
                let next = change.apply(&ledgers[*policy].spec);
                let before = store.now_us();
                let mut file_ledgers = ledgers.clone();
                file_ledgers[*policy].spec = next;
                fleet.reload(&policy_file(&file_ledgers)).await;
                ledgers[*policy].reload(next, before, store.now_us());
                let route = route_of(*policy);
                let got = at_once(&fleet, &body(route), *drain).await;
                admitted_checks += tally("after", got, route, &mut ledgers);
            }
            Op::Stop { daemon, graceful } => fleet.restart(*daemon, *graceful).await,
            Op::Reset { policy, via, drain } => {
                let before = store.now_us();
                let route = route_of(*policy);
                fleet.reset(*via, NAMES[*policy], route.name(), user).await;
                // The announcement reaches the other pods (loopback pub/sub) well within this;
                // the checks start while a lease that outlived the reset would still be in use
                // (`idle`), so such a lease shows as over-admission.
                tokio::time::sleep(ANNOUNCED).await;
                ledgers[*policy].fresh(before, store.now_us(), "reset");
                let got = at_once(&fleet, &body(route), *drain).await;
                admitted_checks += tally("after", got, route, &mut ledgers);
            }
            Op::Pause { ms, route } => {
                store.single().signal("STOP");
                let (via, checked): (Vec<usize>, _) = ((0..DAEMONS).collect(), body(*route));
                let (got, ()) = tokio::join!(fleet.burst(&via, 1, 10, &checked, 1), async {
                    tokio::time::sleep(Duration::from_millis(*ms)).await;
                    store.single().signal("CONT");
                });
                admitted_checks += tally("pause", got, *route, &mut ledgers);
                fleet.reach_store().await;
            }
            Op::DataLoss { route } => {
                let before = store.now_us();
                let server = store.single();
                server.kill();
                let _ = std::fs::remove_file(server.dir().join("dump.rdb"));
                let via: Vec<usize> = (0..DAEMONS).collect();
                let got = fleet.burst(&via, 1, 10, &body(*route), 1).await;
                admitted_checks += tally("down", got, *route, &mut ledgers);
                tokio::task::block_in_place(|| store.single().restart());
                fleet.reach_store().await;
                fleet
                    .settle(&NAMES, "a data loss")
                    .await
                    .map_err(|why| failure(seed, &ops, &why, &fleet))?;
                let after = store.now_us();
                for ledger in &mut ledgers {
                    ledger.fresh(before, after, "data loss");
                }
            }
        }
    }
    // The end: leases given back (idle), then the last units drained through every daemon.
    fleet
        .settle(&NAMES, "idle leases given back")
        .await
        .map_err(|why| failure(seed, &ops, &why, &fleet))?;
    tokio::time::sleep(IDLE + Duration::from_millis(100)).await;
    for route in [Route::Solo, Route::Group] {
        let got = at_once(&fleet, &body(route), true).await;
        admitted_checks += tally("drain", got, route, &mut ledgers);
    }
    let leased_checks = fleet.metric("sluice_lease_checks_total", &[]).await;
    let end = store.now_us();
    let mut accounts = Vec::new();
    let mut over = Vec::new();
    for (at, ledger) in ledgers.into_iter().enumerate() {
        for closed in ledger.finish(end) {
            if closed.used > 1.0 {
                over.push(format!(
                    "{} (account opened by {}): {}",
                    NAMES[at], closed.opened_by, closed.text
                ));
            }
            accounts.push((at, closed));
        }
    }
    if !over.is_empty() {
        let why = format!("over-admission: {}", over.join("; "));
        return Err(failure(seed, &ops, &why, &fleet));
    }
    Ok(Outcome {
        accounts,
        answers,
        primed,
        leased_checks,
        admitted_checks,
    })
}

fn failure(seed: u64, ops: &[Op], why: &str, fleet: &Fleet) -> String {
    let (specs, _) = sequence(seed, true);
    format!(
        "lease simulator, seed {seed} (replay: SLUICE_LEASE_SIM_SEED={seed} \
         SLUICE_LEASE_SIM_CASES=1): {why}\npolicies at the start: {specs:?}\noperations:\n  {}\n\
         daemon logs:{}",
        ops.iter()
            .map(|op| format!("{op:?}"))
            .collect::<Vec<_>>()
            .join("\n  "),
        fleet.logs()
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs [`cases`] sequences on `store`, printing each one's figures and a summary.
fn simulate(label: &str, mut store: Store) {
    let rt = runtime();
    let started = Instant::now();
    let budget = if cases() <= 8 {
        Duration::from_secs(80)
    } else {
        Duration::from_secs(3600)
    };
    let (mut ran, mut skipped) = (0, 0);
    let mut last_use: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut opened: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut leased, mut admitted) = (0.0, 0);
    let mut primed = Primed::default();
    for i in 0..cases() {
        if started.elapsed() > budget {
            skipped += 1;
            continue;
        }
        let seed = base_seed().wrapping_add(i);
        let user = format!("{label}-{seed}");
        let outcome = rt
            .block_on(run(&mut store, seed, &user))
            .unwrap_or_else(|why| panic!("{label}: {why}"));
        ran += 1;
        leased += outcome.leased_checks;
        primed.add(&outcome.primed);
        admitted += outcome.admitted_checks;
        let mut line = Vec::new();
        for (at, closed) in &outcome.accounts {
            *opened.entry(closed.opened_by).or_default() += 1;
            line.push(format!(
                "{} [{}] {:.0}%",
                NAMES[*at],
                closed.opened_by,
                closed.used * 100.0
            ));
        }
        // Each route's last accounts ended drained: how much of its bound the binding policy
        // (the one most used: a group is held by its tighter member) reached.
        for route in [Route::Solo, Route::Group] {
            let last = route
                .policies()
                .iter()
                .filter_map(|&at| outcome.accounts.iter().rev().find(|(p, _)| *p == at));
            let Some((_, binding)) = last.max_by(|a, b| a.1.used.total_cmp(&b.1.used)) else {
                continue;
            };
            let kind = if binding.text.starts_with("fixed") {
                "fixed_window"
            } else {
                "token_bucket"
            };
            last_use.entry(kind).or_default().push(binding.used);
        }
        eprintln!(
            "lease sim {label} seed {seed}: answers {:?}; accounts (use of the bound): {}",
            outcome.answers,
            line.join(", ")
        );
    }
    let summary: Vec<String> = last_use
        .iter()
        .map(|(kind, uses)| {
            let min = uses.iter().copied().fold(f64::MAX, f64::min);
            let mean = uses.iter().sum::<f64>() / uses.len() as f64;
            format!(
                "{kind}: {} drained accounts, use of the bound min {:.1}% mean {:.1}%",
                uses.len(),
                min * 100.0,
                mean * 100.0
            )
        })
        .collect();
    eprintln!(
        "lease sim {label}: {ran} sequences ({skipped} not started: time budget), {:.1?}; \
         accounts opened by {opened:?}; changes and faults that met leases in hand (of all) \
         {:?}; {admitted} checks admitted, {leased} from leases (daemons' counts since their \
         last start); drained: {}",
        started.elapsed(),
        primed.0,
        summary.join("; ")
    );
}

#[test]
fn leases_never_over_admit_through_changes_on_single_redis() {
    simulate("single", Store::Single(RedisServer::start()));
}

#[test]
fn leases_never_over_admit_through_changes_on_a_redis_cluster() {
    simulate("cluster", Store::Cluster(RedisCluster::start()));
}

#[test]
fn leases_never_over_admit_through_changes_on_redis_6_2() {
    if let Some(binary) = crate::store_binaries::redis_6_2() {
        simulate("redis-6.2", Store::Single(RedisServer::start_from(&binary)));
    }
}

#[test]
fn leases_never_over_admit_through_changes_on_valkey_9() {
    if let Some(binary) = crate::store_binaries::valkey_9() {
        simulate("valkey-9", Store::Single(RedisServer::start_from(&binary)));
    }
}

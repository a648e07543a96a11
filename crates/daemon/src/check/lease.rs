//! Quota leases in the check path: for policies with `lease: true` on a shared store, this pod
//! takes blocks of units from a partition's counter ([`RateStore::take`]: spent there before a
//! single one is admitted) and admits checks from them with no round trip, until they are used,
//! expire under the grant's terms ([`Grant`]) or are given back.
//!
//! - **When**: a partition this pod checks at least `leases.min_units` units a second. A take
//!   runs in the background while checks go on (to the store while no lease covers them): a
//!   check never waits for a take. The next take starts when the lease is half used, so a busy
//!   partition never runs dry while the counter has room.
//! - **How much**: this pod's last second of demand times `leases.span`, within
//!   `leases.min_units..=leases.max_units`; the counter grants at most `1/leases.fraction` of
//!   what it has left, so near the limit grants are 0 and every check is decided at the counter,
//!   exactly as without leases.
//! - **Exact**: a check is admitted from a lease only if every one of its counters (every policy
//!   and window) has the units, all consumed together. A fixed window's units are admitted only
//!   until the window ends (measured from before the take was sent); a token bucket's lease
//!   shrinks at the refill rate past its hold ([`bucket_lease_shrunk`]), measured the same way.
//! - **Given back** ([`RateStore::give_back`], which measures what is left on the counter's
//!   clock): when unused for `leases.idle`, when the policy changes (a reload), at shutdown.
//!   A reset of the partition (here or on another pod) drops the lease without giving it back,
//!   and the grant of a take that was out meanwhile (it may come from the forgotten counter).
//! - **Answers**: an admission from a lease is `enforced` (the store counted the units at the
//!   take); its `remaining` is what this pod's lease still holds, a floor of what is left.
//! - **Over the limit** ([`starved`]): once a take finds the counter unable to admit a single
//!   unit, the pod denies what its lease cannot cover here and takes the refill in blocks,
//!   paced, instead of asking the counter per check.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::LeaseSettings;
use crate::limit::{bucket_lease_shrunk, Algorithm, Decision, Grant, Key, PolicySet};
use crate::store::{RateStore, StoreCheck};

use starved::{Starved, STARVED_FRACTION};

mod starved;

/// Shards of the lease table (a power of two).
const SHARDS: usize = 16;
/// Most leases held per partition: the one in use and the next one taken before it runs out.
const HELD: usize = 2;
/// How often idle leases are given back and the held gauge refreshed.
const SWEEP: Duration = Duration::from_millis(100);
/// After a take that granted nothing (near the limit), no take for this long.
const QUIET_EMPTY: Duration = Duration::from_millis(100);
/// The first and the longest wait after a lease that mostly went unused.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// After a take that failed, no take for this long (the check path reports store failures).
const QUIET_FAILED: Duration = Duration::from_secs(1);

/// Where the lease bookkeeping reads the time (a test steps it by hand).
type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// What this pod's leases make of one request ([`Leases::admit`]).
#[derive(Debug)]
pub enum Leased {
    /// Admitted from the leases: each counter's decision, in order.
    Admitted(Vec<Decision>),
    /// Denied here: the counters that are over their limit on this pod ([`starved`]) and
    /// cannot cover the cost, each with its index in the request and its answer.
    Denied(Vec<(usize, Decision)>),
}

/// The lease metrics.
#[derive(Clone)]
struct LeaseMetrics {
    /// `sluice_lease_takes_total{policy,outcome}`: `granted`, `empty`, `failed`, `stale`.
    takes: IntCounterVec,
    /// `sluice_lease_units_total{policy,fate}`: `taken`, `admitted`, `returned`, `expired`,
    /// `refilled`, `dropped`.
    units: IntCounterVec,
    /// `sluice_lease_checks_total{policy}`: checks admitted from a lease.
    checks: IntCounterVec,
    /// `sluice_lease_units_held{policy}`: units this pod holds (what a crash would take along).
    held: IntGaugeVec,
    /// `sluice_lease_denials_total{policy}`: checks denied here, the partition over its limit.
    denials: IntCounterVec,
}

impl LeaseMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let takes = IntCounterVec::new(
            Opts::new(
                "sluice_lease_takes_total",
                "Lease takes by outcome: granted, empty (the counter was near its limit), failed, stale (the policy changed meanwhile: given back; the counter was reset meanwhile: dropped)",
            ),
            &["policy", "outcome"],
        )?;
        let units = IntCounterVec::new(
            Opts::new(
                "sluice_lease_units_total",
                "Leased units by fate: taken, admitted, returned, expired (a fixed window ended before they were used: under-admission), refilled (a token bucket refilled them), dropped (a reset, or a give-back that failed: under-admission)",
            ),
            &["policy", "fate"],
        )?;
        let checks = IntCounterVec::new(
            Opts::new(
                "sluice_lease_checks_total",
                "Checks admitted from a lease, without a store round trip",
            ),
            &["policy"],
        )?;
        let held = IntGaugeVec::new(
            Opts::new(
                "sluice_lease_units_held",
                "Leased units this pod holds and may still admit (a pod that dies takes them along: under-admission until they expire)",
            ),
            &["policy"],
        )?;
        let denials = IntCounterVec::new(
            Opts::new(
                "sluice_lease_denials_total",
                "Checks denied without a store round trip: the leased partition is over its limit on this pod and its lease is used up until the next block is due",
            ),
            &["policy"],
        )?;
        registry.register(Box::new(denials.clone()))?;
        registry.register(Box::new(takes.clone()))?;
        registry.register(Box::new(units.clone()))?;
        registry.register(Box::new(checks.clone()))?;
        registry.register(Box::new(held.clone()))?;
        Ok(Self {
            takes,
            units,
            checks,
            held,
            denials,
        })
    }

    fn units(&self, key: &Key, fate: &str, n: u64) {
        if n > 0 {
            self.units
                .with_label_values(&[key.policy_name(), fate])
                .inc_by(n);
        }
    }
}

/// One grant this pod holds.
struct Held {
    grant: Grant,
    /// When the take was sent: the grant's terms are measured from here (never later than the
    /// counter's own `now`).
    sent: Instant,
    /// Units admitted from it.
    used: u64,
}

impl Held {
    /// Units still admissible at `now` under the grant's terms.
    fn available(&self, algorithm: &Algorithm, now: Instant) -> u64 {
        let left = self.grant.units.saturating_sub(self.used);
        left.saturating_sub(self.lost(algorithm, now))
    }

    /// Units the grant's terms took away by `now`: a fixed window's all once it ended, a token
    /// bucket's those refilled.
    fn lost(&self, algorithm: &Algorithm, now: Instant) -> u64 {
        let elapsed = micros(now.saturating_duration_since(self.sent));
        match algorithm {
            Algorithm::TokenBucket(bucket) => {
                bucket_lease_shrunk(bucket, self.grant.hold_us, elapsed, self.grant.units)
            }
            Algorithm::FixedWindow(_) if elapsed < self.grant.hold_us => 0,
            _ => self.grant.units,
        }
    }

    /// The time until the counter is whole again, as the take saw it, less what has passed.
    fn reset_after_us(&self, algorithm: &Algorithm, now: Instant) -> u64 {
        let elapsed = micros(now.saturating_duration_since(self.sent));
        match algorithm {
            Algorithm::FixedWindow(_) => self.grant.hold_us.saturating_sub(elapsed),
            _ => self.grant.decision.reset_after_us.saturating_sub(elapsed),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Units this pod checked in the current and the last second.
struct Demand {
    since: Instant,
    this: u64,
    last: u64,
}

impl Demand {
    fn note(&mut self, now: Instant, units: u64) {
        let age = now.saturating_duration_since(self.since);
        if age >= Duration::from_secs(1) {
            self.last = if age < Duration::from_secs(2) {
                self.this
            } else {
                0
            };
            self.this = 0;
            self.since = now;
        }
        self.this = self.this.saturating_add(units);
    }

    fn per_second(&self) -> u64 {
        self.this.max(self.last)
    }
}

/// One partition's lease bookkeeping.
struct Entry {
    /// The policy revision and quota the leases were taken under.
    revision: u64,
    algorithm: Algorithm,
    held: VecDeque<Held>,
    taking: bool,
    quiet_until: Option<Instant>,
    /// After leases that mostly went unused (a token bucket's shrank away: the bucket refilled
    /// faster than this pod used them), how long to wait before the next take; doubles per
    /// such lease, back to none after a lease used whole.
    backoff: Duration,
    demand: Demand,
    last_use: Instant,
    /// Resets of the counter this pod heard of: a take sent before one may have run on the
    /// counter the reset forgot, so its grant is dropped.
    resets: u64,
    /// Over its limit on this pod: checks the lease cannot cover are denied here.
    starved: Option<Starved>,
}

impl Entry {
    fn new(check: &StoreCheck, now: Instant) -> Self {
        Self {
            revision: check.generation,
            algorithm: check.algorithm,
            held: VecDeque::with_capacity(HELD),
            taking: false,
            quiet_until: None,
            backoff: Duration::ZERO,
            demand: Demand {
                since: now,
                this: 0,
                last: 0,
            },
            last_use: now,
            resets: 0,
            starved: None,
        }
    }

    fn available(&self, now: Instant) -> u64 {
        self.held
            .iter()
            .map(|held| held.available(&self.algorithm, now))
            .sum()
    }

    /// Takes out the grants with nothing left to admit: a fixed window's that ended (what was
    /// not used is counted `expired`), a token bucket's that shrank to nothing here, whose
    /// unused part goes back (the counter measures what it still holds exactly: a fraction of
    /// a token the rounding here took away).
    fn drop_spent(&mut self, key: &Key, now: Instant, metrics: &LeaseMetrics, jobs: &mut Vec<Job>) {
        while let Some(front) = self.held.front() {
            if front.available(&self.algorithm, now) > 0 {
                break;
            }
            let Some(held) = self.held.pop_front() else {
                break;
            };
            let unused = held.grant.units.saturating_sub(held.used);
            // A lease mostly wasted (a warm key's token bucket lease shrinks away within
            // milliseconds) costs a take and a give-back for a few checks: back off.
            if held.used.saturating_mul(2) < held.grant.units && self.starved.is_none() {
                self.backoff = (self.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
                self.quiet_until = Some(now + self.backoff);
            } else {
                self.backoff = Duration::ZERO;
            }
            match self.algorithm {
                Algorithm::TokenBucket(_) if unused > 0 => {
                    let check = StoreCheck {
                        key: key.clone(),
                        algorithm: self.algorithm,
                        cost: 0,
                        enforce: true,
                        generation: self.revision,
                    };
                    jobs.push(Job::GiveBack(check, held));
                }
                _ => metrics.units(key, "expired", unused),
            }
        }
    }
}

/// A give-back or take to run once the table's locks are released.
enum Job {
    /// A take, the resets its entry had heard of when it was sent, and its fraction.
    Take(StoreCheck, u64, u64),
    GiveBack(StoreCheck, Held),
}

struct Inner {
    store: Arc<dyn RateStore>,
    shards: Box<[Mutex<HashMap<Key, Entry>>]>,
    hasher: RandomState,
    settings: LeaseSettings,
    metrics: LeaseMetrics,
    tasks: TaskTracker,
    /// Units being given back, per policy: still held until the store has them.
    returning: Mutex<HashMap<Arc<str>, u64>>,
    now: Now,
}

/// This pod's quota leases (see the module documentation).
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Inner>,
}

impl Leases {
    /// Leases on `store`'s counters, sized by `settings`, counted in `registry`.
    pub fn new(
        store: Arc<dyn RateStore>,
        settings: LeaseSettings,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        Self::with_clock(store, settings, registry, Arc::new(Instant::now))
    }

    /// As [`Leases::new`], reading the time from `now`.
    fn with_clock(
        store: Arc<dyn RateStore>,
        settings: LeaseSettings,
        registry: &Registry,
        now: Now,
    ) -> prometheus::Result<Self> {
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: RandomState::new(),
                settings,
                metrics: LeaseMetrics::register(registry)?,
                tasks: TaskTracker::new(),
                returning: Mutex::default(),
                now,
            }),
        })
    }

    /// Leases whose clock a test steps by hand.
    #[cfg(test)]
    pub(super) fn with_test_clock(
        store: Arc<dyn RateStore>,
        settings: LeaseSettings,
        registry: &Registry,
        now: impl Fn() -> Instant + Send + Sync + 'static,
    ) -> Self {
        Self::with_clock(store, settings, registry, Arc::new(now)).expect("metrics")
    }

    fn now(&self) -> Instant {
        (self.inner.now)()
    }

    /// How long a lease may sit unused before it is given back (`leases.idle`).
    pub fn idle(&self) -> Duration {
        self.inner.settings.idle.as_std()
    }

    fn shard_of(&self, key: &Key) -> usize {
        usize::try_from(self.inner.hasher.hash_one(key)).unwrap_or(0) % SHARDS
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // Updates are single assignments: a panic cannot leave an entry half-changed.
        self.inner.shards[shard]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits `checks` (one request's counters, every one leasable and enforced) from this
    /// pod's leases if every one has the units, consuming them all; else denies them here if a
    /// counter the leases cannot cover is over its limit on this pod ([`starved`]), consuming
    /// nothing; `None` otherwise (the store decides). Either way, starts takes where a lease
    /// runs low or a block is due.
    pub fn admit(&self, checks: &[StoreCheck]) -> Option<Leased> {
        let now = self.now();
        // Each check's shard, locked in index order (no deadlock with a concurrent group).
        let shards: Vec<usize> = checks.iter().map(|c| self.shard_of(&c.key)).collect();
        let mut order = shards.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<_> = order.iter().map(|&shard| self.lock(shard)).collect();
        let guard: Vec<usize> = shards
            .iter()
            .map(|shard| order.binary_search(shard).unwrap_or(0))
            .collect();
        let per_shard = self.inner.settings.max_keys.div_ceil(SHARDS);
        let mut jobs = Vec::new();
        let mut covered = true;
        for (at, check) in checks.iter().enumerate() {
            let table = &mut guards[guard[at]];
            let full = table.len() >= per_shard;
            let entry = match table.get_mut(&check.key) {
                Some(entry) => entry,
                None if full => {
                    covered = false;
                    continue;
                }
                None => table
                    .entry(check.key.clone())
                    .or_insert_with(|| Entry::new(check, now)),
            };
            if entry.revision != check.generation || entry.algorithm != check.algorithm {
                if check.generation < entry.revision {
                    // Planned before a reload that changed the policy: the store decides (and
                    // answers it superseded if the new revision already wrote).
                    covered = false;
                    continue;
                }
                self.retire(&check.key, entry, &mut jobs);
                entry.revision = check.generation;
                entry.algorithm = check.algorithm;
            }
            entry.demand.note(now, check.cost);
            entry.last_use = now;
            entry.drop_spent(&check.key, now, &self.inner.metrics, &mut jobs);
            if entry.available(now) < check.cost {
                covered = false;
            }
        }
        let decisions = covered.then(|| {
            checks
                .iter()
                .enumerate()
                .map(|(at, check)| {
                    let table = &mut guards[guard[at]];
                    let entry = table.get_mut(&check.key).expect("covered above");
                    let mut need = check.cost;
                    for held in entry.held.iter_mut() {
                        let spend = need.min(held.available(&entry.algorithm, now));
                        held.used += spend;
                        need -= spend;
                    }
                    self.inner.metrics.units(&check.key, "admitted", check.cost);
                    let newest = entry.held.back();
                    Decision {
                        allowed: true,
                        limit: entry.algorithm.limit(),
                        remaining: entry.available(now),
                        reset_after_us: newest
                            .map_or(0, |held| held.reset_after_us(&entry.algorithm, now)),
                        retry_after_us: 0,
                    }
                })
                .collect::<Vec<_>>()
        });
        let mut denials = Vec::new();
        for (at, check) in checks.iter().enumerate() {
            if let Some(entry) = guards[guard[at]].get_mut(&check.key) {
                if check.generation == entry.revision {
                    self.maybe_take(check, entry, now, &mut jobs);
                    // Over its limit here: denied until the next block, or while it is out.
                    let starved = entry.starved.filter(|s| now < s.next || entry.taking);
                    if let Some(starved) = starved.filter(|_| decisions.is_none()) {
                        if entry.available(now) < check.cost {
                            denials.push((at, starved.denial(&entry.algorithm, now)));
                        }
                    }
                }
            }
        }
        drop(guards);
        let metrics = &self.inner.metrics;
        for &(at, _) in &denials {
            let policy = checks[at].key.policy_name();
            metrics.denials.with_label_values(&[policy]).inc();
        }
        if let Some(first) = checks.first().filter(|_| decisions.is_some()) {
            metrics
                .checks
                .with_label_values(&[first.key.policy_name()])
                .inc();
        }
        self.run(jobs);
        match decisions {
            Some(decisions) => Some(Leased::Admitted(decisions)),
            None if !denials.is_empty() => Some(Leased::Denied(denials)),
            None => None,
        }
    }

    /// Starts a take for `entry` if its lease is below half of what a take would ask for, none
    /// is in flight, and the partition is busy enough.
    fn maybe_take(&self, check: &StoreCheck, entry: &mut Entry, now: Instant, jobs: &mut Vec<Job>) {
        let settings = &self.inner.settings;
        let demand = entry.demand.per_second();
        // A starved partition's blocks are paced by its own clock, not by a backoff.
        let quiet = match entry.starved {
            Some(starved) => now < starved.next,
            None => entry.quiet_until.is_some_and(|until| now < until),
        };
        if entry.taking || entry.held.len() >= HELD || demand < settings.min_units || quiet {
            return;
        }
        let span = u128::from(settings.span.0);
        let want = u128::from(demand) * span / 1_000_000;
        let mut want = u64::try_from(want).unwrap_or(u64::MAX);
        let mut fraction = settings.fraction;
        if let Some(starved) = entry.starved {
            fraction = STARVED_FRACTION;
            if matches!(entry.algorithm, Algorithm::TokenBucket(_)) {
                want = starved.want(demand);
            }
        }
        let want = want.clamp(settings.min_units, settings.max_units);
        if entry.available(now) > want / 2 {
            return;
        }
        entry.taking = true;
        jobs.push(Job::Take(
            StoreCheck {
                cost: want,
                ..check.clone()
            },
            entry.resets,
            fraction,
        ));
    }

    /// Moves `entry`'s grants into give-backs.
    fn retire(&self, key: &Key, entry: &mut Entry, jobs: &mut Vec<Job>) {
        entry.starved = None;
        for held in entry.held.drain(..) {
            let check = StoreCheck {
                key: key.clone(),
                algorithm: entry.algorithm,
                cost: 0,
                enforce: true,
                generation: entry.revision,
            };
            jobs.push(Job::GiveBack(check, held));
        }
    }

    fn run(&self, jobs: Vec<Job>) {
        for job in jobs {
            let leases = self.clone();
            match job {
                Job::Take(check, resets, fraction) => {
                    self.inner
                        .tasks
                        .spawn(async move { leases.take(check, resets, fraction).await });
                }
                Job::GiveBack(check, held) => {
                    self.returning(&check.key, held.grant.units.saturating_sub(held.used), true);
                    self.inner
                        .tasks
                        .spawn(async move { leases.give_back(check, held).await });
                }
            }
        }
    }

    async fn take(&self, check: StoreCheck, resets: u64, fraction: u64) {
        let sent = self.now();
        let taken = self.inner.store.take(&check, fraction, None).await;
        let metrics = &self.inner.metrics;
        let policy = check.key.policy_name();
        let mut jobs = Vec::new();
        {
            let mut table = self.lock(self.shard_of(&check.key));
            let entry = table.get_mut(&check.key);
            let current = entry
                .as_ref()
                .is_some_and(|e| e.revision == check.generation && e.algorithm == check.algorithm);
            let reset = entry.as_ref().is_some_and(|e| e.resets != resets);
            let now = self.now();
            let idle = self.inner.settings.idle.as_std();
            let jitter = self.inner.hasher.hash_one(sent);
            match (entry, taken) {
                // The counter was reset while the take was out: its units may belong to the
                // counter the reset forgot (admitting them would add to a fresh quota) and
                // giving them back could take from the new one: dropped (under-admission).
                (Some(entry), Ok(Some(grant))) if reset && grant.units > 0 => {
                    entry.taking = false;
                    metrics.takes.with_label_values(&[policy, "stale"]).inc();
                    metrics.units(&check.key, "taken", grant.units);
                    metrics.units(&check.key, "dropped", grant.units);
                }
                (Some(entry), Ok(Some(grant))) if current && grant.units > 0 => {
                    entry.taking = false;
                    metrics.takes.with_label_values(&[policy, "granted"]).inc();
                    metrics.units(&check.key, "taken", grant.units);
                    // A starved bucket stays starved until a block is all it asked for (a
                    // window's units are a new window's); a bucket starves once a block is
                    // short and lasts this pod less than the pace of blocks.
                    let bucket = matches!(entry.algorithm, Algorithm::TokenBucket(_));
                    let short = bucket
                        && grant.units < check.cost
                        && (entry.starved.is_some()
                            || starved::outpaced(
                                &entry.algorithm,
                                grant.units,
                                entry.demand.per_second(),
                            ));
                    entry.starved = short
                        .then(|| {
                            let (decision, hold) = (&grant.decision, grant.hold_us);
                            Starved::after(&entry.algorithm, decision, hold, sent, idle, jitter)
                        })
                        .flatten();
                    entry.held.push_back(Held {
                        grant,
                        sent,
                        used: 0,
                    });
                    entry.drop_spent(&check.key, now, metrics, &mut jobs);
                }
                (entry, Ok(Some(grant))) if grant.units > 0 => {
                    if let Some(entry) = entry {
                        entry.taking = false;
                    }
                    metrics.takes.with_label_values(&[policy, "stale"]).inc();
                    metrics.units(&check.key, "taken", grant.units);
                    let held = Held {
                        grant,
                        sent,
                        used: 0,
                    };
                    jobs.push(Job::GiveBack(check.clone(), held));
                }
                (Some(entry), Ok(Some(grant))) if current && !reset => {
                    metrics.takes.with_label_values(&[policy, "empty"]).inc();
                    entry.taking = false;
                    // Not a single unit left for a check: over the limit (see `starved`).
                    // A few left: decided per check (a store's denial of the last one starves).
                    let starve = entry.starved.is_some() || !grant.decision.allowed;
                    let (decision, hold) = (&grant.decision, grant.hold_us);
                    entry.starved = starve
                        .then(|| {
                            Starved::after(&entry.algorithm, decision, hold, sent, idle, jitter)
                        })
                        .flatten();
                    if entry.starved.is_none() {
                        // A bucket's next take once `fraction` units could have refilled: a
                        // counter a busy fleet keeps near empty soon shows it can admit none.
                        let refill = match entry.algorithm {
                            Algorithm::TokenBucket(bucket) if starved::paced(&bucket) => {
                                Duration::from_micros(
                                    fraction
                                        .saturating_sub(grant.decision.remaining)
                                        .saturating_mul(bucket.period_us() / bucket.limit().max(1)),
                                )
                            }
                            _ => QUIET_EMPTY,
                        };
                        entry.quiet_until = Some(now + refill.min(QUIET_EMPTY));
                    }
                }
                (entry, Ok(_)) => {
                    metrics.takes.with_label_values(&[policy, "empty"]).inc();
                    if let Some(entry) = entry {
                        entry.taking = false;
                        entry.quiet_until = Some(now + QUIET_EMPTY);
                    }
                }
                (entry, Err(error)) => {
                    tracing::debug!(%error, "lease take failed");
                    metrics.takes.with_label_values(&[policy, "failed"]).inc();
                    if let Some(entry) = entry {
                        entry.taking = false;
                        entry.starved = None;
                        entry.quiet_until = Some(now + QUIET_FAILED);
                    }
                }
            }
        }
        self.run(jobs);
    }

    /// The store denied `check` (no lease covered it) with `decision`: if the counter could not
    /// admit a single unit and this pod checks the partition often enough to lease it, the
    /// partition is over its limit here ([`starved`]). A denial asked before a reset this pod
    /// has just heard of may start it again: at worst until the next block is due.
    pub fn denied(&self, check: &StoreCheck, decision: &Decision) {
        if decision.allowed || decision.remaining > 0 {
            return;
        }
        let now = self.now();
        let idle = self.inner.settings.idle.as_std();
        let mut table = self.lock(self.shard_of(&check.key));
        let Some(entry) = table.get_mut(&check.key) else {
            return;
        };
        if entry.revision != check.generation
            || entry.algorithm != check.algorithm
            || entry.starved.is_some()
            || entry.demand.per_second() < self.inner.settings.min_units
        {
            return;
        }
        // A window's units come back when it ends: its denial's wait.
        let hold = decision.retry_after_us;
        let jitter = self.inner.hasher.hash_one(now);
        entry.starved = Starved::after(&entry.algorithm, decision, hold, now, idle, jitter);
    }

    /// Counts `units` of `key`'s policy as being given back (`add`), or as given back.
    fn returning(&self, key: &Key, units: u64, add: bool) {
        let mut returning = self
            .inner
            .returning
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = returning.entry(Arc::clone(key.policy_name())).or_default();
        *count = if add {
            count.saturating_add(units)
        } else {
            count.saturating_sub(units)
        };
    }

    async fn give_back(&self, check: StoreCheck, held: Held) {
        let unused = held.grant.units.saturating_sub(held.used);
        self.give_back_unused(&check, unused, held).await;
        self.returning(&check.key, unused, false);
    }

    async fn give_back_unused(&self, check: &StoreCheck, unused: u64, held: Held) {
        if unused == 0 {
            return;
        }
        let metrics = &self.inner.metrics;
        match self
            .inner
            .store
            .give_back(check, unused, held.grant, None)
            .await
        {
            Ok(back) => {
                metrics.units(&check.key, "returned", back);
                let fate = match check.algorithm {
                    Algorithm::TokenBucket(_) => "refilled",
                    _ => "expired",
                };
                metrics.units(&check.key, fate, unused.saturating_sub(back));
            }
            Err(error) => {
                tracing::debug!(%error, "lease give-back failed");
                metrics.units(&check.key, "dropped", unused);
            }
        }
    }

    /// Makes every lease series of the policies with `lease: true` exist from the start (at 0),
    /// so that dashboards and `rate()` see them before the first lease.
    pub fn register(&self, policies: &PolicySet) {
        let metrics = &self.inner.metrics;
        for policy in policies.iter().filter(|p| p.lease()) {
            let name = policy.name();
            metrics.checks.with_label_values(&[name]);
            metrics.denials.with_label_values(&[name]);
            metrics.held.with_label_values(&[name]);
            for fate in [
                "taken", "admitted", "returned", "expired", "refilled", "dropped",
            ] {
                metrics.units.with_label_values(&[name, fate]);
            }
            for outcome in ["granted", "empty", "failed", "stale"] {
                metrics.takes.with_label_values(&[name, outcome]);
            }
        }
    }

    /// Gives back the leases of policies `policies` changed (a reload): checks of the new
    /// revision take their own; checks planned before it go to the store.
    pub fn retire_changed(&self, policies: &PolicySet) {
        let mut jobs = Vec::new();
        for shard in 0..SHARDS {
            let mut table = self.lock(shard);
            for (key, entry) in table.iter_mut() {
                let revision = policies.revision(key.policy_name());
                let gone = policies.get(key.policy_name()).is_none();
                if revision != entry.revision || gone {
                    self.retire(key, entry, &mut jobs);
                    entry.revision = revision;
                }
            }
        }
        self.run(jobs);
    }

    /// Drops the lease of `key` without giving it back: its counter was reset.
    pub fn forget(&self, key: &Key) {
        if let Some(entry) = self.lock(self.shard_of(key)).get_mut(key) {
            entry.resets = entry.resets.wrapping_add(1);
            entry.starved = None;
            let dropped: u64 = entry.held.drain(..).map(|h| h.grant.units - h.used).sum();
            self.inner.metrics.units(key, "dropped", dropped);
        }
    }

    /// Drops every lease without giving it back (resets may have been missed).
    pub fn clear(&self) {
        for shard in 0..SHARDS {
            for (key, entry) in self.lock(shard).iter_mut() {
                entry.resets = entry.resets.wrapping_add(1);
                entry.starved = None;
                let dropped: u64 = entry.held.drain(..).map(|h| h.grant.units - h.used).sum();
                self.inner.metrics.units(key, "dropped", dropped);
            }
        }
    }

    /// Gives back idle leases and forgets idle partitions every [`SWEEP`] until `stop`, then
    /// gives back every lease (bounded by the store's deadline) and waits for the calls.
    pub async fn run_sweeper(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SWEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.sweep(false),
                () = stop.cancelled() => break,
            }
        }
        self.sweep(true);
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// One sweep; `all`: give back every lease (shutdown).
    fn sweep(&self, all: bool) {
        let now = self.now();
        let idle = self.inner.settings.idle.as_std();
        let mut jobs = Vec::new();
        let mut held: HashMap<Arc<str>, u64> = HashMap::new();
        for shard in 0..SHARDS {
            let mut table = self.lock(shard);
            table.retain(|key, entry| {
                entry.drop_spent(key, now, &self.inner.metrics, &mut jobs);
                let unused = now.saturating_duration_since(entry.last_use);
                if all || unused >= idle {
                    self.retire(key, entry, &mut jobs);
                }
                let units = entry.available(now);
                *held.entry(Arc::clone(key.policy_name())).or_default() += units;
                !entry.held.is_empty() || entry.taking || unused < idle * 4
            });
        }
        self.run(jobs);
        let returning = self
            .inner
            .returning
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        for (policy, units) in returning {
            *held.entry(policy).or_default() += units;
        }
        for (policy, units) in held {
            self.inner
                .metrics
                .held
                .with_label_values(&[&*policy])
                .set(i64::try_from(units).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests;

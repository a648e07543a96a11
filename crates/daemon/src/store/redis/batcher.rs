//! Turns concurrent checks into one script call per batch. Callers put a [`Job`] (one check: one
//! or more counters, all or nothing) on a bounded queue; the dispatcher takes whatever is queued
//! (up to `max_batch`) as soon as one of its `in_flight` slots is free, and sends it to Redis as
//! one `EVALSHA` of the batch script: every counter of the batch once in `KEYS`, `TIME` read once,
//! the checks decided in arrival order. No timer (a lone check goes out at once), no task per
//! batch: the dispatcher polls its calls in flight itself, and answers each job on its oneshot.
//!
//! The deadline of a batch counts from when it is written to Redis, not from when its checks were
//! queued: time spent waiting inside sluice (a saturated CPU, a burst) is not a Redis failure and
//! does not turn into failure-mode answers. The breaker counts calls, not checks
//! (`batcher/call.rs`). The queue is bounded, so callers wait (back-pressure).
//! A job whose caller has gone (its request was dropped) is not sent: nothing is spent for it.
//! In a Cluster a batch becomes one call per node or per slot (`batcher/cluster.rs`).
//!
//! A reload can leave a check planned under the old policy set queued behind checks of the new
//! one (it waited for a CPU, or a tenant's tier). The dispatcher takes jobs in queue order, which
//! is the order their calls reach Redis (one connection per node, commands in order), and keeps
//! the newest revision it has sent per policy (`PolicySet::revision`): a job of an older revision
//! of a policy than one already sent is answered superseded (denied, nothing spent, retry at once)
//! without a call, so it never restarts a partition under the old algorithm nor spends under the
//! old quota; one sent before any check of the new set is decided as if the reload came after
//! it, as on the embedded store. Pods reload at different moments: across pods nothing orders
//! them (docs/policies.md).
//!
//! `NOSCRIPT` (Redis restarted, failed over, `SCRIPT FLUSH`, a Cluster node that never saw the
//! script) means the script did not run, so the call is resent once with `EVAL`, which also
//! caches the script. A timeout or a broken connection is never retried: the write may have
//! happened. A key of the wrong type fails only the check that names it.

mod call;
mod cluster;
mod deadline;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::{Histogram, IntCounterVec};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use self::call::{Stalls, Via};
pub(crate) use self::deadline::Excuse;
use super::conn::Conn;
use super::error::ErrorKind;
use super::health::Health;
use super::permissions::AclWatch;
use super::scripts::{Commit, Item, Scripts};
use crate::limit::Decision;
use crate::store::StoreError;
use crate::telemetry::Tracing;

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Most checks in one script call.
    pub max_batch: usize,
    /// Script calls in flight at once.
    pub in_flight: usize,
    /// Checks waiting to be sent, at most.
    pub queue: usize,
}

/// Metrics the batcher keeps.
#[derive(Clone)]
pub struct BatchMetrics {
    /// Checks per script call.
    pub batch_size: Histogram,
    /// Time from writing a call to its reply.
    pub call_duration: Histogram,
    /// Calls by scope (`slot`, `node`).
    pub calls: IntCounterVec,
    /// Errors by kind.
    pub errors: IntCounterVec,
    /// Missed deadlines not taken for Redis's silence, by reason (`batcher/deadline.rs`).
    pub excused: IntCounterVec,
    /// The ACL user's permissions: a refusal at run time is logged there, once per change.
    pub acl: Arc<AclWatch>,
}

impl BatchMetrics {
    fn count(&self, kind: ErrorKind) {
        self.errors.with_label_values(&[kind.as_str()]).inc();
    }

    /// `error`, counted under its kind (a call not made, circuit open, counts nothing).
    fn counted(&self, error: StoreError) -> StoreError {
        if let Some(kind) = error.kind() {
            self.count(kind);
        }
        error
    }
}

/// One decision per item, or why the check could not be decided.
pub type Reply = Result<Vec<Decision>, StoreError>;

/// Where a check was planned: each item's policy and its revision then (see the module header:
/// a job of an older revision of a policy than one already sent is answered superseded).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// Each item's policy and the revision it was planned under, in item order.
    pub policies: Vec<(Arc<str>, u64)>,
}

/// The newest revision sent per policy, kept by the dispatcher alone (no lock: one task).
#[derive(Default)]
struct Sent {
    newest: std::collections::HashMap<Arc<str>, u64>,
}

impl Sent {
    /// Most policies remembered; past it the entries of older revisions go (a check planned
    /// under one of those is then sent, as before this guard).
    const MAX: usize = 4096;

    /// Whether `origin` was planned under an older revision of one of its policies than a check
    /// already sent; if not, records its revisions.
    fn superseded(&mut self, origin: &Origin) -> bool {
        if origin.policies.iter().any(|(policy, revision)| {
            self.newest
                .get(policy)
                .is_some_and(|newest| newest > revision)
        }) {
            return true;
        }
        for (policy, revision) in &origin.policies {
            match self.newest.get_mut(policy) {
                Some(newest) => *newest = (*newest).max(*revision),
                None => {
                    if self.newest.len() >= Self::MAX {
                        let newest = self.newest.values().copied().max().unwrap_or(0);
                        self.newest.retain(|_, revision| *revision >= newest);
                    }
                    self.newest.insert(Arc::clone(policy), *revision);
                }
            }
        }
        false
    }
}

/// One check: its items are decided together, all or nothing (in a Cluster they share a slot).
pub struct Job {
    items: Vec<Item>,
    origin: Origin,
    commit: Commit,
    deadline: Duration,
    reply: oneshot::Sender<Reply>,
    /// The sampled check span it was submitted in (tracing on only).
    trace: Option<opentelemetry::trace::SpanContext>,
}

/// The handle callers submit checks to.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
    tracing: Tracing,
}

/// What the dispatcher shares with its calls.
struct Dispatch {
    scripts: Scripts,
    config: BatchConfig,
    metrics: BatchMetrics,
    health: Arc<Health>,
    /// Replies received so far: a call past its deadline while this moved was delayed by this
    /// daemon, not by Redis.
    progress: AtomicU64,
    /// Missed deadlines, one per stall.
    stalls: Stalls,
    /// A span per call that serves a sampled check.
    tracing: Tracing,
}

impl Batcher {
    /// Starts the dispatcher over the connection published by `conn`; it stops taking batches
    /// when the store is dropped (`alive`).
    pub fn spawn(
        conn: watch::Receiver<Option<Conn>>,
        scripts: Scripts,
        config: BatchConfig,
        metrics: BatchMetrics,
        health: Arc<Health>,
        tracing: Tracing,
        alive: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let dispatch = Dispatch {
            scripts,
            config,
            metrics,
            health,
            progress: AtomicU64::new(0),
            stalls: Stalls::new(),
            tracing: tracing.clone(),
        };
        tokio::spawn(dispatch.run(rx, conn, alive));
        Self { tx, tracing }
    }

    /// Queues a check (waiting while the queue is full); the receiver yields its decisions.
    /// `deadline` bounds the Redis round trip of the call it goes out in.
    pub async fn submit(
        &self,
        items: Vec<Item>,
        origin: Origin,
        commit: impl Into<Commit>,
        deadline: Duration,
    ) -> Result<oneshot::Receiver<Reply>, StoreError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            items,
            origin,
            commit: commit.into(),
            deadline,
            reply,
            trace: self.tracing.current(),
        };
        self.tx
            .send(job)
            .await
            .map_err(|_| StoreError::failed(ErrorKind::Other, "Redis dispatcher stopped"))?;
        Ok(rx)
    }
}

impl Dispatch {
    /// Takes batches until the store is dropped (`alive`), then answers the calls in flight.
    async fn run(
        self,
        mut rx: mpsc::Receiver<Job>,
        conn: watch::Receiver<Option<Conn>>,
        alive: CancellationToken,
    ) {
        let max_batch = self.config.max_batch.max(1);
        let in_flight_max = self.config.in_flight.max(1);
        let mut in_flight = FuturesUnordered::new();
        let mut jobs = Vec::with_capacity(max_batch);
        let mut open = true;
        // A timer kept armed no later than the deadline of any call written while it is: each
        // call's own deadline timer is then never the earliest one, and registering it does not
        // make tokio's time driver wake the I/O driver (an eventfd write per call, which was one
        // of the 7 syscalls of a lone check). Re-armed by the first call after it fires, so an
        // idle store sets no timer and a busy one re-arms it once per deadline, not per call.
        let mut keeper = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut keeper_armed = false;
        let mut sent = Sent::default();
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                () = alive.cancelled(), if open => open = false,
                taken = rx.recv_many(&mut jobs, max_batch), if open && in_flight.len() < in_flight_max => {
                    if taken == 0 {
                        open = false;
                        continue;
                    }
                    if !keeper_armed {
                        let soonest = jobs.iter().map(|job| job.deadline).min().unwrap_or_default();
                        keeper.as_mut().reset(tokio::time::Instant::now() + soonest);
                        keeper_armed = true;
                    }
                    // The buffer keeps its capacity; the batch gets exactly what it holds.
                    let mut batch = Vec::with_capacity(jobs.len());
                    for job in jobs.drain(..) {
                        if sent.superseded(&job.origin) {
                            let decisions = job.items.iter().map(|item| item.algorithm.superseded()).collect();
                            let _ = job.reply.send(Ok(decisions));
                        } else {
                            batch.push(job);
                        }
                    }
                    if batch.is_empty() {
                        continue;
                    }
                    let current = conn.borrow().clone();
                    in_flight.push(self.batch(current, batch));
                }
                () = &mut keeper, if keeper_armed => keeper_armed = false,
            }
        }
    }

    async fn batch(&self, conn: Option<Conn>, mut jobs: Vec<Job>) {
        // A caller that has gone (its request dropped) gets nothing spent on its behalf.
        jobs.retain(|job| !job.reply.is_closed());
        if jobs.is_empty() {
            return;
        }
        if !self.health.allows_calls() {
            return fail_all(jobs, &StoreError::CircuitOpen);
        }
        self.metrics.batch_size.observe(jobs.len() as f64);
        let Some(conn) = conn else {
            let error = StoreError::failed(ErrorKind::NotConnected, "not connected to Redis");
            return fail_all(jobs, &self.metrics.counted(error));
        };
        if !conn.is_cluster() {
            let _ = self.call(conn, jobs, Via::Keys).await;
            return;
        }
        self.cluster_batch(conn, jobs).await;
    }
}

fn fail_all(jobs: Vec<Job>, error: &StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

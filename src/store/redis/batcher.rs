//! Turns concurrent checks into one script call per batch. Callers put a [`Job`] (one check: one
//! or more counters, all or nothing) on a bounded queue; the dispatcher takes whatever is queued
//! (up to `max_batch`) as soon as one of its `in_flight` slots is free, and sends it to Redis as
//! one `EVALSHA` of the batch script: every counter of the batch once in `KEYS`, `TIME` read once,
//! the checks decided in arrival order. No timer (a lone check goes out at once), no task per
//! batch: the dispatcher polls its calls in flight itself, and answers each job on its oneshot.
//!
//! The deadline of a batch counts from when it is written to Redis, not from when its checks were
//! queued: time spent waiting inside sluice (a saturated CPU, a burst) is not a Redis failure and
//! does not turn into failure-mode answers. A call past its deadline fails as a Redis timeout only
//! if Redis answered nothing else since it was written and this daemon did not wake a whole
//! deadline late; otherwise Redis is alive and the reply was read late, so the call keeps waiting
//! (up to a 1 s backstop). The breaker counts calls, not checks. The queue is bounded, so callers
//! wait (back-pressure).
//! A job whose caller has gone (its request was dropped) is not sent: nothing is spent for it.
//!
//! `NOSCRIPT` (Redis restarted, failed over, `SCRIPT FLUSH`, a Cluster node that never saw the
//! script) means the script did not run, so the call is resent once with `EVAL`, which also
//! caches the script. A timeout or a broken connection is never retried: the write may have
//! happened. A key of the wrong type fails only the check that names it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::{Histogram, IntCounterVec};
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::Conn;
use super::error::{check_error, ErrorKind};
use super::health::Health;
use super::keys;
use super::scripts::{
    batch_keys_and_checks, parse_figures, split_batch_reply, Commit, Item, Script, Scripts,
};
use crate::limit::{Algorithm, Decision};
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
}

impl BatchMetrics {
    fn count(&self, kind: ErrorKind) {
        self.errors.with_label_values(&[kind.as_str()]).inc();
    }
}

/// One decision per item, or why the check could not be decided.
pub type Reply = Result<Vec<Decision>, StoreError>;

/// One check: its items are decided together, all or nothing (in a Cluster they share a slot).
pub struct Job {
    items: Vec<Item>,
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

/// Longest a call past its deadline keeps waiting while Redis answers other calls (see `send`).
const OVERDUE_BACKSTOP: Duration = Duration::from_secs(1);

impl Batcher {
    /// Starts the dispatcher over the connection published by `conn`.
    pub fn spawn(
        conn: watch::Receiver<Option<Conn>>,
        scripts: Scripts,
        config: BatchConfig,
        metrics: BatchMetrics,
        health: Arc<Health>,
        tracing: Tracing,
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
        tokio::spawn(dispatch.run(rx, conn));
        Self { tx, tracing }
    }

    /// Queues a check (waiting while the queue is full); the receiver yields its decisions.
    /// `deadline` bounds the Redis round trip of the call it goes out in.
    pub async fn submit(
        &self,
        items: Vec<Item>,
        commit: impl Into<Commit>,
        deadline: Duration,
    ) -> Result<oneshot::Receiver<Reply>, StoreError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            items,
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
    async fn run(self, mut rx: mpsc::Receiver<Job>, conn: watch::Receiver<Option<Conn>>) {
        let max_batch = self.config.max_batch.max(1);
        let in_flight_max = self.config.in_flight.max(1);
        let mut in_flight = FuturesUnordered::new();
        let mut jobs = Vec::with_capacity(max_batch);
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                taken = rx.recv_many(&mut jobs, max_batch), if open && in_flight.len() < in_flight_max => {
                    if taken == 0 {
                        open = false;
                        continue;
                    }
                    // The buffer keeps its capacity; the batch gets exactly what it holds.
                    let mut batch = Vec::with_capacity(jobs.len());
                    batch.append(&mut jobs);
                    let current = conn.borrow().clone();
                    in_flight.push(self.batch(current, batch));
                }
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
            self.metrics.count(ErrorKind::NotConnected);
            let error = StoreError::failed(ErrorKind::NotConnected, "not connected to Redis");
            return fail_all(jobs, &error);
        };
        if !conn.is_cluster() {
            let _ = self.call(conn, jobs, Via::Keys).await;
            return;
        }
        // A Cluster call's declared keys must share a slot; a node call may cover every slot of
        // one node. Checks are grouped by node (when the slot map is known) and slot, arrival
        // order kept within a slot (a job's items share a slot already); each job's slot is
        // hashed once.
        let map = conn.node_calls().and_then(|calls| calls.map());
        let mut placed: Vec<(Option<u16>, u16, Job)> = jobs
            .into_iter()
            .map(|job| {
                let slot = job.items.first().map_or(0, |item| keys::slot(&item.key));
                (map.as_ref().and_then(|map| map.node_of(slot)), slot, job)
            })
            .collect();
        placed.sort_by_key(|(node, slot, _)| (*node, *slot));
        let mut calls = Vec::new();
        let mut placed = placed.into_iter().peekable();
        while let Some((node, slot, first)) = placed.next() {
            let mut group = vec![(slot, first)];
            while let Some((_, other, job)) = placed.next_if(|(other_node, other_slot, _)| {
                *other_node == node && (node.is_some() || *other_slot == slot)
            }) {
                group.push((other, job));
            }
            calls.push(self.cluster_call(conn.clone(), group));
        }
        futures_util::future::join_all(calls).await;
    }

    /// One call for `group` (sorted by slot: one slot, or several of one node). A node that
    /// refuses a node call (a key it does not serve: the slot map is stale) ran nothing of it;
    /// its checks are resent one call per slot and the map is read again.
    async fn cluster_call(&self, conn: Conn, group: Vec<(u16, Job)>) {
        let first = group.first().map_or(0, |(slot, _)| *slot);
        let (slots, jobs): (Vec<u16>, Vec<Job>) = group.into_iter().unzip();
        let via = if slots.iter().all(|slot| *slot == first) {
            Via::Keys
        } else {
            Via::Node(first)
        };
        let Err(refused) = self.call(conn.clone(), jobs, via).await else {
            return;
        };
        self.refresh_slot_map(&conn);
        let mut calls = Vec::new();
        let mut rest = slots.into_iter().zip(refused).peekable();
        while let Some((slot, job)) = rest.next() {
            let mut jobs = vec![job];
            while let Some((_, job)) = rest.next_if(|(other, _)| *other == slot) {
                jobs.push(job);
            }
            calls.push(self.call(conn.clone(), jobs, Via::Keys));
        }
        futures_util::future::join_all(calls).await;
    }

    /// Forgets the slot map (one call per slot meanwhile) and reads it again in the background,
    /// once at a time.
    fn refresh_slot_map(&self, conn: &Conn) {
        let Some(calls) = conn.node_calls() else {
            return;
        };
        if !calls.start_refresh() {
            return;
        }
        calls.set(None);
        let (mut conn, calls) = (conn.clone(), Arc::clone(calls));
        tokio::spawn(async move {
            conn.refresh_slot_map().await;
            calls.end_refresh();
        });
    }

    /// One script call for `jobs`; answers every job, except when a node refused a node call
    /// before running any of it: then the jobs come back, to be resent one call per slot.
    async fn call(&self, mut conn: Conn, jobs: Vec<Job>, via: Via) -> Result<(), Vec<Job>> {
        let via = match (via, &jobs[..]) {
            (Via::Keys, [job]) if job.items.len() == 1 && job.commit != Commit::Report => {
                Via::Single
            }
            _ => via,
        };
        let deadline = jobs
            .iter()
            .map(|job| job.deadline)
            .max()
            .unwrap_or_default();
        let started = Instant::now();
        let span = self
            .tracing
            .store_span(jobs.iter().filter_map(|job| job.trace.as_ref()), jobs.len());
        self.metrics.calls.with_label_values(&[via.scope()]).inc();
        let mut reply = self.send(&mut conn, &jobs, Send::Sha, via, deadline).await;
        if matches!(&reply, Err(error) if error.kind() == Some(ErrorKind::Noscript)) {
            self.metrics.count(ErrorKind::Noscript);
            tracing::debug!(checks = jobs.len(), "NOSCRIPT: resending with EVAL");
            reply = self
                .send(&mut conn, &jobs, Send::Source, via, deadline)
                .await;
        }
        self.metrics
            .call_duration
            .observe(started.elapsed().as_secs_f64());
        if let Some(span) = span {
            span.end(
                reply
                    .as_ref()
                    .err()
                    .map(|e| e.kind().map_or("other", ErrorKind::as_str)),
            );
        }
        // The breaker counts calls, not checks: one slow call of 50 checks is one failure.
        let value = match reply {
            Ok(value) => {
                self.health.on_success();
                value
            }
            Err(error) => {
                if let Some(kind) = error.kind() {
                    self.metrics.count(kind);
                    if kind == ErrorKind::SlotMap && matches!(via, Via::Node(_)) {
                        tracing::debug!(
                            checks = jobs.len(),
                            "node call refused (stale slot map): resending per slot"
                        );
                        return Err(jobs);
                    }
                    let new_stall =
                        kind != ErrorKind::Deadline || self.stalls.counts(started, Instant::now());
                    if kind.is_redis_failure() && new_stall {
                        self.health.on_failure(kind);
                    }
                }
                fail_all(jobs, &error);
                return Ok(());
            }
        };
        // A single check's script answers for the check itself: its figures or its error, which
        // is the batch script's flat reply of one check.
        let value = match value {
            Value::ServerError(error) if via == Via::Single => {
                Value::Array(vec![Value::ServerError(error)])
            }
            value => value,
        };
        let Value::Array(flat) = value else {
            self.metrics.count(ErrorKind::Protocol);
            let error = StoreError::failed(ErrorKind::Protocol, "batch reply is not an array");
            fail_all(jobs, &error);
            return Ok(());
        };
        let parts = match split_batch_reply(&flat, jobs.iter().map(|job| job.items.len())) {
            Ok(parts) => parts,
            Err(detail) => {
                self.metrics.count(ErrorKind::Protocol);
                fail_all(jobs, &StoreError::failed(ErrorKind::Protocol, detail));
                return Ok(());
            }
        };
        for (job, part) in jobs.into_iter().zip(parts) {
            let answer = match part {
                Err(error) => {
                    let kind = ErrorKind::of_code(error.code());
                    self.metrics.count(kind);
                    Err(check_error(kind, error))
                }
                Ok(figures) => parse_figures(figures).map_err(|detail| {
                    self.metrics.count(ErrorKind::Protocol);
                    StoreError::failed(ErrorKind::Protocol, detail)
                }),
            };
            let _ = job.reply.send(answer);
        }
        Ok(())
    }

    /// Writes the call and waits for its reply, at most `deadline` from now.
    async fn send(
        &self,
        conn: &mut Conn,
        jobs: &[Job],
        send: Send,
        via: Via,
        deadline: Duration,
    ) -> Result<Value, StoreError> {
        let cmd = match (via, jobs) {
            (Via::Single, [job]) => single_command(&self.scripts, job, send),
            (Via::Node(_), _) => batch_command(self.scripts.node_batch(), jobs, send, via),
            _ => batch_command(self.scripts.batch(), jobs, send, via),
        };
        let progress = self.progress.load(Ordering::Relaxed);
        let written = Instant::now();
        let query = async move {
            match via {
                Via::Keys | Via::Single => conn.query(&cmd).await,
                Via::Node(slot) => conn.query_slot(cmd, slot).await,
            }
        };
        tokio::pin!(query);
        let reply = match tokio::time::timeout(deadline, &mut query).await {
            Ok(reply) => Some(reply),
            // Redis answered other calls since this one was written, or this task woke a whole
            // deadline late: the delay is this daemon's own (a saturated CPU runs the reply's
            // reader late), not a Redis failure. Keep waiting, up to the backstop.
            Err(_)
                if self.progress.load(Ordering::Relaxed) != progress
                    || written.elapsed() >= deadline * 2 =>
            {
                tokio::time::timeout(OVERDUE_BACKSTOP, &mut query)
                    .await
                    .ok()
            }
            Err(_) => None,
        };
        if reply.as_ref().is_some_and(|r| r.is_ok()) {
            self.progress.fetch_add(1, Ordering::Relaxed);
        }
        match reply {
            None => Err(StoreError::Timeout),
            // A single check's bad key fails that check alone, as in a batch.
            Some(Ok(Value::ServerError(error)))
                if via == Via::Single && ErrorKind::of_code(error.code()) == ErrorKind::BadKey =>
            {
                Ok(Value::ServerError(error))
            }
            Some(Ok(Value::ServerError(error))) => Err(StoreError::failed(
                ErrorKind::of_code(error.code()),
                format!("Redis replied {}", error.code()),
            )),
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(StoreError::failed(ErrorKind::of(&error), error.to_string())),
        }
    }
}

/// Missed deadlines as the breaker should count them. Calls in flight together that miss their
/// deadlines saw one stall, not several: a miss counts only if its call was written after the
/// last counted miss was noticed. A hung Redis still opens the circuit after `breaker.failures`
/// deadlines in a row (each round of calls written after the previous round failed counts once);
/// a pipeline of calls caught in one pause of a busy Redis (or a saturated machine) counts once.
struct Stalls {
    /// When the last counted miss was noticed, in µs since `epoch`.
    last: AtomicU64,
    epoch: Instant,
}

impl Stalls {
    fn new() -> Self {
        Self {
            last: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether a call written at `written` whose deadline passed (noticed at `now`) counts.
    fn counts(&self, written: Instant, now: Instant) -> bool {
        if self.micros(written) < self.last.load(Ordering::Acquire) {
            return false;
        }
        self.last.fetch_max(self.micros(now), Ordering::AcqRel);
        true
    }
}

/// How a call names its script.
#[derive(Clone, Copy)]
enum Send {
    /// `EVALSHA sha`: the normal, small form.
    Sha,
    /// `EVAL source`: after `NOSCRIPT`; runs and caches the script.
    Source,
}

/// Where a call goes and how it names its counters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Declared in `KEYS`, routed by them: a single primary, or one Cluster slot.
    Keys,
    /// A batch of one check (not a report) of one counter, routed by its key: its algorithm's own script, the
    /// cheapest call (at low load most batches are this; the batch script's bookkeeping costs
    /// Redis about as much again, see `lua/state.lua`).
    Single,
    /// A Cluster node call: the node script, no declared keys (they follow the checks in ARGV),
    /// sent to the primary serving the given slot (the group's first).
    Node(u16),
}

impl Via {
    /// The `scope` label of `sluice_redis_calls_total`.
    fn scope(self) -> &'static str {
        match self {
            Self::Keys | Self::Single => "slot",
            Self::Node(_) => "node",
        }
    }
}

/// The batch script call for `jobs`, in arrival order.
fn batch_command(script: &Script, jobs: &[Job], send: Send, via: Via) -> Cmd {
    let (keys, packed) = batch_keys_and_checks(jobs.iter().map(|job| (job.commit, &job.items[..])));
    let (verb, script) = match send {
        Send::Sha => ("EVALSHA", &*script.sha),
        Send::Source => ("EVAL", &*script.source),
    };
    let size = script.len() + packed.len() + keys.iter().map(|k| k.len()).sum::<usize>() + 32;
    let mut cmd = Cmd::with_capacity(keys.len() + 5, size);
    cmd.arg(verb).arg(script);
    // `now` 0: the script reads Redis `TIME`.
    match via {
        Via::Keys | Via::Single => cmd.arg(keys.len()).arg(&keys).arg(0).arg(packed),
        Via::Node(_) => cmd.arg(0).arg(0).arg(packed).arg(&keys),
    };
    cmd
}

/// The algorithm script call for a batch of one check of one counter.
fn single_command(scripts: &Scripts, job: &Job, send: Send) -> Cmd {
    let item = &job.items[0];
    let script = scripts.for_algorithm(&item.algorithm);
    let mut cmd = Cmd::with_capacity(10, item.key.len() + 128);
    match send {
        Send::Sha => cmd.arg("EVALSHA").arg(&*script.sha),
        Send::Source => cmd.arg("EVAL").arg(&*script.source),
    };
    cmd.arg(1).arg(&item.key);
    // ARGV as each script's header gives it; no `now` (the script reads Redis `TIME`).
    match item.algorithm {
        Algorithm::TokenBucket(b) => cmd.arg(b.limit()).arg(b.period_us()).arg(b.capacity()),
        Algorithm::SlidingLog(l) => cmd.arg(l.limit()).arg(l.period_us()),
        Algorithm::FixedWindow(w) => cmd.arg(w.limit()).arg(w.period_us()),
    };
    cmd.arg(item.cost).arg(job.commit.flag());
    cmd
}

fn fail_all(jobs: Vec<Job>, error: &StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stall_counts_once_and_a_hung_redis_counts_every_round() {
        let stalls = Stalls::new();
        let at = |ms: u64| stalls.epoch + Duration::from_micros(ms * 1_000 + 1);
        // Four calls written at 0-3 ms miss at 5-8 ms: one stall. Their slots are reused as they
        // fail (calls written at 5-8 ms, interleaved with the misses).
        let first_round: Vec<bool> = (0..4).map(|i| stalls.counts(at(i), at(5 + i))).collect();
        assert_eq!(first_round, [true, false, false, false]);
        // Those miss at 10-13 ms: written after the first counted miss, so the round counts once.
        let second_round: Vec<bool> = (0..4)
            .map(|i| stalls.counts(at(5 + i), at(10 + i)))
            .collect();
        assert_eq!(second_round, [true, false, false, false]);
        // One call at a time against a hung Redis: every miss counts.
        let sequential = Stalls::new();
        let at = |ms: u64| sequential.epoch + Duration::from_micros(ms * 1_000 + 1);
        assert!((0..5).all(|i| sequential.counts(at(i * 50), at(i * 50 + 50))));
    }
}

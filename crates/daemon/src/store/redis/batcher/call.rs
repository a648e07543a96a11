//! One script call: its command (the batch script, a Cluster node's, or for a batch of one check
//! of one counter its algorithm's own), `NOSCRIPT` resent once with `EVAL`, the deadline counted
//! from the write, the breaker fed once per call and a stall counted once ([`Stalls`]), and the
//! reply split into each job's answer.
//!
//! A call past its deadline opens the circuit only if Redis was silent for a whole deadline that
//! this daemon watched on time (`batcher/deadline.rs`): a timer that fired late, a reply already
//! readable, or a reply to another call means the call keeps waiting (up to
//! [`OVERDUE_BACKSTOP`]). A timeout or a broken connection is never retried: the write may have
//! happened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use super::deadline::{wait, Waited, OVERDUE_BACKSTOP};
use super::{fail_all, Dispatch, Job};
use crate::store::redis::conn::Conn;
use crate::store::redis::error::{check_error, ErrorKind};
use crate::store::redis::health::CircuitReason;
use crate::store::redis::scripts::{
    batch_command, has_own_script, parse_figures, single_command, split_batch_reply, Commit,
    Counters, ScriptRef,
};
use crate::store::StoreError;

/// The pause before resending a call a resharding refused (after redis-rs' own few retries).
const RESHARD_PAUSE: Duration = Duration::from_millis(2);

impl Dispatch {
    /// One script call for `jobs`; answers every job, except when a node refused a node call
    /// before running any of it: then the jobs come back, to be resent one call per slot.
    pub(super) async fn call(
        &self,
        mut conn: Conn,
        jobs: Vec<Job>,
        via: Via,
    ) -> Result<(), Vec<Job>> {
        let via = match (via, &jobs[..]) {
            // A calendar window goes to the batch script: its own script knows only periods.
            (Via::Keys, [job])
                if job.items.len() == 1
                    && job.commit != Commit::Report
                    && has_own_script(&job.items[0].algorithm) =>
            {
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
        let mut by = ScriptRef::Sha;
        let mut reply = self.send(&mut conn, &jobs, by, via, deadline).await;
        loop {
            match reply.as_ref().err().and_then(StoreError::kind) {
                Some(ErrorKind::Noscript) if by == ScriptRef::Sha => {
                    self.metrics.count(ErrorKind::Noscript);
                    tracing::debug!(checks = jobs.len(), "NOSCRIPT: resending with EVAL");
                    by = ScriptRef::Source;
                }
                // A slot moving under the call: nothing ran, and Redis is answering. Resent,
                // each send with its own deadline, until the keys are on one node again or
                // the call has been refused for `OVERDUE_BACKSTOP`.
                Some(ErrorKind::Reshard) if started.elapsed() < OVERDUE_BACKSTOP => {
                    self.metrics.count(ErrorKind::Reshard);
                    tokio::time::sleep(RESHARD_PAUSE).await;
                }
                _ => break,
            }
            reply = self.send(&mut conn, &jobs, by, via, deadline).await;
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
            let error = self.metrics.counted(StoreError::failed(
                ErrorKind::Protocol,
                "batch reply is not an array",
            ));
            fail_all(jobs, &error);
            return Ok(());
        };
        let parts = match split_batch_reply(&flat, jobs.iter().map(|job| job.items.len())) {
            Ok(parts) => parts,
            Err(detail) => {
                let error = self
                    .metrics
                    .counted(StoreError::failed(ErrorKind::Protocol, detail));
                fail_all(jobs, &error);
                return Ok(());
            }
        };
        for (job, part) in jobs.into_iter().zip(parts) {
            let answer = match part {
                Err(error) => {
                    let kind = ErrorKind::of_reply(error);
                    if kind == ErrorKind::Auth {
                        self.metrics.acl.refused(error);
                    }
                    Err(check_error(kind, error))
                }
                Ok(figures) => parse_figures(figures)
                    .map_err(|detail| StoreError::failed(ErrorKind::Protocol, detail)),
            }
            .map_err(|error| self.metrics.counted(error));
            let _ = job.reply.send(answer);
        }
        Ok(())
    }

    /// Writes the call and waits for its reply, at most `deadline` from now.
    async fn send(
        &self,
        conn: &mut Conn,
        jobs: &[Job],
        by: ScriptRef,
        via: Via,
        deadline: Duration,
    ) -> Result<Value, StoreError> {
        let checks = || jobs.iter().map(|job| (job.commit, &job.items[..]));
        let cmd = match (via, jobs) {
            (Via::Single, [job]) => single_command(&self.scripts, &job.items[0], job.commit, by),
            (Via::Node(_), _) => batch_command(
                self.scripts.node_batch(),
                checks(),
                by,
                Counters::AfterChecks,
            ),
            _ => batch_command(self.scripts.batch(), checks(), by, Counters::Declared),
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
        let waited = wait(
            query,
            written,
            deadline,
            &self.progress,
            progress,
            &self.metrics.excused,
        )
        .await;
        let reply = match waited {
            Waited::Reply(reply) => Some(reply),
            // Redis answered no call at all for a whole deadline, watched by this daemon on
            // time, and the reply is not in the socket: an outage (a hung or unreachable node),
            // not a slow moment. The circuit opens now instead of after `breaker.failures` such
            // calls, so a hung Redis is detected in one deadline; the default deadline (100 ms)
            // is one a busy node's Redis meets.
            Waited::Silent => {
                self.health
                    .open(CircuitReason::Failure(ErrorKind::Deadline));
                None
            }
            // Every miss excused (this daemon ran late, or Redis answered others) until the
            // backstop: a timeout, fed to the breaker as one failure.
            Waited::Overdue => None,
        };
        // Redis answered: a reply, or a resharding's refusal (which redis-rs gives back as an
        // error).
        let answered = |r: &redis::RedisResult<Value>| {
            r.as_ref()
                .map_or_else(|e| ErrorKind::of(e) == ErrorKind::Reshard, |_| true)
        };
        if reply.as_ref().is_some_and(answered) {
            self.progress.fetch_add(1, Ordering::Relaxed);
        }
        match reply {
            None => Err(StoreError::Timeout),
            // A single check's bad key fails that check alone, as in a batch; so does a command
            // the ACL refused inside the script (a configuration error that other checks, of other
            // algorithms, may not meet: not an outage, the circuit stays as it is).
            Some(Ok(Value::ServerError(error)))
                if via == Via::Single
                    && (ErrorKind::of_reply(&error) == ErrorKind::BadKey
                        || script_refusal(&error)) =>
            {
                Ok(Value::ServerError(error))
            }
            // A batch whose script the ACL stopped before any check (its `TIME`): each check
            // fails alone, the same way.
            Some(Ok(Value::ServerError(error))) if script_refusal(&error) => Ok(Value::Array(
                jobs.iter()
                    .map(|_| Value::ServerError(error.clone()))
                    .collect(),
            )),
            Some(Ok(Value::ServerError(error))) => {
                let kind = ErrorKind::of_reply(&error);
                if kind == ErrorKind::Auth {
                    self.metrics.acl.refused(&error);
                }
                Err(StoreError::failed(
                    kind,
                    format!("Redis replied {}", error.code()),
                ))
            }
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(StoreError::failed(ErrorKind::of(&error), error.to_string())),
        }
    }
}

/// Whether an error reply is a command the ACL refused to the script while it ran (Redis says
/// so: "the script", `@user_script`), rather than the call itself refused (`EVALSHA` not granted,
/// which no check can pass).
fn script_refusal(error: &redis::ServerError) -> bool {
    ErrorKind::of_reply(error) == ErrorKind::Auth
        && error.details().is_some_and(|text| text.contains("script"))
}

/// Missed deadlines as the breaker should count them. Calls in flight together that miss their
/// deadlines saw one stall, not several: a miss counts only if its call was written after the
/// last counted miss was noticed. A hung Redis still opens the circuit after `breaker.failures`
/// deadlines in a row (each round of calls written after the previous round failed counts once);
/// a pipeline of calls caught in one pause of a busy Redis (or a saturated machine) counts once.
pub(super) struct Stalls {
    /// When the last counted miss was noticed, in µs since `epoch`.
    last: AtomicU64,
    epoch: Instant,
}

impl Stalls {
    pub(super) fn new() -> Self {
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

/// Where a call goes and how it names its counters.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
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

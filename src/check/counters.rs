//! Counters an operator can see and reset (`/v1/counters` on the admin listener): one policy's
//! partition, named by its descriptors exactly as a check names it.
//!
//! Seeing never writes: the store is asked a dry run of two reads of the same key in one group,
//! cost 0 (the state now: remaining units, time until full) and the request's cost (would it
//! pass, and when). A key never seen reads as a full quota. Resetting deletes the counter's state,
//! forgets this pod's remembered denial at once, and (with Redis) announces it so that the other
//! pods forget theirs; it is logged with who asked and counted.

use std::fmt::Display;

use prometheus::{IntCounterVec, Opts};
use serde::Serialize;

use super::plan::Planned;
use super::request::{CheckError, CheckRequest};
use super::CheckService;
use crate::limit::Descriptors;
use crate::store::{Fleet, StoreCheck, StoreError};

/// Which counter: a policy and the descriptors its key is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterQuery {
    /// The policy (required: a counter belongs to one policy).
    pub policy: String,
    /// The request's attributes, as a check gives them.
    pub descriptors: Descriptors,
    /// The cost `allowed` and `retry_after_ms` are for; usually 1 (a policy's cost table, when
    /// it lists the request's value, sets it instead).
    pub cost: u64,
}

/// Why a counter could not be shown or reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CounterError {
    /// The question is malformed (like a check's: 400).
    #[error(transparent)]
    Request(#[from] CheckError),
    /// The store could not answer (503); nothing was changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A counter's state in its policy's terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterState {
    /// The policy.
    pub policy: String,
    /// The partition (escaped key descriptor values).
    pub partition: String,
    /// The counter's key as the store holds it.
    pub key: String,
    /// The store (`memory`, `redis`).
    pub store: &'static str,
    /// The tier whose quota applies, if the policy has tiers and the request is in a listed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The algorithm.
    pub algorithm: &'static str,
    /// `enforced`, or `shadow` (a shadow policy, or a partition outside its rollout).
    pub mode: &'static str,
    /// The most units available at once.
    pub limit: u64,
    /// Units available now.
    pub remaining: u64,
    /// Milliseconds until the quota is full again if nothing arrives (0: full now).
    pub reset_after_ms: u64,
    /// The cost the next two fields are for.
    pub cost: u64,
    /// Whether a request of `cost` would pass now.
    pub allowed: bool,
    /// Milliseconds until a request of `cost` passes (0 when it would now).
    pub retry_after_ms: u64,
    /// Milliseconds this pod's local layer goes on denying the partition without asking the
    /// store (a remembered denial), if it holds one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_layer_retry_after_ms: Option<u64>,
}

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResetReport {
    /// The policy.
    pub policy: String,
    /// The partition.
    pub partition: String,
    /// The counter's key as the store held it.
    pub key: String,
    /// The store.
    pub store: &'static str,
    /// Whether the store held state for it (false: it was already full).
    pub existed: bool,
    /// How other pods learn of it: `alone` (embedded store: no other pod shares it),
    /// `announced` (on Redis' reset channel) or `not_announced` (their local layers keep a
    /// remembered denial until its retry instant).
    pub fleet: &'static str,
    /// The partition's fingerprint in this process's log lines (the raw one is at debug level).
    pub fingerprint: String,
}

impl CheckService {
    /// The counter `query` names, in its policy's terms; nothing is written.
    pub async fn counter(&self, query: &CounterQuery) -> Result<CounterState, CounterError> {
        let planned = self.plan_counter(query).await?;
        let check = &planned.check;
        let read = StoreCheck {
            cost: 0,
            ..check.clone()
        };
        let decisions = self.store.check(&[read, check.clone()], true, None).await?;
        let [now, next] = decisions[..] else {
            return Err(StoreError::failed(
                crate::store::ErrorKind::Protocol,
                format!("2 decisions asked, {} answered", decisions.len()),
            )
            .into());
        };
        let local = self.hot.as_ref().and_then(|hot| {
            hot.denial(&check.key, u64::MAX, std::time::Instant::now())
                .map(|denial| millis(denial.retry_after_us))
        });
        Ok(CounterState {
            policy: planned.policy.name().to_owned(),
            partition: check.key.partition().to_owned(),
            key: self.store.stored_key(&check.key),
            store: self.store.name(),
            tier: planned.tier,
            algorithm: check.algorithm.name(),
            mode: if check.enforce { "enforced" } else { "shadow" },
            limit: now.limit,
            remaining: now.remaining,
            reset_after_ms: millis(now.reset_after_us),
            cost: check.cost,
            allowed: next.allowed,
            retry_after_ms: millis(next.retry_after_us),
            local_layer_retry_after_ms: local,
        })
    }

    /// Resets the counter `query` names: the next request sees a full quota (on every pod, once
    /// the announcement arrives). Logged at warn level with `requested_by`, and counted.
    pub async fn reset_counter(
        &self,
        query: &CounterQuery,
        requested_by: &(dyn Display + Sync),
    ) -> Result<ResetReport, CounterError> {
        let planned = self.plan_counter(query).await?;
        let key = &planned.check.key;
        let policy = planned.policy.name();
        let fingerprint = self.shadow_log.fingerprint(key);
        let outcome = match self.store.reset(key).await {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(policy, partition = %fingerprint, requested_by = %requested_by, %error, "counter reset failed: the store could not answer");
                return Err(error.into());
            }
        };
        if let Some(hot) = &self.hot {
            hot.forget(key);
        }
        self.counter_resets.with_label_values(&[policy]).inc();
        let fleet = outcome.fleet.as_str();
        let receivers = match outcome.fleet {
            Fleet::Announced { receivers } => Some(receivers),
            Fleet::Alone | Fleet::NotAnnounced => None,
        };
        tracing::warn!(policy, partition = %fingerprint, requested_by = %requested_by, existed = outcome.existed, fleet, receivers, "counter reset by an operator");
        tracing::debug!(
            policy,
            partition = key.partition(),
            "counter reset: raw partition"
        );
        Ok(ResetReport {
            policy: policy.to_owned(),
            partition: key.partition().to_owned(),
            key: self.store.stored_key(key),
            store: self.store.name(),
            existed: outcome.existed,
            fleet,
            fingerprint,
        })
    }

    /// Plans `query` like a check naming its policy (caps, descriptors, tier, cost); exactly one
    /// planned part comes back.
    async fn plan_counter(&self, query: &CounterQuery) -> Result<Planned, CheckError> {
        let request = CheckRequest {
            policy: Some(query.policy.clone()),
            descriptors: query.descriptors.clone(),
            cost: query.cost,
            dry_run: true,
        };
        let mut planned = self.plan(&self.policies(), &request).await?;
        match (planned.pop(), planned.is_empty()) {
            (Some(one), true) => Ok(one),
            _ => Err(CheckError::Invalid(format!(
                "policy `{}` does not name one counter",
                query.policy
            ))),
        }
    }
}

/// Whole milliseconds, rounded up (a wait of 1 µs is 1 ms, not 0).
fn millis(us: u64) -> u64 {
    us.div_ceil(1_000)
}

/// `sluice_counter_resets_total{policy}`, registered on `metrics`' registry.
pub(super) fn resets_metric(metrics: &crate::telemetry::Metrics) -> IntCounterVec {
    let resets = IntCounterVec::new(
        Opts::new(
            "sluice_counter_resets_total",
            "Counters reset by an operator (DELETE /v1/counters), by policy.",
        ),
        &["policy"],
    )
    .expect("a valid metric");
    if let Err(error) = metrics.registry().register(Box::new(resets.clone())) {
        tracing::debug!(%error, "sluice_counter_resets_total not registered");
    }
    resets
}

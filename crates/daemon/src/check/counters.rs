//! Counters an operator can see and reset (`/v1/counters` on the admin listener): one policy's
//! partition, named by its descriptors exactly as a check names it.
//!
//! Seeing never writes: the store is asked one dry run of two reads of each of the policy's
//! counters, cost 0 (the state now: remaining units, time until full) and the request's cost
//! (would it pass, and when). A key never seen reads as a full quota. Resetting deletes the
//! counters' state (every window's), forgets this pod's remembered denials and refills its
//! local-limit bucket at once, and (with Redis) announces it so that the other pods do the same;
//! it is logged with who asked and counted.

use std::fmt::Display;

use prometheus::{IntCounterVec, Opts};
use serde::Serialize;

use super::plan::{Part, Plan};
use super::request::{CheckError, CheckRequest};
use super::CheckService;
use crate::limit::{Decision, Descriptors};
use crate::store::{Fleet, Spend, StoreCheck, StoreError};

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

/// One counter of the policy (a policy of several windows would have one per window).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterPart {
    /// The counter's key as the store holds it.
    pub key: String,
    /// The algorithm.
    pub algorithm: &'static str,
    /// The quota's period in milliseconds.
    pub period_ms: u64,
    /// The most units available at once.
    pub limit: u64,
    /// Units available now.
    pub remaining: u64,
    /// Milliseconds until the quota is full again if nothing arrives (0: full now).
    pub reset_after_ms: u64,
    /// Whether a request of the state's `cost` would pass now.
    pub allowed: bool,
    /// Milliseconds until a request of that cost passes (0 when it would now).
    pub retry_after_ms: u64,
    /// Milliseconds this pod's local layer goes on denying the counter without asking the
    /// store (a remembered denial), if it holds one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_layer_retry_after_ms: Option<u64>,
}

impl CounterPart {
    /// `check`'s counter under `key`, from the two dry runs a read makes: `now` (cost 0: what is
    /// left) and `next` (the state's cost: whether it would pass).
    fn read(
        key: String,
        check: &StoreCheck,
        (now, next): (Decision, Decision),
        local_layer_retry_after_ms: Option<u64>,
    ) -> Self {
        Self {
            key,
            algorithm: check.algorithm.name(),
            period_ms: millis(check.algorithm.period_us()),
            limit: now.limit,
            remaining: now.remaining,
            reset_after_ms: millis(now.reset_after_us),
            allowed: next.allowed,
            retry_after_ms: millis(next.retry_after_us),
            local_layer_retry_after_ms,
        }
    }
}

/// A partition's state in its policy's terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CounterState {
    /// The policy.
    pub policy: String,
    /// The partition (escaped key descriptor values).
    pub partition: String,
    /// The store (`memory`, `redis`).
    pub store: &'static str,
    /// The tier whose quota applies, if the policy has tiers and the request is in a listed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Set when the policy has tiers, no tier applied and the request named no tier descriptor:
    /// the figures are the base quota's, while the application's requests (which carry it) may
    /// be held to a tier's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_warning: Option<String>,
    /// `enforced`, or `shadow` (a shadow policy, or a partition outside its rollout).
    pub mode: &'static str,
    /// The cost `allowed` and `retry_after_ms` are for.
    pub cost: u64,
    /// The counter that decides, as a check picks it: the denying one with the longest wait,
    /// else the one with the least remaining.
    #[serde(flatten)]
    pub deciding: CounterPart,
    /// Every counter, when the policy has several.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<CounterPart>,
    /// This pod's bucket of the policy's `local_limit` (checked before the store), when it has
    /// one and the partition is enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_limit: Option<CounterPart>,
}

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResetReport {
    /// The policy.
    pub policy: String,
    /// The partition.
    pub partition: String,
    /// The counters' keys as the store held them (one per window).
    pub keys: Vec<String>,
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
    /// The counters `query` names, in its policy's terms; nothing is written.
    pub async fn counter(&self, query: &CounterQuery) -> Result<CounterState, CounterError> {
        let plan = self.plan_counter(query).await?;
        // Per counter, two reads in one dry run: cost 0 (the state now) and the cost asked.
        let checks: Vec<StoreCheck> = plan
            .checks
            .iter()
            .flat_map(|check| {
                let read = StoreCheck {
                    cost: 0,
                    ..check.clone()
                };
                [read, check.clone()]
            })
            .collect();
        let decisions = self.store.check(&checks, Spend::DryRun, None).await?;
        if decisions.len() != checks.len() {
            let asked = format!(
                "{} decisions asked, {} answered",
                checks.len(),
                decisions.len()
            );
            return Err(StoreError::failed(crate::store::ErrorKind::Protocol, asked).into());
        }
        let at = std::time::Instant::now();
        let mut counters: Vec<CounterPart> = plan
            .checks
            .iter()
            .zip(decisions.chunks_exact(2))
            .map(|(check, pair)| {
                let (now, next) = (pair[0], pair[1]);
                let local = self.hot.as_ref().and_then(|hot| {
                    let denial = hot.denial(&check.key, u64::MAX, at)?;
                    Some(millis(denial.retry_after_us))
                });
                CounterPart::read(self.store.stored_key(&check.key), check, (now, next), local)
            })
            .collect();
        let deciding = counters
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.allowed)
            .max_by_key(|(_, c)| c.retry_after_ms)
            .or_else(|| counters.iter().enumerate().min_by_key(|(_, c)| c.remaining))
            .map_or(0, |(i, _)| i);
        let (first, first_check) = (&plan.parts[0], &plan.checks[0]);
        Ok(CounterState {
            policy: first.policy.name().to_owned(),
            partition: first_check.key.partition().to_owned(),
            store: self.store.name(),
            tier: first.tier.clone(),
            tier_warning: tier_warning(first, &query.descriptors),
            mode: if first_check.enforce {
                "enforced"
            } else {
                "shadow"
            },
            cost: first_check.cost,
            deciding: counters[deciding].clone(),
            windows: if counters.len() > 1 {
                std::mem::take(&mut counters)
            } else {
                Vec::new()
            },
            local_limit: self.local_limit_state(first),
        })
    }

    /// This pod's local-limit bucket of `part`'s partition, read like a counter (nothing spent).
    fn local_limit_state(&self, part: &Part) -> Option<CounterPart> {
        let (buckets, check) = (self.local_limits.as_ref()?, part.local.as_ref()?);
        let read = StoreCheck {
            cost: 0,
            ..check.clone()
        };
        let decisions = buckets.check_now(&[read, check.clone()], Spend::DryRun);
        let (now, next) = (*decisions.first()?, *decisions.get(1)?);
        let key = format!("{} (this pod)", check.key);
        Some(CounterPart::read(key, check, (now, next), None))
    }

    /// Resets the counters `query` names: the next request sees a full quota (on every pod, once
    /// the announcement arrives). Logged at warn level with `requested_by`, and counted.
    pub async fn reset_counter(
        &self,
        query: &CounterQuery,
        requested_by: &(dyn Display + Sync),
    ) -> Result<ResetReport, CounterError> {
        let plan = self.plan_counter(query).await?;
        let first = &plan.checks[0];
        let (policy, partition) = (plan.parts[0].policy.name(), first.key.partition());
        let fingerprint = self.shadow_log.fingerprint(&first.key);
        let mut existed = false;
        let mut fleets = Vec::with_capacity(plan.checks.len());
        for check in &plan.checks {
            let key = &check.key;
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
            if let Some(leases) = &self.leases {
                leases.forget(key);
            }
            existed |= outcome.existed;
            fleets.push(outcome.fleet);
        }
        // This pod's local-limit bucket of the partition starts full too (the others refill
        // theirs on the announcement).
        if let Some(buckets) = &self.local_limits {
            buckets.reset_now(&first.key.without_window());
        }
        self.counter_resets.with_label_values(&[policy]).inc();
        // The weakest announcement tells what the other pods may still remember.
        let fleet = fleets
            .iter()
            .find(|f| **f == Fleet::NotAnnounced)
            .or(fleets.first())
            .map_or(Fleet::Alone.as_str(), Fleet::as_str);
        let receivers = fleets.iter().find_map(|f| match f {
            Fleet::Announced { receivers } => Some(*receivers),
            Fleet::Alone | Fleet::NotAnnounced => None,
        });
        tracing::warn!(policy, partition = %fingerprint, requested_by = %requested_by, existed, fleet, receivers, "counter reset by an operator");
        tracing::debug!(policy, partition, "counter reset: raw partition");
        Ok(ResetReport {
            policy: policy.to_owned(),
            partition: partition.to_owned(),
            keys: plan
                .checks
                .iter()
                .map(|check| self.store.stored_key(&check.key))
                .collect(),
            store: self.store.name(),
            existed,
            fleet,
            fingerprint,
        })
    }

    /// Plans `query` like a check naming its policy (caps, descriptors, tier, cost): its
    /// counters, at least one.
    async fn plan_counter(&self, query: &CounterQuery) -> Result<Plan, CheckError> {
        let request = CheckRequest {
            policy: Some(query.policy.clone()),
            descriptors: query.descriptors.clone(),
            cost: query.cost,
            spend: Spend::DryRun,
        };
        let plan = self.plan(&self.policies(), &request).await?;
        if plan.is_empty() {
            return Err(CheckError::UnknownPolicy(query.policy.clone()));
        }
        Ok(plan)
    }
}

/// Why a tiered policy's figures may not be the application's: no tier applied and the tier
/// descriptor was not given (the tenant table, when there is one, named no tier either).
fn tier_warning(part: &Part, descriptors: &Descriptors) -> Option<String> {
    let tiers = part.policy.parts().tiers.as_ref()?;
    if part.tier.is_some() || descriptors.contains_key(&tiers.descriptor) {
        return None;
    }
    let levels: Vec<&str> = tiers.levels.keys().map(String::as_str).collect();
    Some(format!(
        "policy {} has tiers chosen by descriptor `{}`, which was not given: these are the base \
         quota's figures; a request of a tier ({}) is held to that tier's limit, give `{}` to see it",
        part.policy.name(),
        tiers.descriptor,
        levels.join(", "),
        tiers.descriptor,
    ))
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

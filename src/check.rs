//! The one decision path every transport calls: validate the request, find the policies that
//! apply, ask the store as one atomic group, apply failure modes, pick the deciding policy, count.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::RequestLimits;
use crate::limit::{Algorithm, Decision, Descriptors, FailureMode, Micros, Policy, PolicySet};
use crate::store::{MemoryStore, RateStore, StoreCheck, StoreError};
use crate::telemetry::Metrics;

/// Longest descriptor name accepted.
pub const MAX_DESCRIPTOR_NAME: usize = 64;

/// One request's question: may it go through?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    /// Check only this policy (its `match` conditions are not consulted).
    pub policy: Option<String>,
    /// The request's attributes.
    pub descriptors: Descriptors,
    /// Units to spend (a GraphQL query's complexity, LLM tokens); usually 1.
    pub cost: u64,
    /// Evaluate without spending anything.
    pub dry_run: bool,
}

/// The request is malformed or cannot be checked as asked: a 4xx, nothing was spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The request breaks a cap or a syntax rule.
    #[error("{0}")]
    Invalid(String),
    /// The named policy does not exist.
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    /// The named policy needs a descriptor the request lacks.
    #[error("policy `{policy}` needs descriptor `{descriptor}`")]
    MissingDescriptor {
        /// The policy.
        policy: String,
        /// The descriptor it keys on.
        descriptor: String,
    },
    /// A batch item failed: the reason names the item, the inner error says what failed.
    #[error("{0}")]
    Batch(String, Box<CheckError>),
    /// No amount of waiting would admit this cost.
    #[error("cost {cost} exceeds the most policy `{policy}` can ever allow at once ({limit})")]
    CostExceedsLimit {
        /// The policy.
        policy: String,
        /// The requested cost.
        cost: u64,
        /// What the policy allows at most.
        limit: u64,
    },
}

impl CheckError {
    /// The same error, its reason prefixed with the batch item it concerns.
    fn in_batch(self, index: usize) -> Self {
        let at = |reason: String| format!("checks[{index}]: {reason}");
        match self {
            Self::Invalid(reason) => Self::Invalid(at(reason)),
            other => Self::Batch(at(other.to_string()), Box::new(other)),
        }
    }
}

/// How a policy's decision was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// By the store, and it counts.
    Enforced,
    /// By the store, but only reported: a shadow policy never blocks.
    Shadow,
    /// The store could not answer; the policy fails open.
    FailOpen,
    /// The store could not answer; decided by this pod's local share.
    Local,
    /// The store could not answer; the policy fails closed (503).
    FailClosed,
}

impl Mode {
    /// The name used in answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforced => "enforced",
            Self::Shadow => "shadow",
            Self::FailOpen => "fail_open",
            Self::Local => "local",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// The overall answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Go ahead (200).
    Allowed,
    /// Over the limit (429).
    Denied,
    /// A fail-closed policy could not be checked (503).
    Unavailable,
}

/// One policy's part in a verdict.
#[derive(Debug, Clone)]
pub struct PolicyDecision {
    /// The policy.
    pub policy: Arc<Policy>,
    /// Its decision (for fail-closed policies that could not be checked: a denial with no retry).
    pub decision: Decision,
    /// How it was reached.
    pub mode: Mode,
    /// The window of the quota, for `RateLimit-Policy` (for a token bucket: the time to refill
    /// from empty, so `limit` per window is exactly the refill rate).
    pub window_us: Micros,
}

/// The answer to a [`CheckRequest`].
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The overall answer.
    pub outcome: Outcome,
    /// The policy whose figures the client should see: the denying one with the longest wait,
    /// else the enforced one with the least remaining. `None` when no policy applied.
    pub deciding: Option<PolicyDecision>,
    /// Every policy evaluated, in policy-file order.
    pub evaluated: Vec<PolicyDecision>,
}

/// The `local` failure mode's state: this pod's share of each limit, in memory.
pub struct LocalShare {
    store: Arc<MemoryStore>,
    replicas: u64,
    margin_percent: u64,
}

impl LocalShare {
    /// Shares of `(limit - margin_percent%) / replicas`, kept in `store`.
    pub fn new(store: Arc<MemoryStore>, replicas: u64, margin_percent: u64) -> Self {
        Self {
            store,
            replicas,
            margin_percent,
        }
    }

    fn share(&self, algorithm: &Algorithm) -> Algorithm {
        algorithm.share(self.replicas, self.margin_percent)
    }
}

/// Answers checks against a policy set and a store.
pub struct CheckService {
    policies: RwLock<Arc<PolicySet>>,
    store: Arc<dyn RateStore>,
    local: LocalShare,
    limits: RequestLimits,
    metrics: Metrics,
}

impl CheckService {
    /// A service over `store` enforcing `policies`, with `local` for the `local` failure mode.
    pub fn new(
        policies: PolicySet,
        store: Arc<dyn RateStore>,
        local: LocalShare,
        limits: RequestLimits,
        metrics: Metrics,
    ) -> Self {
        metrics
            .policies_loaded
            .set(i64::try_from(policies.len()).unwrap_or(i64::MAX));
        Self {
            policies: RwLock::new(Arc::new(policies)),
            store,
            local,
            limits,
            metrics,
        }
    }

    /// The policy set in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        let guard = self.policies.read().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&guard)
    }

    /// Replaces the policy set atomically; checks in flight finish with the old one.
    pub fn replace_policies(&self, policies: PolicySet) {
        self.metrics
            .policies_loaded
            .set(i64::try_from(policies.len()).unwrap_or(i64::MAX));
        *self.policies.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policies);
    }

    /// The store's name.
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// The store's health, for a remote store.
    pub fn store_health(&self) -> Option<&'static str> {
        self.store.health()
    }

    /// The caps requests are held to.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// Checks several independent requests; all are validated before any is checked, so a bad
    /// one fails the batch (the error names it) without spending anything.
    pub async fn check_batch(
        &self,
        requests: Vec<CheckRequest>,
    ) -> Result<Vec<Verdict>, CheckError> {
        if requests.len() > self.limits.max_batch {
            return Err(CheckError::Invalid(format!(
                "a batch holds at most {} checks, got {}",
                self.limits.max_batch,
                requests.len()
            )));
        }
        let policies = self.policies();
        let mut plans = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            plans.push(
                self.plan(&policies, request)
                    .map_err(|e| e.in_batch(index))?,
            );
        }
        let mut verdicts = Vec::with_capacity(plans.len());
        for (request, plan) in requests.iter().zip(plans) {
            verdicts.push(self.run(request, plan).await);
        }
        Ok(verdicts)
    }

    /// Checks one request.
    pub async fn check(&self, request: &CheckRequest) -> Result<Verdict, CheckError> {
        let plan = self.plan(&self.policies(), request)?;
        Ok(self.run(request, plan).await)
    }

    /// Validates the request and lists what to ask the store.
    fn plan(
        &self,
        policies: &PolicySet,
        request: &CheckRequest,
    ) -> Result<Vec<(Arc<Policy>, StoreCheck)>, CheckError> {
        self.validate(request)?;
        let selected: Vec<&Arc<Policy>> = match &request.policy {
            Some(name) => {
                let policy = policies
                    .get(name)
                    .ok_or_else(|| CheckError::UnknownPolicy(name.clone()))?;
                if let Some(missing) = policy.missing_key_descriptor(&request.descriptors) {
                    return Err(CheckError::MissingDescriptor {
                        policy: name.clone(),
                        descriptor: missing.to_owned(),
                    });
                }
                vec![policy]
            }
            None => policies.matching(&request.descriptors).collect(),
        };
        selected
            .into_iter()
            .map(|policy| {
                let algorithm = *policy.algorithm_for(&request.descriptors);
                if request.cost > algorithm.limit() {
                    return Err(CheckError::CostExceedsLimit {
                        policy: policy.name().to_owned(),
                        cost: request.cost,
                        limit: algorithm.limit(),
                    });
                }
                let key = policy.key_for(&request.descriptors).ok_or_else(|| {
                    CheckError::Invalid(format!(
                        "policy `{}` lacks a key descriptor",
                        policy.name()
                    ))
                })?;
                let check = StoreCheck {
                    key,
                    algorithm,
                    cost: request.cost,
                    enforce: !policy.shadow(),
                };
                Ok((Arc::clone(policy), check))
            })
            .collect()
    }

    fn validate(&self, request: &CheckRequest) -> Result<(), CheckError> {
        let limits = &self.limits;
        let invalid = |reason: String| Err(CheckError::Invalid(reason));
        if request.cost == 0 || request.cost > limits.max_cost {
            return invalid(format!(
                "cost must be 1 to {}, got {}",
                limits.max_cost, request.cost
            ));
        }
        if request.descriptors.len() > limits.max_descriptors {
            return invalid(format!(
                "at most {} descriptors, got {}",
                limits.max_descriptors,
                request.descriptors.len()
            ));
        }
        for (name, value) in &request.descriptors {
            let name_ok = !name.is_empty()
                && name.len() <= MAX_DESCRIPTOR_NAME
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !name_ok {
                return invalid(format!(
                    "descriptor name {name:?} must be 1 to {MAX_DESCRIPTOR_NAME} characters of a-z, A-Z, 0-9, `_`, `-`, `.`"
                ));
            }
            if value.is_empty() || value.len() > limits.max_value_bytes {
                return invalid(format!(
                    "descriptor `{name}` must be 1 to {} bytes, got {}",
                    limits.max_value_bytes,
                    value.len()
                ));
            }
        }
        Ok(())
    }

    async fn run(&self, request: &CheckRequest, plan: Vec<(Arc<Policy>, StoreCheck)>) -> Verdict {
        if plan.is_empty() {
            return Verdict {
                outcome: Outcome::Allowed,
                deciding: None,
                evaluated: Vec::new(),
            };
        }
        let (policies, checks): (Vec<Arc<Policy>>, Vec<StoreCheck>) = plan.into_iter().unzip();
        let windows: Vec<Micros> = checks.iter().map(|c| c.algorithm.window_us()).collect();
        // The most patient matched policy sets the deadline; the others' answers come with it.
        let deadline = policies
            .iter()
            .filter_map(|p| p.timeout_us())
            .max()
            .map(Duration::from_micros);
        let needs_local = policies
            .iter()
            .any(|p| p.failure_mode() == FailureMode::Local);
        let fallback = needs_local.then(|| checks.clone());
        let evaluated = match self.store.check(checks, request.dry_run, deadline).await {
            Ok(decisions) => policies
                .into_iter()
                .zip(decisions)
                .zip(windows)
                .map(|((policy, decision), window_us)| PolicyDecision {
                    mode: if policy.shadow() {
                        Mode::Shadow
                    } else {
                        Mode::Enforced
                    },
                    policy,
                    decision,
                    window_us,
                })
                .collect(),
            Err(error) => self.degrade(policies, fallback, &windows, &error, request.dry_run),
        };
        let verdict = decide(evaluated);
        if !request.dry_run {
            self.record(&verdict);
        }
        verdict
    }

    /// Applies each policy's failure mode when the store could not answer: `open` allows,
    /// `closed` refuses, `local` checks this pod's share in memory (all `local` policies of the
    /// request as one group, recorded only if no fail-closed policy refuses the request anyway).
    fn degrade(
        &self,
        policies: Vec<Arc<Policy>>,
        fallback: Option<Vec<StoreCheck>>,
        windows: &[Micros],
        error: &StoreError,
        dry_run: bool,
    ) -> Vec<PolicyDecision> {
        tracing::debug!(%error, store = self.store.name(), "store could not decide; applying failure modes");
        let mode_of = |i: usize| policies[i].failure_mode();
        let local_checks: Vec<(usize, StoreCheck)> = fallback
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(i, _)| mode_of(*i) == FailureMode::Local)
            .map(|(i, mut check)| {
                check.algorithm = self.local.share(&check.algorithm);
                (i, check)
            })
            .collect();
        let refused =
            (0..policies.len()).any(|i| mode_of(i) == FailureMode::Closed && !policies[i].shadow());
        let group: Vec<StoreCheck> = local_checks.iter().map(|(_, c)| c.clone()).collect();
        let mut local_decisions = self
            .local
            .store
            .check_now(&group, dry_run || refused)
            .into_iter();
        let mut local_checks = local_checks.into_iter().peekable();
        policies
            .into_iter()
            .enumerate()
            .map(|(i, policy)| {
                let limit = policy.parts().algorithm.limit();
                let degraded = |allowed: bool, mode: Mode| {
                    (
                        Decision {
                            allowed,
                            limit,
                            remaining: 0,
                            reset_after_us: 0,
                            retry_after_us: 0,
                        },
                        mode,
                        windows[i],
                    )
                };
                let (decision, mode, window_us) = match policy.failure_mode() {
                    FailureMode::Open => degraded(true, Mode::FailOpen),
                    FailureMode::Closed => degraded(false, Mode::FailClosed),
                    FailureMode::Local => {
                        let local = local_checks.next_if(|(j, _)| *j == i);
                        match (local, local_decisions.next()) {
                            (Some((_, check)), Some(decision)) => {
                                (decision, Mode::Local, check.algorithm.window_us())
                            }
                            _ => degraded(false, Mode::FailClosed),
                        }
                    }
                };
                if policy.shadow() {
                    // A shadow policy never blocks, degraded or not.
                    let decision = Decision {
                        allowed: true,
                        ..decision
                    };
                    return PolicyDecision {
                        policy,
                        decision,
                        mode: Mode::Shadow,
                        window_us,
                    };
                }
                PolicyDecision {
                    policy,
                    decision,
                    mode,
                    window_us,
                }
            })
            .collect()
    }

    fn record(&self, verdict: &Verdict) {
        for part in &verdict.evaluated {
            let outcome = match (part.mode, part.decision.allowed) {
                (Mode::FailOpen, _) => "fail_open",
                (Mode::FailClosed, _) => "fail_closed",
                (Mode::Local, true) => "local_allowed",
                (Mode::Local, false) => "local_denied",
                (Mode::Enforced, false) => "denied",
                (Mode::Shadow, false) => {
                    tracing::info!(policy = part.policy.name(), "shadow policy would block");
                    "shadow_denied"
                }
                (_, true) => "allowed",
            };
            self.metrics
                .decisions
                .with_label_values(&[part.policy.name(), outcome])
                .inc();
        }
    }
}

/// Combines per-policy decisions: any enforced denial denies (the longest wait decides), else any
/// fail-closed policy makes the answer unavailable, else the tightest enforced policy decides.
fn decide(evaluated: Vec<PolicyDecision>) -> Verdict {
    let enforced = || evaluated.iter().filter(|p| p.mode != Mode::Shadow);
    let denied = enforced()
        .filter(|p| !p.decision.allowed && p.mode != Mode::FailClosed)
        .max_by_key(|p| p.decision.retry_after_us);
    let unavailable = enforced().find(|p| p.mode == Mode::FailClosed);
    let (outcome, deciding) = if let Some(p) = denied {
        (Outcome::Denied, Some(p.clone()))
    } else if let Some(p) = unavailable {
        (Outcome::Unavailable, Some(p.clone()))
    } else {
        let tightest = |it: &mut dyn Iterator<Item = &PolicyDecision>| {
            it.min_by_key(|p| p.decision.remaining).cloned()
        };
        let deciding = tightest(&mut enforced()).or_else(|| tightest(&mut evaluated.iter()));
        (Outcome::Allowed, deciding)
    };
    Verdict {
        outcome,
        deciding,
        evaluated,
    }
}

#[cfg(test)]
mod tests;

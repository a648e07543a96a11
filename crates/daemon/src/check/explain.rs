//! "Explain" for operators: which policies a request would hit and why the others do not, with
//! each one's partition, tier, cost and current state (every window of a policy of several, and
//! its local limit). A dry run: nothing is spent or counted.

use std::sync::Arc;

use serde::Serialize;

use super::request::{validate, CheckError, CheckRequest};
use super::verdict::{self, Mode, PolicyDecision};
use super::{CheckService, Outcome};
use crate::limit::{period_name, Decision, Descriptors, Policy};
use crate::store::{Spend, StoreCheck};

/// The explanation of one request.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// `allowed`, `denied` or `unavailable`: what the check would answer now.
    pub outcome: Outcome,
    /// The policy that would decide.
    pub deciding: Option<String>,
    /// The window of the deciding policy that would decide, when it has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Every policy, in file order.
    pub policies: Vec<PolicyExplanation>,
}

/// One policy's part.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyExplanation {
    /// The policy.
    pub policy: String,
    /// Whether it applies to the request.
    pub applies: bool,
    /// Why it applies or not.
    pub why: String,
    /// The counter's partition (escaped key descriptor values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The tier whose quota applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// What the request would cost under this policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// `enforced`, `shadow` (also a partition outside the rollout), or a failure mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Whether it would allow the request now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed: Option<bool>,
    /// The quota's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Units left after this request (if allowed) or now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// Milliseconds until this request would pass (0 if it would now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The window whose figures these are (the one deciding for this policy), when the policy
    /// has several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Every window's state, when the policy has several.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<StateExplanation>,
    /// The policy's local limit in this pod, when it has one and the partition is enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_limit: Option<StateExplanation>,
}

/// The state of one counter: a window of the policy, or its local limit.
#[derive(Debug, Clone, Serialize)]
pub struct StateExplanation {
    /// The window's index in `limits` (absent for the local limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// The configured period.
    pub period: String,
    /// Whether it would allow the request now.
    pub allowed: bool,
    /// Most units available at once.
    pub limit: u64,
    /// Units left after this request (if allowed) or now.
    pub remaining: u64,
    /// Milliseconds until this request would pass here (0 if it would now).
    pub retry_after_ms: u64,
}

impl StateExplanation {
    fn new(window: Option<usize>, period_us: u64, d: &Decision) -> Self {
        Self {
            window,
            period: period_name(period_us).to_string(),
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_us.div_ceil(1_000),
        }
    }
}

impl CheckService {
    /// Explains `request` (always as a dry run).
    pub async fn explain(&self, request: &CheckRequest) -> Result<Explanation, CheckError> {
        validate(&self.limits, request)?;
        let request = CheckRequest {
            spend: Spend::DryRun,
            ..request.clone()
        };
        let policies = self.policies();
        let mut plan = self.plan(&policies, &request).await?;
        // Each part's cost (its check moves into the verdict).
        let costs: Vec<u64> = plan.checks.iter().map(|c| c.cost).collect();
        let locals: Vec<(Arc<Policy>, StoreCheck)> = plan
            .parts
            .iter()
            .filter_map(|p| Some((Arc::clone(&p.policy), p.local.clone()?)))
            .collect();
        let local_states = match &self.local_limits {
            Some(buckets) if !locals.is_empty() => {
                let checks: Vec<StoreCheck> = locals.iter().map(|(_, c)| c.clone()).collect();
                buckets.check_now(&checks, Spend::DryRun)
            }
            _ => Vec::new(),
        };
        let verdict = self.ask_store(Spend::DryRun, &mut plan).await;
        let explained = policies
            .iter()
            .map(|policy| {
                let Some(decided) = verdict::per_policy(&verdict.evaluated)
                    .find(|d| Arc::ptr_eq(&d.policy, policy))
                else {
                    return PolicyExplanation {
                        policy: policy.name().to_owned(),
                        why: why_not(policy, &request),
                        ..PolicyExplanation::default()
                    };
                };
                let tier = plan.parts.get(decided.part).and_then(|p| p.tier.clone());
                let cost = costs.get(decided.part).copied().unwrap_or_default();
                let d = &decided.decision;
                let local_limit = locals
                    .iter()
                    .zip(&local_states)
                    .find(|((owner, _), _)| Arc::ptr_eq(owner, policy))
                    .map(|((_, check), d)| {
                        StateExplanation::new(None, check.algorithm.period_us(), d)
                    });
                PolicyExplanation {
                    policy: policy.name().to_owned(),
                    applies: true,
                    why: if request.policy.is_some() {
                        "named in the request".into()
                    } else {
                        "its conditions hold and its key descriptors are present".into()
                    },
                    partition: Some(decided.key.partition().to_owned()),
                    tier,
                    cost: Some(cost),
                    mode: Some(decided.mode),
                    allowed: Some(d.allowed),
                    limit: Some(d.limit),
                    remaining: Some(d.remaining),
                    retry_after_ms: Some(d.retry_after_us.div_ceil(1_000)),
                    window: decided.window_index,
                    windows: windows_of(&verdict.evaluated, policy),
                    local_limit,
                }
            })
            .collect();
        // A local limit without room denies before the store is asked.
        let local_denial = locals
            .iter()
            .zip(&local_states)
            .filter(|(_, d)| !d.allowed)
            .max_by_key(|(_, d)| d.retry_after_us);
        let (outcome, deciding, window) = match (local_denial, verdict.deciding()) {
            (Some(((policy, _), _)), _) => (Outcome::Denied, Some(policy.name()), None),
            (None, deciding) => (
                verdict.outcome,
                deciding.map(|d| d.policy.name()),
                deciding.and_then(|d| d.window_index),
            ),
        };
        Ok(Explanation {
            outcome,
            deciding: deciding.map(str::to_owned),
            window,
            policies: explained,
        })
    }
}

/// Every window's state of `policy`, when it has several.
fn windows_of(evaluated: &[PolicyDecision], policy: &Arc<Policy>) -> Vec<StateExplanation> {
    evaluated
        .iter()
        .filter(|d| Arc::ptr_eq(&d.policy, policy))
        .filter_map(|d| {
            let period_us = d.key.period_us()?;
            Some(StateExplanation::new(
                d.window_index,
                period_us,
                &d.decision,
            ))
        })
        .collect()
}

/// Why `policy` does not apply to `request`.
fn why_not(policy: &Policy, request: &CheckRequest) -> String {
    if request.policy.is_some() {
        return "the request names another policy".into();
    }
    let descriptors: &Descriptors = &request.descriptors;
    match policy.unmet_condition(descriptors) {
        Some((name, pattern, false)) => {
            return format!("descriptor `{name}` is absent (match needs `{pattern}`)")
        }
        Some((name, pattern, true)) => {
            return format!("descriptor `{name}` does not match `{pattern}`")
        }
        None => {}
    }
    let captures = policy.conditions_hold(descriptors).unwrap_or_default();
    if let Some(missing) = policy.missing_key_descriptor(descriptors, &captures) {
        return format!("key descriptor `{missing}` is absent");
    }
    match &policy.parts().group {
        Some(group) => format!("a more specific policy of group `{group}` applies"),
        None => "does not apply".into(),
    }
}

//! Turns a request into store checks: which policies apply (named, or by match with group
//! precedence), each one's tier (tenant override table first, then the tier descriptor), cost
//! (cost table or the request's), counter key and whether it is enforced (shadow, rollout). A
//! policy of several windows gives one check per window (its own counter, the same cost and
//! enforcement); a policy with a local limit also carries that pre-check.

use std::sync::Arc;
use std::time::Duration;

use super::request::{validate, CheckError, CheckRequest};
use crate::config::RequestLimits;
use crate::limit::{Algorithm, Applicable, Policy, PolicySet};
use crate::store::StoreCheck;
use crate::tenants::TenantTiers;

/// The descriptor that names a request's tenant (the override table is keyed by it).
pub const TENANT_DESCRIPTOR: &str = "tenant";

/// A request's planned checks: the store's checks, contiguous as the store takes them, and
/// beside each (at the same index) the rest of its part. A [`PolicyDecision`] names its part by
/// that index, so every answer finds its policy, window and group item without a search.
///
/// Asking the store moves the checks into the verdict (their keys become the decisions'); the
/// parts stay, for the caller to place the decisions by.
///
/// [`PolicyDecision`]: super::PolicyDecision
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The counter, quota, cost and enforcement of each part, in part order.
    pub checks: Vec<StoreCheck>,
    /// Each part's policy, tier, window and local limit, in the same order.
    pub parts: Vec<Part>,
}

/// One policy's part in a check, beside its store check in a [`Plan`].
#[derive(Debug, Clone)]
pub struct Part {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The tier whose quota applies, if the policy has tiers and the request is in a listed one.
    pub tier: Option<String>,
    /// Which window of the policy's quota this is (its index), when the policy has several.
    pub window_index: Option<usize>,
    /// The policy's local limit, checked in this pod before the store; carried by the first
    /// window of an enforced partition only.
    pub local: Option<StoreCheck>,
    /// The group item this part belongs to (0 outside a group).
    pub item: usize,
}

impl Plan {
    /// The store's deadline for the whole plan: the most patient matched policy's `timeout`
    /// (the others' answers come with it), or the store's own when none sets one.
    pub fn deadline(&self) -> Option<Duration> {
        self.parts
            .iter()
            .filter_map(|part| part.policy.timeout_us())
            .max()
            .map(Duration::from_micros)
    }

    /// A plan with room for `parts` parts.
    fn with_capacity(parts: usize) -> Self {
        Self {
            checks: Vec::with_capacity(parts),
            parts: Vec::with_capacity(parts),
        }
    }

    /// Whether no policy applies.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Adds a part and its store check.
    pub fn push(&mut self, part: Part, check: StoreCheck) {
        self.parts.push(part);
        self.checks.push(check);
    }

    /// The parts at `at` (indexes into this plan), as a plan of their own: a part's index there
    /// is its position in `at`.
    pub fn subset(&self, at: &[usize]) -> Self {
        let mut subset = Self::with_capacity(at.len());
        for index in at {
            if let (Some(part), Some(check)) = (self.parts.get(*index), self.checks.get(*index)) {
                subset.push(part.clone(), check.clone());
            }
        }
        subset
    }
}

impl IntoIterator for Plan {
    type Item = (Part, StoreCheck);
    type IntoIter = std::iter::Zip<std::vec::IntoIter<Part>, std::vec::IntoIter<StoreCheck>>;

    fn into_iter(self) -> Self::IntoIter {
        self.parts.into_iter().zip(self.checks)
    }
}

/// Validates `request` and plans its store checks, without the policies another applying one
/// replaces. Nothing is spent.
pub(crate) async fn plan(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
) -> Result<Plan, CheckError> {
    plan_as(policies, limits, tiers, request, false).await
}

/// As [`plan`], for a report (a cost known afterwards): a cost above what a policy ever allows
/// at once is no error there, since it was spent already (it is recorded as an overspend).
pub(crate) async fn plan_report(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
) -> Result<Plan, CheckError> {
    plan_as(policies, limits, tiers, request, true).await
}

async fn plan_as(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
    report: bool,
) -> Result<Plan, CheckError> {
    let mut applicable = [select(policies, limits, request)?];
    policies.drop_replaced(&mut applicable);
    let [applicable] = applicable;
    plan_selected(tiers, request, applicable, policies, report).await
}

/// Validates `request` and selects the policies that apply: the one it names, else every one
/// that matches (group precedence applied, replacement not yet).
pub(crate) fn select(
    policies: &PolicySet,
    limits: &RequestLimits,
    request: &CheckRequest,
) -> Result<Vec<Applicable>, CheckError> {
    validate(limits, request)?;
    let descriptors = &request.descriptors;
    Ok(match &request.policy {
        Some(name) => {
            let policy = policies
                .get(name)
                .ok_or_else(|| CheckError::UnknownPolicy(name.clone()))?;
            let captures = policy.conditions_hold(descriptors).unwrap_or_default();
            if let Some(missing) = policy.missing_key_descriptor(descriptors, &captures) {
                return Err(CheckError::MissingDescriptor {
                    policy: name.clone(),
                    descriptor: missing.to_owned(),
                });
            }
            vec![Applicable {
                policy: Arc::clone(policy),
                captures,
            }]
        }
        None => policies.matching(descriptors),
    })
}

/// Plans the store checks of `applicable` (from [`select`]) for `request`: tier, cost, key,
/// enforcement, windows and local limit, each check carrying its policy's revision in `policies`
/// (the set `applicable` was selected from). A `report`'s cost may exceed what a policy ever allows.
pub(crate) async fn plan_selected(
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
    applicable: Vec<Applicable>,
    policies: &PolicySet,
    report: bool,
) -> Result<Plan, CheckError> {
    let descriptors = &request.descriptors;
    let tenant_tier = match (tiers, descriptors.get(TENANT_DESCRIPTOR)) {
        (Some(tiers), Some(tenant))
            if applicable.iter().any(|a| a.policy.parts().tiers.is_some()) =>
        {
            tiers.tier_of(tenant).await
        }
        _ => None,
    };
    let mut plan = Plan::with_capacity(applicable.len());
    for Applicable { policy, captures } in applicable {
        let generation = policies.revision(policy.name());
        let (tier, quota) = policy.quota_for(descriptors, tenant_tier.as_deref());
        let concurrency = matches!(quota.windows(), [Algorithm::Concurrency(_)]);
        if report && concurrency {
            // A cost known afterwards holds no slot: the request's permit did.
            continue;
        }
        // A permit is one request in flight, whatever the request's cost (which the request's
        // other policies spend).
        let cost = if concurrency {
            1
        } else {
            policy.cost_for(descriptors, request.cost)
        };
        if !report && cost > quota.max_cost() {
            return Err(CheckError::CostExceedsLimit {
                policy: policy.name().to_owned(),
                cost,
                limit: quota.max_cost(),
            });
        }
        let key = policy.key_for(descriptors, &captures).ok_or_else(|| {
            CheckError::Invalid(format!("policy `{}` lacks a key descriptor", policy.name()))
        })?;
        let enforce = policy.enforces(&key);
        let mut local = quota.local().filter(|_| enforce).map(|bucket| StoreCheck {
            key: key.clone(),
            algorithm: Algorithm::TokenBucket(*bucket),
            cost,
            enforce,
            generation,
        });
        let mut push = |key, algorithm: &Algorithm, window_index, local| {
            let part = Part {
                policy: Arc::clone(&policy),
                tier: tier.map(str::to_owned),
                window_index,
                local,
                item: 0,
            };
            let check = StoreCheck {
                key,
                algorithm: *algorithm,
                cost,
                enforce,
                generation,
            };
            plan.push(part, check);
        };
        match quota.windows() {
            // One window: the policy's own counter, as it always was.
            [algorithm] => push(key, algorithm, None, local),
            windows => {
                for (index, algorithm) in windows.iter().enumerate() {
                    let key = key.for_window(algorithm.period_us());
                    push(key, algorithm, Some(index), local.take());
                }
            }
        }
    }
    Ok(plan)
}

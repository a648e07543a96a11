//! Turns a request into store checks: which policies apply (named, or by match with group
//! precedence), each one's tier (tenant override table first, then the tier descriptor), cost
//! (cost table or the request's), counter key and whether it is enforced (shadow, rollout). A
//! policy of several windows gives one check per window (its own counter, the same cost and
//! enforcement); a policy with a local limit also carries that pre-check.

use std::sync::Arc;

use super::request::{validate, CheckError, CheckRequest};
use crate::config::RequestLimits;
use crate::limit::{Algorithm, Applicable, Policy, PolicySet};
use crate::store::StoreCheck;
use crate::tenants::TenantTiers;

/// The descriptor that names a request's tenant (the override table is keyed by it).
pub const TENANT_DESCRIPTOR: &str = "tenant";

/// One policy's part in a check, ready for the store.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The counter, quota, cost and enforcement.
    pub check: StoreCheck,
    /// The tier whose quota applies, if the policy has tiers and the request is in a listed one.
    pub tier: Option<String>,
    /// Which window of the policy's quota this is (its index), when the policy has several.
    pub window: Option<usize>,
    /// The policy's local limit, checked in this pod before the store; carried by the first
    /// window of an enforced partition only.
    pub local: Option<StoreCheck>,
}

/// Validates `request` and plans its store checks, without the policies another applying one
/// replaces. Nothing is spent.
pub(crate) async fn plan(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
) -> Result<Vec<Planned>, CheckError> {
    plan_as(policies, limits, tiers, request, false).await
}

/// As [`plan`], for a report (a cost known afterwards): a cost above what a policy ever allows
/// at once is no error there, since it was spent already (it is recorded as an overspend).
pub(crate) async fn plan_report(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
) -> Result<Vec<Planned>, CheckError> {
    plan_as(policies, limits, tiers, request, true).await
}

async fn plan_as(
    policies: &PolicySet,
    limits: &RequestLimits,
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
    report: bool,
) -> Result<Vec<Planned>, CheckError> {
    let mut applicable = [select(policies, limits, request)?];
    policies.drop_replaced(&mut applicable);
    let [applicable] = applicable;
    plan_selected(tiers, request, applicable, report).await
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
/// enforcement, windows and local limit. A `report`'s cost may exceed what a policy ever allows.
pub(crate) async fn plan_selected(
    tiers: Option<&TenantTiers>,
    request: &CheckRequest,
    applicable: Vec<Applicable>,
    report: bool,
) -> Result<Vec<Planned>, CheckError> {
    let descriptors = &request.descriptors;
    let tenant_tier = match (tiers, descriptors.get(TENANT_DESCRIPTOR)) {
        (Some(tiers), Some(tenant))
            if applicable.iter().any(|a| a.policy.parts().tiers.is_some()) =>
        {
            tiers.tier_of(tenant).await
        }
        _ => None,
    };
    let mut planned = Vec::with_capacity(applicable.len());
    for Applicable { policy, captures } in applicable {
        let (tier, quota) = policy.quota_for(descriptors, tenant_tier.as_deref());
        let cost = policy.cost_for(descriptors, request.cost);
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
        });
        let part = |key, algorithm: &Algorithm, window, local| Planned {
            policy: Arc::clone(&policy),
            check: StoreCheck {
                key,
                algorithm: *algorithm,
                cost,
                enforce,
            },
            tier: tier.map(str::to_owned),
            window,
            local,
        };
        match quota.windows() {
            // One window: the policy's own counter, as it always was.
            [algorithm] => planned.push(part(key, algorithm, None, local)),
            windows => {
                for (index, algorithm) in windows.iter().enumerate() {
                    let key = key.for_window(algorithm.period_us());
                    planned.push(part(key, algorithm, Some(index), local.take()));
                }
            }
        }
    }
    Ok(planned)
}

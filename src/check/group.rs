//! Several questions checked as one all-or-nothing group, each with its own answer: Envoy's
//! `ShouldRateLimit` sends one descriptor per limit and wants a status for each, and sluice spends
//! from every one of them or from none (envoyproxy/ratelimit spends the others even when one is
//! over its limit).

use std::sync::Arc;

use super::plan::Planned;
use super::request::{CheckError, CheckRequest};
use super::verdict::{self, PolicyDecision, Verdict};
use super::CheckService;
use crate::limit::{Algorithm, Key};

/// One question of a group.
#[derive(Debug, Clone)]
pub struct GroupItem {
    /// The question (its `dry_run` must be the same for every item of a group).
    pub request: CheckRequest,
    /// A quota to use instead of the selected policies' own (Envoy's descriptor `limit`); it
    /// counts in its own partition, so that changing it does not inherit another quota's state.
    pub quota_override: Option<Algorithm>,
}

/// The answer to a group: the overall verdict and one per item, in order.
#[derive(Debug, Clone)]
pub struct GroupVerdict {
    /// Over every policy of every item: denied if any enforced one denied.
    pub overall: Verdict,
    /// Each item's own policies. An item may be allowed while the group is denied (then nothing
    /// was spent from it). When the local layer answered, only the denying items have figures;
    /// the others were not asked and look unlimited.
    pub items: Vec<Verdict>,
}

impl CheckService {
    /// Checks every item as one store group: every item is validated and planned first (a bad
    /// one fails the whole group, nothing spent), then the allowed policies are spent only if
    /// no enforced policy of any item denies.
    pub async fn check_group(&self, items: &[GroupItem]) -> Result<GroupVerdict, CheckError> {
        let dry_run = items.first().is_some_and(|item| item.request.dry_run);
        if items.iter().any(|item| item.request.dry_run != dry_run) {
            return Err(CheckError::Invalid(
                "every item of a group must spend, or none: a group is recorded whole".into(),
            ));
        }
        let policies = self.policies();
        let mut planned = Vec::new();
        let mut owners = Vec::new();
        for (index, item) in items.iter().enumerate() {
            for mut part in self.plan(&policies, &item.request).await? {
                if let Some(quota) = item.quota_override {
                    // The override replaces the whole quota: one window, no local limit.
                    if part.window.is_some_and(|window| window > 0) {
                        continue;
                    }
                    override_quota(&mut part, quota)?;
                }
                planned.push(part);
                owners.push(index);
            }
        }
        // Only an answer of a local layer or local limit (denials only) needs placing by identity.
        let local_answers = self.hot.is_some() || planned.iter().any(|p| p.local.is_some());
        let identities: Vec<(Arc<crate::limit::Policy>, Key)> = if local_answers {
            planned
                .iter()
                .map(|p| (Arc::clone(&p.policy), p.check.key.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let overall = self.run(dry_run, planned).await;
        let mut per_item: Vec<Vec<PolicyDecision>> = vec![Vec::new(); items.len()];
        if overall.evaluated.len() == owners.len() {
            for (part, owner) in overall.evaluated.iter().zip(&owners) {
                per_item[*owner].push(part.clone());
            }
        } else {
            // A local layer answered with the denials only: place each by its policy and
            // partition (a local limit's key has no window).
            for part in &overall.evaluated {
                let found = identities.iter().position(|(policy, key)| {
                    Arc::ptr_eq(policy, &part.policy) && key.partition() == part.key.partition()
                });
                if let Some(at) = found {
                    per_item[owners[at]].push(part.clone());
                }
            }
        }
        let items = per_item
            .into_iter()
            .map(|parts| {
                if parts.is_empty() {
                    Verdict::unlimited()
                } else {
                    verdict::decide(parts)
                }
            })
            .collect();
        Ok(GroupVerdict { overall, items })
    }
}

/// Replaces a planned check's quota, refusing where the policy forbids overrides or the cost can
/// never fit the new quota.
fn override_quota(part: &mut Planned, quota: Algorithm) -> Result<(), CheckError> {
    let name = part.policy.name();
    if !part.policy.parts().limit_override {
        return Err(CheckError::Invalid(format!(
            "policy `{name}` does not accept a limit override"
        )));
    }
    if part.check.cost > quota.limit() {
        return Err(CheckError::CostExceedsLimit {
            policy: name.to_owned(),
            cost: part.check.cost,
            limit: quota.limit(),
        });
    }
    let marker = format!("override={}/{}us", quota.limit(), quota.period_us());
    let partition = part.check.key.partition();
    // The partition is already escaped; escaping it again as one value keeps keys injective.
    part.check.key = Key::new(Arc::from(name), [partition, marker.as_str()]);
    part.check.algorithm = quota;
    part.tier = None;
    part.window = None;
    part.local = None;
    Ok(())
}

//! "Explain" for operators: which policies a request would hit and why the others do not, with
//! each one's partition, tier, cost and current state. A dry run: nothing is spent or counted.

use serde::Serialize;

use super::request::{validate, CheckError, CheckRequest};
use super::{CheckService, Outcome};
use crate::limit::{Descriptors, Policy};

/// The explanation of one request.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// `allowed`, `denied` or `unavailable`: what the check would answer now.
    pub outcome: &'static str,
    /// The policy that would decide.
    pub deciding: Option<String>,
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
    pub mode: Option<&'static str>,
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
}

impl CheckService {
    /// Explains `request` (always as a dry run).
    pub async fn explain(&self, request: &CheckRequest) -> Result<Explanation, CheckError> {
        validate(&self.limits, request)?;
        let request = CheckRequest {
            dry_run: true,
            ..request.clone()
        };
        let policies = self.policies();
        let planned = self.plan(&policies, &request).await?;
        let facts: Vec<_> = planned
            .iter()
            .map(|p| (p.policy.name().to_owned(), p.tier.clone(), p.check.cost))
            .collect();
        let verdict = self.run(true, planned).await;
        let explained = policies
            .iter()
            .map(|policy| {
                let decided = verdict
                    .evaluated
                    .iter()
                    .find(|d| d.policy.name() == policy.name());
                let Some(decided) = decided else {
                    return PolicyExplanation {
                        policy: policy.name().to_owned(),
                        why: why_not(policy, &request),
                        ..PolicyExplanation::default()
                    };
                };
                let (_, tier, cost) = facts
                    .iter()
                    .find(|(name, _, _)| name == policy.name())
                    .cloned()
                    .unwrap_or_default();
                let d = &decided.decision;
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
                    mode: Some(decided.mode.as_str()),
                    allowed: Some(d.allowed),
                    limit: Some(d.limit),
                    remaining: Some(d.remaining),
                    retry_after_ms: Some(d.retry_after_us.div_ceil(1_000)),
                }
            })
            .collect();
        Ok(Explanation {
            outcome: match verdict.outcome {
                Outcome::Allowed => "allowed",
                Outcome::Denied => "denied",
                Outcome::Unavailable => "unavailable",
            },
            deciding: verdict.deciding().map(|d| d.policy.name().to_owned()),
            policies: explained,
        })
    }
}

/// Why `policy` does not apply to `request`.
fn why_not(policy: &Policy, request: &CheckRequest) -> String {
    if request.policy.is_some() {
        return "the request names another policy".into();
    }
    let descriptors: &Descriptors = &request.descriptors;
    for (name, pattern) in &policy.parts().conditions {
        match descriptors.get(name) {
            None => return format!("descriptor `{name}` is absent (match needs `{pattern}`)"),
            Some(value) if !pattern.matches(value, &mut Vec::new()) => {
                return format!("descriptor `{name}` does not match `{pattern}`")
            }
            Some(_) => {}
        }
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

//! Block lists: a policy with `deny: true` denies every request it applies to, on every
//! transport (the check API, `/v1/authz`, batches, Envoy's gRPC service) and in explanations,
//! because the denial is made here, on the one decision path, by the policy's kind, never by its
//! name. It has no counter: nothing is asked of the store for it, and the other policies the
//! request selected are read without spending (a denied group records nothing). The wait a
//! denied client is told is the policy's `period`.

use std::sync::Arc;

use super::{CheckService, Mode, Plan, PolicyDecision, Spend, Verdict};
use crate::limit::Decision;

impl CheckService {
    /// Denies `plan` for its block-list parts, with the other parts' figures read (dry run);
    /// `None` when no part is a block list. The checks move into the verdict.
    pub(super) async fn deny_listed(&self, plan: &mut Plan) -> Option<Verdict> {
        if !plan.parts.iter().any(|part| part.policy.is_deny()) {
            return None;
        }
        let mut evaluated: Vec<PolicyDecision> = Vec::with_capacity(plan.parts.len());
        let mut others = Vec::new();
        for (at, (part, check)) in plan.parts.iter().zip(&plan.checks).enumerate() {
            if !part.policy.is_deny() {
                others.push(at);
                continue;
            }
            let wait = check.algorithm.period_us();
            evaluated.push(PolicyDecision {
                policy: Arc::clone(&part.policy),
                key: check.key.clone(),
                decision: Decision {
                    allowed: false,
                    limit: 0,
                    remaining: 0,
                    reset_after_us: wait,
                    retry_after_us: wait,
                },
                mode: Mode::Enforced,
                advertised_us: wait,
                window_index: part.window_index,
                part: at,
            });
        }
        if !others.is_empty() {
            let mut rest = plan.subset(&others);
            let read = self.store_verdict(Spend::DryRun, &mut rest).await;
            evaluated.extend(read.evaluated.into_iter().map(|decision| PolicyDecision {
                part: others.get(decision.part).copied().unwrap_or(decision.part),
                ..decision
            }));
        }
        plan.checks.clear();
        Some(super::verdict::decide(evaluated))
    }
}

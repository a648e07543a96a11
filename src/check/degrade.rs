//! Failure modes, applied per policy when the store cannot answer: `open` allows, `closed`
//! refuses (503), `local` enforces this pod's share of the limit in memory.

use std::sync::Arc;

use super::plan::Planned;
use super::verdict::{Mode, PolicyDecision};
use crate::limit::{Algorithm, Decision, FailureMode};
use crate::store::{MemoryStore, StoreCheck};

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

    /// Decides every planned policy by its failure mode. All `local` policies of the request
    /// form one group in memory, recorded only if no enforced fail-closed policy refuses the
    /// request anyway. Shadow (un-enforced) policies never block, degraded or not.
    pub(crate) fn degrade(&self, plan: Vec<Planned>, dry_run: bool) -> Vec<PolicyDecision> {
        let local: Vec<(usize, StoreCheck)> = plan
            .iter()
            .enumerate()
            .filter(|(_, p)| p.policy.failure_mode() == FailureMode::Local)
            .map(|(i, p)| {
                let mut check = p.check.clone();
                check.algorithm = self.share(&check.algorithm);
                (i, check)
            })
            .collect();
        let refused = plan
            .iter()
            .any(|p| p.policy.failure_mode() == FailureMode::Closed && p.check.enforce);
        let group: Vec<StoreCheck> = local.iter().map(|(_, check)| check.clone()).collect();
        let mut local_decisions = self.store.check_now(&group, dry_run || refused).into_iter();
        let mut local = local.into_iter().peekable();
        plan.into_iter()
            .enumerate()
            .map(|(i, planned)| {
                let Planned { policy, check, .. } = planned;
                let fallback = |allowed: bool, mode: Mode| {
                    let decision = Decision {
                        allowed,
                        limit: check.algorithm.limit(),
                        remaining: 0,
                        reset_after_us: 0,
                        retry_after_us: 0,
                    };
                    (decision, mode, check.algorithm.window_us())
                };
                let (decision, mode, window_us) = match policy.failure_mode() {
                    FailureMode::Open => fallback(true, Mode::FailOpen),
                    FailureMode::Closed => fallback(false, Mode::FailClosed),
                    FailureMode::Local => {
                        match (local.next_if(|(j, _)| *j == i), local_decisions.next()) {
                            (Some((_, shared)), Some(decision)) => {
                                (decision, Mode::Local, shared.algorithm.window_us())
                            }
                            _ => fallback(false, Mode::FailClosed),
                        }
                    }
                };
                let (decision, mode) = if check.enforce {
                    (decision, mode)
                } else {
                    (
                        Decision {
                            allowed: true,
                            ..decision
                        },
                        Mode::Shadow,
                    )
                };
                PolicyDecision {
                    policy,
                    key: check.key,
                    decision,
                    mode,
                    window_us,
                }
            })
            .collect()
    }
}

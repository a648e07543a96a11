//! Failure modes, applied per policy when the store cannot answer: `open` allows, `closed`
//! refuses (503), `local` enforces this pod's share of the limit in memory (of every window of
//! a policy of several, each its own share, in one group).

use std::sync::Arc;

use super::plan::{Part, Plan};
use super::verdict::{Mode, PolicyDecision};
use crate::limit::{Algorithm, Decision, FailureMode, Micros};
use crate::store::{MemoryStore, Spend, StoreCheck};

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

    /// Pods sharing each limit (`local.replicas`).
    pub fn replicas(&self) -> u64 {
        self.replicas
    }

    fn share(&self, algorithm: &Algorithm) -> Algorithm {
        algorithm.share(self.replicas, self.margin_percent)
    }

    /// Spends `check` regardless in this pod's share of its limit (a report while the store
    /// cannot answer, for a `local` policy).
    pub(crate) fn spend(&self, check: &StoreCheck) -> Decision {
        let shared = StoreCheck {
            algorithm: self.share(&check.algorithm),
            ..check.clone()
        };
        let spent = self.store.spend_now(std::slice::from_ref(&shared));
        spent
            .into_iter()
            .next()
            .unwrap_or_else(|| shared.algorithm.decide(&shared.algorithm.new_state(), 0, 0))
    }

    /// Decides every policy by its failure mode. All `local` policies of the request form one
    /// group in memory, recorded only if no enforced fail-closed policy refuses the request
    /// anyway. Shadow (un-enforced) policies never block, degraded or not. The checks move
    /// into the decisions.
    pub(crate) fn degrade(&self, plan: &mut Plan, spend: Spend) -> Vec<PolicyDecision> {
        let is_local = |part: &Part| part.policy.failure_mode() == FailureMode::Local;
        let (owners, shared): (Vec<usize>, Vec<StoreCheck>) = plan
            .parts
            .iter()
            .zip(&plan.checks)
            .enumerate()
            .filter(|(_, (part, _))| is_local(part))
            .map(|(at, (_, check))| {
                let shared = StoreCheck {
                    algorithm: self.share(&check.algorithm),
                    ..check.clone()
                };
                (at, shared)
            })
            .unzip();
        let refused = plan.parts.iter().zip(&plan.checks).any(|(part, check)| {
            part.policy.failure_mode() == FailureMode::Closed && check.enforce
        });
        let decisions = self
            .store
            .check_now(&shared, if refused { Spend::DryRun } else { spend });
        // Each part's decision in the local group, by its index in the plan.
        let mut local: Vec<Option<(Decision, Micros)>> = vec![None; plan.parts.len()];
        for ((at, shared), decision) in owners.into_iter().zip(&shared).zip(decisions) {
            local[at] = Some((decision, shared.algorithm.advertised_us()));
        }
        std::mem::take(&mut plan.checks)
            .into_iter()
            .zip(&plan.parts)
            .zip(local)
            .enumerate()
            .map(|(at, ((check, part), local))| {
                let fallback = |allowed: bool| Decision {
                    allowed,
                    limit: check.algorithm.limit(),
                    remaining: 0,
                    reset_after_us: 0,
                    retry_after_us: 0,
                };
                let advertised_us = check.algorithm.advertised_us();
                let (decision, mode, advertised_us) = match (part.policy.failure_mode(), local) {
                    (FailureMode::Open, _) => (fallback(true), Mode::FailOpen, advertised_us),
                    (FailureMode::Closed, _) => (fallback(false), Mode::FailClosed, advertised_us),
                    (FailureMode::Local, Some((decision, shared_us))) => {
                        (decision, Mode::Local, shared_us)
                    }
                    (FailureMode::Local, None) => {
                        (fallback(false), Mode::FailClosed, advertised_us)
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
                    policy: Arc::clone(&part.policy),
                    key: check.key,
                    decision,
                    mode,
                    advertised_us,
                    window_index: part.window_index,
                    part: at,
                }
            })
            .collect()
    }
}

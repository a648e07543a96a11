//! Failure modes, applied per policy when the store cannot answer: `open` allows, `closed`
//! refuses (503), `local` enforces this pod's share of the limit in memory (of every window of
//! a policy of several, each its own share, in one group).

use std::sync::Arc;

use super::verdict::{Mode, PolicyDecision};
use crate::limit::{Algorithm, Decision, FailureMode, Policy};
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
    /// anyway. Shadow (un-enforced) policies never block, degraded or not.
    pub(crate) fn degrade(
        &self,
        policies: Vec<(Arc<Policy>, Option<usize>)>,
        checks: Vec<StoreCheck>,
        spend: Spend,
    ) -> Vec<PolicyDecision> {
        let is_local = |policy: &Policy| policy.failure_mode() == FailureMode::Local;
        let shared: Vec<StoreCheck> = policies
            .iter()
            .zip(&checks)
            .filter(|((policy, _), _)| is_local(policy))
            .map(|(_, check)| StoreCheck {
                algorithm: self.share(&check.algorithm),
                ..check.clone()
            })
            .collect();
        let refused = policies.iter().zip(&checks).any(|((policy, _), check)| {
            policy.failure_mode() == FailureMode::Closed && check.enforce
        });
        let decisions = self
            .store
            .check_now(&shared, if refused { Spend::DryRun } else { spend });
        let mut local = shared.iter().zip(decisions);
        policies
            .into_iter()
            .zip(checks)
            .map(|((policy, window), check)| {
                let fallback = |allowed: bool| Decision {
                    allowed,
                    limit: check.algorithm.limit(),
                    remaining: 0,
                    reset_after_us: 0,
                    retry_after_us: 0,
                };
                let (decision, mode, window_us) = match policy.failure_mode() {
                    FailureMode::Open => {
                        (fallback(true), Mode::FailOpen, check.algorithm.window_us())
                    }
                    FailureMode::Closed => (
                        fallback(false),
                        Mode::FailClosed,
                        check.algorithm.window_us(),
                    ),
                    // The local group holds the `local` policies in this same order.
                    FailureMode::Local => match local.next() {
                        Some((shared, decision)) => {
                            (decision, Mode::Local, shared.algorithm.window_us())
                        }
                        None => (
                            fallback(false),
                            Mode::FailClosed,
                            check.algorithm.window_us(),
                        ),
                    },
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
                    window,
                }
            })
            .collect()
    }
}

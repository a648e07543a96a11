//! Costs known afterwards (`POST /v1/report`): an LLM's tokens are counted only once its answer
//! is out, so the app checks first (cost 1, or an estimate) and reports the real cost after.
//! A report decides nothing: every policy the request matches spends the cost whatever its
//! counter holds (see `Algorithm::spend` for what past the limit means per algorithm), so the
//! next check sees it. The answer is what is left; a spend past the limit leaves 0 and says how
//! long the next check waits. It is never a 429 (nothing was refused); when the store cannot
//! answer, each policy's failure mode applies: `open` loses the report (counted), `closed`
//! answers 503, `local` spends in this pod's share.

use std::time::Instant;

use prometheus::{IntCounterVec, Opts};

use super::plan::{self, Plan};
use super::request::{CheckError, CheckRequest};
use super::verdict::{self, Mode, PolicyDecision, Verdict};
use super::{CheckService, ReportOutcome};
use crate::limit::{Decision, FailureMode};
use crate::store::{Spend, StoreCheck};

impl CheckService {
    /// Spends `request`'s cost on every policy it matches, whatever their counters hold; the
    /// verdict's decisions are what is left (see the module docs). A dry run is refused.
    pub async fn report(&self, request: &CheckRequest) -> Result<Verdict, CheckError> {
        if request.spend == Spend::DryRun {
            return Err(CheckError::Invalid(
                "a report spends what was used: it cannot be a dry run".to_owned(),
            ));
        }
        let policies = self.policies();
        let plan = plan::plan_report(&policies, &self.limits, self.tiers.as_ref(), request).await?;
        if plan.is_empty() {
            return Ok(Verdict::unlimited());
        }
        // Validation before state: a policy that refuses reports refuses the whole report.
        if let Some(part) = plan.parts.iter().find(|p| !p.policy.parts().reports) {
            let name = part.policy.name();
            self.reports
                .with_label_values(&[name, ReportOutcome::Disabled.as_str()])
                .inc();
            return Err(CheckError::ReportsRefused(name.to_owned()));
        }
        if let Some(buckets) = &self.local_limits {
            let local: Vec<StoreCheck> =
                plan.parts.iter().filter_map(|p| p.local.clone()).collect();
            if !local.is_empty() {
                buckets.spend_now(&local);
            }
        }
        let verdict = verdict::decide(self.spend_regardless(plan).await);
        for part in verdict::per_policy(&verdict.evaluated) {
            let outcome = ReportOutcome::of(part.mode, part.decision.allowed);
            self.reports
                .with_label_values(&[part.policy.name(), outcome.as_str()])
                .inc();
        }
        Ok(verdict)
    }

    async fn spend_regardless(&self, plan: Plan) -> Vec<PolicyDecision> {
        let deadline = plan.deadline();
        let asked = Instant::now();
        let spent = self.store.spend(&plan.checks, deadline).await;
        let decisions: Vec<(Decision, Mode)> = match spent {
            Ok(decisions) => plan
                .checks
                .iter()
                .zip(decisions)
                .map(|(check, decision)| {
                    if check.enforce {
                        // Past the limit the answer is a denial of 1 unit: what the store would
                        // answer the next check, so the local layer may answer it instead.
                        if let Some(hot) = &self.hot {
                            hot.remember(&check.key, 1, &decision, asked);
                        }
                        (decision, Mode::Enforced)
                    } else {
                        (decision, Mode::Shadow)
                    }
                })
                .collect(),
            Err(error) => {
                tracing::debug!(%error, store = self.store.name(), "store could not take a report; applying failure modes");
                if let Some(hot) = &self.hot {
                    hot.clear();
                }
                plan.parts
                    .iter()
                    .zip(&plan.checks)
                    .map(|(part, check)| {
                        let none = |allowed| Decision {
                            allowed,
                            limit: check.algorithm.limit(),
                            remaining: 0,
                            reset_after_us: 0,
                            retry_after_us: 0,
                        };
                        match part.policy.failure_mode() {
                            FailureMode::Open => (none(true), Mode::FailOpen),
                            FailureMode::Closed if check.enforce => (none(false), Mode::FailClosed),
                            FailureMode::Closed => (none(true), Mode::FailOpen),
                            FailureMode::Local => (self.local.spend(check), Mode::Local),
                        }
                    })
                    .collect()
            }
        };
        plan.into_iter()
            .zip(decisions)
            .enumerate()
            .map(|(at, ((part, check), (decision, mode)))| PolicyDecision {
                advertised_us: check.algorithm.advertised_us(),
                policy: part.policy,
                key: check.key,
                decision,
                mode,
                window_index: part.window_index,
                part: at,
            })
            .collect()
    }
}

/// `sluice_reports_total{policy,outcome}`, registered on the daemon's registry.
pub(super) fn reports_metric(metrics: &crate::telemetry::Metrics) -> IntCounterVec {
    let reports = IntCounterVec::new(
        Opts::new(
            "sluice_reports_total",
            "Costs reported after the fact (POST /v1/report), by policy and outcome.",
        ),
        &["policy", "outcome"],
    )
    .expect("a valid metric");
    if let Err(error) = metrics.registry().register(Box::new(reports.clone())) {
        tracing::debug!(%error, "sluice_reports_total not registered");
    }
    reports
}

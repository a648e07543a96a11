//! The one decision path every transport calls: validate the request and plan its policies
//! ([`plan`]), answer from the local layer when the store recently denied the same partition
//! ([`hot_keys`]), pass the policies' per-pod local limits ([`local_limit`]), ask the store as one
//! group, apply failure modes when it cannot answer ([`degrade`]), pick the deciding policy
//! ([`verdict`]), count and log.

mod counters;
mod degrade;
mod deny;
mod explain;
mod group;
mod hot_keys;
mod labels;
mod lease;
mod local_limit;
mod permits;
mod permits_top;
mod plan;
mod report;
mod request;
mod reservations;
mod rlqs;
mod shadow_log;
mod tokens;
mod top;
mod top_sketch;
mod unmatched;
mod verdict;

use std::sync::{Arc, RwLock};
use std::time::Instant;

pub use counters::{CounterError, CounterQuery, CounterState, ResetReport};
pub use degrade::LocalShare;
pub use explain::{Explanation, PolicyExplanation};
pub use group::{GroupItem, GroupVerdict};
pub use hot_keys::HotKeys;
pub use labels::{DecisionOutcome, ReportOutcome};
pub use lease::Leases;
pub use permits::{Release, ReleaseError, MAX_PERMIT_TOKEN};
pub use permits_top::{HeldEntry, HeldList};
pub use plan::{Part, Plan, TENANT_DESCRIPTOR};
pub use request::{CheckError, CheckRequest, Spend, MAX_DESCRIPTOR_NAME};
pub use reservations::{SettleError, Settled, SettledPart, MAX_RESERVATION_TOKEN};
pub use top::{Tally, TopDenied, TopEntry, TopList, MAX_POLICIES, TOP_CAPACITY};
pub use top_sketch::{SpaceSaving, MAX_LABEL};
pub use verdict::{Mode, Outcome, PolicyDecision, Verdict};

use crate::config::RequestLimits;
use crate::limit::PolicySet;
use crate::store::{Circuit, MemoryStore, RateStore, StoreError};
use crate::telemetry::Metrics;
use crate::tenants::TenantTiers;

/// Answers checks against a policy set and a store.
pub struct CheckService {
    policies: RwLock<Arc<PolicySet>>,
    store: Arc<dyn RateStore>,
    local: LocalShare,
    tiers: Option<TenantTiers>,
    hot: Option<HotKeys>,
    local_limits: Option<Arc<MemoryStore>>,
    leases: Option<Leases>,
    shadow_log: shadow_log::ShadowLog,
    unmatched: unmatched::Unmatched,
    limits: RequestLimits,
    metrics: Metrics,
    /// `sluice_counter_resets_total{policy}`.
    counter_resets: prometheus::IntCounterVec,
    /// `sluice_reports_total{policy,outcome}`.
    reports: prometheus::IntCounterVec,
    /// The partitions denied most, per policy.
    top: top::TopDenied,
    /// Concurrency permits' tokens and counters.
    permits: permits::Permits,
    /// Reservations' tokens and counters.
    reservations: reservations::Reservations,
}

impl CheckService {
    /// A service over `store` enforcing `policies`, with `local` for the `local` failure mode.
    pub fn new(
        policies: PolicySet,
        store: Arc<dyn RateStore>,
        local: LocalShare,
        limits: RequestLimits,
        metrics: Metrics,
    ) -> Self {
        let service = Self {
            policies: RwLock::new(Arc::new(PolicySet::default())),
            store,
            local,
            tiers: None,
            hot: None,
            local_limits: None,
            leases: None,
            shadow_log: shadow_log::ShadowLog::new(None),
            unmatched: unmatched::Unmatched::new(false),
            limits,
            counter_resets: counters::resets_metric(&metrics),
            permits: permits::Permits::new(None, &metrics),
            reservations: reservations::Reservations::new(None, &metrics),
            reports: report::reports_metric(&metrics),
            top: top::TopDenied::new(&PolicySet::default()),
            metrics,
        };
        service.replace_policies(policies);
        service
    }

    /// Consults `tiers` for tenants' tiers.
    pub fn with_tenant_tiers(mut self, tiers: TenantTiers) -> Self {
        self.tiers = Some(tiers);
        self
    }

    /// Keys partition fingerprints (log lines, `/v1/top`) by `secret`, the same on every pod
    /// given it (`None`: a random key of this process, as [`CheckService::new`] starts with).
    pub fn with_fingerprint_key(mut self, secret: Option<&str>) -> Self {
        self.shadow_log = shadow_log::ShadowLog::new(secret.map(str::as_bytes));
        self.permits = self.permits.rekeyed(secret.map(str::as_bytes));
        self.reservations = self.reservations.rekeyed(secret.map(str::as_bytes));
        self
    }

    /// Logs a warn line (rate-limited) when a check matches no policy.
    pub fn with_unmatched_log(mut self, log: bool) -> Self {
        self.unmatched = unmatched::Unmatched::new(log);
        self
    }

    /// Answers partitions the store recently denied from `hot` (for a remote store).
    pub fn with_local_layer(mut self, hot: HotKeys) -> Self {
        self.hot = Some(hot);
        self
    }

    /// Keeps the policies' local limits (per-pod token buckets checked before the store) in
    /// `buckets`; without it `local_limit` is not enforced.
    pub fn with_local_limits(mut self, buckets: Arc<MemoryStore>) -> Self {
        self.local_limits = Some(buckets);
        self
    }

    /// Admits the checks of policies with `lease: true` from `leases` when they hold the units
    /// (a shared store only: the embedded store has no round trip to save).
    pub fn with_leases(mut self, leases: Leases) -> Self {
        leases.register(&self.policies());
        self.leases = Some(leases);
        self
    }

    /// The quota leases, if any (their sweeper runs beside the service).
    pub fn leases(&self) -> Option<&Leases> {
        self.leases.as_ref()
    }

    /// The policy set in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        let guard = self.policies.read().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&guard)
    }

    /// Replaces the policy set atomically, as the next generation; checks in flight finish with
    /// the old one (the embedded store answers one that reaches a counter the new set already
    /// wrote as superseded, see `MemoryStore`). Logs a warning for each local limit too low for
    /// its shared quota.
    pub fn replace_policies(&self, policies: PolicySet) {
        for warning in crate::config::local_limit_warnings(&policies, self.local.replicas()) {
            tracing::warn!("{warning}");
        }
        self.metrics
            .policies_loaded
            .set(i64::try_from(policies.len()).unwrap_or(i64::MAX));
        // Every policy's outcome series exists from the start, so rate() sees the first one.
        unmatched::Unmatched::register(&self.metrics);
        for policy in policies.iter() {
            for outcome in DecisionOutcome::ALL.into_iter().filter(|o| o.has_policy()) {
                self.metrics
                    .decisions
                    .with_label_values(&[policy.name(), outcome.as_str()]);
            }
            self.metrics
                .local_layer_hits
                .with_label_values(&[policy.name()]);
            self.counter_resets.with_label_values(&[policy.name()]);
            let windows = policy.parts().quota.windows();
            if matches!(
                windows.first(),
                Some(crate::limit::Algorithm::Concurrency(_))
            ) {
                self.permits.register(policy.name());
            }
            if policy.reservation_ttl_us().is_some() {
                self.reservations.register(policy.name());
            }
            for outcome in ReportOutcome::ALL {
                self.reports
                    .with_label_values(&[policy.name(), outcome.as_str()]);
            }
        }
        self.top.replace_policies(&policies);
        // Numbered under the lock, so generations only grow in the order sets come in force.
        let mut in_force = self.policies.write().unwrap_or_else(|p| p.into_inner());
        let generation = in_force.generation() + 1;
        *in_force = Arc::new(policies.with_generation(generation, &in_force));
        self.permits
            .held
            .replace_policies(&in_force, |name| in_force.revision(name) == generation);
        if let Some(leases) = &self.leases {
            leases.register(&in_force);
            leases.retire_changed(&in_force);
        }
        drop(in_force);
        if let Some(hot) = &self.hot {
            hot.clear();
        }
    }

    /// The store's name.
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// The store's circuit, for a remote store.
    pub fn store_health(&self) -> Option<Circuit> {
        self.store.health()
    }

    /// The caps requests are held to.
    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// Checks one request.
    pub async fn check(&self, request: &CheckRequest) -> Result<Verdict, CheckError> {
        let mut plan = self.plan(&self.policies(), request).await?;
        self.note_unmatched(request, &plan);
        Ok(self.run(request.spend, &mut plan).await)
    }

    /// Checks one request for a path that cannot give a permit back (`/v1/authz`): a request a
    /// concurrency policy applies to is refused, nothing spent.
    pub async fn check_without_permits(
        &self,
        request: &CheckRequest,
    ) -> Result<Verdict, CheckError> {
        let mut plan = self.plan(&self.policies(), request).await?;
        if let Some(part) = plan
            .parts
            .iter()
            .zip(&plan.checks)
            .find_map(|(part, check)| {
                matches!(check.algorithm, crate::limit::Algorithm::Concurrency(_)).then_some(part)
            })
        {
            return Err(group::concurrency_refused(part.policy.name()));
        }
        self.note_unmatched(request, &plan);
        Ok(self.run(request.spend, &mut plan).await)
    }

    /// Checks several independent requests; all are validated and planned before any is
    /// checked, so a bad one fails the batch (the error names it) without spending anything.
    /// The checks go to the store together (in order: two of one partition are decided as if
    /// one came after the other).
    pub async fn check_batch(
        &self,
        requests: Vec<CheckRequest>,
    ) -> Result<Vec<Verdict>, CheckError> {
        if requests.len() > self.limits.max_batch {
            return Err(CheckError::Invalid(format!(
                "a batch holds at most {} checks, got {}",
                self.limits.max_batch,
                requests.len()
            )));
        }
        let policies = self.policies();
        let mut plans = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            let plan = self.plan(&policies, request).await;
            plans.push(plan.map_err(|e| e.in_batch(index))?);
        }
        // Asked together, not one after another: every check reaches the store's queue in the
        // same poll, so the Redis batcher sends them as one call (one round trip, not N).
        let runs = requests.iter().zip(&mut plans).map(|(request, plan)| {
            self.note_unmatched(request, plan);
            self.run(request.spend, plan)
        });
        Ok(futures_util::future::join_all(runs).await)
    }

    fn note_unmatched(&self, request: &CheckRequest, plan: &Plan) {
        if plan.is_empty() && request.spend == Spend::Record {
            self.unmatched.note(&self.metrics, request);
        }
    }

    async fn plan(&self, policies: &PolicySet, request: &CheckRequest) -> Result<Plan, CheckError> {
        plan::plan(policies, &self.limits, self.tiers.as_ref(), request).await
    }

    /// Decides `plan`: from the local layer, the local limits, else the store (whose checks
    /// then move into the verdict, see [`Plan`]).
    async fn run(&self, spend: Spend, plan: &mut Plan) -> Verdict {
        if plan.is_empty() {
            return Verdict::unlimited();
        }
        let verdict = if permits::holds_permits(plan) {
            self.run_with_permits(spend, plan).await
        } else {
            let local = self.answer_locally(plan);
            let local = local.or_else(|| self.local_limit(plan, spend));
            let local = local.or_else(|| self.admit_leased(plan, spend));
            match local {
                Some(verdict) => verdict,
                None => self.ask_store(spend, plan).await,
            }
        };
        if spend == Spend::Record {
            self.record(&verdict);
        }
        verdict
    }

    /// Asks the store about every check of `plan` as one group (failure modes if it cannot
    /// answer), unless a block list denies it ([`deny`]); records nothing in the metrics. The
    /// checks move into the verdict.
    async fn ask_store(&self, spend: Spend, plan: &mut Plan) -> Verdict {
        if let Some(denied) = self.deny_listed(plan).await {
            return denied;
        }
        self.store_verdict(spend, plan).await
    }

    /// [`Self::ask_store`] without block lists.
    async fn store_verdict(&self, spend: Spend, plan: &mut Plan) -> Verdict {
        let deadline = plan.deadline();
        let asked = Instant::now();
        let evaluated = match self.store.check(&plan.checks, spend, deadline).await {
            Ok(decisions) => std::mem::take(&mut plan.checks)
                .into_iter()
                .zip(decisions)
                .zip(&plan.parts)
                .enumerate()
                .map(|(at, ((check, decision), part))| {
                    if check.enforce {
                        let leased = self.leases.as_ref().filter(|_| part.policy.lease());
                        if let Some(hot) = &self.hot {
                            let at_most = leased.map(Leases::idle);
                            hot.remember_for(&check.key, check.cost, &decision, asked, at_most);
                        }
                        if let Some(leases) = leased.filter(|_| spend == Spend::Record) {
                            leases.denied(&check, &decision);
                        }
                    }
                    PolicyDecision {
                        mode: if check.enforce {
                            Mode::Enforced
                        } else {
                            Mode::Shadow
                        },
                        advertised_us: check.algorithm.advertised_us(),
                        policy: Arc::clone(&part.policy),
                        key: check.key,
                        decision,
                        window_index: part.window_index,
                        part: at,
                    }
                })
                .collect(),
            Err(error) => {
                tracing::debug!(%error, store = self.store.name(), "store could not decide; applying failure modes");
                if let StoreError::BadKey { item, detail } = &error {
                    if let (Some(part), Some(check)) =
                        (plan.parts.get(*item), plan.checks.get(*item))
                    {
                        self.shadow_log
                            .bad_key(part.policy.name(), &check.key, detail);
                    }
                }
                // A store that failed may come back without its counters (restart, failover):
                // remembered denials could then outlive the state they came from.
                if let Some(hot) = &self.hot {
                    hot.clear();
                }
                self.local.degrade(plan, spend)
            }
        };
        verdict::decide(evaluated)
    }

    /// An admission from this pod's quota leases, when every part of `plan` is an enforced,
    /// leased policy's and every counter's lease holds the cost (see [`lease`]): the checks
    /// move into the verdict. Or a denial from them, when a counter the leases cannot cover
    /// is over its limit on this pod: nothing is asked of the store (and nothing spent).
    fn admit_leased(&self, plan: &mut Plan, spend: Spend) -> Option<Verdict> {
        let leases = self.leases.as_ref()?;
        let leased = spend == Spend::Record
            && plan
                .parts
                .iter()
                .all(|part| part.policy.lease() && !part.policy.is_deny())
            && plan
                .checks
                .iter()
                .all(|check| check.enforce && check.algorithm.leasable());
        if !leased {
            return None;
        }
        let decisions = match leases.admit(&plan.checks)? {
            lease::Leased::Admitted(decisions) => decisions,
            lease::Leased::Denied(denials) => {
                let denied = denials
                    .into_iter()
                    .map(|(at, decision)| {
                        let (check, part) = (&plan.checks[at], &plan.parts[at]);
                        PolicyDecision {
                            mode: Mode::Enforced,
                            advertised_us: check.algorithm.advertised_us(),
                            policy: Arc::clone(&part.policy),
                            key: check.key.clone(),
                            decision,
                            window_index: part.window_index,
                            part: at,
                        }
                    })
                    .collect();
                return Some(verdict::decide(denied));
            }
        };
        let evaluated = std::mem::take(&mut plan.checks)
            .into_iter()
            .zip(decisions)
            .zip(&plan.parts)
            .enumerate()
            .map(|(at, ((check, decision), part))| PolicyDecision {
                mode: Mode::Enforced,
                advertised_us: check.algorithm.advertised_us(),
                policy: Arc::clone(&part.policy),
                key: check.key,
                decision,
                window_index: part.window_index,
                part: at,
            })
            .collect();
        Some(verdict::decide(evaluated))
    }

    /// A denial from the local layer, when an enforced policy's partition is known to be over
    /// its limit for this cost; nothing is asked of the store (and nothing would be spent).
    fn answer_locally(&self, plan: &Plan) -> Option<Verdict> {
        let hot = self.hot.as_ref()?;
        let now = Instant::now();
        let denied: Vec<PolicyDecision> = plan
            .checks
            .iter()
            .zip(&plan.parts)
            .enumerate()
            .filter(|(_, (check, _))| check.enforce)
            .filter_map(|(at, (check, part))| {
                let decision = hot.denial(&check.key, check.cost, now)?;
                self.metrics
                    .local_layer_hits
                    .with_label_values(&[part.policy.name()])
                    .inc();
                Some(PolicyDecision {
                    policy: Arc::clone(&part.policy),
                    key: check.key.clone(),
                    decision,
                    mode: Mode::Enforced,
                    advertised_us: check.algorithm.advertised_us(),
                    window_index: part.window_index,
                    part: at,
                })
            })
            .collect();
        (!denied.is_empty()).then(|| verdict::decide(denied))
    }

    /// Counts one outcome per policy (a policy of several windows counts once, by the window
    /// that decided for it).
    fn record(&self, verdict: &Verdict) {
        for part in verdict::per_policy(&verdict.evaluated) {
            let outcome = DecisionOutcome::of(part.mode, part.decision.allowed);
            match outcome {
                DecisionOutcome::Denied
                | DecisionOutcome::LocalDenied
                | DecisionOutcome::LocalLimitDenied => self.note_top(top::Tally::Denied, part),
                DecisionOutcome::ShadowDenied => {
                    self.note_top(top::Tally::WouldBlock, part);
                    self.shadow_log.would_block(part);
                }
                _ => {}
            }
            self.metrics
                .decisions
                .with_label_values(&[part.policy.name(), outcome.as_str()])
                .inc();
        }
    }
}

#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod over_limit_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod windows_tests;

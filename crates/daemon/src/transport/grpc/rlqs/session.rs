//! One RLQS stream's buckets: each usage report planned as a check would be (the `bucket_id` as
//! descriptors, the stream's domain as `rls.domain`), and answered when something changes:
//! `ALLOW_ALL` when no enforced policy applies, `DENY_ALL` for a block list (or a bucket that
//! cannot be leased exactly), else a token bucket backed by a lease taken from the store
//! ([`super::sizing`]). Leases are renewed as reports show demand, settled (the unused part
//! given back) once their assignment is over and reported, and abandoned buckets forgotten.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{Kind, Refusal};
use super::sizing::{self, DELIVERY_MARGIN_US, REFILL_INTERVAL_S};
use super::{Quota, ShareGuard};
use crate::check::{CheckRequest, CheckService, Spend};
use crate::config::envoy::DOMAIN_DESCRIPTOR;
use crate::limit::{Descriptors, FailureMode, Grant};
use crate::store::StoreCheck;
use crate::transport::grpc::proto::envoy::r#type::v3::{
    rate_limit_strategy::{BlanketRule, Strategy},
    RateLimitStrategy, TokenBucket,
};
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{
        bucket_action::{AbandonAction, BucketAction as Action, QuotaAssignmentAction},
        BucketAction,
    },
    rate_limit_quota_usage_reports::BucketQuotaUsage,
    BucketId,
};

/// Most buckets one stream may track; reports of others are refused (Envoy keeps them at its
/// `no_assignment_behavior`).
pub const MAX_BUCKETS: usize = 1_000;
/// Time to live of `ALLOW_ALL` and `DENY_ALL` answers; renewed by reports before it ends.
const BLANKET_TTL_S: u64 = 60;
/// Time to live of the answer to a store that could not lease (the policy's failure mode).
const FAILURE_TTL_S: u64 = 1;
/// A bucket with no request reported for this long, and no lease, is abandoned.
const ABANDON_AFTER: Duration = Duration::from_secs(30);
/// Assumed time between an Envoy's reports until two have arrived.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

const MARGIN: Duration = Duration::from_micros(DELIVERY_MARGIN_US);

/// A stream's state.
pub(super) struct Session {
    quota: Arc<Quota>,
    service: Arc<CheckService>,
    domain: Option<String>,
    buckets: HashMap<BTreeMap<String, String>, Bucket>,
}

struct Bucket {
    id: BucketId,
    last_report: Option<Instant>,
    interval: Duration,
    last_active: Instant,
    /// Requests per second in the last report.
    rate_per_s: u64,
    blanket: Option<(bool, Instant)>,
    lease: Option<Lease>,
    /// Alternates between assignments, so that Envoy builds a fresh bucket for each (it keeps
    /// its bucket when a token bucket's settings repeat).
    flip: bool,
}

/// A lease backing the assignment Envoy holds.
struct Lease {
    check: StoreCheck,
    grant: Grant,
    /// Just before the take was asked.
    asked: Instant,
    sent: Instant,
    ttl: Duration,
    tokens: u64,
    /// Requests reported allowed since the assignment was sent.
    admitted: u64,
    _share: ShareGuard,
}

/// What a bucket's policies ask for.
enum Target {
    Unlimited,
    Deny,
    Lease(StoreCheck, FailureMode, Option<Duration>),
    Refused(Refusal),
}

impl Session {
    pub(super) fn new(quota: Arc<Quota>, service: Arc<CheckService>) -> Self {
        Self {
            quota,
            service,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// Takes the stream's domain from its first message; a later one must repeat it or be empty.
    pub(super) fn domain(&mut self, domain: &str) -> Result<(), String> {
        match &self.domain {
            None if domain.is_empty() => Err("the first message must name a domain".into()),
            None if domain.len() > self.service.limits().max_value_bytes => Err(format!(
                "domain must be at most {} bytes",
                self.service.limits().max_value_bytes
            )),
            None => {
                self.domain = Some(domain.to_owned());
                Ok(())
            }
            Some(ours) if domain.is_empty() || domain == ours => Ok(()),
            Some(_) => Err("a stream keeps its first message's domain".into()),
        }
    }

    /// The actions one bucket's usage report calls for, at `now`.
    pub(super) async fn report(
        &mut self,
        usage: &BucketQuotaUsage,
        now: Instant,
    ) -> Vec<BucketAction> {
        let Some(id) = usage.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
            return Vec::new();
        };
        let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
        self.quota.metrics.reported(allowed, denied);
        let name: BTreeMap<String, String> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !self.buckets.contains_key(&name) {
            if self.buckets.len() >= MAX_BUCKETS {
                self.quota.metrics.refused(Refusal::TooManyBuckets);
                return Vec::new();
            }
            self.quota.metrics.buckets.inc();
            self.buckets.insert(
                name.clone(),
                Bucket {
                    id: id.clone(),
                    last_report: None,
                    interval: REPORT_INTERVAL,
                    last_active: now,
                    rate_per_s: 0,
                    blanket: None,
                    lease: None,
                    flip: false,
                },
            );
        }
        let target = self.target(&name).await;
        let quota = Arc::clone(&self.quota);
        let Some(bucket) = self.buckets.get_mut(&name) else {
            return Vec::new();
        };
        let requests = allowed.saturating_add(denied);
        if let Some(last) = bucket.last_report.replace(now) {
            bucket.interval = now.duration_since(last).max(Duration::from_millis(100));
        }
        let seconds = bucket.interval.as_micros().max(1_000_000);
        bucket.rate_per_s =
            u64::try_from(u128::from(requests) * 1_000_000 / seconds).unwrap_or(u64::MAX);
        if requests > 0 {
            bucket.last_active = now;
        }
        if let Some(lease) = &mut bucket.lease {
            lease.admitted = lease.admitted.saturating_add(allowed);
        }
        let action = match target {
            Target::Unlimited => bucket.blanket(&quota, true, BLANKET_TTL_S, now),
            Target::Deny => bucket.blanket(&quota, false, BLANKET_TTL_S, now),
            Target::Refused(reason) => {
                quota.metrics.refused(reason);
                bucket.blanket(&quota, false, BLANKET_TTL_S, now)
            }
            Target::Lease(check, mode, deadline) => {
                bucket
                    .lease(
                        &quota,
                        &self.service,
                        check,
                        mode,
                        deadline,
                        requests,
                        denied,
                        now,
                    )
                    .await
            }
        };
        action.into_iter().collect()
    }

    /// Abandons the buckets idle for long and holding no lease (their actions).
    pub(super) async fn abandon_idle(&mut self, now: Instant) -> Vec<BucketAction> {
        let idle: Vec<_> = self
            .buckets
            .iter()
            .filter(|(_, b)| {
                b.lease.is_none() && now.duration_since(b.last_active) >= ABANDON_AFTER
            })
            .map(|(name, _)| name.clone())
            .collect();
        let mut actions = Vec::with_capacity(idle.len());
        for name in idle {
            if let Some(bucket) = self.buckets.remove(&name) {
                self.quota.metrics.buckets.dec();
                self.quota.metrics.assigned(Kind::Abandon);
                actions.push(BucketAction {
                    bucket_id: Some(bucket.id),
                    bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                });
            }
        }
        actions
    }

    /// What the policies in force ask of the bucket `name`.
    async fn target(&self, name: &BTreeMap<String, String>) -> Target {
        if name.len() >= self.service.limits().max_descriptors
            || name.keys().any(|key| key.starts_with("rls."))
        {
            return Target::Refused(Refusal::Invalid);
        }
        let mut descriptors = Descriptors::new();
        for (key, value) in name {
            descriptors.insert(key.clone(), value.clone());
        }
        if let Some(domain) = &self.domain {
            descriptors.insert(DOMAIN_DESCRIPTOR.into(), domain.clone());
        }
        let request = CheckRequest {
            policy: None,
            descriptors,
            cost: 1,
            spend: Spend::Record,
        };
        let plan = match self.service.plan_request(&request).await {
            Ok(plan) => plan,
            Err(error) => {
                tracing::debug!(%error, "an RLQS bucket is not a valid check");
                return Target::Refused(Refusal::Invalid);
            }
        };
        let deadline = plan.deadline();
        let enforced: Vec<_> = plan
            .parts
            .iter()
            .zip(&plan.checks)
            .filter(|(_, check)| check.enforce)
            .collect();
        if enforced.iter().any(|(part, _)| part.policy.is_deny()) {
            return Target::Deny;
        }
        match enforced.as_slice() {
            [] => Target::Unlimited,
            [(part, check)] if check.algorithm.leasable() => {
                Target::Lease((*check).clone(), part.policy.failure_mode(), deadline)
            }
            _ => Target::Refused(Refusal::Unsupported),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let buckets = i64::try_from(self.buckets.len()).unwrap_or(i64::MAX);
        self.quota.metrics.buckets.sub(buckets);
    }
}

impl Bucket {
    /// `ALLOW_ALL` or `DENY_ALL` for `ttl_s`, unless already said and far from its end. A lease
    /// it replaces is over (its rest is lost: its use is not known exactly).
    fn blanket(
        &mut self,
        quota: &Quota,
        allow: bool,
        ttl_s: u64,
        now: Instant,
    ) -> Option<BucketAction> {
        let renew_by = self.interval + MARGIN + MARGIN;
        if self.lease.is_none() {
            if let Some((said, until)) = self.blanket {
                if said == allow && until.saturating_duration_since(now) > renew_by {
                    return None;
                }
            }
        }
        self.lease = None;
        self.blanket = Some((allow, now + Duration::from_secs(ttl_s)));
        let (rule, kind) = if allow {
            (BlanketRule::AllowAll, Kind::AllowAll)
        } else {
            (BlanketRule::DenyAll, Kind::DenyAll)
        };
        quota.metrics.assigned(kind);
        Some(self.assign(Strategy::BlanketRule(rule as i32), ttl_s))
    }

    fn assign(&self, strategy: Strategy, ttl_s: u64) -> BucketAction {
        BucketAction {
            bucket_id: Some(self.id.clone()),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(prost_types::Duration {
                    seconds: i64::try_from(ttl_s).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }

    /// Keeps a lease-backed assignment going: settles the one that is over, renews one that is
    /// running out while requests come, takes the first when they start.
    #[allow(clippy::too_many_arguments)]
    async fn lease(
        &mut self,
        quota: &Quota,
        service: &CheckService,
        check: StoreCheck,
        mode: FailureMode,
        deadline: Option<Duration>,
        requests: u64,
        denied: u64,
        now: Instant,
    ) -> Option<BucketAction> {
        self.blanket = None;
        if let Some(lease) = &self.lease {
            let same = lease.check.key == check.key
                && lease.check.algorithm == check.algorithm
                && lease.check.cost == check.cost;
            let end = lease.sent + lease.ttl;
            if !same {
                // The policy changed: the new one applies from the next assignment, now.
                self.lease = None;
            } else if now >= end + MARGIN + MARGIN {
                // Over at Envoy, and this report was made after that: every request it
                // admitted is counted.
                self.settle(quota, service, deadline).await;
            } else {
                let running_out = end.saturating_duration_since(now) <= self.interval + MARGIN
                    || lease.admitted >= lease.tokens.div_ceil(4) * 3
                    || (denied > 0 && now >= lease.sent + self.interval);
                if !(running_out && requests > 0) {
                    return None;
                }
            }
        }
        if requests == 0 {
            return None;
        }
        self.take(quota, service, check, mode, deadline).await
    }

    /// Gives back what the lease, over and reported, did not use.
    async fn settle(&mut self, quota: &Quota, service: &CheckService, deadline: Option<Duration>) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let elapsed = u64::try_from(lease.asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        let unused = sizing::unused(
            &lease.check.algorithm,
            &lease.grant,
            lease.check.cost,
            lease.admitted,
            elapsed,
        );
        give_back(quota, service, &lease.check, &lease.grant, unused, deadline).await;
    }

    async fn take(
        &mut self,
        quota: &Quota,
        service: &CheckService,
        check: StoreCheck,
        mode: FailureMode,
        deadline: Option<Duration>,
    ) -> Option<BucketAction> {
        let cost = check.cost.max(1);
        let share = quota.shares.join(&check.key);
        let fraction = share.holders();
        let want = sizing::wanted(self.rate_per_s, u64::from(u32::MAX) / cost);
        let ask = StoreCheck {
            cost: want * cost,
            ..check.clone()
        };
        let asked = Instant::now();
        let mut taken = service.store().take(&ask, fraction, deadline).await;
        if let Ok(Some(grant)) = &taken {
            // Fewer left than holders: the last units go to whoever asks first.
            if grant.units == 0 && grant.decision.allowed && fraction > 1 {
                taken = service.store().take(&ask, 1, deadline).await;
            }
        }
        let grant = match taken {
            Ok(Some(grant)) => grant,
            Ok(None) => {
                quota.metrics.refused(Refusal::Unsupported);
                return self.blanket(quota, false, BLANKET_TTL_S, Instant::now());
            }
            Err(error) => {
                tracing::debug!(%error, "an RLQS lease could not be taken; the failure mode applies");
                quota.metrics.refused(Refusal::Store);
                let allow = mode == FailureMode::Open;
                return self.blanket(quota, allow, FAILURE_TTL_S, Instant::now());
            }
        };
        quota.metrics.taken.inc_by(grant.units);
        let spent = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        let Some(assignment) = sizing::assignment(&check.algorithm, &grant, cost, spent) else {
            // Nothing sent: every unit is unused. A running assignment ends on its own.
            let elapsed = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
            let unused = sizing::unused(&check.algorithm, &grant, cost, 0, elapsed);
            give_back(quota, service, &check, &grant, unused, deadline).await;
            return None;
        };
        quota.metrics.assigned.inc_by(assignment.tokens * cost);
        quota.metrics.assigned(Kind::TokenBucket);
        self.flip = !self.flip;
        let sent = Instant::now();
        let strategy = Strategy::TokenBucket(TokenBucket {
            max_tokens: u32::try_from(assignment.tokens).unwrap_or(u32::MAX),
            tokens_per_fill: Some(1),
            fill_interval: Some(prost_types::Duration {
                seconds: REFILL_INTERVAL_S,
                nanos: i32::from(self.flip),
            }),
        });
        let action = self.assign(strategy, assignment.ttl_s);
        // The lease this replaces is over once Envoy applies this one; its rest is lost.
        self.lease = Some(Lease {
            check,
            grant,
            asked,
            sent,
            ttl: Duration::from_secs(assignment.ttl_s),
            tokens: assignment.tokens,
            admitted: 0,
            _share: share,
        });
        Some(action)
    }
}

async fn give_back(
    quota: &Quota,
    service: &CheckService,
    check: &StoreCheck,
    grant: &Grant,
    units: u64,
    deadline: Option<Duration>,
) {
    if units == 0 {
        return;
    }
    match service
        .store()
        .give_back(check, units, grant.window, deadline)
        .await
    {
        Ok(true) => quota.metrics.given_back.inc_by(units),
        Ok(false) => {}
        Err(error) => tracing::debug!(%error, "RLQS units could not be given back"),
    }
}

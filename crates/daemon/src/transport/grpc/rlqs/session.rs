//! One RLQS stream's buckets: each usage report planned as a check would be (the `bucket_id` as
//! descriptors, the stream's domain as `rls.domain`), and answered when something changes:
//! `ALLOW_ALL` when no enforced policy applies, `DENY_ALL` for a block list (or a bucket that
//! cannot be leased exactly), else a token bucket backed by a lease taken from the store
//! ([`super::bucket`]); buckets idle for long are abandoned.
//!
//! A bucket's id is sized before anything of it is kept, and planned before it is kept: an id
//! over the bounds is refused and never echoed back (no answer names it: Envoy keeps its
//! `no_assignment_behavior`), an id that is no valid check gets `DENY_ALL` unkept, and a new
//! bucket past the budget ([`super::budget`]) gets its policy's failure mode as a blanket rule,
//! unkept. A kept bucket is keyed by its descriptors once; the budget is released as buckets
//! are abandoned and when the stream ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::actions::blanket_once;
use super::bucket::{Bucket, Name, BLANKET_TTL_S};
use super::budget::ConnectionBuckets;
use super::metrics::{Kind, Refusal};
use super::Quota;
use crate::check::{CheckRequest, CheckService, Spend};
use crate::config::envoy::DOMAIN_DESCRIPTOR;
use crate::limit::{Descriptors, FailureMode};
use crate::store::StoreCheck;
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{
        bucket_action::{AbandonAction, BucketAction as Action},
        BucketAction,
    },
    rate_limit_quota_usage_reports::BucketQuotaUsage,
};

/// A bucket with no request reported for this long, and no lease, is abandoned.
const ABANDON_AFTER: Duration = Duration::from_secs(30);

/// A stream's state.
pub(super) struct Session {
    quota: Arc<Quota>,
    service: Arc<CheckService>,
    /// What the streams of this one's connection keep.
    connection: ConnectionBuckets,
    domain: Option<String>,
    buckets: HashMap<Name, Bucket>,
}

/// What a bucket's policies ask for.
enum Target {
    Unlimited,
    /// No policy matched at all (`ALLOW_ALL`, counted and logged).
    Unmatched,
    Deny,
    Lease(StoreCheck, FailureMode, Option<Duration>),
    Refused(Refusal),
}

impl Session {
    pub(super) fn new(
        quota: Arc<Quota>,
        service: Arc<CheckService>,
        connection: ConnectionBuckets,
    ) -> Self {
        Self {
            quota,
            service,
            connection,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// What every stream shares (tests read its metrics).
    #[cfg(test)]
    pub(super) fn quota(&self) -> &Quota {
        &self.quota
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
        let limits = self.service.limits();
        if let Some(reason) = self.quota.budget.oversized(limits, id.bucket.iter()) {
            tracing::debug!(%reason, "an RLQS bucket id over the bounds; refused, not echoed");
            self.quota.metrics.refused(Refusal::Invalid);
            return Vec::new();
        }
        let name: Name = Arc::new(
            id.bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let target = self.target(&name).await;
        if let Target::Refused(Refusal::Invalid) = target {
            self.quota.metrics.refused(Refusal::Invalid);
            return vec![blanket_once(&self.quota, &name, false, BLANKET_TTL_S)];
        }
        if !self.buckets.contains_key(&name) {
            if let Target::Unmatched = target {
                self.quota.unmatched(&name);
            }
            if let Err(reason) = self
                .quota
                .budget
                .reserve(self.buckets.len(), &self.connection)
            {
                self.quota.metrics.refused(reason);
                let allow = match &target {
                    Target::Unlimited | Target::Unmatched => true,
                    Target::Lease(_, mode, _) => *mode == FailureMode::Open,
                    Target::Deny | Target::Refused(_) => false,
                };
                return vec![blanket_once(&self.quota, &name, allow, BLANKET_TTL_S)];
            }
            self.quota.metrics.buckets.inc();
            let bucket = Bucket::new(Arc::clone(&name), now);
            self.buckets.insert(Arc::clone(&name), bucket);
        }
        let quota = Arc::clone(&self.quota);
        let Some(bucket) = self.buckets.get_mut(&name) else {
            return Vec::new();
        };
        let requests = bucket.note(allowed, denied, now);
        let action = match target {
            Target::Unlimited | Target::Unmatched => {
                bucket.blanket(&quota, true, BLANKET_TTL_S, now)
            }
            Target::Deny => bucket.blanket(&quota, false, BLANKET_TTL_S, now),
            Target::Refused(reason) => {
                quota.metrics.refused(reason);
                bucket.blanket(&quota, false, BLANKET_TTL_S, now)
            }
            Target::Lease(check, mode, deadline) => {
                return bucket
                    .lease(&quota, &self.service, check, mode, deadline, requests, now)
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
            .filter(|(_, b)| b.idle_for(now).is_some_and(|idle| idle >= ABANDON_AFTER))
            .map(|(name, _)| name.clone())
            .collect();
        let mut actions = Vec::with_capacity(idle.len());
        for name in idle {
            if let Some(bucket) = self.buckets.remove(&name) {
                self.quota.metrics.buckets.dec();
                self.quota.budget.release(1, &self.connection);
                self.quota.metrics.assigned(Kind::Abandon);
                actions.push(BucketAction {
                    bucket_id: Some(bucket.id()),
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
        if plan.parts.is_empty() {
            return Target::Unmatched;
        }
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
        self.quota
            .budget
            .release(self.buckets.len(), &self.connection);
    }
}

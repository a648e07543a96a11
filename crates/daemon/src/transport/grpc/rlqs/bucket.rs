//! One bucket of a stream and the assignment Envoy holds for it: a blanket rule, or a token
//! bucket backed by a lease ([`super::sizing`]) that is renewed at each report while the
//! lease's terms allow (the same bucket, a fresh time to live), replaced by a fresh one once
//! reported used up, settled (its unused part given back) once it is over and reported, and
//! replaced when the bucket's policy changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::actions;
use super::metrics::{Kind, Refusal};
use super::sizing::{self, DELIVERY_MARGIN_US, MAX_LIFE_S, REFILL_INTERVAL_S, RENEW_HEADROOM_US};
use super::{Quota, ShareGuard};
use crate::check::CheckService;
use crate::limit::{FailureMode, Grant};
use crate::store::StoreCheck;
use crate::transport::grpc::proto::envoy::r#type::v3::{
    rate_limit_strategy::{BlanketRule, Strategy},
    TokenBucket,
};
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::BucketAction, BucketId,
};

/// Time to live of `ALLOW_ALL` and `DENY_ALL` answers; renewed by reports before it ends.
pub(super) const BLANKET_TTL_S: u64 = 60;
/// Time to live of the answer to a store that could not lease (the policy's failure mode).
const FAILURE_TTL_S: u64 = 1;
/// Assumed time between an Envoy's reports until two have arrived.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);

const MARGIN: Duration = Duration::from_micros(DELIVERY_MARGIN_US);
const HEADROOM: Duration = Duration::from_micros(RENEW_HEADROOM_US);

/// A bucket's id as its descriptors, kept once (the session's map and the bucket share it).
pub(super) type Name = Arc<BTreeMap<String, String>>;

/// A bucket's state on one stream.
pub(super) struct Bucket {
    name: Name,
    last_report: Option<Instant>,
    interval: Duration,
    last_active: Instant,
    /// Requests per second in the last report.
    rate_per_s: u64,
    /// Of which allowed within the tokens its assignment held (demand a lease backed; the rest
    /// is a claim, as denials are).
    allowed_per_s: u64,
    blanket: Option<(bool, Instant)>,
    lease: Option<Lease>,
    /// Alternates between assignments, so that Envoy builds a fresh bucket for each (it keeps
    /// its bucket when a token bucket's settings repeat: that is how a renewal is said).
    flip: bool,
}

/// A lease backing the assignment Envoy holds.
struct Lease {
    check: StoreCheck,
    grant: Grant,
    /// Just before the take was asked: the lease's terms count from here.
    asked: Instant,
    /// The first assignment of this lease was sent (Envoy's bucket was made then).
    first_sent: Instant,
    /// The last assignment or renewal was sent, for `ttl`.
    sent: Instant,
    ttl: Duration,
    /// The assignment's requests (`max_tokens`), and what it said.
    tokens: u64,
    strategy: Strategy,
    /// Requests reported allowed since the assignment was sent.
    admitted: u64,
    _share: ShareGuard,
}

impl Bucket {
    /// A bucket first reported at `now`.
    pub(super) fn new(name: Name, now: Instant) -> Self {
        Self {
            name,
            last_report: None,
            interval: REPORT_INTERVAL,
            last_active: now,
            rate_per_s: 0,
            allowed_per_s: 0,
            blanket: None,
            lease: None,
            flip: false,
        }
    }

    /// Takes in a report of `allowed` and `denied` requests made at `now`; the requests.
    pub(super) fn note(&mut self, allowed: u64, denied: u64, now: Instant) -> u64 {
        let requests = allowed.saturating_add(denied);
        if let Some(last) = self.last_report.replace(now) {
            self.interval = now.duration_since(last).max(Duration::from_millis(100));
        }
        let seconds = self.interval.as_micros().max(1_000_000);
        let per_s = |n: u64| u64::try_from(u128::from(n) * 1_000_000 / seconds).unwrap_or(u64::MAX);
        self.rate_per_s = per_s(requests);
        let backed = self
            .lease
            .as_ref()
            .map_or(0, |lease| lease.tokens.saturating_sub(lease.admitted));
        self.allowed_per_s = per_s(allowed.min(backed));
        if requests > 0 {
            self.last_active = now;
        }
        if let Some(lease) = &mut self.lease {
            lease.admitted = lease.admitted.saturating_add(allowed);
        }
        requests
    }

    /// How long no request has been reported, if no lease is held.
    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        self.lease
            .is_none()
            .then(|| now.saturating_duration_since(self.last_active))
    }

    /// The bucket's id, for an answer.
    pub(super) fn id(&self) -> BucketId {
        actions::bucket_id(&self.name)
    }

    /// `ALLOW_ALL` or `DENY_ALL` for `ttl_s`, unless already said and far from its end. A lease
    /// it replaces is over (its rest is lost: its use is not known exactly).
    pub(super) fn blanket(
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
        actions::assignment(&self.name, strategy, ttl_s)
    }

    /// Keeps a lease-backed assignment going: renews the running one while its lease allows,
    /// settles the one that is over (or reported used up) and, while requests come, takes the
    /// next, or the first when they start.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lease(
        &mut self,
        quota: &Quota,
        service: &CheckService,
        check: StoreCheck,
        mode: FailureMode,
        deadline: Option<Duration>,
        requests: u64,
        now: Instant,
    ) -> Vec<BucketAction> {
        self.blanket = None;
        // Whether Envoy may still hold a running token bucket of this lease.
        let mut running = false;
        if let Some(lease) = &self.lease {
            let same = lease.check.key == check.key
                && lease.check.algorithm == check.algorithm
                && lease.check.cost == check.cost;
            let end = lease.sent + lease.ttl;
            let over = now >= end + MARGIN + MARGIN;
            if !same {
                // The policy changed: the new one applies from the next assignment, now.
                running = !over;
                self.lease = None;
            } else if over || lease.admitted >= lease.tokens {
                // Over at Envoy, and this report was made after that, or every token of its
                // bucket reported admitted (it admits nothing more, and a fresh one replaces
                // it): every request it admitted is counted.
                running = !over;
                self.settle(quota, service, deadline).await;
            } else if requests == 0 {
                // Still running at Envoy with no demand: left to end, and its rest comes back.
                return Vec::new();
            } else {
                // Still running at Envoy, tokens left: renewed while its lease allows (the same
                // settings keep Envoy's bucket, so its admissions stay within its tokens). If
                // its tokens will not last until the report after next, a fresh bucket
                // replaces it; what Envoy admitted on the old one since this report is counted
                // nowhere, so its whole rest is written off (never given back): under-admission
                // by at most what it had left, never over.
                let (left, cost) = (lease.tokens - lease.admitted, lease.check.cost.max(1));
                if left < self.demand_until_next_report() {
                    let fresh = self.take(quota, service, check, None, left, deadline);
                    if let Some(fresh) = fresh.await {
                        quota.metrics.written_off.inc_by(left.saturating_mul(cost));
                        return vec![self.clear(), fresh];
                    }
                }
                return self.renew(quota, now).into_iter().collect();
            }
        }
        if requests == 0 {
            return Vec::new();
        }
        match self
            .take(quota, service, check, Some(mode), 0, deadline)
            .await
        {
            Some(fresh) if running => vec![self.clear(), fresh],
            fresh => fresh.into_iter().collect(),
        }
    }

    /// Clears a running token bucket at Envoy, ahead of its replacement in the same message:
    /// Envoy 1.40 gives a token bucket that replaces a running one no tokens (measured: 0 of 80
    /// requests admitted on it), and a fresh one after a blanket rule.
    fn clear(&self) -> BucketAction {
        self.assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32), 1)
    }

    /// Requests the last report's rate asks for until a report interval and a second from now.
    fn demand_until_next_report(&self) -> u64 {
        let horizon = self.interval + Duration::from_secs(1);
        let requests = u128::from(self.rate_per_s).saturating_mul(horizon.as_micros()) / 1_000_000;
        u64::try_from(requests).unwrap_or(u64::MAX)
    }

    /// A renewal of the running assignment: the same token bucket for the longest time to live
    /// its lease still backs, if that ends later than the running one, and only while the
    /// renewal reaches Envoy before the running one ends there (a late one would be a fresh,
    /// full bucket), and while the bucket is young enough never to refill a token.
    fn renew(&mut self, quota: &Quota, now: Instant) -> Option<BucketAction> {
        // Counted from when it is sent (later than the report, by the takes of the report's
        // other buckets), never earlier.
        let now = now.max(Instant::now());
        let lease = self.lease.as_mut()?;
        let end = lease.sent + lease.ttl;
        if now + HEADROOM > end {
            return None;
        }
        let spent = u64::try_from(now.saturating_duration_since(lease.asked).as_micros())
            .unwrap_or(u64::MAX);
        let cost = lease.check.cost.max(1);
        let ttl_s = sizing::renewal(
            &lease.check.algorithm,
            &lease.grant,
            cost,
            lease.tokens,
            spent,
        )?;
        let ttl = Duration::from_secs(ttl_s);
        let renewed_end = now + ttl;
        if renewed_end < end + Duration::from_secs(1)
            || renewed_end > lease.first_sent + Duration::from_secs(MAX_LIFE_S)
        {
            return None;
        }
        lease.sent = now;
        lease.ttl = ttl;
        let strategy = lease.strategy;
        quota.metrics.assigned(Kind::Renewal);
        Some(self.assign(strategy, ttl_s))
    }

    /// Gives back what the lease, over and reported, did not use.
    async fn settle(&mut self, quota: &Quota, service: &CheckService, deadline: Option<Duration>) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let unused = sizing::unused(&lease.grant, lease.check.cost, lease.admitted);
        give_back(quota, service, &lease.check, &lease.grant, unused, deadline).await;
    }

    /// Takes a lease and sends the assignment it backs, if that is more than `more_than`
    /// tokens (else the units go back). `mode` is the policy's failure mode for a store that
    /// cannot take; `None` for a replacement, which then leaves the running assignment alone.
    async fn take(
        &mut self,
        quota: &Quota,
        service: &CheckService,
        check: StoreCheck,
        mode: Option<FailureMode>,
        more_than: u64,
        deadline: Option<Duration>,
    ) -> Option<BucketAction> {
        let cost = check.cost.max(1);
        let share = quota.shares.join(&check.key);
        // This bucket's running lease (about to be replaced) is no other holder.
        let replaced = self
            .lease
            .as_ref()
            .is_some_and(|lease| lease.check.key == check.key);
        let fraction = share.holders().saturating_sub(u64::from(replaced)).max(1);
        let interval = u64::try_from(self.interval.as_micros()).unwrap_or(u64::MAX);
        // Sized by the reported demand: what Envoy admitted as it is, what it denied (a claim)
        // at most the take's share of the limit.
        let most = u64::from(u32::MAX) / cost;
        let fair = sizing::fair_share(&check.algorithm, cost).min(most);
        let claimed = self.rate_per_s.saturating_sub(self.allowed_per_s);
        let part = |rate: u64, max: u64| match rate {
            0 => 0,
            rate => sizing::wanted(rate, interval, max),
        };
        let want = part(self.allowed_per_s, most)
            .saturating_add(part(claimed, fair))
            .clamp(1, most.max(1));
        let ask = StoreCheck {
            cost: sizing::ask_units(&check.algorithm, want, cost),
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
        let grant = match (taken, mode) {
            (Ok(Some(grant)), _) => grant,
            // A replacement that cannot be taken leaves the running assignment alone.
            (_, None) => return None,
            (Ok(None), Some(_)) => {
                quota.metrics.refused(Refusal::Unsupported);
                return self.blanket(quota, false, BLANKET_TTL_S, Instant::now());
            }
            (Err(error), Some(mode)) => {
                tracing::debug!(%error, "an RLQS lease could not be taken; the failure mode applies");
                quota.metrics.refused(Refusal::Store);
                let allow = mode == FailureMode::Open;
                return self.blanket(quota, allow, FAILURE_TTL_S, Instant::now());
            }
        };
        quota.metrics.taken.inc_by(grant.units);
        let spent = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        let assignment = sizing::assignment(&check.algorithm, &grant, cost, spent);
        let Some(assignment) = assignment.filter(|a| a.tokens > more_than) else {
            // Nothing sent (nothing backed, or no more than the running assignment has left,
            // which it keeps): every unit is unused.
            let unused = sizing::unused(&grant, cost, 0);
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
            first_sent: sent,
            sent,
            ttl: Duration::from_secs(assignment.ttl_s),
            tokens: assignment.tokens,
            strategy,
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
    // The store subtracts what a token bucket refilled by itself since the take.
    match service
        .store()
        .give_back(check, units, *grant, deadline)
        .await
    {
        Ok(back) => quota.metrics.given_back.inc_by(back),
        Err(error) => tracing::debug!(%error, "RLQS units could not be given back"),
    }
}

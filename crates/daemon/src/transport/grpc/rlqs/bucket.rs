//! One bucket of a stream and the assignment Envoy holds for it: a blanket rule, or a token
//! bucket that refills at the client's rate, backed by the units the bucket holds (its grants,
//! [`super::sizing`]). At each report with demand the bucket tops its units up (a take) when
//! they do not back the next assignment, and sends the assignment its units back: the same
//! settings renew Envoy's bucket, other settings replace it (Envoy carries the level over in
//! proportion). Once the assignment is over and reported, what is left comes back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::actions;
use super::metrics::{Kind, Refusal};
use super::pool::Pool;
use super::sizing::{self, Held, Terms, DELIVERY_MARGIN_US};
use super::Quota;
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
/// Assumed time between an Envoy's reports until two have arrived: Envoy 1.40 reports every
/// 5 s whatever the bucket's `reporting_interval` says.
const REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// Grants one bucket holds at most (a token bucket's expire and go; a fixed window's merge).
const MAX_GRANTS: usize = 32;
/// Takes one report may make to top a bucket's units up.
const TAKES: usize = 3;
/// The refill interval of an assignment that refills nothing: one token a day, and a nanosecond
/// so that Envoy (which compares only the nanoseconds of `fill_interval`) never takes it for a
/// bucket refilling one token a second.
const NO_REFILL: prost_types::Duration = prost_types::Duration {
    seconds: 86_400,
    nanos: 1,
};

const MARGIN: Duration = Duration::from_micros(DELIVERY_MARGIN_US);

/// A bucket's id as its descriptors, kept once (the session's map and the bucket share it).
pub(super) type Name = Arc<BTreeMap<String, String>>;

/// A bucket's state on one stream.
pub(super) struct Bucket {
    name: Name,
    last_report: Option<Instant>,
    interval: Duration,
    last_active: Instant,
    /// Requests allowed and denied per second in the last report.
    allowed_per_s: u64,
    denied_per_s: u64,
    /// Whether the last report had any request denied (or claimed).
    held_back: bool,
    blanket: Option<(bool, Instant)>,
    pool: Option<Pool>,
}

impl Bucket {
    /// A bucket first reported at `now`.
    pub(super) fn new(name: Name, now: Instant) -> Self {
        Self {
            name,
            last_report: None,
            interval: REPORT_INTERVAL,
            last_active: now,
            allowed_per_s: 0,
            denied_per_s: 0,
            held_back: false,
            blanket: None,
            pool: None,
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
        // Admissions past what the last assignment could admit are a claim, as denials are.
        let most = self
            .pool
            .as_ref()
            .map_or(
                Some((
                    Terms {
                        tokens: 0,
                        per_s: 0,
                        ttl_s: 0,
                    },
                    now,
                )),
                |pool| pool.sent,
            )
            .map_or(0, |(terms, _)| {
                let span = u64::try_from((self.interval + MARGIN).as_micros()).unwrap_or(u64::MAX);
                terms
                    .tokens
                    .saturating_add(sizing::refill(terms.per_s, span))
            });
        self.allowed_per_s = per_s(allowed.min(most));
        let claimed = denied.saturating_add(allowed.saturating_sub(most));
        self.denied_per_s = per_s(claimed);
        self.held_back = claimed > 0;
        if requests > 0 {
            self.last_active = now;
        }
        if let Some(pool) = &mut self.pool {
            pool.note(allowed, now);
        }
        requests
    }

    /// How long no request has been reported, if no units are held.
    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        self.pool
            .is_none()
            .then(|| now.saturating_duration_since(self.last_active))
    }

    /// The bucket's id, for an answer.
    pub(super) fn id(&self) -> BucketId {
        actions::bucket_id(&self.name)
    }

    /// `ALLOW_ALL` or `DENY_ALL` for `ttl_s`, unless already said and far from its end. Units
    /// held are lost (what Envoy admitted on them is not known exactly).
    pub(super) fn blanket(
        &mut self,
        quota: &Quota,
        allow: bool,
        ttl_s: u64,
        now: Instant,
    ) -> Option<BucketAction> {
        let renew_by = self.interval + MARGIN + MARGIN;
        if self.pool.is_none() {
            if let Some((said, until)) = self.blanket {
                if said == allow && until.saturating_duration_since(now) > renew_by {
                    return None;
                }
            }
        }
        self.write_off(quota);
        self.blanket = Some((allow, now + Duration::from_secs(ttl_s)));
        let (rule, kind) = if allow {
            (BlanketRule::AllowAll, Kind::AllowAll)
        } else {
            (BlanketRule::DenyAll, Kind::DenyAll)
        };
        quota.metrics.assigned(kind);
        Some(self.assign(Strategy::BlanketRule(rule as i32), ttl_s))
    }

    /// Drops the units held without giving them back (what Envoy admits on them is no longer
    /// followed): their unused part is counted written off.
    fn write_off(&mut self, quota: &Quota) {
        if let Some(pool) = self.pool.take() {
            let total: u64 = pool.grants.iter().map(|(g, _)| g.units).sum();
            quota
                .metrics
                .written_off
                .inc_by(total.saturating_sub(pool.used));
        }
    }

    fn assign(&self, strategy: Strategy, ttl_s: u64) -> BucketAction {
        actions::assignment(&self.name, strategy, ttl_s)
    }

    /// Keeps a lease-backed assignment going: while requests come, tops the units up and sends
    /// the assignment they back; once the assignment is over and reported, gives back the rest.
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
        if let Some(pool) = &self.pool {
            let same = pool.check.key == check.key
                && pool.check.algorithm == check.algorithm
                && pool.check.cost == check.cost;
            if !same {
                // The policy changed: the new one applies from the next assignment, now; what
                // the old units back may still be admitted, so they are not given back.
                self.write_off(quota);
            }
        }
        if requests == 0 {
            // No demand: the assignment is left to end, then what is left comes back.
            if self.pool.as_ref().is_some_and(|pool| !pool.running(now)) {
                self.settle(quota, service, deadline).await;
            }
            return Vec::new();
        }
        let cost = check.cost.max(1);
        let interval = u64::try_from(self.interval.as_micros()).unwrap_or(u64::MAX);
        // Sized by the reported demand: what Envoy admitted as it is, what it denied (a claim)
        // at most the policy's fair rate.
        let fair = sizing::fair_rate(&check.algorithm, cost);
        let mut want = sizing::wanted(
            self.allowed_per_s,
            self.denied_per_s.min(fair),
            self.held_back,
            interval,
        );
        if self.pool.as_ref().is_none_or(|pool| pool.grants.is_empty()) {
            // A burst from idle: at least the policy's burst share.
            let first = sizing::first(&check.algorithm, cost, interval);
            want.tokens = want.tokens.max(first.tokens);
            want.per_s = want.per_s.max(first.per_s);
        }
        // The most Envoy's running bucket may hold until the next assignment lands.
        let carried = self
            .pool
            .as_ref()
            .filter(|pool| pool.running(now))
            .map_or(0, |pool| pool.level);
        if let Some(refusal) = self
            .top_up(quota, service, &check, mode, want, carried, deadline, now)
            .await
        {
            return refusal.into_iter().collect();
        }
        self.send(quota, want, carried, now).into_iter().collect()
    }

    /// Takes what the units held lack for `want`, in up to [`TAKES`] takes (a grant taken
    /// behind others' debt lasts; one from a full token bucket starts to expire at once and
    /// leaves more to take). The first take opens the pool. A store that cannot take leaves a
    /// running pool alone; with none, the policy's failure mode answers.
    #[allow(clippy::too_many_arguments)]
    async fn top_up(
        &mut self,
        quota: &Quota,
        service: &CheckService,
        check: &StoreCheck,
        mode: FailureMode,
        want: Terms,
        carried: u64,
        deadline: Option<Duration>,
        now: Instant,
    ) -> Option<Option<BucketAction>> {
        for _ in 0..TAKES {
            let asked = Instant::now().max(now);
            let (short, fraction) = {
                let pool = self.pool.get_or_insert_with(|| {
                    Pool::open(check.clone(), now, quota.shares.join(&check.key))
                });
                if pool.grants.len() >= MAX_GRANTS {
                    return None;
                }
                let held = pool.held();
                let from = pool.us(now).saturating_sub(DELIVERY_MARGIN_US);
                let end = pool.us(asked) + DELIVERY_MARGIN_US + want.ttl_s * 1_000_000;
                let short =
                    pool.backing(&held)
                        .shortfall(want.tokens.max(carried), want.per_s, from, end);
                // Never more than the assignment itself admits at most (a report of more
                // admissions than Envoy could make burns no units).
                let most = want
                    .tokens
                    .max(carried)
                    .saturating_add(sizing::refill(want.per_s, end.saturating_sub(from)))
                    .saturating_mul(check.cost.max(1));
                (
                    short.min(most).min(u64::from(u32::MAX)),
                    pool.share.holders(),
                )
            };
            if short == 0 {
                return None;
            }
            let ask = StoreCheck {
                cost: short,
                ..check.clone()
            };
            let mut taken = service.store().take(&ask, fraction, deadline).await;
            if let Ok(Some(grant)) = &taken {
                // Fewer left than holders: the last units go to whoever asks first.
                if grant.units == 0 && grant.decision.allowed && fraction > 1 {
                    taken = service.store().take(&ask, 1, deadline).await;
                }
            }
            let opened = self
                .pool
                .as_ref()
                .is_some_and(|pool| pool.grants.is_empty());
            match taken {
                Ok(Some(grant)) if grant.units > 0 => {
                    quota.metrics.taken.inc_by(grant.units);
                    if let Some(pool) = &mut self.pool {
                        let held = Held {
                            units: grant.units,
                            asked_us: pool.us(asked),
                            hold_us: grant.hold_us,
                        };
                        pool.grants.push((grant, held));
                    }
                }
                // Nothing left: what is held is what is sent.
                Ok(Some(_)) => {
                    if opened {
                        self.pool = None;
                    }
                    return None;
                }
                _ if !opened => return None,
                Ok(None) => {
                    quota.metrics.refused(Refusal::Unsupported);
                    return Some(self.blanket(quota, false, BLANKET_TTL_S, Instant::now()));
                }
                Err(error) => {
                    tracing::debug!(%error, "an RLQS lease could not be taken; the failure mode applies");
                    quota.metrics.refused(Refusal::Store);
                    let allow = mode == FailureMode::Open;
                    return Some(self.blanket(quota, allow, FAILURE_TTL_S, Instant::now()));
                }
            }
        }
        None
    }

    /// The assignment the units held back, closest to `want`: a renewal when it repeats the
    /// last one (Envoy keeps its bucket), else a replacement; nothing when none is backed.
    fn send(
        &mut self,
        quota: &Quota,
        want: Terms,
        carried: u64,
        now: Instant,
    ) -> Option<BucketAction> {
        let pool = self.pool.as_mut()?;
        let held = pool.held();
        let from = pool.us(now).saturating_sub(DELIVERY_MARGIN_US);
        let sent = Instant::now().max(now);
        let interval = u64::try_from(self.interval.as_micros()).unwrap_or(u64::MAX);
        let min_ttl_s = sizing::ttl_for(interval);
        let terms = pool
            .backing(&held)
            .backed(want, carried, min_ttl_s, from, pool.us(sent))?;
        let cost = pool.check.cost.max(1);
        let renewal = pool
            .sent
            .is_some_and(|(last, _)| last.tokens == terms.tokens && last.per_s == terms.per_s);
        pool.record(terms, sent);
        if renewal {
            quota.metrics.assigned(Kind::Renewal);
        } else {
            quota
                .metrics
                .assigned
                .inc_by(terms.tokens.saturating_mul(cost));
            quota.metrics.assigned(Kind::TokenBucket);
        }
        let (tokens_per_fill, fill_interval) = match terms.per_s {
            0 => (1, NO_REFILL),
            per_s => (
                u32::try_from(per_s).unwrap_or(u32::MAX),
                prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                },
            ),
        };
        let strategy = Strategy::TokenBucket(TokenBucket {
            max_tokens: u32::try_from(terms.tokens).unwrap_or(u32::MAX),
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(fill_interval),
        });
        Some(self.assign(strategy, terms.ttl_s))
    }

    /// Gives back what the units held, the assignment over and reported, were not used for:
    /// the latest grants' first (the earliest to expire are counted used).
    async fn settle(&mut self, quota: &Quota, service: &CheckService, deadline: Option<Duration>) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        let now = Instant::now();
        let total: u64 = pool.grants.iter().map(|(g, _)| g.units).sum();
        let mut left = total.saturating_sub(pool.used.max(pool.expired(now)));
        for (grant, _) in pool.grants.iter().rev() {
            let units = left.min(grant.units);
            left -= units;
            give_back(quota, service, &pool.check, grant, units, deadline).await;
        }
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

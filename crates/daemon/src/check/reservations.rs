//! Reservations: reserve an estimate at the check, settle the real cost afterwards (an LLM
//! call's tokens are known only when its stream ends). `POST /v1/check` with `"reserve": true`
//! spends the request's cost on every policy it applies to, each a lease take of all or nothing
//! on the partition's counter (`RateStore::take` with fraction 0: the whole cost or none, in one
//! atomic step on the store's clock), and answers, when allowed, a `reservation` token. `POST
//! /v1/settle` with the real cost gives the difference back when it is lower, exactly as a
//! lease's give-back does (into the counter and window the units were taken from, never into a
//! counter reset, recreated or lost since: the take's lease epoch), or spends it when higher,
//! as a report does (bounded by `report_debt_periods`).
//!
//! A reservation settles once: the store marks it settled in one atomic step (`RateStore::
//! settle_mark`, on the first partition's key, so its Cluster slot), and a second settle, from
//! any pod, is refused with `already_settled` and changes nothing. One never settled needs
//! nothing done: its estimate was spent at the check, so it settled at its estimate; after its
//! `reservation_ttl` (on the store's clock) a settle is refused as `reservation_expired`.
//!
//! The token is a [`tokens`] token (domain `sluice-reservation`): the id, the MAC, and what
//! the settle needs, so that any pod may settle it without shared state besides the mark: the
//! reservation's end, and per counter its partition, window, policy revision, the algorithm
//! and quota the take used (tier included), and the take's grant (units, window, instant,
//! hold, epoch). A token whose MAC does not hold (forged, altered, another partition's or
//! another fleet's) is refused with a reason and changes nothing.
//!
//! A token bucket's refund is measured as a lease's give-back: the unused tokens are the last
//! of the reservation to refill, so the refund is exact until they would have refilled, and
//! smaller after (what the bucket refilled by itself is never given twice). A policy changed by
//! a reload since the reservation (its revision) gets nothing back and nothing more spent: its
//! partitions start afresh under the new definition.

mod settle;
mod token;

use std::sync::Arc;

use prometheus::{IntCounterVec, Opts};

use super::plan::Plan;
use super::request::{CheckError, CheckRequest};
use super::tokens::{self, Signer};
use super::verdict::{self, Mode, Outcome, PolicyDecision, Verdict};
use super::CheckService;
use crate::limit::{Algorithm, Grant};
use crate::store::{Spend, StoreError};
use token::{Reservation, Taken};

/// The longest reservation token accepted by a settle.
pub const MAX_RESERVATION_TOKEN: usize = 16 * 1024;

/// What the MAC is taken over first: reservations, permits and fingerprints never share a MAC
/// input.
const DOMAIN: &[u8] = b"sluice-reservation\0";

/// Signs and reads reservation tokens; counts reservations.
pub struct Reservations {
    signer: Signer,
    /// `sluice_reservations_total{policy,event}`.
    events: IntCounterVec,
    /// `sluice_reservation_units_total{policy,kind}`.
    units: IntCounterVec,
}

/// Why a settle was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// Not a reservation token's shape (`bad_reservation`).
    #[error("not a reservation: {0}")]
    Malformed(&'static str),
    /// The MAC does not hold (`forged_reservation`).
    #[error(
        "this reservation was not issued by this fleet: forged, altered (another partition's or \
         policy's), or signed with another shadow.fingerprint_key"
    )]
    Forged,
    /// Settled before (`already_settled`, 409).
    #[error("this reservation was settled already; a second settle changes nothing")]
    AlreadySettled,
    /// Its time to live ended before the settle (`reservation_expired`, 410).
    #[error("this reservation's reservation_ttl ended: it settled at its estimate")]
    Expired,
    /// The cost is out of bounds (`bad_request`).
    #[error("{0}")]
    Invalid(String),
    /// The store could not answer (`limiter_unavailable`, 503).
    #[error("the store could not settle the reservation ({0}); it settles at its estimate when its reservation_ttl ends")]
    Unavailable(StoreError),
}

/// What a settle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The units reserved (the check's cost).
    pub estimate: u64,
    /// The real cost settled.
    pub cost: u64,
    /// Per counter, in the check's order.
    pub parts: Vec<SettledPart>,
}

/// What a settle did on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledPart {
    /// The policy.
    pub policy: String,
    /// The window (its index in `limits`) for a policy of several.
    pub window: Option<usize>,
    /// Units given back to the counter.
    pub refunded: u64,
    /// Units spent beyond the estimate.
    pub charged: u64,
    /// False when the policy changed since the reservation (nothing given back or spent).
    pub applied: bool,
}

impl Reservations {
    /// Tokens signed with `secret` (`None`: a random key of this process).
    pub fn new(secret: Option<&[u8]>, metrics: &crate::telemetry::Metrics) -> Self {
        let events = IntCounterVec::new(
            Opts::new(
                "sluice_reservations_total",
                "Reservations by policy and event: opened, denied, settled, already_settled (a \
                 second settle, refused), expired (a settle after its reservation_ttl, refused).",
            ),
            &["policy", "event"],
        )
        .expect("a valid metric");
        let units = IntCounterVec::new(
            Opts::new(
                "sluice_reservation_units_total",
                "Units of reservations by policy and kind: reserved (spent at the check), \
                 refunded (given back by a settle), charged (spent by a settle beyond the \
                 estimate).",
            ),
            &["policy", "kind"],
        )
        .expect("a valid metric");
        for metric in [&events, &units] {
            if let Err(error) = metrics.registry().register(Box::new(metric.clone())) {
                tracing::debug!(%error, "a reservation metric not registered");
            }
        }
        Self::with_metrics(secret, events, units)
    }

    fn with_metrics(secret: Option<&[u8]>, events: IntCounterVec, units: IntCounterVec) -> Self {
        Self {
            signer: Signer::new(secret),
            events,
            units,
        }
    }

    /// The same counters, tokens signed with `secret`.
    pub fn rekeyed(&self, secret: Option<&[u8]>) -> Self {
        Self::with_metrics(secret, self.events.clone(), self.units.clone())
    }

    /// Every series of `policy`, so rate() sees the first one.
    pub fn register(&self, policy: &str) {
        for event in ["opened", "denied", "settled", "already_settled", "expired"] {
            self.events.with_label_values(&[policy, event]);
        }
        for kind in ["reserved", "refunded", "charged"] {
            self.units.with_label_values(&[policy, kind]);
        }
    }

    fn count(&self, policy: &str, event: &str) {
        self.events.with_label_values(&[policy, event]).inc();
    }

    fn count_units(&self, policy: &str, kind: &str, n: u64) {
        if n > 0 {
            self.units.with_label_values(&[policy, kind]).inc_by(n);
        }
    }
}

impl CheckService {
    /// Checks `request` and, when allowed, reserves its cost as an estimate (see the module's
    /// doc): the verdict's `reservation` is the token a settle names. Every policy the request
    /// applies to must take reservations (validated before anything is spent).
    pub async fn reserve(&self, request: &CheckRequest) -> Result<Verdict, CheckError> {
        if request.spend == Spend::DryRun {
            return Err(CheckError::Invalid(
                "a reservation spends its estimate: it cannot be a dry run".to_owned(),
            ));
        }
        let policies = self.policies();
        let mut plan = self.plan(&policies, request).await?;
        self.note_unmatched(request, &plan);
        if plan.is_empty() {
            return Ok(Verdict::unlimited());
        }
        // A concurrency policy holds a permit beside the reservation (its slot is one request,
        // whatever the cost: nothing of it to settle); a block list denies as for a check.
        if let Some(part) = plan
            .parts
            .iter()
            .zip(&plan.checks)
            .find_map(|(part, check)| {
                let held = matches!(check.algorithm, Algorithm::Concurrency(_));
                let exempt = held || part.policy.is_deny();
                (!exempt && part.policy.reservation_ttl_us().is_none()).then_some(part)
            })
        {
            return Err(CheckError::ReservationsRefused(
                part.policy.name().to_owned(),
            ));
        }
        let verdict = if super::permits::holds_permits(&plan) {
            self.run_with_permits_as(Spend::Record, &mut plan, true)
                .await
        } else {
            self.run_reserved(&mut plan).await
        };
        if verdict.outcome == Outcome::Denied {
            for part in verdict::per_policy(&verdict.evaluated) {
                let reserving = part.policy.reservation_ttl_us().is_some();
                if reserving && part.mode != Mode::Shadow && !part.decision.allowed {
                    self.reservations.count(part.policy.name(), "denied");
                }
            }
        }
        self.record(&verdict);
        Ok(verdict)
    }

    /// Decides `plan` by taking each counter's cost, all or nothing; gives back what it took
    /// when the request is not admitted.
    pub(super) async fn run_reserved(&self, plan: &mut Plan) -> Verdict {
        let local = self.answer_locally(plan);
        let local = local.or_else(|| self.local_limit(plan, Spend::Record));
        if let Some(verdict) = local {
            return verdict;
        }
        if let Some(denied) = self.deny_listed(plan).await {
            return denied;
        }
        let deadline = plan.deadline();
        let asked = std::time::Instant::now();
        let mut decided = Vec::with_capacity(plan.checks.len());
        let mut taken: Vec<(usize, Grant)> = Vec::new();
        for at in 0..plan.checks.len() {
            let (check, part) = (&plan.checks[at], &plan.parts[at]);
            let mode = if check.enforce {
                Mode::Enforced
            } else {
                Mode::Shadow
            };
            match self.store.take(check, 0, deadline).await {
                Ok(Some(grant)) => {
                    let allowed = grant.units == check.cost && grant.decision.allowed;
                    if grant.units > 0 {
                        taken.push((at, grant));
                    }
                    let mut decision = grant.decision;
                    decision.allowed = allowed;
                    if let (Some(hot), true) = (&self.hot, check.enforce) {
                        // As for a check: a partition the store denies is denied in the pod
                        // until its retry (the reservation's cost, on the store's figures).
                        let leased = self.leases.as_ref().filter(|_| part.policy.lease());
                        let at_most = leased.map(super::Leases::idle);
                        hot.remember_for(&check.key, check.cost, &decision, asked, at_most);
                    }
                    decided.push(PolicyDecision {
                        policy: Arc::clone(&part.policy),
                        key: check.key.clone(),
                        decision,
                        mode,
                        advertised_us: check.algorithm.advertised_us(),
                        window_index: part.window_index,
                        part: at,
                    });
                    if !allowed && check.enforce {
                        break;
                    }
                }
                other => {
                    if let Err(error) = other {
                        tracing::debug!(%error, store = self.store.name(), "store could not take a reservation; applying the failure mode");
                    }
                    let mut one = plan.subset(&[at]);
                    decided.extend(self.local.degrade(&mut one, Spend::Record).into_iter().map(
                        |mut degraded| {
                            degraded.part = at;
                            degraded
                        },
                    ));
                }
            }
        }
        let mut verdict = verdict::decide(decided);
        if verdict.outcome != Outcome::Allowed {
            // Not admitted: what it took goes back now, into the counters it came from.
            for (at, grant) in taken {
                let check = &plan.checks[at];
                let _ = self
                    .store
                    .give_back(check, grant.units, grant, deadline)
                    .await;
            }
            return verdict;
        }
        // Every counter taken from, with a grant (a part the failure mode answered has none:
        // nothing was spent there, so there is nothing to settle).
        let ttl = plan
            .parts
            .iter()
            .filter_map(|part| part.policy.reservation_ttl_us())
            .min()
            .unwrap_or(0);
        let Some(&(_, first)) = taken.first() else {
            return verdict;
        };
        let reservation = Reservation {
            id: tokens::random_id(),
            expires_us: first.at_us.saturating_add(ttl),
            parts: taken
                .iter()
                .map(|&(at, grant)| Taken {
                    key: plan.checks[at].key.clone(),
                    window_index: plan.parts[at].window_index,
                    generation: plan.checks[at].generation,
                    algorithm: plan.checks[at].algorithm,
                    grant,
                })
                .collect(),
        };
        for part in verdict::per_policy(&verdict.evaluated) {
            self.reservations.count(part.policy.name(), "opened");
        }
        for part in &reservation.parts {
            self.reservations
                .count_units(part.key.policy(), "reserved", part.grant.units);
        }
        verdict.reservation = Some(self.reservations.token(&reservation));
        verdict
    }
}

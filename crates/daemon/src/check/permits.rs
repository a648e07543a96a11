//! Concurrency limits on the check path: a plan with a concurrency policy takes its permits
//! first (one store call each, on the partition's key, see [`RateStore::acquire`]), then asks
//! the store about the other policies as usual; the request is allowed only if both are, and the
//! permits it took are given back at once when it is not. The answer carries one `permit`
//! token for every permit the request holds; `POST /v1/release` gives them back.
//!
//! A permit token is `<id>.<mac>.<partitions>`: a 128-bit id from the operating system's
//! CSPRNG (32 hex digits, the member in the store), the first 64 bits of HMAC-SHA1 over the id
//! and the partitions (16 hex digits), and the partitions it holds (base64url of `policy \0
//! partition`, `\n` between them). The key is `shadow.fingerprint_key` (the same on every pod
//! given it, so any pod can release any pod's permit), else random per process. A token whose
//! MAC does not hold (forged, altered, from another partition or another fleet) is refused with
//! a reason and releases nothing; a genuine one releases its permits if they are still held and
//! answers `released: false` otherwise (released already, expired): releasing is idempotent.
//!
//! [`RateStore::acquire`]: crate::store::RateStore::acquire

use std::sync::Arc;

use prometheus::{IntCounterVec, Opts};

use super::permits_top::HeldPartitions;
use super::plan::Plan;
use super::tokens::{self, Signer, TokenError};
use super::verdict::{self, Mode, Outcome, PolicyDecision, Verdict};
use super::CheckService;
use crate::limit::{Algorithm, Key};
use crate::store::{Spend, StoreError};

/// The longest permit token accepted by a release (a request's permits, with their partitions).
pub const MAX_PERMIT_TOKEN: usize = 8 * 1024;

/// What the MAC is taken over first: permits and fingerprints never share a MAC input.
const DOMAIN: &[u8] = b"sluice-permit\0";

/// Signs and reads permit tokens; counts permits.
pub struct Permits {
    signer: Signer,
    /// `sluice_permits_total{policy,event}`.
    events: IntCounterVec,
    /// The partitions permits were taken in, for `/v1/top`.
    pub(super) held: Arc<HeldPartitions>,
}

/// Why a release was refused: the token is not one this fleet issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// Not a permit token's shape (`bad_permit`).
    #[error("not a permit: {0}")]
    Malformed(&'static str),
    /// The MAC does not hold: forged, altered, another partition's or another fleet's
    /// (`forged_permit`).
    #[error(
        "this permit was not issued by this fleet: forged, altered, or signed with another \
         shadow.fingerprint_key"
    )]
    Forged,
    /// The store could not answer: the permits return by themselves at their time to live.
    #[error("the store could not release the permit ({0}); it returns by itself when its permit_ttl ends")]
    Unavailable(StoreError),
}

impl From<TokenError> for ReleaseError {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::Malformed(why) => Self::Malformed(why),
            TokenError::Forged => Self::Forged,
        }
    }
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Whether any of the token's permits was still held (its slot is back now); false when
    /// every one was released already or had expired.
    pub released: bool,
    /// The policies whose permits the token held, in order.
    pub policies: Vec<String>,
}

impl Permits {
    /// Tokens signed with `secret` (`None`: a random key of this process).
    pub fn new(secret: Option<&[u8]>, metrics: &crate::telemetry::Metrics) -> Self {
        let events = IntCounterVec::new(
            Opts::new(
                "sluice_permits_total",
                "Concurrency permits by policy and event: acquired, denied, released, \
                 released_none (a release that found nothing held), expired (found past their \
                 permit_ttl, never released).",
            ),
            &["policy", "event"],
        )
        .expect("a valid metric");
        if let Err(error) = metrics.registry().register(Box::new(events.clone())) {
            tracing::debug!(%error, "sluice_permits_total not registered");
        }
        Self::with_events(secret, events, Arc::default())
    }

    fn with_events(
        secret: Option<&[u8]>,
        events: IntCounterVec,
        held: Arc<HeldPartitions>,
    ) -> Self {
        Self {
            signer: Signer::new(secret),
            events,
            held,
        }
    }

    /// The same counters and lists, tokens signed with `secret`.
    pub fn rekeyed(&self, secret: Option<&[u8]>) -> Self {
        Self::with_events(secret, self.events.clone(), Arc::clone(&self.held))
    }

    /// Every event's series of `policy`, so rate() sees the first one.
    pub fn register(&self, policy: &str) {
        for event in ["acquired", "denied", "released", "released_none", "expired"] {
            self.events.with_label_values(&[policy, event]);
        }
    }

    fn count(&self, policy: &str, event: &str, n: u64) {
        if n > 0 {
            self.events.with_label_values(&[policy, event]).inc_by(n);
        }
    }

    /// The token for permit `id` on `keys`.
    fn token(&self, id: u128, keys: &[Key]) -> String {
        self.signer.seal(DOMAIN, id, payload(keys).as_bytes())
    }

    /// The id and keys of a token this fleet issued.
    pub fn read(&self, token: &str) -> Result<(u128, Vec<Key>), ReleaseError> {
        let (id, text) = self.signer.open(DOMAIN, token, MAX_PERMIT_TOKEN)?;
        // Signed by this fleet: the payload is one `payload` wrote.
        let keys = text
            .split('\n')
            .map(|one| tokens::read_key(one).map_err(|_| ReleaseError::Forged))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((id, keys))
    }
}

/// Each key as [`tokens::push_key`] writes it, `\n` between them.
fn payload(keys: &[Key]) -> String {
    let mut out = String::new();
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        tokens::push_key(&mut out, key);
    }
    out
}

/// Whether `plan` has a concurrency policy's part.
pub(super) fn holds_permits(plan: &Plan) -> bool {
    plan.checks
        .iter()
        .any(|check| matches!(check.algorithm, Algorithm::Concurrency(_)))
}

impl CheckService {
    /// Decides a plan with concurrency policies (see the module's doc); records nothing in
    /// the decision metrics (the caller does).
    pub(super) async fn run_with_permits(&self, spend: Spend, plan: &mut Plan) -> Verdict {
        self.run_with_permits_as(spend, plan, false).await
    }

    /// [`Self::run_with_permits`]; with `reserve`, the other policies' cost is reserved (see
    /// `reservations`) and the verdict carries the reservation beside the permit.
    pub(super) async fn run_with_permits_as(
        &self,
        spend: Spend,
        plan: &mut Plan,
        reserve: bool,
    ) -> Verdict {
        let (held_at, rest_at): (Vec<usize>, Vec<usize>) = (0..plan.checks.len())
            .partition(|&at| matches!(plan.checks[at].algorithm, Algorithm::Concurrency(_)));
        let id = tokens::random_id();
        let deadline = plan.deadline();
        let mut decided = Vec::with_capacity(plan.checks.len());
        let mut taken: Vec<Key> = Vec::new();
        for &at in &held_at {
            let (check, part) = (&plan.checks[at], &plan.parts[at]);
            let policy = part.policy.name();
            match self.store.acquire(check, id, spend, deadline).await {
                Ok(acquired) => {
                    let decision = acquired.decision;
                    self.permits.count(policy, "expired", acquired.expired);
                    if spend == Spend::Record {
                        let event = if decision.allowed {
                            "acquired"
                        } else {
                            "denied"
                        };
                        self.permits.count(policy, event, 1);
                        if decision.allowed {
                            taken.push(check.key.clone());
                            let fingerprint = self.shadow_log.fingerprint_id(&check.key);
                            self.permits.held.note(fingerprint, check);
                        }
                    }
                    decided.push(PolicyDecision {
                        policy: Arc::clone(&part.policy),
                        key: check.key.clone(),
                        decision,
                        mode: if check.enforce {
                            Mode::Enforced
                        } else {
                            Mode::Shadow
                        },
                        advertised_us: check.algorithm.advertised_us(),
                        window_index: part.window_index,
                        part: at,
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, store = self.store.name(), "store could not take a permit; applying the failure mode");
                    let mut one = plan.subset(&[at]);
                    decided.extend(self.local.degrade(&mut one, spend).into_iter().map(
                        |mut degraded| {
                            degraded.part = at;
                            degraded
                        },
                    ));
                }
            }
        }
        let blocked = decided
            .iter()
            .any(|p| p.mode != Mode::Shadow && !p.decision.allowed);
        let mut reservation = None;
        if !blocked && !rest_at.is_empty() {
            let mut rest = plan.subset(&rest_at);
            let others = if reserve {
                self.run_reserved(&mut rest).await
            } else {
                let local = self.answer_locally(&rest);
                let local = local.or_else(|| self.local_limit(&mut rest, spend));
                let local = local.or_else(|| self.admit_leased(&mut rest, spend));
                match local {
                    Some(verdict) => verdict,
                    None => self.ask_store(spend, &mut rest).await,
                }
            };
            reservation = others.reservation;
            decided.extend(others.evaluated.into_iter().map(|mut other| {
                other.part = rest_at.get(other.part).copied().unwrap_or(other.part);
                other
            }));
            decided.sort_by_key(|p| p.part);
        }
        let mut verdict = verdict::decide(decided);
        verdict.reservation = reservation;
        if verdict.outcome == Outcome::Allowed {
            if !taken.is_empty() {
                verdict.permit = Some(self.permits.token(id, &taken));
            }
        } else {
            // Not admitted: the permits it took go back now, not at their time to live.
            for key in &taken {
                let _ = self.store.release(key, id, deadline).await;
            }
        }
        verdict
    }

    /// Gives back the permits of `token` (`POST /v1/release`).
    pub async fn release(&self, token: &str) -> Result<Release, ReleaseError> {
        let (id, keys) = self.permits.read(token)?;
        let mut released = false;
        for key in &keys {
            let answer = self
                .store
                .release(key, id, None)
                .await
                .map_err(ReleaseError::Unavailable)?;
            self.permits.count(key.policy(), "expired", answer.expired);
            let event = if answer.released {
                "released"
            } else {
                "released_none"
            };
            self.permits.count(key.policy(), event, 1);
            released |= answer.released;
        }
        Ok(Release {
            released,
            policies: keys.iter().map(|k| k.policy().to_owned()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(secret: &[u8]) -> Permits {
        let events = IntCounterVec::new(Opts::new("t", "t"), &["policy", "event"]).expect("metric");
        Permits::with_events(Some(secret), events, Arc::default())
    }

    #[test]
    fn a_token_reads_back_only_where_it_was_signed_and_unaltered() {
        let keys = vec![
            Key::new(Arc::from("gen"), ["tenant:a", "x\ny"]),
            Key::new(Arc::from("other"), ["b"]),
        ];
        let fleet = permits(b"secret");
        let token = fleet.token(42, &keys);
        assert_eq!(fleet.read(&token), Ok((42, keys.clone())));
        assert_eq!(permits(b"another").read(&token), Err(ReleaseError::Forged));
        // The same id and MAC on another partition.
        let moved = fleet.token(42, &keys[1..]);
        let (head, _) = token.rsplit_once('.').expect("three fields");
        let (_, tail) = moved.rsplit_once('.').expect("three fields");
        assert_eq!(
            fleet.read(&format!("{head}.{tail}")),
            Err(ReleaseError::Forged)
        );
        let other_id = format!("{:032x}{}", 43, &token[32..]);
        assert_eq!(fleet.read(&other_id), Err(ReleaseError::Forged));
        for bad in ["", "x", "a.b.c", &token[1..]] {
            assert!(
                matches!(fleet.read(bad), Err(ReleaseError::Malformed(_))),
                "{bad}"
            );
        }
    }
}

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

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use prometheus::{IntCounterVec, Opts};

use super::permits_top::HeldPartitions;
use super::plan::Plan;
use super::shadow_log::Hmac;
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
    signer: Hmac,
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

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Whether any of the token's permits was still held (its slot is back now); false when
    /// every one was released already or had expired.
    pub released: bool,
    /// The policies whose permits the token held, in order.
    pub policies: Vec<String>,
}

/// A permit id: 128 bits from the operating system's CSPRNG.
fn permit_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // The OS refused randomness (never on Linux once booted): ids from the std hasher's
        // random keys, unique per call, still unknowable to clients.
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        let high = state.hash_one(std::time::Instant::now());
        let low = state.hash_one(std::thread::current().id());
        return (u128::from(high) << 64) | u128::from(low);
    }
    u128::from_be_bytes(bytes)
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
        let signer = match secret {
            Some(secret) => Hmac::new(secret),
            None => Hmac::new(&permit_id().to_be_bytes()),
        };
        Self {
            signer,
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
        let payload = payload(keys);
        let mac = self
            .signer
            .mac64(&[DOMAIN, &id.to_be_bytes(), payload.as_bytes()]);
        format!("{id:032x}.{mac:016x}.{}", URL_SAFE_NO_PAD.encode(payload))
    }

    /// The id and keys of a token this fleet issued.
    pub fn read(&self, token: &str) -> Result<(u128, Vec<Key>), ReleaseError> {
        if token.len() > MAX_PERMIT_TOKEN {
            return Err(ReleaseError::Malformed("longer than any permit"));
        }
        let mut fields = token.splitn(3, '.');
        let (Some(id), Some(mac), Some(keys)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(ReleaseError::Malformed("expected <id>.<mac>.<partitions>"));
        };
        let hex = |text: &str, len: usize| {
            (text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u128::from_str_radix(text, 16).ok())
                .flatten()
        };
        let (Some(id), Some(mac)) = (hex(id, 32), hex(mac, 16)) else {
            return Err(ReleaseError::Malformed(
                "the id is 32 hex digits and the mac 16",
            ));
        };
        let payload = URL_SAFE_NO_PAD
            .decode(keys)
            .map_err(|_| ReleaseError::Malformed("the partitions are not base64url"))?;
        let expected = self.signer.mac64(&[DOMAIN, &id.to_be_bytes(), &payload]);
        if u128::from(expected) != mac {
            return Err(ReleaseError::Forged);
        }
        // Signed by this fleet: the payload is one `payload` wrote.
        let text = String::from_utf8(payload).map_err(|_| ReleaseError::Forged)?;
        let keys = text
            .split('\n')
            .map(|one| {
                let (policy, partition) = one.split_once('\0').ok_or(ReleaseError::Forged)?;
                Ok(Key::from_partition(Arc::from(policy), partition.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((id, keys))
    }
}

/// `policy \0 partition` of each key, `\n` between them (partitions escape control bytes, and
/// policy names are `[a-z0-9_-]`, so neither separator occurs inside one).
fn payload(keys: &[Key]) -> String {
    let mut out = String::new();
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(key.policy());
        out.push('\0');
        out.push_str(key.partition());
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
        let (held_at, rest_at): (Vec<usize>, Vec<usize>) = (0..plan.checks.len())
            .partition(|&at| matches!(plan.checks[at].algorithm, Algorithm::Concurrency(_)));
        let id = permit_id();
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
        if !blocked && !rest_at.is_empty() {
            let mut rest = plan.subset(&rest_at);
            let local = self.answer_locally(&rest);
            let local = local.or_else(|| self.local_limit(&mut rest, spend));
            let local = local.or_else(|| self.admit_leased(&mut rest, spend));
            let others = match local {
                Some(verdict) => verdict,
                None => self.ask_store(spend, &mut rest).await,
            };
            decided.extend(others.evaluated.into_iter().map(|mut other| {
                other.part = rest_at.get(other.part).copied().unwrap_or(other.part);
                other
            }));
            decided.sort_by_key(|p| p.part);
        }
        let mut verdict = verdict::decide(decided);
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

    #[test]
    fn ids_differ() {
        assert_ne!(permit_id(), permit_id());
    }
}

//! The check API's JSON bodies and rate-limit headers: the stable wire contract that clients in
//! other languages rely on (docs/api.md).

use axum::http::header::{CACHE_CONTROL, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use std::fmt::Write as _;
use std::sync::Arc;

use crate::check::{CheckError, CheckRequest, Mode, Outcome, PolicyDecision, Spend, Verdict};
use crate::limit::{period_name, Descriptors, Micros};

/// `POST /v1/check` body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    /// Check only this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The request's attributes; a name given twice is an error, not "the last one wins".
    #[serde(default, deserialize_with = "unique_descriptors")]
    pub descriptors: Descriptors,
    /// Units to spend; 1 when absent.
    #[serde(default = "one")]
    pub cost: u64,
    /// Evaluate without spending.
    #[serde(default)]
    pub dry_run: bool,
    /// Spend `cost` as an estimate and answer a `reservation` to settle (`POST /v1/settle`);
    /// `/v1/check` only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserve: bool,
}

fn one() -> u64 {
    1
}

/// Reads a descriptor object, refusing a name given twice.
fn unique_descriptors<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Descriptors, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = Descriptors;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of descriptor names to string values")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Descriptors, A::Error> {
            let mut descriptors = Descriptors::new();
            while let Some((name, value)) = map.next_entry::<String, String>()? {
                if descriptors.contains_key(&name) {
                    return Err(serde::de::Error::custom(format_args!(
                        "descriptor `{name}` given more than once"
                    )));
                }
                descriptors.insert(name, value);
            }
            Ok(descriptors)
        }
    }
    deserializer.deserialize_map(Unique)
}

/// Only a JSON object is a request: serde reads an array as the struct's fields by position
/// (`["login", {...}, 1, false]`), which no client means.
pub fn object_only(json: &[u8]) -> Result<(), &'static str> {
    match json.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err("expected a JSON object"),
    }
}

impl From<CheckBody> for CheckRequest {
    fn from(body: CheckBody) -> Self {
        Self {
            policy: body.policy,
            descriptors: body.descriptors,
            cost: body.cost,
            spend: Spend::from_dry_run(body.dry_run),
        }
    }
}

/// `POST /v1/check/batch` body. Items stay raw JSON text until [`BatchBody::requests`], so that
/// an error can name the item (and duplicate names in an item are still seen).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// Independent checks, answered in the same order.
    pub checks: Vec<Box<RawValue>>,
}

impl BatchBody {
    /// Parses every item; the error names the first bad one.
    pub fn requests(self) -> Result<Vec<CheckRequest>, String> {
        self.checks
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                object_only(item.get().as_bytes())
                    .map_err(|error| format!("checks[{index}]: {error}"))?;
                let body = serde_json::from_str::<CheckBody>(item.get())
                    .map_err(|error| format!("checks[{index}]: {error}"))?;
                if body.reserve {
                    return Err(format!(
                        "checks[{index}]: a batch cannot reserve; reserve with POST /v1/check"
                    ));
                }
                Ok(body.into())
            })
            .collect()
    }
}

/// `POST /v1/check/batch` answer.
#[derive(Debug, Clone, Serialize)]
pub struct BatchReply<'a> {
    /// One answer per check, in order.
    pub results: Vec<CheckReply<'a>>,
}

/// The answer to one check (200, 429 or 503), borrowing from its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReply<'a> {
    /// Whether the request may go through.
    pub allowed: bool,
    /// The deciding policy; `null` when none applied.
    pub policy: Option<&'a str>,
    /// The deciding policy's window that decided (its index in the policy's `limits`), for a
    /// policy of several windows; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Most units the deciding policy ever has available at once; `null` when none applied.
    pub limit: Option<u64>,
    /// Units still available; `null` when none applied or nothing was counted (`fail_open`,
    /// `fail_closed`: the store was not reached).
    pub remaining: Option<u64>,
    /// Milliseconds (rounded up) until the quota is fully restored.
    pub reset_after_ms: u64,
    /// Milliseconds (rounded up) until this request would pass; 0 when allowed.
    pub retry_after_ms: u64,
    /// `enforced`, `shadow`, `fail_open`, `local`, `local_limit` (denied by the policy's
    /// per-pod local limit) or `fail_closed` (on a 503).
    pub mode: Mode,
    /// `rate_limit` on a 429, `limiter_unavailable` on a 503.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// Whole seconds (rounded up) until this request would pass, as in `Retry-After`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_sec: Option<u64>,
    /// When allowed by a concurrency policy: the permit the request holds until `POST
    /// /v1/release` gives it back (or its `permit_ttl` ends); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit: Option<&'a str>,
    /// When a `"reserve": true` check is allowed: the reservation `POST /v1/settle` settles
    /// with the real cost (within the policies' `reservation_ttl`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<&'a str>,
}

/// `POST /v1/settle` body: a reservation and the real cost.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleBody {
    /// The `reservation` of the check's answer, as it was.
    pub reservation: String,
    /// The units really used (0 or more).
    pub cost: u64,
}

/// `POST /v1/settle` answer (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleReply {
    /// Always true: the reservation is settled now (a refusal is a 4xx).
    pub settled: bool,
    /// The units reserved at the check.
    pub estimate: u64,
    /// The units settled.
    pub cost: u64,
    /// Per counter the reservation spent on, in the check's order.
    pub policies: Vec<SettledPolicy>,
}

/// One counter of [`SettleReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettledPolicy {
    /// The policy.
    pub policy: String,
    /// The window (its index in `limits`) for a policy of several; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Units given back (the estimate less the cost, or less when a token bucket refilled
    /// them meanwhile; 0 when the window ended or the counter was reset since).
    pub refunded: u64,
    /// Units spent beyond the estimate.
    pub charged: u64,
    /// False when the policy was changed by a reload since the check: nothing was given back
    /// or spent.
    pub applied: bool,
}

/// `POST /v1/release` body: the permit an allowed check answered.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The `permit` of the check's answer, as it was.
    pub permit: String,
}

/// `POST /v1/release` answer (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    /// Whether the permit was still held and its slot is back now; `false` when it was
    /// released already or its `permit_ttl` had ended (a release is idempotent).
    pub released: bool,
    /// The concurrency policies whose permits it held.
    pub policies: Vec<String>,
}

/// A 4xx answer: what was wrong, for a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// A stable code: `bad_request`, `unknown_policy`, `missing_descriptor`,
    /// `cost_exceeds_limit`, `payload_too_large`, `not_found`, `method_not_allowed`.
    pub error: String,
    /// What exactly is wrong.
    pub reason: String,
}

/// Seconds sent to a client told 503: retry soon, the store may be back.
const UNAVAILABLE_RETRY_SEC: u64 = 1;

fn ceil_div(us: Micros, unit: Micros) -> u64 {
    us.div_ceil(unit)
}

/// Whole seconds to wait, for both `Retry-After` and the body's `retry_after_sec` (one source, so
/// they always agree); `None` when allowed.
fn retry_after_sec(verdict: &Verdict) -> Option<u64> {
    match verdict.outcome {
        Outcome::Allowed => None,
        Outcome::Unavailable => Some(UNAVAILABLE_RETRY_SEC),
        Outcome::Denied => Some(ceil_div(
            verdict.deciding().map_or(0, |p| p.decision.retry_after_us),
            1_000_000,
        )),
    }
}

impl<'a> CheckReply<'a> {
    /// The HTTP status and body for a verdict.
    pub fn from_verdict(verdict: &'a Verdict) -> (StatusCode, Self) {
        let retry_after_sec = retry_after_sec(verdict);
        let (status, error) = match verdict.outcome {
            Outcome::Allowed => (StatusCode::OK, None),
            Outcome::Denied => (StatusCode::TOO_MANY_REQUESTS, Some("rate_limit")),
            Outcome::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, Some("limiter_unavailable")),
        };
        let reply = match verdict.deciding() {
            None => Self {
                allowed: true,
                policy: None,
                window: None,
                limit: None,
                remaining: None,
                reset_after_ms: 0,
                retry_after_ms: 0,
                mode: Mode::Enforced,
                error,
                retry_after_sec,
                permit: None,
                reservation: None,
            },
            Some(part) => Self {
                allowed: verdict.outcome == Outcome::Allowed,
                policy: Some(part.policy.name()),
                window: part.window_index,
                limit: Some(part.decision.limit),
                remaining: part.mode.counted().then_some(part.decision.remaining),
                reset_after_ms: ceil_div(part.decision.reset_after_us, 1_000),
                // A shadow policy's would-block is allowed all the same: nothing to wait for.
                retry_after_ms: if verdict.outcome == Outcome::Allowed {
                    0
                } else {
                    ceil_div(part.decision.retry_after_us, 1_000)
                },
                mode: part.mode,
                error,
                retry_after_sec,
                permit: verdict.permit.as_deref(),
                reservation: verdict.reservation.as_deref(),
            },
        };
        (status, reply)
    }
}

/// Rate-limit headers for a verdict: `Retry-After`, `X-RateLimit-*` and the IETF draft
/// `RateLimit-Policy` / `RateLimit` structured fields. Only enforced (or local) figures are
/// advertised: a shadow policy must stay invisible to clients and a fail-open answer has none.
///
/// `RateLimit-Policy` lists every window of the deciding policy that the answer evaluated, one
/// item each (named `<policy>/<period>` when it has several, `<policy>/local` for its local
/// limit); `X-RateLimit-*` and `RateLimit` give the deciding window's figures.
pub fn headers(verdict: &Verdict) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = retry_after_sec(verdict) {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    let Some(part) = verdict.deciding() else {
        return headers;
    };
    if !advertised(part) {
        return headers;
    }
    let d = &part.decision;
    let reset_sec = ceil_div(d.reset_after_us, 1_000_000);
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(d.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(d.remaining));
    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset_sec));
    // The structured fields are written piece by piece (no `format!`): this runs for every
    // answer, and the formatting machinery cost more than the rest of the headers together.
    let mut policy = String::with_capacity(64);
    let same_counter = |p: &&PolicyDecision| {
        Arc::ptr_eq(&p.policy, &part.policy) && p.key.partition() == part.key.partition()
    };
    for item in verdict
        .evaluated
        .iter()
        .filter(same_counter)
        .filter(|p| advertised(p))
    {
        if !policy.is_empty() {
            policy.push_str(", ");
        }
        // `w`: the advertised length, in seconds.
        let advertised_sec = ceil_div(item.advertised_us, 1_000_000).max(1);
        push_item(
            &mut policy,
            item,
            ("q", item.decision.limit),
            ("w", advertised_sec),
        );
    }
    let mut current = String::with_capacity(48);
    push_item(&mut current, part, ("r", d.remaining), ("t", reset_sec));
    for (name, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, current)] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
    headers
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Appends one structured-field item, `"<name>";<key>=<n>;<key>=<n>`, to `out`.
fn push_item(out: &mut String, part: &PolicyDecision, first: (&str, u64), second: (&str, u64)) {
    let mut digits = itoa::Buffer::new();
    out.push('"');
    ItemName(part).push_to(out);
    out.push('"');
    for (key, value) in [first, second] {
        out.push(';');
        out.push_str(key);
        out.push('=');
        out.push_str(digits.format(value));
    }
}

/// Whether a part's figures may be shown to the client.
fn advertised(part: &PolicyDecision) -> bool {
    matches!(part.mode, Mode::Enforced | Mode::Local | Mode::LocalLimit)
}

/// A part's name in `RateLimit-Policy` and `RateLimit`: the policy's name for a policy of one
/// window, `<policy>/<period>` for one of several, `<policy>/local` for its local limit.
pub struct ItemName<'a>(pub &'a PolicyDecision);

impl ItemName<'_> {
    /// Appends the name to `out` (a policy of one window, the common case, without formatting).
    fn push_to(&self, out: &mut String) {
        match (self.0.mode, self.0.key.period_us()) {
            (Mode::LocalLimit, _) | (_, Some(_)) => {
                let _ = write!(out, "{self}");
            }
            (_, None) => out.push_str(self.0.policy.name()),
        }
    }
}

impl std::fmt::Display for ItemName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let part = self.0;
        let name = part.policy.name();
        match (part.mode, part.key.period_us()) {
            (Mode::LocalLimit, _) => write!(f, "{name}/local"),
            (_, Some(period_us)) => write!(f, "{name}/{}", period_name(period_us)),
            (_, None) => f.write_str(name),
        }
    }
}

impl ErrorReply {
    /// A reply with this code and reason.
    pub fn new(error: &str, reason: impl Into<String>) -> Self {
        Self {
            error: error.to_owned(),
            reason: reason.into(),
        }
    }

    /// The status and body for a request the check service refused.
    pub fn from_check_error(error: &CheckError) -> (StatusCode, Self) {
        let status = match error {
            // Well-formed, and never to be accepted as sent: the policy says so.
            CheckError::ReportsRefused(_) | CheckError::ReservationsRefused(_) => {
                StatusCode::FORBIDDEN
            }
            _ => StatusCode::BAD_REQUEST,
        };
        (status, Self::new(code_of(error), error.to_string()))
    }
}

pub(crate) fn code_of(error: &CheckError) -> &'static str {
    match error {
        CheckError::Invalid(_) => "bad_request",
        CheckError::UnknownPolicy(_) => "unknown_policy",
        CheckError::MissingDescriptor { .. } => "missing_descriptor",
        CheckError::CostExceedsLimit { .. } => "cost_exceeds_limit",
        CheckError::ReportsRefused(_) => "reports_refused",
        CheckError::ReservationsRefused(_) => "reservations_off",
        CheckError::Batch(_, inner) => code_of(inner),
    }
}

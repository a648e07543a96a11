//! The check API's JSON bodies and rate-limit headers: the stable wire contract that clients in
//! other languages rely on (docs/api.md).

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::BytesMut;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use std::collections::btree_map::Entry;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};

use crate::check::{CheckError, CheckRequest, Mode, Outcome, PolicyDecision, Spend, Verdict};
use crate::limit::{period_name, Descriptors, Micros};

mod json;

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
                match descriptors.entry(name) {
                    Entry::Vacant(entry) => {
                        entry.insert(value);
                    }
                    Entry::Occupied(entry) => {
                        return Err(serde::de::Error::custom(format_args!(
                            "descriptor `{}` given more than once",
                            entry.key()
                        )));
                    }
                }
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
    rate_limit_headers(verdict, false)
}

/// [`headers`], then `content-type: application/json`: a JSON answer's whole header map.
pub fn json_headers(verdict: &Verdict) -> HeaderMap {
    rate_limit_headers(verdict, true)
}

fn rate_limit_headers(verdict: &Verdict, json: bool) -> HeaderMap {
    let retry_after = retry_after_sec(verdict);
    let Some(part) = verdict.deciding().filter(|part| advertised(part)) else {
        let mut headers = HeaderMap::with_capacity(3);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(seconds) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if json {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
        }
        return headers;
    };
    // Every value is written into one buffer and each header's value is a slice of it (two
    // allocations, the buffer and its shared count, where each value took two of its own); the
    // map is a copy of one holding these names in this order, its values then replaced in
    // place (no name hashed or looked up per answer). No `format!` either.
    let mut text = BytesMut::with_capacity(160);
    let mut ends = [0usize; 6];
    let mut count = 0;
    let mut end = |text: &BytesMut| {
        if let Some(end) = ends.get_mut(count) {
            *end = text.len();
            count += 1;
        }
    };
    let mut digits = itoa::Buffer::new();
    if let Some(seconds) = retry_after {
        text.extend_from_slice(digits.format(seconds).as_bytes());
        end(&text);
    }
    let d = &part.decision;
    let reset_sec = ceil_div(d.reset_after_us, 1_000_000);
    for value in [d.limit, d.remaining, reset_sec] {
        text.extend_from_slice(digits.format(value).as_bytes());
        end(&text);
    }
    let same_counter = |p: &&PolicyDecision| {
        Arc::ptr_eq(&p.policy, &part.policy) && p.key.partition() == part.key.partition()
    };
    let mut first = true;
    for item in verdict
        .evaluated
        .iter()
        .filter(same_counter)
        .filter(|p| advertised(p))
    {
        if !first {
            text.extend_from_slice(b", ");
        }
        first = false;
        // `w`: the advertised length, in seconds.
        let advertised_sec = ceil_div(item.advertised_us, 1_000_000).max(1);
        push_item(
            &mut text,
            item,
            ("q", item.decision.limit),
            ("w", advertised_sec),
        );
    }
    end(&text);
    push_item(&mut text, part, ("r", d.remaining), ("t", reset_sec));
    end(&text);
    let text = text.freeze();
    let mut start = 0;
    let values = ends[..count].iter().map(|&end| {
        let value = HeaderValue::from_maybe_shared(text.slice(start..end));
        start = end;
        value
    });
    let template = usize::from(retry_after.is_some()) | usize::from(json) << 1;
    let mut headers = TEMPLATES[template].clone();
    // `cache-control` (and `content-type`, last) stay; every other value is replaced, in order.
    for ((_, slot), value) in headers.iter_mut().skip(1).zip(values) {
        match value {
            Ok(value) => *slot = value,
            // A policy name that cannot be a header value (a control character): both
            // structured fields left out, as they always were.
            Err(_) => {
                headers.remove(RATELIMIT_POLICY);
                headers.remove(RATELIMIT);
                break;
            }
        }
    }
    headers
}

/// An advertised answer's headers, in order, with placeholder values: allowed, denied (with
/// `Retry-After`), each without and with `content-type`.
static TEMPLATES: LazyLock<[HeaderMap; 4]> = LazyLock::new(|| {
    [
        template(false, false),
        template(true, false),
        template(false, true),
        template(true, true),
    ]
});

/// The content type of every JSON answer.
pub const JSON: &str = "application/json";

fn template(denied: bool, json: bool) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(8);
    let placeholder = HeaderValue::from_static("0");
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if denied {
        headers.insert(RETRY_AFTER, placeholder.clone());
    }
    for name in [
        X_RATELIMIT_LIMIT,
        X_RATELIMIT_REMAINING,
        X_RATELIMIT_RESET,
        RATELIMIT_POLICY,
        RATELIMIT,
    ] {
        headers.insert(name, placeholder.clone());
    }
    if json {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    }
    headers
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Appends one structured-field item, `"<name>";<key>=<n>;<key>=<n>`, to `out`.
fn push_item(out: &mut BytesMut, part: &PolicyDecision, first: (&str, u64), second: (&str, u64)) {
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(b"\"");
    ItemName(part).push_to(out);
    out.extend_from_slice(b"\"");
    for (key, value) in [first, second] {
        out.extend_from_slice(b";");
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"=");
        out.extend_from_slice(digits.format(value).as_bytes());
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
    fn push_to(&self, out: &mut BytesMut) {
        match (self.0.mode, self.0.key.period_us()) {
            (Mode::LocalLimit, _) | (_, Some(_)) => {
                let _ = write!(out, "{self}");
            }
            (_, None) => out.extend_from_slice(self.0.policy.name().as_bytes()),
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

//! A group verdict as a `RateLimitResponse`: the overall code, one status per descriptor in
//! order, and the rate-limit headers Envoy forwards to the client. A converted `unlimited` or
//! exempt entry is answered as upstream answers it (OK, no `current_limit`).

use crate::check::{GroupVerdict, Mode, Outcome, PolicyDecision, Verdict};
use crate::config::envoy::StandIn;
use crate::limit::Micros;
use crate::transport::wire;
use hyper::header::CACHE_CONTROL;

use super::proto::envoy::config::core::v3::HeaderValue;
use super::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use super::proto::envoy::service::ratelimit::v3::RateLimitResponse;

const SECOND: Micros = 1_000_000;
/// Envoy's units, shortest first, with their length.
const UNITS: [(Unit, Micros); 6] = [
    (Unit::Second, SECOND),
    (Unit::Minute, 60 * SECOND),
    (Unit::Hour, 3_600 * SECOND),
    (Unit::Day, 86_400 * SECOND),
    (Unit::Month, 30 * 86_400 * SECOND),
    (Unit::Year, 365 * 86_400 * SECOND),
];

/// The response for a group verdict; headers only when `with_headers`.
pub(super) fn response(verdict: &GroupVerdict, with_headers: bool) -> RateLimitResponse {
    let no_limit = verdict
        .overall
        .deciding()
        .and_then(|part| StandIn::of(part.policy.name()))
        .is_some_and(StandIn::is_no_limit);
    let response_headers_to_add = if with_headers && !no_limit {
        headers(&verdict.overall)
    } else {
        Vec::new()
    };
    RateLimitResponse {
        overall_code: code(verdict.overall.outcome) as i32,
        statuses: verdict.items.iter().map(status).collect(),
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

fn code(outcome: Outcome) -> Code {
    match outcome {
        Outcome::Allowed => Code::Ok,
        // A fail-closed policy that could not be checked: OVER_LIMIT, not a gRPC error, since
        // Envoy lets a request through on errors unless `failure_mode_deny` is set.
        Outcome::Denied | Outcome::Unavailable => Code::OverLimit,
    }
}

fn status(item: &Verdict) -> DescriptorStatus {
    let mut status = DescriptorStatus {
        code: code(item.outcome) as i32,
        ..DescriptorStatus::default()
    };
    // A converted `unlimited` or exempt entry won its group: answered as upstream answers it.
    let no_limit = item
        .evaluated
        .iter()
        .find_map(|part| StandIn::of(part.policy.name()));
    if let (Some(kind), Outcome::Allowed) = (no_limit.filter(|k| k.is_no_limit()), item.outcome) {
        status.limit_remaining = match kind {
            StandIn::Unlimited => u32::MAX,
            StandIn::Exempt | StandIn::Blocked | StandIn::ShadowBlocked | StandIn::Override => 0,
        };
        return status;
    }
    if let Some(part) = item.deciding() {
        status.current_limit = Some(current_limit(part));
        status.limit_remaining = u32::try_from(part.decision.remaining).unwrap_or(u32::MAX);
        if part.mode != Mode::FailOpen {
            status.duration_until_reset = Some(duration(part.decision.reset_after_us));
        }
    }
    status
}

/// The policy's rate in Envoy's terms: `limit` per window when the window is a whole unit, else
/// the rate over the shortest unit that holds the window (rounded down, at least 1). For a
/// policy of several windows, the window that decided (named `<policy>/<period>` as in
/// `RateLimit-Policy`): Envoy takes one status per descriptor.
fn current_limit(part: &PolicyDecision) -> RateLimit {
    let (limit, advertised) = (part.decision.limit, part.advertised_us.max(1));
    let (unit, length) = UNITS
        .iter()
        .copied()
        .find(|(_, length)| *length >= advertised)
        .unwrap_or(UNITS[UNITS.len() - 1]);
    let per_unit = if length == advertised {
        limit
    } else {
        let scaled = u128::from(limit) * u128::from(length) / u128::from(advertised);
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    };
    RateLimit {
        name: wire::ItemName(part).to_string(),
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

fn duration(us: Micros) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(us / SECOND).unwrap_or(i64::MAX),
        // Below 1e9: the remainder of a division by 1e6, times 1000.
        nanos: i32::try_from((us % SECOND) * 1_000).unwrap_or(0),
    }
}

/// The check API's own rate-limit headers (`cache-control` aside: it is not a client concern),
/// moved out of the header map into Envoy's `HeaderValue`s, one allocation each for name and
/// value, the list allocated once at its size.
fn headers(verdict: &Verdict) -> Vec<HeaderValue> {
    let map = wire::headers(verdict);
    let mut out = Vec::with_capacity(map.len().saturating_sub(1));
    let mut name = None;
    for (key, value) in map {
        // `None`: another value of the previous name.
        name = key.or(name);
        let Some(key) = name.as_ref().filter(|key| **key != CACHE_CONTROL) else {
            continue;
        };
        if let Ok(value) = value.to_str() {
            out.push(HeaderValue {
                key: key.as_str().to_owned(),
                value: value.to_owned(),
                raw_value: Vec::new(),
            });
        }
    }
    out
}

//! A group verdict as Envoy's `RateLimitResponse`: the overall code, one status per descriptor
//! in order, and the rate-limit headers Envoy forwards to the client. A converted `unlimited` or
//! exempt entry is answered as upstream answers it (OK, no `current_limit`).
//!
//! The message is encoded straight into the answer's buffer, field by field as prost encodes
//! it (fields in tag order, proto3 defaults left out), from the verdict's borrowed names and the
//! check API's own header map: no message of owned `String`s (two per header, one per limit
//! name) is built, measured and dropped per answer. A test holds the bytes equal to prost's
//! encoding of the same answer.

use std::borrow::Cow;

use bytes::BufMut;
use hyper::header::{HeaderMap, CACHE_CONTROL};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

use crate::check::{GroupVerdict, Mode, Outcome, PolicyDecision, Verdict};
use crate::limit::{Micros, StandIn};
use crate::transport::wire;

use super::proto::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};

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

/// Writes the response for a group verdict to `buf` (headers only when `with_headers`) and
/// returns its overall code.
pub(super) fn encode(verdict: &GroupVerdict, with_headers: bool, buf: &mut impl BufMut) -> Code {
    let no_limit = verdict
        .overall
        .deciding()
        .and_then(|part| part.policy.stand_in())
        .is_some_and(StandIn::is_no_limit);
    let headers = if with_headers && !no_limit {
        wire::headers(&verdict.overall)
    } else {
        HeaderMap::new()
    };
    let overall = code(verdict.overall.outcome);
    write(overall, verdict.items.iter().map(status), &headers, buf);
    overall
}

fn code(outcome: Outcome) -> Code {
    match outcome {
        Outcome::Allowed => Code::Ok,
        // A fail-closed policy that could not be checked: OVER_LIMIT, not a gRPC error, since
        // Envoy lets a request through on errors unless `failure_mode_deny` is set.
        Outcome::Denied | Outcome::Unavailable => Code::OverLimit,
    }
}

/// One descriptor's `DescriptorStatus`, borrowed from its verdict.
#[derive(Debug, Clone)]
struct Status<'a> {
    code: Code,
    current_limit: Option<Limit<'a>>,
    limit_remaining: u32,
    /// `duration_until_reset`: seconds and nanoseconds.
    duration_until_reset: Option<(i64, i32)>,
}

/// A `RateLimit`: the deciding window's rate in Envoy's terms.
#[derive(Debug, Clone)]
struct Limit<'a> {
    name: Cow<'a, str>,
    requests_per_unit: u32,
    unit: Unit,
}

fn status(item: &Verdict) -> Status<'_> {
    let mut status = Status {
        code: code(item.outcome),
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
    };
    // A converted `unlimited` or exempt entry won its group: answered as upstream answers it.
    let no_limit = item
        .evaluated
        .iter()
        .find_map(|part| part.policy.stand_in());
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
fn current_limit(part: &PolicyDecision) -> Limit<'_> {
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
    // The name is the policy's own for a policy of one window (the usual case: borrowed);
    // `wire::ItemName` formats the others.
    let name = if part.mode != Mode::LocalLimit && part.key.period_us().is_none() {
        Cow::Borrowed(part.policy.name())
    } else {
        Cow::Owned(wire::ItemName(part).to_string())
    };
    Limit {
        name,
        requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
        unit,
    }
}

fn duration(us: Micros) -> (i64, i32) {
    (
        i64::try_from(us / SECOND).unwrap_or(i64::MAX),
        // Below 1e9: the remainder of a division by 1e6, times 1000.
        i32::try_from((us % SECOND) * 1_000).unwrap_or(0),
    )
}

// The encoding. Field numbers are those of Envoy's `rls.proto`, `base.proto` and
// `google/protobuf/duration.proto`; a field holding its default value is not written.

/// `RateLimitResponse`: `overall_code` (1), `statuses` (2), `response_headers_to_add` (3): the
/// check API's headers but `cache-control` (not a client concern), each value that is text.
fn write<'a>(
    overall: Code,
    statuses: impl Iterator<Item = Status<'a>>,
    headers: &HeaderMap,
    buf: &mut impl BufMut,
) {
    varint_field(1, overall as i32 as u64, buf);
    for status in statuses {
        message_field(2, status_len(&status), buf);
        write_status(&status, buf);
    }
    for (key, value) in headers {
        let Ok(value) = value.to_str() else {
            continue;
        };
        if key == CACHE_CONTROL {
            continue;
        }
        // `HeaderValue`: `key` (1), `value` (2).
        let len = bytes_field_len(1, key.as_str().len()) + bytes_field_len(2, value.len());
        message_field(3, len, buf);
        bytes_field(1, key.as_str().as_bytes(), buf);
        bytes_field(2, value.as_bytes(), buf);
    }
}

/// `DescriptorStatus`: `code` (1), `current_limit` (2), `limit_remaining` (3),
/// `duration_until_reset` (4).
fn write_status(status: &Status<'_>, buf: &mut impl BufMut) {
    varint_field(1, status.code as i32 as u64, buf);
    if let Some(limit) = &status.current_limit {
        message_field(2, limit_len(limit), buf);
        // `RateLimit`: `requests_per_unit` (1), `unit` (2), `name` (3).
        varint_field(1, u64::from(limit.requests_per_unit), buf);
        varint_field(2, limit.unit as i32 as u64, buf);
        bytes_field(3, limit.name.as_bytes(), buf);
    }
    varint_field(3, u64::from(status.limit_remaining), buf);
    if let Some((seconds, nanos)) = status.duration_until_reset {
        message_field(4, duration_len(seconds, nanos), buf);
        // `Duration`: `seconds` (1), `nanos` (2); int64 and int32 as varints of their
        // two's complement.
        varint_field(1, seconds as u64, buf);
        varint_field(2, i64::from(nanos) as u64, buf);
    }
}

fn status_len(status: &Status<'_>) -> usize {
    varint_field_len(1, status.code as i32 as u64)
        + status
            .current_limit
            .as_ref()
            .map_or(0, |limit| message_field_len(2, limit_len(limit)))
        + varint_field_len(3, u64::from(status.limit_remaining))
        + status.duration_until_reset.map_or(0, |(seconds, nanos)| {
            message_field_len(4, duration_len(seconds, nanos))
        })
}

fn limit_len(limit: &Limit<'_>) -> usize {
    varint_field_len(1, u64::from(limit.requests_per_unit))
        + varint_field_len(2, limit.unit as i32 as u64)
        + bytes_field_len(3, limit.name.len())
}

fn duration_len(seconds: i64, nanos: i32) -> usize {
    varint_field_len(1, seconds as u64) + varint_field_len(2, i64::from(nanos) as u64)
}

fn varint_field(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

fn bytes_field(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if !bytes.is_empty() {
        message_field(tag, bytes.len(), buf);
        buf.put_slice(bytes);
    }
}

fn bytes_field_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        message_field_len(tag, len)
    }
}

/// The key and length of a length-delimited field (a message is written even when empty).
fn message_field(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn message_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::grpc::proto::envoy::config::core::v3::HeaderValue;
    use crate::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit,
    };
    use crate::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;
    use hyper::header::{HeaderName, HeaderValue as Value, RETRY_AFTER};
    use prost::Message;

    /// The same answer as prost's own message.
    fn prost(overall: Code, statuses: &[Status<'_>], headers: &HeaderMap) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: overall as i32,
            statuses: statuses
                .iter()
                .map(|status| DescriptorStatus {
                    code: status.code as i32,
                    current_limit: status.current_limit.as_ref().map(|limit| RateLimit {
                        name: limit.name.to_string(),
                        requests_per_unit: limit.requests_per_unit,
                        unit: limit.unit as i32,
                    }),
                    limit_remaining: status.limit_remaining,
                    duration_until_reset: status
                        .duration_until_reset
                        .map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
                    ..DescriptorStatus::default()
                })
                .collect(),
            response_headers_to_add: headers
                .iter()
                .filter(|(key, _)| **key != CACHE_CONTROL)
                .filter_map(|(key, value)| {
                    Some(HeaderValue {
                        key: key.as_str().to_owned(),
                        value: value.to_str().ok()?.to_owned(),
                        raw_value: Vec::new(),
                    })
                })
                .collect(),
            ..RateLimitResponse::default()
        }
    }

    fn same_as_prost(overall: Code, statuses: &[Status<'_>], headers: &HeaderMap) {
        let mut ours = Vec::new();
        write(overall, statuses.iter().cloned(), headers, &mut ours);
        let theirs = prost(overall, statuses, headers);
        assert_eq!(ours, theirs.encode_to_vec(), "{theirs:?}");
        assert_eq!(RateLimitResponse::decode(&ours[..]).unwrap(), theirs);
    }

    fn limited(name: &str, per_unit: u32, unit: Unit, remaining: u32) -> Status<'_> {
        Status {
            code: Code::Ok,
            current_limit: Some(Limit {
                name: Cow::Borrowed(name),
                requests_per_unit: per_unit,
                unit,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some((59, 999_000_000)),
        }
    }

    #[test]
    fn answers_encode_as_prost_encodes_them() {
        let none = HeaderMap::new();
        same_as_prost(Code::Ok, &[], &none);
        same_as_prost(Code::Unknown, &[], &none);
        let bare = Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
        };
        same_as_prost(Code::Ok, std::slice::from_ref(&bare), &none);
        let unlimited = Status {
            limit_remaining: u32::MAX,
            ..bare.clone()
        };
        same_as_prost(Code::Ok, &[unlimited, bare.clone()], &none);
        let long_name = "p".repeat(300);
        let mut denied = limited(&long_name, u32::MAX, Unit::Year, 0);
        denied.code = Code::OverLimit;
        denied.duration_until_reset = Some((i64::MAX, 0));
        let zero_wait = Status {
            duration_until_reset: Some((0, 0)),
            ..limited("login/1m", 0, Unit::Unknown, 7)
        };
        let mut headers = HeaderMap::new();
        headers.insert(CACHE_CONTROL, Value::from_static("no-store"));
        headers.insert(RETRY_AFTER, Value::from(60u64));
        headers.insert("ratelimit", Value::from_static("\"login\";r=0;t=60"));
        let repeated = HeaderName::from_static("x-repeated");
        headers.append(repeated.clone(), Value::from_static("one"));
        headers.append(repeated.clone(), Value::from_static(""));
        headers.append(repeated, Value::from_bytes(b"not \xff text").unwrap());
        headers.insert("x-long", Value::try_from("v".repeat(200)).unwrap());
        same_as_prost(
            Code::OverLimit,
            &[
                limited("api", 1000, Unit::Minute, 149),
                denied,
                zero_wait,
                bare,
            ],
            &headers,
        );
    }

    #[test]
    fn durations_split_into_seconds_and_nanoseconds() {
        assert_eq!(duration(0), (0, 0));
        assert_eq!(duration(1_500_001), (1, 500_001_000));
        assert_eq!(duration(u64::MAX).1, 551_615_000);
    }
}

//! `POST /v1/report`'s answer: a cost spent after the fact (an LLM's tokens) decides nothing, so
//! it is a 200 whatever the counter holds (a 503 only when a fail-closed policy's store could not
//! take it), saying what is left and how long the next check waits.

use axum::http::header::CACHE_CONTROL;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::check::{Outcome, Verdict};

/// The answer to a report, borrowing from its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportReply<'a> {
    /// Whether every enforced policy's limit held the cost; `false`: it was spent past the
    /// deciding policy's limit, and checks are denied for `retry_after_ms`.
    pub within_limit: bool,
    /// The deciding policy (spent past its limit with the longest wait, else the least
    /// remaining); `null` when none applied (nothing was spent).
    pub policy: Option<&'a str>,
    /// The deciding window (its index in the policy's `limits`), for a policy of several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Most units the deciding policy ever has available at once; `null` when none applied.
    pub limit: Option<u64>,
    /// Units left after the spend (0 past the limit); `null` when none applied or nothing was
    /// counted (`fail_open`, `fail_closed`).
    pub remaining: Option<u64>,
    /// Milliseconds (rounded up) until the quota is full again if nothing else arrives.
    pub reset_after_ms: u64,
    /// Milliseconds (rounded up) until a check of 1 unit passes: 0 while units remain.
    pub retry_after_ms: u64,
    /// `enforced`, `shadow`, `fail_open` (the store could not take it: lost), `local` (spent
    /// in this pod's share) or `fail_closed` (on a 503).
    pub mode: &'static str,
    /// `limiter_unavailable` on a 503.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
}

impl<'a> ReportReply<'a> {
    /// The status and body for a report's verdict.
    pub fn from_verdict(verdict: &'a Verdict) -> (StatusCode, Self) {
        let (status, error) = match verdict.outcome {
            Outcome::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, Some("limiter_unavailable")),
            Outcome::Allowed | Outcome::Denied => (StatusCode::OK, None),
        };
        let within_limit = verdict.outcome == Outcome::Allowed;
        let reply = match verdict.deciding() {
            None => Self {
                within_limit,
                policy: None,
                window: None,
                limit: None,
                remaining: None,
                reset_after_ms: 0,
                retry_after_ms: 0,
                mode: "enforced",
                error,
            },
            Some(part) => Self {
                within_limit,
                policy: Some(part.policy.name()),
                window: part.window_index,
                limit: Some(part.decision.limit),
                remaining: part.mode.counted().then_some(part.decision.remaining),
                reset_after_ms: part.decision.reset_after_us.div_ceil(1_000),
                retry_after_ms: if within_limit {
                    0
                } else {
                    part.decision.retry_after_us.div_ceil(1_000)
                },
                mode: part.mode.as_str(),
                error,
            },
        };
        (status, reply)
    }

    /// The HTTP response for a report's verdict.
    pub fn response(verdict: &Verdict) -> Response {
        let (status, reply) = ReportReply::from_verdict(verdict);
        (status, [(CACHE_CONTROL, "no-store")], Json(reply)).into_response()
    }
}

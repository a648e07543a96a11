//! The simulator's side of the wire: request bodies, bounded requests, and the answers read as
//! the model compares them (and how a disagreement is named).

use std::time::Duration;

use axum::http::Method;
use serde_json::{json, Value};
use sluice::client::{self, Reply, Target};

use super::model::Expect;
use super::ops::{Item, Pick};

/// Longest one request may take before the step fails (bounded; no timing is asserted).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the daemon answered, as the model compares it.
#[derive(Debug, PartialEq, Eq)]
pub enum Actual {
    /// A 400 `cost_exceeds_limit`.
    TooCostly,
    /// An enforced answer.
    Answer { allowed: bool, remaining: u64 },
    /// Anything else: a failure mode, a 503, an unexpected status.
    Failure(String),
}

/// A check or report body.
pub fn body(item: &Item, check: bool) -> Value {
    let mut body = json!({"descriptors": {"user": format!("u{}", item.part)}, "cost": item.cost});
    if let Pick::One(policy) = item.pick {
        body["policy"] = json!(format!("p{policy}"));
    }
    if check && item.dry_run {
        body["dry_run"] = json!(true);
    }
    body
}

pub async fn post(target: Target, path: &str, body: Value) -> Result<Reply, String> {
    let bytes = body.to_string().into_bytes();
    let request = client::request(&target, Method::POST, path, Some(bytes));
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(reply) => reply.map_err(|e| format!("POST {path}: {e}")),
        Err(_) => Err(format!("POST {path}: no answer within {REQUEST_TIMEOUT:?}")),
    }
}

pub async fn get(target: Target, path: &str) -> Result<Reply, String> {
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        client::request(&target, Method::GET, path, None),
    )
    .await
    {
        Ok(reply) => reply.map_err(|e| format!("GET {path}: {e}")),
        Err(_) => Err(format!("GET {path}: no answer within {REQUEST_TIMEOUT:?}")),
    }
}

pub async fn delete(target: Target, path: &str) -> Result<Reply, String> {
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        client::request(&target, Method::DELETE, path, None),
    )
    .await
    {
        Ok(reply) => reply.map_err(|e| format!("DELETE {path}: {e}")),
        Err(_) => Err(format!(
            "DELETE {path}: no answer within {REQUEST_TIMEOUT:?}"
        )),
    }
}

/// One answer (`flag` is `allowed` for a check, `within_limit` for a report).
pub fn read(reply: &Reply, flag: &str) -> Actual {
    let body = reply.json();
    match reply.status.as_u16() {
        400 if body["error"] == "cost_exceeds_limit" => Actual::TooCostly,
        200 | 429 => answer(&body, flag),
        status => Actual::Failure(format!("status {status}: {body}")),
    }
}

fn answer(body: &Value, flag: &str) -> Actual {
    match (
        body["mode"].as_str(),
        body[flag].as_bool(),
        body["remaining"].as_u64(),
    ) {
        (Some("enforced"), Some(allowed), Some(remaining)) => Actual::Answer { allowed, remaining },
        _ => Actual::Failure(body.to_string()),
    }
}

pub fn read_batch(reply: &Reply) -> Vec<Actual> {
    let body = reply.json();
    match (reply.status.as_u16(), body["results"].as_array()) {
        (400, _) if body["reason"].as_str().is_some_and(|r| r.contains("cost")) => {
            vec![Actual::TooCostly]
        }
        (200, Some(results)) => results.iter().map(|r| answer(r, "allowed")).collect(),
        (status, _) => vec![Actual::Failure(format!("status {status}: {body}"))],
    }
}

pub fn agrees(expected: &[Expect], actual: &[Actual]) -> bool {
    expected.len() == actual.len()
        && expected.iter().zip(actual).all(|pair| match pair {
            (Expect::TooCostly, Actual::TooCostly) => true,
            (
                Expect::Answer { allowed, remaining },
                Actual::Answer {
                    allowed: got,
                    remaining: left,
                },
            ) => allowed == got && remaining.contains(left),
            _ => false,
        })
}

/// Which invariant the answers break, and how.
pub fn explain(expected: &[Expect], actual: &[Actual]) -> String {
    let over = expected.iter().zip(actual).any(|pair| {
        matches!(
            pair,
            (
                Expect::Answer { allowed: false, .. },
                Actual::Answer { allowed: true, .. }
            )
        )
    });
    let failure = actual.iter().any(|a| matches!(a, Actual::Failure(_)));
    let what = if failure {
        "a failure-mode answer while the store answered within its budget"
    } else if over {
        "over-admission: more than the policy in force allows"
    } else {
        "an answer other than the model's"
    };
    format!("{what}: expected {expected:?}, got {actual:?}")
}

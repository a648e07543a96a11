//! `GET /v1/top` on the admin listener: the partitions each policy denied most in this pod
//! (`policies`), and apart the partitions shadow policies would have blocked most (`shadow`:
//! their `denials` count would-blocks), and the concurrency partitions this pod took permits in
//! with the slots held now (`concurrency`, see `check::permits_top`) (`?policy=NAME` for one
//! policy's lists, `&limit=N`
//! entries each, 1 to 64, default 10). Any other
//! parameter, or a policy that does not exist, is a 400: a typo must not read as "nobody is
//! limited". Partitions are named by their log fingerprint; the partition itself (escaped key
//! descriptor values, which can be API keys or IPs) only to a local client (`listen.local_peers`:
//! 127.0.0.1 and ::1 unless widened; a port-forward or an exec in the pod), since the admin
//! listener may be reachable in-cluster, and a mesh's sidecar relays remote peers from other
//! 127.0.0.0/8 addresses.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::admin::AdminAccess;
use super::http::error_response;
use super::wire::ErrorReply;
use crate::check::{CheckService, HeldList, Tally, TopList, MAX_POLICIES, TOP_CAPACITY};

/// Entries per policy when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 10;

/// The answer.
#[derive(Debug, Serialize)]
struct TopReply {
    /// Whether `partition` is shown (local clients) or only fingerprints.
    raw_partitions: bool,
    /// The policy asked for, or every policy with a denial (name order).
    policies: Vec<TopList>,
    /// Would-blocks: the policy asked for, or every policy with one (name order).
    shadow: Vec<TopList>,
    /// Concurrency policies: the partitions this pod took permits in, with the slots held now
    /// (read from the store); the policy asked for, if it is one, or every one with a partition.
    concurrency: Vec<HeldList>,
}

/// What the query asks.
#[derive(Debug, PartialEq, Eq)]
struct TopQuery {
    policy: Option<String>,
    limit: usize,
}

/// Answers `GET /v1/top`.
pub async fn top(service: &CheckService, access: &AdminAccess, request: Request) -> Response {
    if request.method() != Method::GET {
        let mut response = error_response((
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorReply::new("method_not_allowed", "use GET"),
        ));
        // RFC 9110: a 405 lists the methods the resource takes.
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return response;
    }
    let query = match parse(request.uri().query().unwrap_or_default()) {
        Ok(query) => query,
        Err(reason) => {
            return error_response((
                StatusCode::BAD_REQUEST,
                ErrorReply::new("bad_request", reason),
            ))
        }
    };
    let raw = access.is_local(
        request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| *peer),
    );
    if let Some(name) = &query.policy {
        if service.policies().get(name).is_none() {
            return error_response((
                StatusCode::BAD_REQUEST,
                ErrorReply::new("unknown_policy", format!("unknown policy `{name}`")),
            ));
        }
        // Asked for by name: an untracked policy must not read as "nobody denied".
        if service.top_list(Tally::Denied, name, 1, false).is_none() {
            return error_response((
                StatusCode::CONFLICT,
                ErrorReply::new(
                    "not_tracked",
                    format!(
                        "policy `{name}` has no top list: the first {MAX_POLICIES} policies of the \
                         set (in file order) are tracked; its denials are counted in \
                         sluice_decisions_total only"
                    ),
                ),
            ));
        }
    }
    let lists = |tally: Tally| -> Vec<TopList> {
        let names = match &query.policy {
            Some(name) => vec![name.clone()],
            None => service.top_policies(tally),
        };
        names
            .iter()
            .filter_map(|name| service.top_list(tally, name, query.limit, raw))
            .collect()
    };
    let concurrency = service
        .held_lists(query.policy.as_deref(), query.limit, raw)
        .await;
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(TopReply {
            raw_partitions: raw,
            policies: lists(Tally::Denied),
            shadow: lists(Tally::WouldBlock),
            concurrency,
        }),
    )
        .into_response()
}

fn parse(query: &str) -> Result<TopQuery, String> {
    let mut parsed = TopQuery {
        policy: None,
        limit: DEFAULT_LIMIT,
    };
    let mut seen_limit = false;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "policy" if parsed.policy.is_none() => parsed.policy = Some(value.into_owned()),
            "limit" if !seen_limit => {
                seen_limit = true;
                parsed.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=TOP_CAPACITY).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "limit must be a whole number from 1 to {TOP_CAPACITY}, got {value:?}"
                        )
                    })?;
            }
            "policy" | "limit" => return Err(format!("`{name}` given twice")),
            other => {
                return Err(format!(
                    "unknown parameter `{other}`; /v1/top takes policy and limit"
                ))
            }
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_read_strictly() {
        assert_eq!(
            parse("policy=login&limit=5"),
            Ok(TopQuery {
                policy: Some("login".into()),
                limit: 5
            })
        );
        assert_eq!(parse("").map(|q| q.limit), Ok(DEFAULT_LIMIT));
        for bad in [
            "limit=0",
            "limit=65",
            "limit=x",
            "polcy=login",
            "policy=a&policy=b",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

//! `/v1/counters` on the admin listener: `GET` shows a partition's counter, `DELETE` resets it.
//! The counter is named in the query string, the way the check API names it in JSON:
//! `?policy=login&d.ip=203.0.113.7` is `{"policy": "login", "descriptors": {"ip": "203.0.113.7"}}`
//! (form encoding: `%XX` escapes, `+` is a space); `GET` also takes `cost` (default 1), the cost
//! whose `allowed` / `retry_after_ms` it reports. Anything else is a 400: a typo must not name
//! another counter. A reset lifts a limit, so it is taken only from the clients
//! `listen.admin_resets` allows (local clients by default: `listen.local_peers`); others get a 403, logged.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::admin::AdminAccess;
use super::http::error_response;
use super::wire::ErrorReply;
use crate::check::{CheckService, CounterError, CounterQuery};
use crate::config::AdminResets;
use crate::limit::Descriptors;
use crate::logging::LogGate;

/// Refused resets are a peer's doing: one warn line per 10 s at most.
static REFUSALS: std::sync::LazyLock<LogGate> =
    std::sync::LazyLock::new(|| LogGate::new(std::time::Duration::from_secs(10)));

/// The prefix of a descriptor parameter: `d.ip=...`.
const DESCRIPTOR_PREFIX: &str = "d.";

/// What the request asks of the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Show,
    Reset,
}

/// Answers `GET` and `DELETE /v1/counters`; resets only from the peers `resets` allows.
pub async fn counters(service: &CheckService, access: &AdminAccess, request: Request) -> Response {
    let action = match *request.method() {
        Method::GET => Action::Show,
        Method::DELETE => Action::Reset,
        _ => {
            let mut response = error_response((
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorReply::new("method_not_allowed", "use GET (show) or DELETE (reset)"),
            ));
            // RFC 9110: a 405 lists the methods the resource takes.
            response.headers_mut().insert(
                header::ALLOW,
                header::HeaderValue::from_static("GET, DELETE"),
            );
            return response;
        }
    };
    if has_body(&request) {
        return bad_request(
            "the counter is named in the query string (?policy=NAME&d.NAME=VALUE), not a body",
        );
    }
    let query = match parse(request.uri().query().unwrap_or_default(), action) {
        Ok(query) => query,
        Err(reason) => return bad_request(&reason),
    };
    let answer = match action {
        Action::Show => service
            .counter(&query)
            .await
            .map(|s| Json(s).into_response()),
        Action::Reset => {
            let peer = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| *addr);
            if let Err(reason) = may_reset(access, peer) {
                if let Some(held_back) = REFUSALS.pass() {
                    let requested_by = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
                    tracing::warn!(policy = %query.policy, requested_by, reason, held_back,
                        "counter reset refused (at most one line per 10 s)");
                }
                return error_response((
                    StatusCode::FORBIDDEN,
                    ErrorReply::new("forbidden", reason),
                ));
            }
            let peer = peer.map_or_else(|| "unknown".to_owned(), |addr| addr.to_string());
            service
                .reset_counter(&query, &peer)
                .await
                .map(|r| Json(r).into_response())
        }
    };
    answer.unwrap_or_else(|error| match error {
        CounterError::Request(error) => error_response(ErrorReply::from_check_error(&error)),
        CounterError::Store(error) => {
            tracing::debug!(%error, "counter request: the store could not answer");
            let kind = error.kind().map_or("circuit_open", |k| k.as_str());
            error_response((
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorReply::new(
                    "limiter_unavailable",
                    format!("the store could not answer ({kind}); nothing was changed"),
                ),
            ))
        }
    })
}

/// Whether `peer` may reset counters under `resets`; why not, if it may not.
fn may_reset(access: &AdminAccess, peer: Option<SocketAddr>) -> Result<(), &'static str> {
    match access.resets {
        AdminResets::Any => Ok(()),
        AdminResets::Off => Err("counter resets are off on this daemon (listen.admin_resets)"),
        AdminResets::Loopback if access.is_local(peer) => Ok(()),
        AdminResets::Loopback => Err(
            "counter resets are taken from local clients only (127.0.0.1 and ::1 unless \
             listen.local_peers widens it; kubectl port-forward); listen.admin_resets = \"any\" \
             allows other clients",
        ),
    }
}

fn bad_request(reason: &str) -> Response {
    error_response((
        StatusCode::BAD_REQUEST,
        ErrorReply::new("bad_request", reason),
    ))
}

/// Whether the request declares or streams a body.
fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|len| len.as_bytes() != b"0")
}

/// Reads `policy`, `d.<name>` (each name once) and, for `GET`, `cost`. The URI is already capped
/// (8 KiB), so the pairs are few; names and values are validated like a check's afterwards.
fn parse(query: &str, action: Action) -> Result<CounterQuery, String> {
    let mut policy = None;
    let mut cost = None;
    let mut descriptors = Descriptors::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let twice = || format!("parameter `{name}` given twice");
        if let Some(descriptor) = name.strip_prefix(DESCRIPTOR_PREFIX) {
            if descriptors
                .insert(descriptor.to_owned(), value.into_owned())
                .is_some()
            {
                return Err(twice());
            }
            continue;
        }
        match (name.as_ref(), action) {
            ("policy", _) => once(&mut policy, value.into_owned()).map_err(|()| twice())?,
            ("cost", Action::Show) => {
                let parsed = value
                    .parse::<u64>()
                    .map_err(|_| format!("cost must be a whole number, got {value:?}"))?;
                once(&mut cost, parsed).map_err(|()| twice())?;
            }
            ("cost", Action::Reset) => return Err("a reset takes no cost".into()),
            (other, Action::Show) => {
                return Err(format!(
                    "unknown parameter `{other}`; use policy=NAME, d.NAME=VALUE and cost=N"
                ))
            }
            (other, Action::Reset) => {
                return Err(format!(
                    "unknown parameter `{other}`; use policy=NAME and d.NAME=VALUE"
                ))
            }
        }
    }
    let policy = policy.ok_or("the policy parameter is missing: ?policy=NAME&d.NAME=VALUE")?;
    Ok(CounterQuery {
        policy,
        descriptors,
        cost: cost.unwrap_or(1),
    })
}

/// Fills `slot`, unless it already holds a value.
fn once<T>(slot: &mut Option<T>, value: T) -> Result<(), ()> {
    match slot {
        Some(_) => Err(()),
        None => {
            *slot = Some(value);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_policy_descriptors_and_cost() {
        let query = parse(
            "policy=login&d.ip=2001%3Adb8%3A%3A1&d.user=a+b&cost=3",
            Action::Show,
        )
        .expect("valid");
        assert_eq!(query.policy, "login");
        assert_eq!(query.descriptors["ip"], "2001:db8::1");
        assert_eq!(
            query.descriptors["user"], "a b",
            "form encoding: + is a space"
        );
        assert_eq!(query.cost, 3);
        assert_eq!(parse("policy=login", Action::Reset).expect("valid").cost, 1);
    }

    #[test]
    fn resets_come_from_the_peers_the_setting_allows() {
        let peer = |text: &str| Some(text.parse::<SocketAddr>().expect("address"));
        let access = |resets| AdminAccess {
            resets,
            local_peers: Default::default(),
        };
        let (local, off, any) = (
            access(AdminResets::Loopback),
            access(AdminResets::Off),
            access(AdminResets::Any),
        );
        for loopback in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
            assert_eq!(may_reset(&local, peer(loopback)), Ok(()), "{loopback}");
            assert!(may_reset(&off, peer(loopback)).is_err());
        }
        // Istio (REDIRECT) delivers mesh traffic from 127.0.0.6: not local unless listed.
        for remote in [
            "10.0.0.7:5000",
            "[fd00::7]:5000",
            "[::ffff:10.0.0.7]:5000",
            "127.0.0.6:5000",
            "127.9.9.9:1",
            "[::ffff:127.0.0.6]:5000",
        ] {
            assert!(may_reset(&local, peer(remote)).is_err(), "{remote}");
            assert_eq!(may_reset(&any, peer(remote)), Ok(()));
        }
        assert!(may_reset(&local, None).is_err(), "unknown peer");
        let widened = AdminAccess {
            resets: AdminResets::Loopback,
            local_peers: serde_json::from_str(r#"["127.0.0.0/8"]"#).expect("peers"),
        };
        assert_eq!(may_reset(&widened, peer("127.0.0.6:1")), Ok(()));
    }

    #[test]
    fn anything_ambiguous_is_refused() {
        let refused = |query: &str, action| parse(query, action).unwrap_err();
        assert!(refused("d.ip=1", Action::Show).contains("policy parameter is missing"));
        assert!(refused("policy=a&policy=b", Action::Show).contains("given twice"));
        assert!(refused("policy=a&policy=b", Action::Reset).contains("given twice"));
        assert!(refused("policy=a&d.ip=1&d.ip=2", Action::Show).contains("given twice"));
        assert!(refused("policy=a&cost=1&cost=2", Action::Show).contains("given twice"));
        assert!(refused("policy=a&cost=x", Action::Show).contains("whole number"));
        assert!(refused("policy=a&cost=1", Action::Reset).contains("takes no cost"));
        assert!(refused("policy=a&ip=1", Action::Show).contains("unknown parameter `ip`"));
        assert!(refused("policy=a&dry_run=1", Action::Reset).contains("unknown parameter"));
    }
}

//! `/v1/authz`: the check API for proxies that forward a request's headers instead of a JSON body
//! (nginx `auth_request`, Envoy `ext_authz` over HTTP, Traefik `forwardAuth`). Any method; the
//! answer is the same as `/v1/check`'s (status, JSON body, rate-limit headers).
//!
//! A proxy copies the client's own headers into the subrequest unless told not to, so only what
//! `[authz]` names is believed:
//! - Descriptors: each `X-Sluice-Descriptor-<name>: <value>` header whose name is in
//!   `authz.descriptors`; any other descriptor header, or one sent twice, is a 400.
//! - `method` and `path` always come from the original request, by `authz.original`:
//!   `X-Original-Method` / `X-Original-URI` (nginx), `X-Forwarded-Method` / `X-Forwarded-Uri`
//!   (Traefik), or this request's own method and path after `/v1/authz` (Envoy's `path_prefix`);
//!   the path is normalised as nginx does ([`super::path`]); matching then ignores its case and
//!   `;` parameters unless a policy says `path_case: exact` ([`crate::limit::Subject`]).
//! - `X-Sluice-Policy`, `X-Sluice-Cost`, `X-Sluice-Dry-Run` only when listed in `authz.control`
//!   (a 400 otherwise); dry run takes `true`/`false`/`1`/`0`, anything else is a 400.
//! - `X-Sluice-Deny-Status` (or `?deny_status=`, not both) replaces 429 on a denial: nginx `auth_request`
//!   understands only 401 and 403 as "deny" (anything else becomes a 500).
//! - Every denial carries `X-Sluice-Denied-By` (`rate_limit` or `limiter_unavailable`); a
//!   fail-closed policy whose store is down is a denial too (the deny status, `Retry-After: 1`),
//!   never a 5xx, which proxies read as the authorization service failing ([`denied_by`]).

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;

use super::http::error_response;
use super::wire::{self, CheckReply, ErrorReply};
use crate::check::{CheckRequest, CheckService, Outcome, Spend};
use crate::config::{AuthzSettings, ControlHeader, OriginalFrom};
use crate::limit::Descriptors;
use crate::telemetry::CheckSpan;

const DESCRIPTOR_PREFIX: &str = "x-sluice-descriptor-";

/// Answers an authorization subrequest, believing only the headers `config` names.
pub async fn authz(
    service: &CheckService,
    config: &AuthzSettings,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    span: Option<&CheckSpan>,
) -> Response {
    let bad_request = |reason: String| {
        super::traced::refused(span, "bad_request");
        error_response((
            StatusCode::BAD_REQUEST,
            ErrorReply::new("bad_request", reason),
        ))
    };
    let request = match request_from(config, &method, &uri, &headers) {
        Ok(request) => request,
        Err(reason) => return bad_request(reason),
    };
    let deny_status = match deny_status(&uri, &headers) {
        Ok(status) => status,
        Err(reason) => return bad_request(reason),
    };
    match super::traced::scope(span, service.check_without_permits(&request)).await {
        Err(error) => {
            super::traced::check_error(span, &error);
            error_response(ErrorReply::from_check_error(&error))
        }
        Ok(verdict) => {
            super::traced::verdict(span, &verdict);
            let (status, reply) = CheckReply::from_verdict(&verdict);
            let mut headers = wire::headers(&verdict);
            let status = match denied_by(verdict.outcome) {
                None => status,
                Some(cause) => {
                    headers.insert(DENIED_BY, HeaderValue::from_static(cause));
                    deny_status.unwrap_or(StatusCode::TOO_MANY_REQUESTS)
                }
            };
            super::http::json_response(status, headers, &reply)
        }
    }
}

/// Names why a request is denied: `rate_limit`, or `limiter_unavailable` (a fail-closed policy
/// whose store is down).
const DENIED_BY: HeaderName = HeaderName::from_static("x-sluice-denied-by");

/// The cause a denial is answered with, `None` when the request may go through. A fail-closed
/// policy's "store down" is a denial here (the deny status, 429 by default), not `/v1/check`'s
/// 503: proxies treat a 5xx from an authorization service as the service failing, and Envoy's
/// ext_authz with `failure_mode_allow` then lets the request through; a 4xx is relayed as a
/// denial by Envoy, nginx (with the deny status) and Traefik alike.
fn denied_by(outcome: Outcome) -> Option<&'static str> {
    match outcome {
        Outcome::Allowed => None,
        Outcome::Denied => Some("rate_limit"),
        Outcome::Unavailable => Some("limiter_unavailable"),
    }
}

/// The one value of header `name`; a header sent twice is refused rather than one copy picked.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("header {name} is sent more than once"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| format!("header {name} is not visible ASCII"))
}

/// A control header's value: `None` when absent; a 400 when sent but not enabled.
fn control<'a>(
    config: &AuthzSettings,
    headers: &'a HeaderMap,
    which: ControlHeader,
) -> Result<Option<&'a str>, String> {
    let value = header(headers, which.header())?;
    if value.is_some() && !config.allows(which) {
        return Err(format!(
            "header {} is not honoured here (authz.control)",
            which.header()
        ));
    }
    Ok(value)
}

fn request_from(
    config: &AuthzSettings,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<CheckRequest, String> {
    let mut descriptors = Descriptors::new();
    for name in headers.keys() {
        let Some(descriptor) = name.as_str().strip_prefix(DESCRIPTOR_PREFIX) else {
            continue;
        };
        if !config.descriptors.iter().any(|d| d == descriptor) {
            return Err(format!(
                "header {name} is not honoured here (authz.descriptors lists {:?})",
                config.descriptors
            ));
        }
        if let Some(value) = header(headers, name.as_str())? {
            descriptors.insert(descriptor.to_owned(), value.to_owned());
        }
    }
    let (original_method, original_uri) = match config.original {
        OriginalFrom::Nginx => original(headers, "x-original-method", "x-original-uri")?,
        OriginalFrom::Traefik => original(headers, "x-forwarded-method", "x-forwarded-uri")?,
        OriginalFrom::Path => {
            let rest = uri.path().strip_prefix("/v1/authz").unwrap_or("");
            (method.as_str(), if rest.is_empty() { "/" } else { rest })
        }
    };
    let path = super::path::normalize(original_uri)?;
    descriptors.insert("method".into(), original_method.to_owned());
    descriptors.insert("path".into(), path);
    let cost = match control(config, headers, ControlHeader::Cost)? {
        None => 1,
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| format!("X-Sluice-Cost {text:?} is not a whole number"))?,
    };
    let dry_run = match control(config, headers, ControlHeader::DryRun)? {
        None => false,
        Some(text) => parse_flag(text)
            .ok_or_else(|| format!("X-Sluice-Dry-Run {text:?}: use true, false, 1 or 0"))?,
    };
    Ok(CheckRequest {
        policy: control(config, headers, ControlHeader::Policy)?.map(str::to_owned),
        descriptors,
        cost,
        spend: Spend::from_dry_run(dry_run),
    })
}

/// The original method and URI from the proxy's two headers; both must be there.
fn original<'a>(
    headers: &'a HeaderMap,
    method: &str,
    uri: &str,
) -> Result<(&'a str, &'a str), String> {
    let missing = |name: &str| format!("header {name} is missing (authz.original)");
    Ok((
        header(headers, method)?.ok_or_else(|| missing(method))?,
        header(headers, uri)?.ok_or_else(|| missing(uri))?,
    ))
}

/// `true`/`false` (any case), `1`/`0`; anything else is not a flag.
fn parse_flag(text: &str) -> Option<bool> {
    match text.trim() {
        "1" => Some(true),
        "0" => Some(false),
        t if t.eq_ignore_ascii_case("true") => Some(true),
        t if t.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

fn deny_status(uri: &Uri, headers: &HeaderMap) -> Result<Option<StatusCode>, String> {
    let from_query = uri.query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("deny_status="))
    });
    let from_header = header(headers, "x-sluice-deny-status")?;
    if from_header.is_some() && from_query.is_some() {
        // Two answers to one question: neither is silently preferred.
        return Err(
            "deny status given both as X-Sluice-Deny-Status and ?deny_status=; give one".into(),
        );
    }
    let Some(text) = from_header.or(from_query) else {
        return Ok(None);
    };
    text.trim()
        .parse::<u16>()
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .filter(|status| status.is_client_error())
        .map(Some)
        .ok_or_else(|| format!("deny status {text:?} is not a 4xx status"))
}

//! `/v1/authz`: the check API for proxies that forward a request's headers instead of a JSON body
//! (nginx `auth_request`, Envoy `ext_authz` over HTTP, Traefik `forwardAuth`). Any method; the
//! answer is the same as `/v1/check`'s (status, JSON body, rate-limit headers).
//!
//! - Descriptors: each `X-Sluice-Descriptor-<name>: <value>` header. `method` and `path` default
//!   to the original request's: `X-Original-Method` / `X-Original-URI` (nginx),
//!   `X-Forwarded-Method` / `X-Forwarded-Uri` (Traefik), else this request's own method and path
//!   after `/v1/authz` (Envoy's `path_prefix`); the query string is dropped.
//! - `X-Sluice-Policy`, `X-Sluice-Cost`, `X-Sluice-Dry-Run: true` as in the JSON form.
//! - `X-Sluice-Deny-Status` (or `?deny_status=`) replaces 429 on a denial: nginx `auth_request`
//!   understands only 401 and 403 as "deny" (anything else becomes a 500).

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::wire::{self, CheckReply, ErrorReply};
use crate::check::{CheckRequest, CheckService};
use crate::limit::Descriptors;

const DESCRIPTOR_PREFIX: &str = "x-sluice-descriptor-";

/// Answers an authorization subrequest.
pub async fn authz(
    service: &CheckService,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let request = match request_from(&method, &uri, &headers) {
        Ok(request) => request,
        Err(reason) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(ErrorReply::new("bad_request", reason)),
            )
                .into_response()
        }
    };
    let deny_status = match deny_status(&uri, &headers) {
        Ok(status) => status,
        Err(reason) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(ErrorReply::new("bad_request", reason)),
            )
                .into_response()
        }
    };
    match service.check(&request).await {
        Err(error) => {
            let (status, reply) = ErrorReply::from_check_error(&error);
            (status, Json(reply)).into_response()
        }
        Ok(verdict) => {
            let (mut status, reply) = CheckReply::from_verdict(&verdict);
            if status == StatusCode::TOO_MANY_REQUESTS {
                status = deny_status.unwrap_or(status);
            }
            (status, wire::headers(&verdict), Json(reply)).into_response()
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn request_from(method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<CheckRequest, String> {
    let mut descriptors = Descriptors::new();
    for (name, value) in headers {
        if let Some(descriptor) = name.as_str().strip_prefix(DESCRIPTOR_PREFIX) {
            let value = value
                .to_str()
                .map_err(|_| format!("header {name} is not visible ASCII"))?;
            descriptors.insert(descriptor.to_owned(), value.to_owned());
        }
    }
    let original_method = header(headers, "x-original-method")
        .or_else(|| header(headers, "x-forwarded-method"))
        .unwrap_or(method.as_str());
    let original_uri = header(headers, "x-original-uri")
        .or_else(|| header(headers, "x-forwarded-uri"))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let rest = uri.path().strip_prefix("/v1/authz").unwrap_or("");
            if rest.is_empty() {
                "/".to_owned()
            } else {
                rest.to_owned()
            }
        });
    let path = original_uri.split('?').next().unwrap_or("/").to_owned();
    descriptors
        .entry("method".into())
        .or_insert_with(|| original_method.to_owned());
    descriptors.entry("path".into()).or_insert(path);
    let cost = match header(headers, "x-sluice-cost") {
        None => 1,
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| format!("X-Sluice-Cost {text:?} is not a whole number"))?,
    };
    Ok(CheckRequest {
        policy: header(headers, "x-sluice-policy").map(str::to_owned),
        descriptors,
        cost,
        dry_run: header(headers, "x-sluice-dry-run")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
    })
}

fn deny_status(uri: &Uri, headers: &HeaderMap) -> Result<Option<StatusCode>, String> {
    let from_query = uri.query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("deny_status="))
    });
    let Some(text) = header(headers, "x-sluice-deny-status").or(from_query) else {
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

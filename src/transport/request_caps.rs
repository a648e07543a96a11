//! Caps on a request's target and headers, answered in sluice's JSON error shape (414, 431).
//! hyper enforces its own, larger limits while parsing and answers those with an empty body
//! before any request exists; these caps sit below them, so a client that sends too much gets
//! `{"error", "reason"}` like every other refusal. Only framing hyper cannot parse at all (a
//! malformed `Content-Length`, headers beyond [`HYPER_MAX_BUF`]) still gets hyper's bare status.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use super::http::error_response;
use super::wire::ErrorReply;

/// Longest request target (path and query), in bytes.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Most bytes of header names and values together.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most header fields.
pub const MAX_HEADERS: usize = 64;
/// hyper's read buffer on the check listeners: above every cap here, so they answer first.
pub const HYPER_MAX_BUF: usize = 64 * 1024;
/// hyper's own header count limit on the check listeners (above [`MAX_HEADERS`]).
pub const HYPER_MAX_HEADERS: usize = 128;

/// Refuses a request over the caps with a JSON 414 or 431; passes the rest on.
pub async fn enforce(request: Request, next: Next) -> Response {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return error_response((
            StatusCode::URI_TOO_LONG,
            ErrorReply::new(
                "uri_too_long",
                format!("request target of {uri_len} bytes, over {MAX_URI_BYTES}"),
            ),
        ));
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return error_response((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorReply::new(
                "headers_too_large",
                format!(
                    "{} headers of {bytes} bytes; at most {MAX_HEADERS} headers and \
                     {MAX_HEADER_BYTES} bytes",
                    headers.len()
                ),
            ),
        ));
    }
    next.run(request).await
}

//! Caps on a request's target and headers, answered in sluice's JSON error shape (414, 431).
//! hyper enforces its own, larger limits while parsing and answers those with an empty body
//! before any request exists; these caps sit below them, so a client that sends too much gets
//! `{"error", "reason"}` like every other refusal. Only framing hyper cannot parse at all (a
//! malformed `Content-Length`, over 100 headers, headers beyond [`HYPER_MAX_BUF`]) still gets
//! hyper's bare status.

use std::convert::Infallible;
use std::future::{ready, Ready};

use axum::http::{Request, StatusCode};
use axum::response::Response;
use futures_util::future::Either;

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
// hyper's own header count limit is its default, 100 (above [`MAX_HEADERS`]); setting another
// would move its header array from the stack to the heap on every request.

/// A hyper service that refuses requests over the caps (JSON 414 or 431) before `inner` sees
/// them; no allocation on the way through (a middleware layer would box every request's future).
#[derive(Clone)]
pub struct Capped<S>(pub S);

impl<S, B> hyper::service::Service<Request<B>> for Capped<S>
where
    S: hyper::service::Service<Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn call(&self, request: Request<B>) -> Self::Future {
        match refusal(&request) {
            Some(response) => Either::Left(ready(Ok(response))),
            None => Either::Right(self.0.call(request)),
        }
    }
}

/// The JSON refusal of a request over the caps, if it is.
fn refusal<B>(request: &Request<B>) -> Option<Response> {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return Some(error_response((
            StatusCode::URI_TOO_LONG,
            ErrorReply::new(
                "uri_too_long",
                format!("request target of {uri_len} bytes, over {MAX_URI_BYTES}"),
            ),
        )));
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return Some(error_response((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorReply::new(
                "headers_too_large",
                format!(
                    "{} headers of {bytes} bytes; at most {MAX_HEADERS} headers and \
                     {MAX_HEADER_BYTES} bytes",
                    headers.len()
                ),
            ),
        )));
    }
    None
}

//! What the transports put on a check's span (when tracing is on): the deciding policy's name,
//! the outcome and the mode, or the reason code of a refusal. Never a descriptor value, key,
//! address or path. With tracing off every function here gets `None` and does nothing.

use std::future::Future;

use futures_util::future::Either;

use super::Transport;
use crate::check::{CheckError, Verdict};
use crate::telemetry::{CheckSpan, SpanTransport};

/// The span attribute for a listener.
pub(crate) fn span_transport(transport: Transport) -> SpanTransport {
    match transport {
        Transport::Tcp => SpanTransport::Tcp,
        Transport::Uds => SpanTransport::Uds,
        Transport::Grpc => SpanTransport::Grpc,
    }
}

/// Runs `future` inside `span` (so the store call relates to it), or as it is. Not an `async
/// fn`: one of those would hold `future` in its own state beside the wrapped one, and a check's
/// future, held so three times over, was 7.2 KB copied into every gRPC call's box.
pub(crate) fn scope<F: Future>(
    span: Option<&CheckSpan>,
    future: F,
) -> impl Future<Output = F::Output> {
    match span {
        Some(span) => Either::Left(span.scope(future)),
        None => Either::Right(future),
    }
}

/// Records a verdict on `span`.
pub(crate) fn verdict(span: Option<&CheckSpan>, verdict: &Verdict) {
    let Some(span) = span else {
        return;
    };
    let deciding = verdict.deciding();
    span.answer(
        deciding.map_or("", |part| part.policy.name()),
        verdict.outcome.as_str(),
        deciding.map(|part| part.mode.as_str()),
    );
}

/// Records a check the service refused (a 4xx).
pub(crate) fn check_error(span: Option<&CheckSpan>, error: &CheckError) {
    refused(span, super::wire::code_of(error));
}

/// Records a request whose body could not be read as JSON (`read_json`'s answer).
pub(crate) fn unread(span: Option<&CheckSpan>, status: hyper::StatusCode) {
    refused(
        span,
        match status.as_u16() {
            408 => "request_timeout",
            413 => "payload_too_large",
            _ => "bad_request",
        },
    );
}

/// Records a request refused before it was checked; `code` is the answer's fixed error code.
pub(crate) fn refused(span: Option<&CheckSpan>, code: &'static str) {
    if let Some(span) = span {
        span.refused(code);
    }
}

//! One gRPC stream's request, bounded before tonic sees it: the body must arrive whole within
//! `limits.body_read_timeout`, hold at most `limits.max_body_bytes` of message, and be exactly
//! one complete length-prefixed, uncompressed message. A stalled stream is answered
//! `DEADLINE_EXCEEDED` and reset; a malformed one (empty, truncated, compressed, several
//! messages, or one that does not decode) `INVALID_ARGUMENT`; an oversized one
//! `RESOURCE_EXHAUSTED`. The stream counts as open on its connection (for the idle timeout) until
//! its answer is ready.
//!
//! `ShouldRateLimit` is answered here, not through tonic: the message is decoded with prost from
//! the bytes already read and the answer encoded into one buffer, sent as one DATA frame and the
//! `grpc-status` trailers. tonic's routing, codec and service layers cost about as much CPU per
//! check as the check itself (see docs/benchmarks.md); they still serve the health service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use prost::Message;
use tonic::codegen::Service as _;
use tonic::Status;

use super::connection::Activity;
use super::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use super::{GrpcCode, Rls, SHOULD_RATE_LIMIT};
use crate::telemetry::Metrics;
use crate::transport::Transport;

/// The gRPC message prefix: a compressed flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// What one stream's request may take.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Longest the whole request body may take to arrive (`limits.body_read_timeout`).
    pub body_read_timeout: Duration,
    /// Largest request message (`limits.max_body_bytes`).
    pub max_message_bytes: usize,
}

/// The hyper service of one connection: each stream's request read under [`StreamLimits`],
/// then answered by the rate limit service or handed to tonic's routes.
pub(super) struct Streams {
    rls: Arc<Rls>,
    routes: tonic::service::Routes,
    activity: Arc<Activity>,
    limits: StreamLimits,
    metrics: Metrics,
}

impl Streams {
    pub(super) fn new(
        rls: Arc<Rls>,
        routes: tonic::service::Routes,
        activity: Arc<Activity>,
        limits: StreamLimits,
        metrics: Metrics,
    ) -> Self {
        Self {
            rls,
            routes,
            activity,
            limits,
            metrics,
        }
    }
}

type Answer = Response<tonic::body::Body>;

impl hyper::service::Service<Request<Incoming>> for Streams {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let open = self.activity.stream_opened();
        let limits = self.limits;
        let metrics = self.metrics.clone();
        if request.uri().path() == super::rlqs::STREAM_RATE_LIMIT_QUOTAS {
            // A long-lived stream: read as its messages arrive, never whole.
            let answer = super::rlqs::serve(self.rls.clone(), request.into_body(), limits, open);
            return Box::pin(std::future::ready(Ok(answer)));
        }
        if request.uri().path() == SHOULD_RATE_LIMIT {
            let rls = Arc::clone(&self.rls);
            return Box::pin(async move {
                let _open = open;
                let (parts, body) = request.into_parts();
                let answer = match read(body, limits).await {
                    Ok(message) => should_rate_limit(&rls, &parts.headers, &message).await,
                    Err(status) => Err(counted(&metrics, status)),
                };
                Ok(answer.unwrap_or_else(Status::into_http))
            });
        }
        let mut routes = self.routes.clone();
        Box::pin(async move {
            let _open = open;
            let (parts, body) = request.into_parts();
            let message = match read(body, limits).await {
                Ok(message) => message,
                Err(status) => return Ok(counted(&metrics, status).into_http()),
            };
            std::future::poll_fn(|cx| {
                <tonic::service::Routes as tonic::codegen::Service<Request<Full<Bytes>>>>::poll_ready(
                    &mut routes,
                    cx,
                )
            })
            .await?;
            routes
                .call(Request::from_parts(parts, Full::new(message)))
                .await
        })
    }
}

/// `status`, counted as the answer to a stream refused before any service saw it.
fn counted(metrics: &Metrics, status: Status) -> Status {
    metrics
        .responses
        .with_label_values(&[
            Transport::Grpc.as_str(),
            GrpcCode::of_status(status.code()).as_str(),
        ])
        .inc();
    status
}

/// `ShouldRateLimit` for one framed request message (checked by [`read`]): decoded, answered
/// and encoded without tonic.
async fn should_rate_limit(
    rls: &Rls,
    headers: &HeaderMap,
    framed: &[u8],
) -> Result<Answer, Status> {
    let request = RateLimitRequest::decode(&framed[PREFIX_BYTES..]).map_err(|error| {
        rls.refused(Status::invalid_argument(format!(
            "the message does not decode: {error}"
        )))
    })?;
    let response = rls.should_rate_limit(headers, &request).await?;
    Ok(unary(&response))
}

/// One message as a gRPC response: HTTP 200, the framed message as the body, `grpc-status: 0`
/// in the trailers.
fn unary(message: &impl Message) -> Answer {
    let len = message.encoded_len();
    let mut framed = BytesMut::with_capacity(PREFIX_BYTES + len);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // A `BytesMut` grows as needed: encoding into it cannot run out of room.
    let _ = message.encode(&mut framed);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = [Frame::data(framed.freeze()), Frame::trailers(trailers)];
    let body = StreamBody::new(futures_util::stream::iter(frames.map(Ok::<_, Infallible>)));
    let mut answer = Response::new(tonic::body::Body::new(body));
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    answer
}

/// The request body, whole and well framed, or the status that refuses it.
async fn read(body: Incoming, limits: StreamLimits) -> Result<Bytes, Status> {
    let cap = limits.max_message_bytes.saturating_add(PREFIX_BYTES);
    let collected =
        tokio::time::timeout(limits.body_read_timeout, Limited::new(body, cap).collect())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "the request message did not arrive within limits.body_read_timeout ({})",
                    crate::config::HumanDuration(
                        u64::try_from(limits.body_read_timeout.as_micros()).unwrap_or(u64::MAX)
                    )
                ))
            })?
            .map_err(|error| {
                if error.is::<http_body_util::LengthLimitError>() {
                    Status::resource_exhausted(format!(
                        "request message over limits.max_body_bytes ({} bytes)",
                        limits.max_message_bytes
                    ))
                } else {
                    Status::cancelled("the request stream broke off")
                }
            })?;
    let message = collected.to_bytes();
    check_framing(&message)?;
    Ok(message)
}

/// Exactly one complete, uncompressed message, or why not.
fn check_framing(body: &[u8]) -> Result<(), Status> {
    let refuse = |reason: String| Err(Status::invalid_argument(reason));
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return refuse(if body.is_empty() {
            "no request message: the stream ended before one".into()
        } else {
            format!(
                "truncated message: {} of the {PREFIX_BYTES} prefix bytes arrived",
                body.len()
            )
        });
    };
    match prefix[0] {
        0 => {}
        1 => return refuse("compressed messages are not accepted (no grpc-encoding)".into()),
        flag => return refuse(format!("message flag {flag} is neither 0 nor 1")),
    }
    let announced = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if rest.len() < announced {
        return refuse(format!(
            "truncated message: the prefix announces {announced} bytes, {} arrived",
            rest.len()
        ));
    }
    if rest.len() > announced {
        return refuse(format!(
            "one request message expected; {} more bytes follow it",
            rest.len() - announced
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_refusals_name_what_is_wrong() {
        let reason = |body: &[u8]| {
            let status = check_framing(body).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert!(reason(b"").contains("no request message"));
        assert!(reason(&[0, 0, 0]).contains("3 of the 5 prefix bytes"));
        assert!(reason(&[0, 0, 0, 0, 10, 1, 2]).contains("announces 10 bytes, 2 arrived"));
        assert!(reason(&[1, 0, 0, 0, 0]).contains("compressed"));
        assert!(reason(&[7, 0, 0, 0, 0]).contains("flag 7"));
        assert!(reason(&[0, 0, 0, 0, 1, 9, 9]).contains("1 more bytes"));
        assert!(check_framing(&[0, 0, 0, 0, 2, 8, 1]).is_ok());
        assert!(check_framing(&[0, 0, 0, 0, 0]).is_ok());
    }
}

//! What the gRPC listeners serve on each stream ([`Streams`], the HTTP/2 server's
//! [`sluice_http2::Service`]), and what makes its HTTP answers gRPC ones: the answer's head and
//! `grpc-status` trailers, a refusal as a trailers-only answer ([`status_trailers`]). `ShouldRateLimit` is a unary call, answered on its connection's
//! task: its body gathered by the connection (at most `limits.max_body_bytes` of message, whole
//! within `limits.body_read_timeout`, or `RESOURCE_EXHAUSTED` / `DEADLINE_EXCEEDED`), checked
//! here to be exactly one complete, uncompressed length-prefixed message (else
//! `INVALID_ARGUMENT`), decoded with prost and answered without tonic: the answer is encoded
//! straight into one framed buffer. RLQS streams and the health service run on a task per
//! stream: RLQS reads its messages as they come ([`super::rlqs`]), health reads its one
//! message whole under the same bounds and is answered by tonic's routes; their answers go to
//! the connection through its [`Responder`] ([`respond`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body, Frame};
use hyper::header::HeaderValue;
use hyper::{HeaderMap, Request, Response};
use prost::Message;
use sluice_http2::{Answer, Block, Kept, RecvBody, Refused, Responder, StreamFuture, UnaryFuture};
use tonic::codegen::Service as _;
use tonic::Status;

use super::connection::{Activity, OpenStream};
use super::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use super::{GrpcCode, Rls, SHOULD_RATE_LIMIT};
use crate::config::HumanDuration;
use crate::telemetry::{Carrier, Metrics};
use crate::transport::request_caps::MAX_HEADER_BYTES;
use crate::transport::Transport;

/// The gRPC message prefix: a compressed flag and a big-endian length.
const PREFIX_BYTES: usize = 5;
/// Room for a framed answer: one descriptor's status and the rate-limit headers fit (a
/// `BytesMut` grows past it as needed).
const ANSWER_BYTES: usize = 256;

/// A gRPC answer's head: `:status: 200` (indexed) and `content-type: application/grpc` (a
/// literal without indexing whose name is static-table entry 31, prefix 15 + 16).
const GRPC_HEAD: &[u8] = b"\x88\x0f\x10\x10application/grpc";
/// `:status: 405`, `allow: POST` and `content-type: text/plain` (literals without indexing,
/// names from the static table: 8, 22 and 31), the head of the answer to any other method.
const NOT_ALLOWED: &[u8] = b"\x08\x03405\x0f\x07\x04POST\x0f\x10\x0atext/plain";
/// `grpc-status: 0`, a literal without indexing with a literal name.
const GRPC_OK: &[u8] = b"\x00\x0bgrpc-status\x010";

/// A status as trailers: `grpc-status`, and `grpc-message` percent-encoded, as tonic writes them.
pub(super) fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    if status.add_header(&mut trailers).is_err() {
        // A message no header can carry: the code alone.
        trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
    }
    trailers
}

/// A call refused with `status`: a trailers-only answer.
fn refusal(status: &Status) -> Answer {
    Answer::Bodiless {
        head: Block::Encoded(GRPC_HEAD),
        trailers: Block::Fields(Box::new(status_trailers(status))),
    }
}

/// A unary call's request fields it keeps: its trace context ([`Trace`]).
const KEPT: &[&[u8]] = &[b"traceparent", b"tracestate"];

/// A unary call's trace context, the only request fields it reads.
struct Trace(Kept);

impl Carrier for Trace {
    fn value(&self, name: &str) -> Option<&str> {
        let index = match name {
            "traceparent" => 0,
            "tracestate" => 1,
            _ => return None,
        };
        std::str::from_utf8(self.0.get(index)?).ok()
    }
}

/// What one stream's request may take.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Longest the whole request body may take to arrive (`limits.body_read_timeout`).
    pub body_read_timeout: Duration,
    /// Largest request message (`limits.max_body_bytes`).
    pub max_message_bytes: usize,
}

/// What one connection serves: `ShouldRateLimit` answered on the connection's task, anything
/// else (RLQS, health) on a task of its own.
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

impl sluice_http2::Service for Streams {
    // gRPC is POST only: any other method is no call this server answers.
    const METHODS: &'static [&'static [u8]] = &[b"POST"];
    const KEPT: &'static [&'static [u8]] = KEPT;

    fn is_unary(&self, path: &[u8]) -> bool {
        path == SHOULD_RATE_LIMIT.as_bytes()
    }

    fn unary(self: &Arc<Self>, kept: Kept, body: Bytes) -> UnaryFuture {
        if let Err(status) = check_framing(&body) {
            return Box::pin(std::future::ready(refusal(&counted(&self.metrics, status))));
        }
        let rls = Arc::clone(&self.rls);
        Box::pin(async move {
            match should_rate_limit(&rls, &Trace(kept), &body).await {
                Ok(framed) => Answer::Whole {
                    head: Block::Encoded(GRPC_HEAD),
                    body: framed,
                    trailers: Block::Encoded(GRPC_OK),
                },
                Err(status) => refusal(&status),
            }
        })
    }

    fn stream(self: &Arc<Self>, request: Request<RecvBody>, responder: Responder) -> StreamFuture {
        let open = self.activity.stream_opened();
        let limits = self.limits;
        if request.uri().path() == super::rlqs::STREAM_RATE_LIMIT_QUOTAS {
            // A long-lived stream: read as its messages arrive, never whole.
            let answer = super::rlqs::serve(self.rls.clone(), request.into_body(), limits, open);
            return Box::pin(respond(answer, responder));
        }
        let mut routes = self.routes.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let _open = open;
            let (parts, body) = request.into_parts();
            let body = StreamBody::new(body.map(|chunk| chunk.map(Frame::data)));
            let message = match read(body, limits).await {
                Ok(message) => message,
                Err(status) => {
                    return respond(counted(&metrics, status).into_http(), responder).await
                }
            };
            let ready = std::future::poll_fn(|cx| {
                <tonic::service::Routes as tonic::codegen::Service<Request<Full<Bytes>>>>::poll_ready(
                    &mut routes,
                    cx,
                )
            })
            .await;
            let answer = match ready {
                Ok(()) => {
                    routes
                        .call(Request::from_parts(parts, Full::new(message)))
                        .await
                }
                Err(never) => match never {},
            };
            match answer {
                Ok(answer) => respond(answer, responder).await,
                Err(never) => match never {},
            }
        })
    }

    fn refuse(&self, why: Refused) -> Answer {
        let status = match why {
            Refused::HeadersTooLarge => {
                Status::resource_exhausted(format!("request headers over {MAX_HEADER_BYTES} bytes"))
            }
            Refused::BodyTooLarge => Status::resource_exhausted(format!(
                "request message over limits.max_body_bytes ({} bytes)",
                self.limits.max_message_bytes
            )),
            Refused::BodyTimeout => Status::deadline_exceeded(format!(
                "the request message did not arrive within limits.body_read_timeout ({})",
                HumanDuration(
                    u64::try_from(self.limits.body_read_timeout.as_micros()).unwrap_or(u64::MAX)
                )
            )),
            // Answered, not counted as a refusal.
            Refused::Panicked => return refusal(&Status::internal("the check failed")),
            // Not a gRPC call at all: HTTP's answer, as gRPC servers give it.
            Refused::Method => {
                return Answer::Whole {
                    head: Block::Encoded(NOT_ALLOWED),
                    body: BytesMut::from(&b"sluice: this listener serves gRPC (POST) only\n"[..]),
                    trailers: Block::Encoded(b""),
                }
            }
        };
        count(&self.metrics, &status);
        refusal(&status)
    }

    fn shaken(&self) {
        self.activity.shake();
    }

    type Open = OpenStream;

    fn opened(&self) -> OpenStream {
        self.activity.stream_opened()
    }
}

/// Sends tonic's `answer` through the connection's `responder`: its head, its body as it comes,
/// and its trailers (a status the body fails with, as `grpc-status` trailers), or its end.
async fn respond(answer: Response<tonic::body::Body>, responder: Responder) {
    let (parts, mut body) = answer.into_parts();
    let Ok(mut sending) = responder.head(parts.status, parts.headers).await else {
        return;
    };
    loop {
        match body.frame().await {
            None => {
                let _ = sending.end().await;
                return;
            }
            Some(Err(status)) => {
                let _ = sending.trailers(status_trailers(&status)).await;
                return;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if sending.data(data).await.is_err() {
                        return;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = sending.trailers(trailers).await;
                        return;
                    }
                }
            },
        }
    }
}

fn count(metrics: &Metrics, status: &Status) {
    metrics
        .responses
        .with_label_values(&[
            Transport::Grpc.as_str(),
            GrpcCode::of_status(status.code()).as_str(),
        ])
        .inc();
}

/// `status`, counted as the answer to a stream refused before any service saw it.
fn counted(metrics: &Metrics, status: Status) -> Status {
    count(metrics, &status);
    status
}

/// `ShouldRateLimit` for one framed request message (checked by [`check_framing`]): decoded,
/// answered and encoded without tonic.
async fn should_rate_limit(
    rls: &Rls,
    headers: &impl Carrier,
    framed: &[u8],
) -> Result<BytesMut, Status> {
    let request = RateLimitRequest::decode(&framed[PREFIX_BYTES..]).map_err(|error| {
        rls.refused(Status::invalid_argument(format!(
            "the message does not decode: {error}"
        )))
    })?;
    let mut framed = BytesMut::with_capacity(ANSWER_BYTES);
    // The prefix: not compressed, and the length once the message is written.
    framed.put_bytes(0, PREFIX_BYTES);
    rls.should_rate_limit(headers, &request, &mut framed)
        .await?;
    let len = u32::try_from(framed.len() - PREFIX_BYTES).unwrap_or(u32::MAX);
    framed[1..PREFIX_BYTES].copy_from_slice(&len.to_be_bytes());
    Ok(framed)
}

/// The request body, whole and well framed, or the status that refuses it.
async fn read<B>(mut body: B, limits: StreamLimits) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut gathered = Gathered::new(limits.max_message_bytes);
    // Frames already received need no timer: take them as they are.
    while !body.is_end_stream() {
        let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
        match polled.await {
            Poll::Ready(Some(frame)) => gathered.push(frame)?,
            Poll::Ready(None) => return gathered.finish(),
            Poll::Pending => {
                // The rest is on its way: read it under `limits.body_read_timeout`.
                let rest = async {
                    while let Some(frame) = body.frame().await {
                        gathered.push(frame)?;
                    }
                    Ok::<_, Status>(())
                };
                tokio::time::timeout(limits.body_read_timeout, rest)
                    .await
                    .map_err(|_| {
                        Status::deadline_exceeded(format!(
                            "the request message did not arrive within limits.body_read_timeout ({})",
                            crate::config::HumanDuration(
                                u64::try_from(limits.body_read_timeout.as_micros())
                                    .unwrap_or(u64::MAX)
                            )
                        ))
                    })??;
                break;
            }
        }
    }
    gathered.finish()
}

/// A request body's bytes so far: the first DATA frame as it came, copied into one buffer only
/// when more follow; at most `cap` bytes of message.
struct Gathered {
    first: Option<Bytes>,
    more: Option<BytesMut>,
    len: usize,
    max_message_bytes: usize,
}

impl Gathered {
    fn new(max_message_bytes: usize) -> Self {
        Self {
            first: None,
            more: None,
            len: 0,
            max_message_bytes,
        }
    }

    /// Adds one frame (trailers are ignored), or refuses the stream.
    fn push<E>(&mut self, frame: Result<Frame<Bytes>, E>) -> Result<(), Status> {
        let frame = frame.map_err(|_| Status::cancelled("the request stream broke off"))?;
        let Ok(data) = frame.into_data() else {
            return Ok(());
        };
        self.len = self.len.saturating_add(data.len());
        if self.len > self.max_message_bytes.saturating_add(PREFIX_BYTES) {
            return Err(Status::resource_exhausted(format!(
                "request message over limits.max_body_bytes ({} bytes)",
                self.max_message_bytes
            )));
        }
        match (&mut self.first, &mut self.more) {
            (None, _) => self.first = Some(data),
            (Some(first), None) => {
                let mut more = BytesMut::with_capacity(self.len);
                more.extend_from_slice(first);
                more.extend_from_slice(&data);
                self.more = Some(more);
            }
            (Some(_), Some(more)) => more.extend_from_slice(&data),
        }
        Ok(())
    }

    /// The whole body, checked to be one well-framed message.
    fn finish(self) -> Result<Bytes, Status> {
        let message = match (self.first, self.more) {
            (_, Some(more)) => more.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        };
        check_framing(&message)?;
        Ok(message)
    }
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

//! The check API (`/v1/check`, `/v1/check/batch`, `/v1/report`, `/v1/release`, `/v1/settle`, `/v1/authz`), served unchanged on TCP and on the Unix socket: reads JSON, asks the
//! [`CheckService`], answers with real status codes, JSON bodies and rate-limit headers.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use bytes::{Bytes, BytesMut};
use hyper::body::Body as HttpBody;
use hyper::body::Incoming;
use prometheus::{Histogram, IntCounter};
use serde::de::DeserializeOwned;
use tower_service::Service as _;

use super::wire::{self, BatchBody, BatchReply, CheckBody, CheckReply, ErrorReply};
use super::{traced, Transport};
use crate::check::{CheckRequest, CheckService, ReleaseError, SettleError};
use crate::config::{AuthzSettings, RequestLimits};
use crate::telemetry::{CheckSpan, Metrics};

/// Shared by every request (axum clones the state per request: keep that one Arc).
type Ctx = Arc<Shared>;

struct Shared {
    service: Arc<CheckService>,
    metrics: Metrics,
    transport: Transport,
    /// This transport's latency histogram, looked up once rather than per request.
    duration: Histogram,
    /// What `/v1/authz` believes of forwarded headers.
    authz: AuthzSettings,
    /// This transport's `sluice_http_responses_total` series of the most frequent statuses,
    /// looked up once rather than per request.
    frequent: [(StatusCode, OnceLock<IntCounter>); 2],
}

/// The check API as the listeners serve it: `POST /v1/check`, `POST /v1/check/batch`,
/// `POST /v1/report` and `/v1/authz` (trusting what `authz` names). `POST /v1/check`, most of the
/// traffic, is answered directly; every other request goes through the router. axum's routing,
/// extractors and response mapping cost ~7% of a check's instructions (callgrind), which the one
/// hot route skips.
#[derive(Clone)]
pub struct CheckApi {
    ctx: Ctx,
    router: Router,
}

impl CheckApi {
    /// The API for `service`.
    pub fn new(
        service: Arc<CheckService>,
        metrics: Metrics,
        transport: Transport,
        authz_settings: AuthzSettings,
    ) -> Self {
        let ctx = shared(service, metrics, transport, authz_settings);
        Self {
            router: routes(ctx.clone()),
            ctx,
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for CheckApi {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Answer {
        if request.method() == Method::POST && request.uri().path() == "/v1/check" {
            // hyper's body as it is: no boxing into axum's `Body`.
            return Box::pin(answer_check(self.ctx.clone(), request));
        }
        let request = request.map(Body::new);
        let mut router = self.router.clone();
        Box::pin(async move { router.call(request).await })
    }
}

fn shared(
    service: Arc<CheckService>,
    metrics: Metrics,
    transport: Transport,
    authz_settings: AuthzSettings,
) -> Ctx {
    let duration = metrics
        .check_duration
        .with_label_values(&[transport.as_str()]);
    Arc::new(Shared {
        service,
        metrics,
        transport,
        duration,
        authz: authz_settings,
        frequent: [
            (StatusCode::OK, OnceLock::new()),
            (StatusCode::TOO_MANY_REQUESTS, OnceLock::new()),
        ],
    })
}

fn routes(ctx: Ctx) -> Router {
    Router::new()
        // Reached by a method other than POST only (405); `CheckApi::call` answers POSTs.
        .route("/v1/check", post(routed_check))
        .route("/v1/check/batch", post(batch))
        .route("/v1/report", post(report))
        .route("/v1/release", post(release))
        .route("/v1/settle", post(settle))
        .route("/v1/authz", any(authz))
        // Envoy's path_prefix sends `/` as `/v1/authz/`, which the wildcard below does not match.
        .route("/v1/authz/", any(authz))
        .route("/v1/authz/{*original}", any(authz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(ctx)
}

async fn answer_check(ctx: Ctx, request: Request<Incoming>) -> Result<Response, Infallible> {
    Ok(check(ctx, request).await)
}

async fn routed_check(State(ctx): State<Ctx>, request: Request) -> Response {
    check(ctx, request).await
}

/// `POST /v1/check`. The answer's JSON is written by hand (`CheckReply::write_json`, the bytes
/// serde writes) into one buffer sized for it.
async fn check<B: HttpBody<Data = Bytes>>(ctx: Ctx, request: Request<B>) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let span = ctx.span("sluice.check", &parts.headers);
    let span = span.as_ref();
    let response = match read_json::<CheckBody>(&parts.headers, body, ctx.service.limits()).await {
        Err(response) => {
            traced::unread(span, response.status());
            response
        }
        Ok(body) => {
            let reserve = body.reserve;
            let request = CheckRequest::from(body);
            // With `"reserve": true`, a reservation.
            let checked = if reserve {
                traced::scope(span, ctx.service.reserve(&request)).await
            } else {
                traced::scope(span, ctx.service.check(&request)).await
            };
            match checked {
                Err(error) => {
                    traced::check_error(span, &error);
                    error_response(ErrorReply::from_check_error(&error))
                }
                Ok(verdict) => {
                    traced::verdict(span, &verdict);
                    let (status, reply) = CheckReply::from_verdict(&verdict);
                    let mut json = Vec::with_capacity(256);
                    reply.write_json(&mut json);
                    response(status, wire::json_headers(&verdict), json)
                }
            }
        }
    };
    ctx.observe(started, &response);
    response
}

/// `POST /v1/report`: the check body, its cost spent whatever the counters hold (never a 429).
async fn report(State(ctx): State<Ctx>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let response = match read_json::<CheckBody>(&parts.headers, body, ctx.service.limits()).await {
        Err(response) => response,
        Ok(body) if body.reserve => error_response((
            StatusCode::BAD_REQUEST,
            ErrorReply::new(
                "bad_request",
                "a report spends what was used: it cannot reserve (settle a reservation with \
                 POST /v1/settle)"
                    .to_owned(),
            ),
        )),
        Ok(body) => match ctx.service.report(&body.into()).await {
            Err(error) => error_response(ErrorReply::from_check_error(&error)),
            Ok(verdict) => super::report::ReportReply::response(&verdict),
        },
    };
    ctx.observe(started, &response);
    response
}

/// `POST /v1/release`: gives a concurrency permit back (idempotent); a token this fleet did not
/// issue is refused (400) with its reason; the store failing is a 503 (the permit returns by
/// itself when its `permit_ttl` ends).
async fn release(State(ctx): State<Ctx>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let response =
        match read_json::<wire::ReleaseBody>(&parts.headers, body, ctx.service.limits()).await {
            Err(response) => response,
            Ok(body) => match ctx.service.release(&body.permit).await {
                Ok(done) => json_response(
                    StatusCode::OK,
                    HeaderMap::from_iter([(
                        header::CACHE_CONTROL,
                        header::HeaderValue::from_static("no-store"),
                    )]),
                    &wire::ReleaseReply {
                        released: done.released,
                        policies: done.policies,
                    },
                ),
                Err(error) => {
                    let (status, code) = match &error {
                        ReleaseError::Malformed(_) => (StatusCode::BAD_REQUEST, "bad_permit"),
                        ReleaseError::Forged => (StatusCode::BAD_REQUEST, "forged_permit"),
                        ReleaseError::Unavailable(_) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "limiter_unavailable")
                        }
                    };
                    error_response((status, ErrorReply::new(code, error.to_string())))
                }
            },
        };
    ctx.observe(started, &response);
    response
}

/// `POST /v1/settle`: settles a reservation at its real cost, once; a token this fleet did not
/// issue is refused (400), a second settle is a 409, one past its `reservation_ttl` a 410, the
/// store failing a 503 (the reservation then settles at its estimate).
async fn settle(State(ctx): State<Ctx>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let response =
        match read_json::<wire::SettleBody>(&parts.headers, body, ctx.service.limits()).await {
            Err(response) => response,
            Ok(body) => match ctx.service.settle(&body.reservation, body.cost).await {
                Ok(done) => json_response(
                    StatusCode::OK,
                    HeaderMap::from_iter([(
                        header::CACHE_CONTROL,
                        header::HeaderValue::from_static("no-store"),
                    )]),
                    &wire::SettleReply {
                        settled: true,
                        estimate: done.estimate,
                        cost: done.cost,
                        policies: done
                            .parts
                            .into_iter()
                            .map(|part| wire::SettledPolicy {
                                policy: part.policy,
                                window: part.window,
                                refunded: part.refunded,
                                charged: part.charged,
                                applied: part.applied,
                            })
                            .collect(),
                    },
                ),
                Err(error) => {
                    let (status, code) = match &error {
                        SettleError::Malformed(_) => (StatusCode::BAD_REQUEST, "bad_reservation"),
                        SettleError::Forged => (StatusCode::BAD_REQUEST, "forged_reservation"),
                        SettleError::Invalid(_) => (StatusCode::BAD_REQUEST, "bad_request"),
                        SettleError::AlreadySettled => (StatusCode::CONFLICT, "already_settled"),
                        SettleError::Expired => (StatusCode::GONE, "reservation_expired"),
                        SettleError::Unavailable(_) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "limiter_unavailable")
                        }
                    };
                    error_response((status, ErrorReply::new(code, error.to_string())))
                }
            },
        };
    ctx.observe(started, &response);
    response
}

async fn authz(State(ctx): State<Ctx>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let span = ctx.span("sluice.authz", &headers);
    let response = super::authz::authz(
        &ctx.service,
        &ctx.authz,
        method,
        uri,
        headers,
        span.as_ref(),
    )
    .await;
    ctx.observe(started, &response);
    response
}

async fn batch(State(ctx): State<Ctx>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let span = ctx
        .span("sluice.check_batch", &parts.headers)
        .map(|span| span.with_items(ctx.metrics.tracing()));
    let span = span.as_ref();
    let response = match read_json::<BatchBody>(&parts.headers, body, ctx.service.limits()).await {
        Err(response) => {
            traced::unread(span, response.status());
            response
        }
        Ok(body) => match body.requests() {
            Err(reason) => {
                traced::refused(span, "bad_request");
                error_response((
                    StatusCode::BAD_REQUEST,
                    ErrorReply::new("bad_request", format!("invalid JSON body: {reason}")),
                ))
            }
            Ok(requests) => match traced::scope(span, ctx.service.check_batch(requests)).await {
                Err(error) => {
                    traced::check_error(span, &error);
                    error_response(ErrorReply::from_check_error(&error))
                }
                Ok(verdicts) => {
                    if let Some(span) = span {
                        span.count("sluice.batch.checks", verdicts.len());
                        for (index, verdict) in verdicts.iter().enumerate() {
                            traced::verdict(span.item(index).as_ref(), verdict);
                        }
                    }
                    let results = verdicts
                        .iter()
                        .map(|v| CheckReply::from_verdict(v).1)
                        .collect();
                    let mut headers = HeaderMap::with_capacity(2);
                    headers.insert(
                        header::CACHE_CONTROL,
                        header::HeaderValue::from_static("no-store"),
                    );
                    json_response(StatusCode::OK, headers, &BatchReply { results })
                }
            },
        },
    };
    ctx.observe(started, &response);
    response
}

impl Shared {
    /// A span for this request when tracing is on (`headers` are not read otherwise).
    fn span(&self, name: &'static str, headers: &HeaderMap) -> Option<CheckSpan> {
        self.metrics
            .tracing()
            .check_span(name, traced::span_transport(self.transport), headers)
    }

    fn observe(&self, started: Instant, response: &Response) {
        self.duration.observe(started.elapsed().as_secs_f64());
        let status = response.status();
        let counter = |status: StatusCode| {
            self.metrics
                .responses
                .with_label_values(&[self.transport.as_str(), status.as_str()])
        };
        match self
            .frequent
            .iter()
            .find(|(frequent, _)| *frequent == status)
        {
            // Found on its first use (a series appears when it is first counted, as before).
            Some((_, found)) => found.get_or_init(|| counter(status)).inc(),
            None => counter(status).inc(),
        }
    }
}

/// Reads a body capped in size and in time and parses it; any failure is a 4xx with a JSON
/// reason. The content type is not insisted on (`curl -d` sends a form type), the body must be
/// a JSON object all the same (serde would read an array as positional fields).
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: impl HttpBody<Data = Bytes>,
    limits: &RequestLimits,
) -> Result<T, Response> {
    let cap = limits.max_body_bytes;
    let too_large = || {
        error_response((
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorReply::new(
                "payload_too_large",
                format!("request body over {cap} bytes"),
            ),
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > cap) {
        return Err(too_large());
    }
    // A check's small body nearly always arrives with its head: read what is there first and
    // arm the timer only for a body still on its way (a timer costs about 3% of a check).
    let mut read = std::pin::pin!(collect_capped(body, cap));
    let read = match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
        Poll::Ready(read) => Ok(read),
        Poll::Pending => tokio::time::timeout(limits.body_read_timeout.as_std(), read).await,
    };
    let bytes = match read {
        Err(_) => {
            return Err(error_response((
                StatusCode::REQUEST_TIMEOUT,
                ErrorReply::new(
                    "request_timeout",
                    "the request body did not arrive within limits.body_read_timeout",
                ),
            )))
        }
        Ok(Ok(bytes)) => bytes,
        Ok(Err(Unread::OverCap)) => return Err(too_large()),
        Ok(Err(Unread::Failed)) => {
            return Err(error_response((
                StatusCode::BAD_REQUEST,
                ErrorReply::new("bad_request", "could not read the request body"),
            )))
        }
    };
    if let Err(reason) = wire::object_only(&bytes) {
        return Err(error_response((
            StatusCode::BAD_REQUEST,
            ErrorReply::new("bad_request", format!("invalid JSON body: {reason}")),
        )));
    }
    serde_json::from_slice(&bytes).map_err(|error| {
        error_response((
            StatusCode::BAD_REQUEST,
            ErrorReply::new("bad_request", format!("invalid JSON body: {error}")),
        ))
    })
}

/// Why a body was not read.
enum Unread {
    /// Over the cap.
    OverCap,
    /// The connection failed or broke the framing.
    Failed,
}

/// A body's bytes, at most `cap` of them (what `http_body_util::Limited` and `collect` do,
/// without the boxing and the list of chunks: a check's body is one chunk, kept as it came).
async fn collect_capped<B: HttpBody<Data = Bytes>>(body: B, cap: usize) -> Result<Bytes, Unread> {
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    // `is_end_stream` spares the poll that would only say the body is over.
    while !body.is_end_stream() {
        let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
            break;
        };
        let Ok(data) = frame.map_err(|_| Unread::Failed)?.into_data() else {
            continue; // trailers
        };
        len = len.saturating_add(data.len());
        if len > cap {
            return Err(Unread::OverCap);
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut both = BytesMut::with_capacity(len);
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// A JSON answer with `headers` as its whole header map (plus the content type): built directly,
/// not merged header by header into a fresh map as axum's tuple responses do, and serialised
/// into one buffer sized for a check's answer.
pub(crate) fn json_response(
    status: StatusCode,
    headers: HeaderMap,
    body: &impl serde::Serialize,
) -> Response {
    let mut bytes = Vec::with_capacity(256);
    if let Err(error) = serde_json::to_writer(&mut bytes, body) {
        tracing::error!(%error, "an answer did not serialise");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    json_bytes_response(status, headers, bytes)
}

/// [`json_response`] of JSON already written.
fn json_bytes_response(status: StatusCode, mut headers: HeaderMap, json: Vec<u8>) -> Response {
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(wire::JSON),
    );
    response(status, headers, json)
}

/// An answer with exactly these headers and body.
fn response(status: StatusCode, headers: HeaderMap, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

pub fn error_response((status, reply): (StatusCode, ErrorReply)) -> Response {
    json_response(status, HeaderMap::new(), &reply)
}

async fn not_found() -> Response {
    error_response((
        StatusCode::NOT_FOUND,
        ErrorReply::new(
            "not_found",
            "no such endpoint; use POST /v1/check, POST /v1/check/batch, POST /v1/report, POST /v1/release, POST /v1/settle or /v1/authz",
        ),
    ))
}

async fn method_not_allowed() -> Response {
    error_response((
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorReply::new("method_not_allowed", "use POST"),
    ))
}

//! Envoy's Rate Limit Quota Service (RLQS),
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`, for the
//! `envoy.filters.http.rate_limit_quota` filter: a long-lived stream on which Envoy reports its
//! buckets' usage and sluice answers with assignments, so that no call sits on the request path.
//!
//! A bucket maps to policies exactly as a check's descriptors do ([`session`]); an enforced
//! token bucket or fixed window policy gives each Envoy a token bucket backed by units taken
//! from the store first (a quota lease, `RateStore::take`), sized so that no Envoy can admit
//! more than its lease holds under the lease's terms ([`sizing`]), renewed, settled and
//! replaced per bucket ([`bucket`]). The fleet therefore never
//! admits more than the limit, whatever the number of Envoys, streams and daemons.
//!
//! The stream is read as its messages arrive ([`frames`]), each at most `limits.max_body_bytes`,
//! a started message completed within `limits.body_read_timeout`; a stream with no message for
//! [`STREAM_IDLE`] ends (`OK`; Envoy reopens it on its next report). The buckets kept are
//! bounded per stream, per connection and per daemon, each id's size too (`[envoy.rlqs]`,
//! [`budget`]); streams per connection by HTTP/2's concurrent streams.

mod actions;
mod bucket;
pub(super) mod budget;
mod frames;
mod metrics;
mod pool;
mod session;
mod sizing;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::StreamBody;
use hyper::body::Frame;

use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;
use prost::Message;
use sluice_http2::RecvBody;
use tokio::sync::mpsc;
use tonic::Status;

use super::connection::OpenStream;
use super::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::BucketAction, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use super::stream::StreamLimits;
use super::Rls;
use crate::config::RlqsSettings;
use crate::limit::Key;
use crate::logging::LogGate;
use crate::telemetry::Metrics;

pub use metrics::RlqsMetrics;

/// The method's path.
pub const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// A stream with no message for this long ends (Envoy reports every `reporting_interval`).
pub const STREAM_IDLE: Duration = Duration::from_secs(60);

/// Answers waiting to be written to one stream.
const QUEUED_ANSWERS: usize = 8;

/// What every stream of the daemon shares: the metrics, the bucket budget, and who holds
/// leases on which counter.
pub struct Quota {
    metrics: RlqsMetrics,
    budget: budget::Budget,
    shares: Shares,
    /// Gates the warn line about buckets that match no policy.
    unmatched: LogGate,
}

impl Quota {
    /// Registers the metrics on `metrics`' registry; buckets kept within `budget`.
    pub fn new(metrics: &Metrics, budget: RlqsSettings) -> Self {
        Self {
            metrics: RlqsMetrics::new(metrics),
            budget: budget::Budget::new(budget),
            shares: Shares::default(),
            unmatched: LogGate::new(UNMATCHED_QUIET),
        }
    }

    /// Counts a new bucket that matches no policy (it is allowed everything) and says so in a
    /// warn line at most once per [`UNMATCHED_QUIET`], naming its descriptors' names (values are
    /// client data).
    fn unmatched(&self, name: &std::collections::BTreeMap<String, String>) {
        self.metrics.unmatched.inc();
        if let Some(held_back) = self.unmatched.pass() {
            let names: Vec<&str> = name.keys().map(String::as_str).collect();
            tracing::warn!(
                descriptors = names.join(","),
                held_back,
                "an RLQS bucket matches no policy and is allowed everything (ALLOW_ALL); \
                 sluice_rlqs_unmatched_buckets_total counts them (at most one line a minute)"
            );
        }
    }
}

/// Shortest time between two warn lines about buckets that match no policy.
const UNMATCHED_QUIET: Duration = Duration::from_secs(60);

/// How many buckets of this daemon's streams hold a lease on each counter: a take asks for at
/// most its share of what is left, so that the Envoys sharing a limit split it.
#[derive(Default, Clone)]
struct Shares(Arc<Mutex<HashMap<Key, u64>>>);

impl Shares {
    fn join(&self, key: &Key) -> ShareGuard {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *held.entry(key.clone()).or_insert(0) += 1;
        ShareGuard {
            shares: self.clone(),
            key: key.clone(),
        }
    }
}

/// One holder of a counter's lease; leaves on drop.
struct ShareGuard {
    shares: Shares,
    key: Key,
}

impl ShareGuard {
    /// Holders of the counter's leases (this one included).
    fn holders(&self) -> u64 {
        let held = self.shares.0.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&self.key).copied().unwrap_or(1).max(1)
    }
}

impl Drop for ShareGuard {
    fn drop(&mut self) {
        let mut held = self.shares.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

type Answer = Response<tonic::body::Body>;

/// Serves one RLQS stream: the answer's headers at once, its messages as they are decided, the
/// status in its trailers. The stream counts as open on its connection until it ends.
pub(super) fn serve(
    rls: Arc<Rls>,
    body: RecvBody,
    limits: StreamLimits,
    open: OpenStream,
) -> Answer {
    let (answers, queued) = mpsc::channel::<Frame<Bytes>>(QUEUED_ANSWERS);
    tokio::spawn(async move {
        let quota = Arc::clone(&rls.quota);
        quota.metrics.streams.inc();
        let mut session = session::Session::new(
            Arc::clone(&quota),
            Arc::clone(&rls.service),
            open.rlqs_buckets(),
        );
        let ended = tokio::select! {
            ended = run(&mut session, body, limits, &answers) => ended,
            // The connection is going (a drain, its maximum age): end the stream now, with
            // `OK`, so that Envoy opens the next one elsewhere at once rather than after the
            // grace period; its assignments run on meanwhile.
            () = open.going().cancelled() => Ok(()),
        };
        drop(session);
        quota.metrics.streams.dec();
        let status = ended.err().unwrap_or_else(|| Status::ok(""));
        if status.code() != tonic::Code::Ok {
            tracing::debug!(%status, "an RLQS stream ended");
        }
        let trailers = super::stream::status_trailers(&status);
        let _ = answers.send(Frame::trailers(trailers)).await;
    });
    let frames = futures_util::stream::unfold(queued, |mut queued| async move {
        queued
            .recv()
            .await
            .map(|frame| (Ok::<_, Infallible>(frame), queued))
    });
    let mut answer = Response::new(tonic::body::Body::new(StreamBody::new(frames)));
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    answer
}

/// Reads and answers the stream's messages until it ends (`Ok`) or is refused.
async fn run(
    session: &mut session::Session,
    mut body: RecvBody,
    limits: StreamLimits,
    answers: &mpsc::Sender<Frame<Bytes>>,
) -> Result<(), Status> {
    let mut deframer = frames::Deframer::new(limits.max_message_bytes);
    loop {
        let wait = if deframer.is_partial() {
            limits.body_read_timeout
        } else {
            STREAM_IDLE
        };
        let data = match tokio::time::timeout(wait, body.next()).await {
            Err(_) if deframer.is_partial() => {
                return Err(Status::deadline_exceeded(
                    "a message did not arrive whole within limits.body_read_timeout",
                ))
            }
            // Idle (the Envoy is gone or has no bucket left) or half-closed: done.
            Err(_) | Ok(None) => return Ok(()),
            Ok(Some(Err(_))) => return Err(Status::cancelled("the stream broke off")),
            Ok(Some(Ok(data))) => data,
        };
        deframer.push(&data);
        while let Some(message) = deframer.next_message()? {
            let reports = RateLimitQuotaUsageReports::decode(message).map_err(|error| {
                Status::invalid_argument(format!("a message does not decode: {error}"))
            })?;
            session
                .domain(&reports.domain)
                .map_err(Status::invalid_argument)?;
            let now = Instant::now();
            // Each bucket's answer goes out as soon as it is decided: an assignment's time to
            // live is counted from just before its take, so it must not wait for the takes of
            // the message's other buckets.
            for usage in &reports.bucket_quota_usages {
                let actions = session.report(usage, now).await;
                if !send(answers, actions).await {
                    return Ok(());
                }
            }
            if !send(answers, session.abandon_idle(now).await).await {
                return Ok(());
            }
        }
    }
}

/// Sends `actions` (if any) as one response; false when the peer has reset the stream.
async fn send(answers: &mpsc::Sender<Frame<Bytes>>, actions: Vec<BucketAction>) -> bool {
    if actions.is_empty() {
        return true;
    }
    let response = RateLimitQuotaResponse {
        bucket_action: actions,
    };
    answers
        .send(Frame::data(frames::frame(&response)))
        .await
        .is_ok()
}

#[cfg(test)]
mod session_tests;

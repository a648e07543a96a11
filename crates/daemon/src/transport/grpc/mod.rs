//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! over gRPC on TCP and on a Unix socket (Envoy's `pipe` address), with the standard gRPC health
//! service: a thin adapter that turns each request into one all-or-nothing group of checks
//! ([`question`]) and the group's verdict into Envoy's answer ([`answer`]). Connections are
//! served by sluice's own HTTP/2 server (the `sluice-http2` package, [`sluice_http2`]) under the
//! check listeners' bounds and one
//! memory budget for every gRPC connection ([`connection`]), each stream's request read whole
//! and checked, then `ShouldRateLimit` answered directly (prost in, the answer encoded straight
//! from the verdict) and anything else (health, RLQS) on a task of its own ([`stream`]). Any
//! `:authority` is accepted: an Istio cluster name or a socket path must not turn every check
//! into a reset stream.

mod answer;
mod budget_metrics;
mod code;
pub mod connection;
pub mod proto;
mod question;
mod rlqs;
mod stream;

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use prometheus::Histogram;
use tonic::Status;

use crate::check::CheckService;
use crate::telemetry::Metrics;
use proto::envoy::service::ratelimit::v3::RateLimitRequest;

pub use code::GrpcCode;

/// Registers the gRPC listeners' memory budget metrics on `metrics`' registry.
pub(crate) fn register_budget_metrics(
    budget: std::sync::Arc<sluice_http2::Budget>,
    metrics: &Metrics,
) {
    budget_metrics::BudgetMetrics::register(budget, metrics.registry());
}

use tokio_util::sync::CancellationToken;

use super::{traced, Transport};

/// The fully qualified service name (for health checks and reflection-less clients).
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The one method's path, which [`stream`] answers without tonic.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The rate limit service over a [`CheckService`].
pub struct Rls {
    service: Arc<CheckService>,
    metrics: Metrics,
    duration: Histogram,
    with_headers: bool,
    /// The rate limit quota service's shared state ([`rlqs`]).
    quota: Arc<rlqs::Quota>,
}

impl Rls {
    /// Answers from `service`; `with_headers` adds rate-limit headers to answers; RLQS buckets
    /// kept within `rlqs`.
    pub fn new(
        service: Arc<CheckService>,
        metrics: Metrics,
        with_headers: bool,
        rlqs: crate::config::RlqsSettings,
    ) -> Self {
        let duration = metrics
            .check_duration
            .with_label_values(&[Transport::Grpc.as_str()]);
        Self {
            quota: Arc::new(rlqs::Quota::new(&metrics, rlqs)),
            service,
            metrics,
            duration,
            with_headers,
        }
    }

    /// `status`, counted as the answer to a request refused before it was checked.
    fn refused(&self, status: Status) -> Status {
        self.count(GrpcCode::of_status(status.code()), Instant::now());
        status
    }

    fn count(&self, code: GrpcCode, started: Instant) {
        self.duration.observe(started.elapsed().as_secs_f64());
        self.metrics
            .responses
            .with_label_values(&[Transport::Grpc.as_str(), code.as_str()])
            .inc();
    }
}

impl Rls {
    /// Envoy's answer to `request`, whose stream's headers are `headers` (a trace parent),
    /// encoded into `buf`, or the status that refuses it; counted either way.
    async fn should_rate_limit(
        &self,
        headers: &impl crate::telemetry::Carrier,
        request: &RateLimitRequest,
        buf: &mut BytesMut,
    ) -> Result<(), Status> {
        let started = Instant::now();
        let span = self.metrics.tracing().check_span(
            "sluice.should_rate_limit",
            crate::telemetry::SpanTransport::Grpc,
            headers,
        );
        let span = span.as_ref();
        let items = match question::items(request, self.service.limits()) {
            Ok(items) => items,
            Err(reason) => {
                traced::refused(span, GrpcCode::InvalidArgument.as_str());
                self.count(GrpcCode::InvalidArgument, started);
                return Err(Status::invalid_argument(reason));
            }
        };
        match traced::scope(span, self.service.check_group(&items)).await {
            Ok(verdict) => {
                traced::verdict(span, &verdict.overall);
                let overall = answer::encode(&verdict, self.with_headers, buf);
                self.count(GrpcCode::of_code(overall), started);
                Ok(())
            }
            Err(error) => {
                traced::check_error(span, &error);
                self.count(GrpcCode::InvalidArgument, started);
                Err(Status::invalid_argument(error.to_string()))
            }
        }
    }
}

/// tonic's routes: the health service (`""` and [`SERVICE_NAME`] serving until `drain`); the
/// rate limit service itself is answered before them ([`stream`]).
pub async fn health_routes(drain: CancellationToken) -> tonic::service::Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    // Tell health-checking Envoys to move away while the listener drains.
    tokio::spawn(async move {
        drain.cancelled().await;
        reporter
            .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::NotServing)
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    });
    tonic::service::Routes::new(health)
}

//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! over gRPC on TCP and on a Unix socket (Envoy's `pipe` address), with the standard gRPC health
//! service: a thin adapter that turns each request into one all-or-nothing group of checks
//! ([`question`]) and the group's verdict into Envoy's answer ([`answer`]).

mod answer;
pub mod proto;
mod question;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use prometheus::Histogram;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::check::CheckService;
use crate::telemetry::Metrics;
use proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::Transport;

/// The fully qualified service name (for health checks and reflection-less clients).
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Most concurrent streams (in-flight checks) per HTTP/2 connection; Envoy multiplexes its
/// checks over few connections.
const MAX_CONCURRENT_STREAMS: u32 = 1_024;
/// Largest request message accepted (a rate limit request is a few hundred bytes).
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The rate limit service over a [`CheckService`].
pub struct Rls {
    service: Arc<CheckService>,
    metrics: Metrics,
    duration: Histogram,
    with_headers: bool,
}

impl Rls {
    /// Answers from `service`; `with_headers` adds rate-limit headers to answers.
    pub fn new(service: Arc<CheckService>, metrics: Metrics, with_headers: bool) -> Self {
        let duration = metrics
            .check_duration
            .with_label_values(&[Transport::Grpc.as_str()]);
        Self {
            service,
            metrics,
            duration,
            with_headers,
        }
    }

    fn count(&self, code: &str, started: Instant) {
        self.duration.observe(started.elapsed().as_secs_f64());
        self.metrics
            .responses
            .with_label_values(&[Transport::Grpc.as_str(), code])
            .inc();
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let items = match question::items(&request, self.service.limits()) {
            Ok(items) => items,
            Err(reason) => {
                self.count("invalid_argument", started);
                return Err(Status::invalid_argument(reason));
            }
        };
        match self.service.check_group(&items).await {
            Ok(verdict) => {
                let response = answer::response(&verdict, self.with_headers);
                let code = if response.overall_code == 1 {
                    "ok"
                } else {
                    "over_limit"
                };
                self.count(code, started);
                Ok(Response::new(response))
            }
            Err(error) => {
                self.count("invalid_argument", started);
                Err(Status::invalid_argument(error.to_string()))
            }
        }
    }
}

/// The gRPC routes: the rate limit service and the health service (`""` and [`SERVICE_NAME`]
/// serving until `drain`).
pub async fn routes(rls: Rls, mut drain: watch::Receiver<bool>) -> tonic::service::Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<RateLimitServiceServer<Rls>>().await;
    // Tell health-checking Envoys to move away while the listener drains.
    tokio::spawn(async move {
        let _ = drain.wait_for(|stop| *stop).await;
        reporter
            .set_not_serving::<RateLimitServiceServer<Rls>>()
            .await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    });
    let rls = RateLimitServiceServer::new(rls).max_decoding_message_size(MAX_MESSAGE_BYTES);
    tonic::service::Routes::new(health).add_service(rls)
}

/// Serves `routes` on a TCP listener until `drain`, then lets in-flight checks finish for up to
/// `grace`.
pub async fn serve_tcp(
    listener: TcpListener,
    routes: tonic::service::Routes,
    drain: watch::Receiver<bool>,
    grace: Duration,
) {
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| {
            // Answers are small single writes: never hold one back for Nagle.
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((accepted, listener))
    });
    serve(incoming, routes, drain, grace).await;
}

/// Serves `routes` on a Unix socket until `drain` (see [`serve_tcp`]).
pub async fn serve_uds(
    listener: UnixListener,
    routes: tonic::service::Routes,
    drain: watch::Receiver<bool>,
    grace: Duration,
) {
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    serve(incoming, routes, drain, grace).await;
}

async fn serve<S, IO>(
    incoming: S,
    routes: tonic::service::Routes,
    drain: watch::Receiver<bool>,
    grace: Duration,
) where
    S: Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    let drained = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, drained(drain.clone()));
    tokio::pin!(server);
    let deadline = async {
        drained(drain).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = &mut server => {
            if let Err(error) = result {
                tracing::warn!(%error, "gRPC listener failed");
            }
        }
        () = deadline => tracing::warn!(?grace, "grace period over; closing gRPC connections"),
    }
}

//! The gRPC listeners of Envoy's rate limit service (TCP and Unix socket), bound at build time
//! like the others and served by `App::run` under the same bounds as the check listeners
//! (`limits.*`) plus the HTTP/2 ones of `[envoy]` ([`grpc::connection::ConnectionBounds`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;

use super::{bind, StartError};
use crate::check::CheckService;
use crate::config::{ListenAddrs, Settings};
use crate::telemetry::Metrics;
use crate::transport::grpc;
use crate::transport::grpc::connection::{self, ConnectionBounds};
use tokio_util::sync::CancellationToken;

/// Connections the kernel completes and queues for the gRPC TCP listener while
/// `limits.max_connections` are open (std's default is 128): Envoy opens one per worker at once,
/// and a queued client past the cap waits its turn instead of being dropped.
const TCP_BACKLOG: u32 = 1_024;

/// The bound gRPC listeners (each optional) and how answers are made.
pub(super) struct GrpcListeners {
    tcp: Option<(TcpListener, SocketAddr)>,
    socket: Option<(UnixListener, PathBuf)>,
    with_headers: bool,
    /// The RLQS bucket budget.
    rlqs: crate::config::RlqsSettings,
    /// Every bound (the grace period is set again by `spawn`).
    bounds: ConnectionBounds,
}

impl GrpcListeners {
    /// Binds `listen.grpc` and `listen.grpc_socket` when set.
    pub(super) fn bind(settings: &Settings, addrs: &ListenAddrs) -> Result<Self, StartError> {
        let tcp = addrs
            .grpc
            .map(|addr| bind::tcp("listen.grpc", addr, TCP_BACKLOG))
            .transpose()?;
        let socket = addrs
            .grpc_socket
            .as_deref()
            .map(|path| {
                bind::uds(
                    "listen.grpc_socket",
                    path,
                    addrs.socket_mode,
                    &settings.listen,
                )
            })
            .transpose()?;
        Ok(Self {
            tcp,
            socket,
            with_headers: settings.envoy.response_headers,
            rlqs: settings.envoy.rlqs,
            bounds: ConnectionBounds::new(settings, settings.shutdown_grace.as_std()),
        })
    }

    pub(super) fn addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(|(_, addr)| *addr)
    }

    pub(super) fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|(_, path)| path.as_path())
    }

    /// Serves each bound listener on `tasks` until `drain`.
    pub(super) async fn spawn(
        self,
        tasks: &mut JoinSet<()>,
        service: Arc<CheckService>,
        metrics: Metrics,
        drain: CancellationToken,
        grace: Duration,
    ) {
        let mut bounds = self.bounds;
        bounds.accept.grace = grace;
        let rls = Arc::new(grpc::Rls::new(
            service.clone(),
            metrics.clone(),
            self.with_headers,
            self.rlqs,
        ));
        // One budget for both listeners: what the pod's memory limit allows gRPC as a whole.
        let budget = bounds.budget();
        grpc::register_budget_metrics(budget.clone(), &metrics);
        let served = |routes| connection::Served {
            rls: rls.clone(),
            routes,
            metrics: metrics.clone(),
            drain: drain.clone(),
            bounds,
            budget: budget.clone(),
        };
        if let Some((listener, addr)) = self.tcp {
            tracing::info!(%addr, "Envoy rate limit service (gRPC) listening on TCP");
            let routes = grpc::health_routes(drain.clone()).await;
            // Answers are small single writes: never hold one back for Nagle.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tasks.spawn(connection::serve(listener, served(routes)));
        }
        if let Some((listener, path)) = self.socket {
            tracing::info!(path = %path.display(), "Envoy rate limit service (gRPC) listening on Unix socket");
            let routes = grpc::health_routes(drain.clone()).await;
            tasks.spawn(connection::serve(listener, served(routes)));
        }
    }
}

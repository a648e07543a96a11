//! Builds the daemon from settings (policies, store, service) and binds every listener, exposing
//! the real addresses (port 0 in tests); `run` serves until the shutdown future resolves, then
//! drains.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod banner;
mod bind;
mod grpc_listeners;
mod signal;
mod stores;

pub use signal::shutdown_signal;
pub use stores::check_redis;

use crate::check::CheckService;
use crate::clock::{Clock, SystemClock};
use crate::config::{load_policies, AuthzSettings, Settings};
use crate::limit::PolicySet;
use crate::reload::Reloader;
use crate::store::MemoryStore;
use crate::telemetry::Metrics;
use crate::transport::serve::{serve, serve_service, Peers};
use crate::transport::{admin, http, uds, Transport};

/// How long the admin listener's last requests get once the check listeners are closed.
const ADMIN_GRACE: Duration = Duration::from_secs(1);

/// How often idle keys are dropped from the embedded store.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Settings or policies are invalid (exit code 64).
    #[error("{0}")]
    Config(String),
    /// A listener could not be bound.
    #[error("{0}")]
    Bind(String),
}

/// A daemon with every listener bound, ready to [`App::run`].
pub struct App {
    http: Option<(TcpListener, SocketAddr)>,
    socket: Option<(UnixListener, PathBuf)>,
    admin: (TcpListener, SocketAddr),
    grpc: grpc_listeners::GrpcListeners,
    service: Arc<CheckService>,
    /// The embedded stores, swept of idle keys while running.
    memory: Vec<Arc<MemoryStore>>,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    grace: Duration,
    reloader: Option<(Reloader, Duration)>,
    authz: AuthzSettings,
    max_connections: usize,
    admin_access: admin::AdminAccess,
    banner: banner::Banner,
}

impl App {
    /// Loads the policy file named by `settings`, builds on the system clock, and watches the
    /// file for changes (and SIGHUP) while running.
    pub async fn build(settings: &Settings) -> Result<Self, StartError> {
        let path = &settings.policies;
        let (policies, version) =
            load_policies(path, &settings.files).map_err(|e| StartError::Config(e.to_string()))?;
        let mut app = Self::build_with(settings, policies, Arc::new(SystemClock::new())).await?;
        app.reloader = Some((
            Reloader::new(
                path.clone(),
                app.service.clone(),
                app.metrics.clone(),
                version,
                settings.files,
                settings.policies_allow_empty,
            ),
            settings.policies_poll.as_std(),
        ));
        Ok(app)
    }

    /// Builds with the given policies and clock and binds every listener.
    pub async fn build_with(
        settings: &Settings,
        policies: PolicySet,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError> {
        let resolved = settings
            .validate()
            .map_err(|e| StartError::Config(e.to_string()))?;
        let tracing =
            crate::telemetry::Tracing::start(&settings.tracing).map_err(StartError::Config)?;
        let metrics = Metrics::new().with_tracing(tracing);
        if let Some(warning) = settings.embedded_store_warning(resolved.redis.as_ref()) {
            tracing::warn!("{warning}");
        }
        let (service, memory) =
            stores::service(settings, resolved.redis.as_ref(), policies, clock, &metrics)?;
        let key = settings.shadow.fingerprint_key.as_deref();
        if key.is_none()
            && service
                .policies()
                .iter()
                .any(|p| !p.enforces_every_partition())
        {
            tracing::warn!(
                "shadow policies (or rollouts) are loaded but shadow.fingerprint_key is not set: \
                 partition fingerprints in would-block lines and /v1/top are random per process \
                 and cannot be joined across pods (set SLUICE_SHADOW__FINGERPRINT_KEY, the same \
                 secret on every pod)"
            );
        }
        let service = Arc::new(
            service
                .with_unmatched_log(settings.log.unmatched)
                .with_fingerprint_key(key),
        );
        let addrs = &resolved.listen;
        let http = addrs
            .http
            .map(|addr| bind::tcp("listen.http", addr, bind::STD_BACKLOG))
            .transpose()?;
        let socket = addrs
            .socket
            .as_deref()
            .map(|path| bind::uds("listen.socket", path, addrs.socket_mode, &settings.listen))
            .transpose()?;
        let grpc = grpc_listeners::GrpcListeners::bind(settings, addrs)?;
        let admin = bind::tcp("listen.admin", addrs.admin, bind::STD_BACKLOG)?;
        Ok(Self {
            http,
            socket,
            admin,
            grpc,
            memory,
            service,
            metrics,
            ready: Arc::new(AtomicBool::new(true)),
            grace: settings.shutdown_grace.as_std(),
            reloader: None,
            authz: settings.authz.clone(),
            max_connections: settings.limits.max_connections,
            admin_access: admin::AdminAccess {
                resets: settings.listen.admin_resets,
                local_peers: settings.listen.local_peers.clone(),
            },
            banner: banner::Banner::new(settings, resolved.redis.as_ref()),
        })
    }

    /// The bound TCP check address, if enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|(_, addr)| *addr)
    }

    /// The Unix socket path, if enabled.
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|(_, path)| path.as_path())
    }

    /// The bound gRPC (Envoy rate limit service) TCP address, if enabled.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.addr()
    }

    /// The gRPC (Envoy rate limit service) Unix socket path, if enabled.
    pub fn grpc_socket_path(&self) -> Option<&Path> {
        self.grpc.socket_path()
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.1
    }

    /// The check service (to swap policies, for instance).
    pub fn service(&self) -> Arc<CheckService> {
        self.service.clone()
    }

    /// Serves until `shutdown` resolves; then readiness turns false, the check listeners stop
    /// accepting, in-flight checks are answered (for up to the grace period), the socket file is
    /// removed and the admin listener closes last.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        // The check listeners drain first; the admin listener and the background tasks stop
        // once they are done.
        // Dropped with this future, the guards stop everything too.
        let drain = CancellationToken::new();
        let stop = CancellationToken::new();
        let (_drain_on_drop, _stop_on_drop) =
            (drain.clone().drop_guard(), stop.clone().drop_guard());
        let until = |stop: CancellationToken| async move { stop.cancelled().await };

        let mut checks = JoinSet::new();
        let api = |transport| {
            http::CheckApi::new(
                self.service.clone(),
                self.metrics.clone(),
                transport,
                self.authz.clone(),
            )
        };
        let (grace, max_connections) = (self.grace, self.max_connections);
        if let Some((listener, addr)) = self.http {
            tracing::info!(%addr, "check API listening on TCP");
            // Answers are small single writes: never hold one back for Nagle.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let app = api(Transport::Tcp);
            checks.spawn(serve_service(
                listener,
                app,
                drain.clone(),
                grace,
                max_connections,
                Peers::Ignore,
            ));
        }
        let socket_path = self.socket.as_ref().map(|(_, path)| path.clone());
        if let Some((listener, path)) = self.socket {
            tracing::info!(path = %path.display(), "check API listening on Unix socket");
            let app = api(Transport::Uds);
            checks.spawn(serve_service(
                listener,
                app,
                drain.clone(),
                grace,
                max_connections,
                Peers::Ignore,
            ));
        }
        let grpc_socket = self.grpc.socket_path().map(Path::to_path_buf);
        self.grpc
            .spawn(
                &mut checks,
                self.service.clone(),
                self.metrics.clone(),
                drain.clone(),
                self.grace,
            )
            .await;
        let (admin_listener, admin_addr) = self.admin;
        tracing::info!(addr = %admin_addr, "admin listening");
        let admin_app = admin::router(
            self.service.clone(),
            self.metrics.clone(),
            self.ready.clone(),
            self.admin_access,
        );
        // The same bounded accept loop as the check listeners (it may face the pod network).
        let admin_task = tokio::spawn(serve(
            admin_listener,
            admin_app,
            stop.clone(),
            ADMIN_GRACE,
            self.max_connections,
            // Counter resets are logged with who asked.
            Peers::Record,
        ));
        let sweeper = tokio::spawn(sweep(self.memory.clone(), until(stop.clone())));
        // Quota leases: idle ones given back while running, every one at shutdown.
        let leases = self
            .service
            .leases()
            .map(|leases| tokio::spawn(leases.clone().run_sweeper(stop.clone())));
        let reloader = self
            .reloader
            .map(|(reloader, poll)| tokio::spawn(reloader.run(poll, until(stop.clone()))));
        let banner = &self.banner;
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            settings = banner.settings.as_str(),
            policies = banner.policies.as_str(),
            store = banner.store.as_str(),
            policy_count = self.service.policies().len(),
            "sluice ready"
        );

        shutdown.await;
        tracing::info!("shutting down: draining in-flight checks");
        self.ready.store(false, Ordering::SeqCst);
        drain.cancel();
        // Each listener closes its own leftover connections once the grace period is over.
        while let Some(result) = checks.join_next().await {
            if let Err(error) = result {
                tracing::warn!(%error, "check listener task failed");
            }
        }
        for path in socket_path.iter().chain(grpc_socket.iter()) {
            uds::remove(path);
        }
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), admin_task).await;
        let _ = sweeper.await;
        if let Some(leases) = leases {
            // The give-backs have the store's deadline; this bounds a stalled one.
            let _ = tokio::time::timeout(Duration::from_secs(2), leases).await;
        }
        if let Some(reloader) = reloader {
            let _ = reloader.await;
        }
        self.metrics.tracing().shutdown().await;
        tracing::info!("sluice stopped");
    }
}

async fn sweep(stores: Vec<Arc<MemoryStore>>, stop: impl Future<Output = ()>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {
                for store in &stores {
                    store.sweep();
                }
            }
        }
    }
}

//! The injector process: the webhook (`POST /mutate`, HTTPS) and the admin listener (`/livez`,
//! `/readyz`, `/metrics`, plain HTTP for the kubelet and Prometheus), both on the same bounded
//! accept loop as the daemon's listeners (`transport::serve`: a connection cap, header read
//! timeout, drain), plus the task that reloads the certificate.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;

use super::metrics::InjectorMetrics;
use super::mutate::{mutate, Mutation, Outcome};
use super::review::{AdmissionOperation, AdmissionReview, ReviewResponse};
use super::tls::{self, CertFiles, ServingCert, Stamps, TlsListener};
use crate::inject::Options;
use sluice::app::StartError;
use sluice::config::{HumanDuration, RequestLimits};
use sluice::transport::http::{error_response, read_json};
use sluice::transport::serve::{serve, Peers};
use sluice::transport::wire::ErrorReply;
use tokio_util::sync::CancellationToken;

/// Largest AdmissionReview body: the API server caps an object near 1.5 MiB, and a review
/// carries it once for `CREATE` (plus metadata); twice that leaves room without unbounded reads.
pub const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;
/// Longest a client may take to send a review's body (the API server's own timeout is 10 s at
/// most, the manifests set 5 s).
const BODY_READ_TIMEOUT: HumanDuration = HumanDuration(10_000_000);
/// Grace for the admin listener after the webhook has drained.
const ADMIN_GRACE: Duration = Duration::from_secs(1);

/// Everything the injector needs to run.
#[derive(Debug, Clone)]
pub struct InjectorConfig {
    /// Webhook (HTTPS) address.
    pub listen: SocketAddr,
    /// Admin (HTTP) address.
    pub admin: SocketAddr,
    /// Serving certificate and key.
    pub tls: CertFiles,
    /// How often the certificate files' metadata is checked for a change.
    pub reload_interval: Duration,
    /// The sidecar every injected pod gets (before its own annotations).
    pub options: Options,
    /// Most connections open at once on each listener; past it, accepting waits.
    pub max_connections: usize,
    /// How long in-flight reviews may take to finish at shutdown.
    pub shutdown_grace: Duration,
}

/// The injector with its certificate loaded and both listeners bound.
pub struct Injector {
    config: InjectorConfig,
    webhook: TcpListener,
    webhook_addr: SocketAddr,
    admin: TcpListener,
    admin_addr: SocketAddr,
    serving: Arc<ServingCert>,
    stamps: Stamps,
    metrics: InjectorMetrics,
    ready: Arc<AtomicBool>,
}

#[derive(Clone)]
struct WebhookCtx {
    options: Arc<Options>,
    limits: Arc<RequestLimits>,
    metrics: InjectorMetrics,
}

#[derive(Clone)]
struct AdminCtx {
    metrics: InjectorMetrics,
    ready: Arc<AtomicBool>,
}

impl Injector {
    /// Loads the certificate (a missing or invalid pair is a configuration error) and binds both
    /// listeners (port 0 picks a free port: see [`Injector::webhook_addr`]).
    pub async fn build(config: InjectorConfig) -> Result<Self, StartError> {
        let (pair, stamps) = config
            .tls
            .load()
            .await
            .map_err(|e| StartError::Config(format!("serving certificate: {e}")))?;
        let bind = |addr: SocketAddr, what: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| StartError::Bind(format!("cannot bind the {what} on {addr}: {e}")))
        };
        let webhook = bind(config.listen, "webhook listener").await?;
        let admin = bind(config.admin, "admin listener").await?;
        let local = |listener: &TcpListener| {
            listener
                .local_addr()
                .map_err(|e| StartError::Bind(e.to_string()))
        };
        let metrics = InjectorMetrics::new();
        if let Some(leaf) = pair.cert.first() {
            metrics.certificate(leaf);
        }
        Ok(Self {
            webhook_addr: local(&webhook)?,
            admin_addr: local(&admin)?,
            webhook,
            admin,
            serving: Arc::new(ServingCert::new(pair)),
            stamps,
            metrics,
            ready: Arc::new(AtomicBool::new(true)),
            config,
        })
    }

    /// The webhook's bound address.
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr
    }

    /// The admin listener's bound address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Serves until `shutdown` resolves; then readiness turns false, the webhook stops accepting
    /// and finishes its reviews (up to the grace period), and the admin listener closes last.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let drain = CancellationToken::new();
        let stop = CancellationToken::new();
        let (_drain_on_drop, _stop_on_drop) =
            (drain.clone().drop_guard(), stop.clone().drop_guard());
        let limits = RequestLimits {
            max_body_bytes: MAX_REVIEW_BYTES,
            body_read_timeout: BODY_READ_TIMEOUT,
            max_connections: self.config.max_connections,
            ..RequestLimits::default()
        };
        let webhook = webhook_router(WebhookCtx {
            options: Arc::new(self.config.options.clone()),
            limits: Arc::new(limits),
            metrics: self.metrics.clone(),
        });
        let listener = TlsListener::new(self.webhook, tls::acceptor(self.serving.clone()));
        let webhook_task = tokio::spawn(serve(
            listener,
            webhook,
            drain.clone(),
            self.config.shutdown_grace,
            self.config.max_connections,
            Peers::Ignore,
        ));
        let admin = admin_router(AdminCtx {
            metrics: self.metrics.clone(),
            ready: self.ready.clone(),
        });
        let admin_task = tokio::spawn(serve(
            self.admin,
            admin,
            stop.clone(),
            ADMIN_GRACE,
            self.config.max_connections,
            Peers::Ignore,
        ));
        let watcher = tokio::spawn(tls::watch_files(
            self.config.tls.clone(),
            self.serving.clone(),
            self.stamps,
            self.config.reload_interval,
            self.metrics.clone(),
            stop.clone(),
        ));
        tracing::info!(
            webhook = %self.webhook_addr,
            admin = %self.admin_addr,
            image = %self.config.options.image,
            "sluice injector ready"
        );
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight reviews");
        self.ready.store(false, Ordering::SeqCst);
        drain.cancel();
        if let Err(error) = webhook_task.await {
            tracing::warn!(%error, "webhook listener task failed");
        }
        stop.cancel();
        let _ = tokio::time::timeout(ADMIN_GRACE * 2, admin_task).await;
        let _ = watcher.await;
        tracing::info!("sluice injector stopped");
    }
}

fn webhook_router(ctx: WebhookCtx) -> Router {
    Router::new()
        .route("/mutate", post(admit))
        .fallback(|| async {
            error_response((
                StatusCode::NOT_FOUND,
                ErrorReply::new("not_found", "the injector serves POST /mutate"),
            ))
        })
        .method_not_allowed_fallback(|| async {
            error_response((
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorReply::new("method_not_allowed", "use POST"),
            ))
        })
        .with_state(ctx)
}

/// `POST /mutate`: one AdmissionReview in, one out. A review it cannot read is a 4xx with a
/// JSON reason (the API server then applies `failurePolicy: Ignore`); every pod is allowed.
async fn admit(State(ctx): State<WebhookCtx>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let bad = |response: Response| {
        let seconds = started.elapsed().as_secs_f64();
        ctx.metrics.admission(Outcome::BadRequest, None, seconds);
        response
    };
    let review: AdmissionReview = match read_json(&headers, body, &ctx.limits).await {
        Ok(review) => review,
        Err(response) => return bad(response),
    };
    let request = match review.into_request() {
        Ok(request) => request,
        Err(error) => {
            let reply = ErrorReply::new(error.code(), error.to_string());
            return bad(error_response((StatusCode::BAD_REQUEST, reply)));
        }
    };
    let mutation = match (&request.operation, &request.object) {
        (AdmissionOperation::Create, Some(pod)) => mutate(pod, &ctx.options),
        _ => Mutation {
            outcome: Outcome::Skipped,
            refusal: None,
            patch: Vec::new(),
            warnings: Vec::new(),
        },
    };
    let pod = request.object.as_ref().map(|pod| &pod["metadata"]);
    let name = pod
        .and_then(|m| m["name"].as_str().or_else(|| m["generateName"].as_str()))
        .unwrap_or("");
    let outcome = mutation.outcome.as_str();
    let (namespace, uid, dry_run) = (&request.namespace, &request.uid, request.dry_run);
    match mutation.outcome {
        Outcome::Injected | Outcome::Refused => tracing::info!(
            namespace,
            pod = name,
            uid,
            dry_run,
            outcome,
            warnings = mutation.warnings.join("; "),
            "admission"
        ),
        _ => tracing::debug!(namespace, pod = name, uid, dry_run, outcome, "admission"),
    }
    ctx.metrics.admission(
        mutation.outcome,
        mutation.refusal,
        started.elapsed().as_secs_f64(),
    );
    let response = ReviewResponse::allowed(request.uid, &mutation.patch, mutation.warnings);
    Json(response).into_response()
}

fn admin_router(ctx: AdminCtx) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|State(ctx): State<AdminCtx>| async move { ctx.metrics.render() }),
        )
        .fallback(|| async {
            error_response((
                StatusCode::NOT_FOUND,
                ErrorReply::new(
                    "not_found",
                    "the injector's admin listener serves /livez, /readyz and /metrics",
                ),
            ))
        })
        .with_state(ctx)
}

/// Ready from start (the certificate is loaded before anything is bound) until the drain.
async fn readyz(State(ctx): State<AdminCtx>) -> Response {
    let ready = ctx.ready.load(Ordering::SeqCst);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "ready": ready }))).into_response()
}

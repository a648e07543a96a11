//! The gRPC listeners' connections: the check listeners' accept loop (at most
//! `limits.max_connections` open, back-off on accept errors, drain on shutdown) with each
//! connection served by sluice's own HTTP/2 server ([`sluice_http2`]) under bounds: concurrent
//! streams, header list size and flow-control windows (memory per connection), keepalive PINGs
//! (a dead peer is closed), a handshake timeout (the preface and SETTINGS must arrive in time,
//! or the connection is dropped), an idle timeout and a maximum age (a graceful GOAWAY; Envoy
//! reconnects), and each stream's body read timeout. Any `:authority` is accepted: an Istio
//! cluster name or a socket path must not turn every check into a reset stream.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::stream::{StreamLimits, Streams};
use super::Rls;
use crate::config::Settings;
use crate::telemetry::Metrics;
use crate::transport::request_caps::MAX_HEADER_BYTES;
use crate::transport::serve::{accept_loop, Bounds};
use sluice_http2::{self as http2, Budget, Refusal};

/// Flow-control window of one stream: far above a rate limit request, bounds what a stalled
/// stream buffers.
const STREAM_WINDOW: u32 = 64 * 1024;
/// Flow-control window of a connection: what all its streams' bodies hold together (given back
/// as their calls take them).
const CONNECTION_WINDOW: u32 = 256 * 1024;
/// A deadline far enough to be never (durations beyond `Instant`'s range).
const NEVER: Duration = Duration::from_secs(30 * 365 * 86_400);

/// Every bound of a gRPC listener and its connections, read once from settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionBounds {
    /// The accept loop's: open connections, grace on drain.
    pub accept: Bounds,
    /// Most concurrent streams per connection.
    pub max_concurrent_streams: u32,
    /// Time for the HTTP/2 preface and SETTINGS.
    pub handshake_timeout: Duration,
    /// Time with no stream open before GOAWAY.
    pub idle_timeout: Duration,
    /// Interval of keepalive PINGs.
    pub keepalive_interval: Duration,
    /// Time for a PING's ACK.
    pub keepalive_timeout: Duration,
    /// Age at which a connection gets GOAWAY.
    pub max_connection_age: Duration,
    /// Each stream's request bounds.
    pub stream: StreamLimits,
    /// The memory budget of every gRPC connection together.
    pub memory_bytes: usize,
}

impl ConnectionBounds {
    /// The bounds `settings` give (`limits.*` and `envoy.*`), with `grace` on drain.
    pub fn new(settings: &Settings, grace: Duration) -> Self {
        let envoy = &settings.envoy;
        Self {
            accept: Bounds {
                grace,
                max_connections: settings.limits.max_connections,
            },
            max_concurrent_streams: envoy.max_concurrent_streams,
            handshake_timeout: envoy.handshake_timeout.as_std(),
            idle_timeout: envoy.idle_timeout.as_std(),
            keepalive_interval: envoy.keepalive_interval.as_std(),
            keepalive_timeout: envoy.keepalive_timeout.as_std(),
            max_connection_age: envoy.max_connection_age.as_std(),
            stream: StreamLimits {
                body_read_timeout: settings.limits.body_read_timeout.as_std(),
                max_message_bytes: settings.limits.max_body_bytes,
            },
            memory_bytes: settings.limits.grpc_memory_bytes,
        }
    }

    /// The budget every connection of the gRPC listeners draws from (one for both).
    pub(crate) fn budget(&self) -> Arc<Budget> {
        let base = http2::connection_base(
            CONNECTION_WINDOW,
            self.max_concurrent_streams,
            http2::PER_STREAM_BYTES,
        );
        Budget::new(self.memory_bytes, base, warn)
    }
}

/// The budget's log line, at most once a minute for each kind of refusal.
fn warn(kind: Refusal, budget: &Budget) {
    match kind {
        Refusal::Calm => tracing::warn!(
            "a gRPC client sent too many frames that make no progress, or caused too many \
             resets; GOAWAY(ENHANCE_YOUR_CALM) (counted in \
             sluice_grpc_budget_refusals_total{{kind=\"enhance_your_calm\"}}; logged at most \
             once a minute)"
        ),
        Refusal::Connection | Refusal::Stream => tracing::warn!(
            refused = kind.as_str(),
            used_bytes = budget.used(),
            budget_bytes = budget.limit(),
            "the gRPC connections are at their memory budget (limits.grpc_memory_bytes); \
             refusing new streams of the heaviest connections and new connections (counted \
             in sluice_grpc_budget_refusals_total; logged at most once a minute)"
        ),
    }
}

/// What a gRPC listener serves, and how.
pub struct Served {
    /// The rate limit service.
    pub rls: Arc<Rls>,
    /// tonic's routes (the health service).
    pub routes: tonic::service::Routes,
    /// Where refusals made before tonic (stalled, oversized, malformed streams) are counted.
    pub metrics: Metrics,
    /// When the listener is to drain.
    pub drain: CancellationToken,
    /// Every bound.
    pub bounds: ConnectionBounds,
    /// The memory budget the connections draw from ([`ConnectionBounds::budget`]).
    pub budget: Arc<Budget>,
}

/// Serves on `listener` until the drain, every connection under the bounds.
pub async fn serve<L: Listener>(listener: L, served: Served) {
    let Served {
        rls,
        routes,
        metrics,
        drain,
        bounds,
        budget,
    } = served;
    accept_loop(listener, drain, bounds.accept, move |io, _, drain| {
        let (rls, routes, metrics) = (rls.clone(), routes.clone(), metrics.clone());
        // Reserved now, so that a refused connection costs nothing but its socket.
        let charge = budget.admit();
        let service = move |activity| Streams::new(rls, routes, activity, bounds.stream, metrics);
        async move {
            match charge {
                Some(charge) => connection(io, service, bounds, drain, charge).await,
                None => drop(io),
            }
        }
    })
    .await;
}

/// Why a connection is asked to go.
#[derive(Debug, Clone, Copy)]
enum Close {
    Drain,
    Idle,
    Age,
}

impl Close {
    fn as_str(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::Idle => "idle",
            Self::Age => "max_connection_age",
        }
    }
}

async fn connection<IO>(
    io: IO,
    service: impl FnOnce(Arc<Activity>) -> Streams + Send + 'static,
    bounds: ConnectionBounds,
    drain: CancellationToken,
    charge: http2::Charge,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let started = activity.started;
    let service = Arc::new(service(activity.clone()));
    let config = http2::Config {
        max_concurrent_streams: bounds.max_concurrent_streams,
        max_header_list: MAX_HEADER_BYTES,
        stream_window: STREAM_WINDOW,
        connection_window: CONNECTION_WINDOW,
        keepalive_interval: bounds.keepalive_interval,
        keepalive_timeout: bounds.keepalive_timeout,
        body_read_timeout: bounds.stream.body_read_timeout,
        // A message and its 5-byte gRPC prefix.
        max_body_bytes: bounds.stream.max_message_bytes.saturating_add(5),
    };
    let mut conn = http2::Connection::new(io, service, config, charge);
    let handshake_by = after(started, bounds.handshake_timeout);
    let age_by = after(started, bounds.max_connection_age);
    let close = loop {
        let idle_by = match activity.idle_since() {
            Some(since) => after(since, bounds.idle_timeout),
            // Streams are open: look again later.
            None => after(Instant::now(), bounds.idle_timeout),
        };
        let mut next = age_by.min(idle_by);
        if !activity.shaken() {
            next = next.min(handshake_by);
        }
        tokio::select! {
            () = &mut conn => return,
            () = drain.cancelled() => break Close::Drain,
            () = tokio::time::sleep_until(next) => {
                let now = Instant::now();
                if !activity.shaken() && now >= handshake_by {
                    tracing::debug!("gRPC connection without a handshake in time; dropped");
                    return;
                }
                if now >= age_by {
                    break Close::Age;
                }
                if activity.idle_since().is_some_and(|since| now >= after(since, bounds.idle_timeout)) {
                    break Close::Idle;
                }
            }
        }
    };
    tracing::debug!(
        reason = close.as_str(),
        "asking a gRPC connection to go (GOAWAY)"
    );
    activity.going.cancel();
    conn.graceful_shutdown();
    if tokio::time::timeout(bounds.accept.grace, conn)
        .await
        .is_err()
    {
        tracing::debug!("gRPC connection still busy after the grace period; closed");
    }
}

fn after(start: Instant, duration: Duration) -> Instant {
    start
        .checked_add(duration)
        .or_else(|| start.checked_add(NEVER))
        .unwrap_or(start)
}

/// What a connection's monitor knows of it: whether the handshake is in, streams open, and
/// when the last one ended.
pub(super) struct Activity {
    started: Instant,
    shaken: AtomicBool,
    open: AtomicUsize,
    /// Milliseconds from `started` to the end of the last stream.
    last_end_ms: AtomicU64,
    /// Cancelled when the connection is asked to go (GOAWAY): long-lived streams end then.
    going: CancellationToken,
    /// RLQS buckets its streams keep (their budget per connection).
    rlqs_buckets: super::rlqs::budget::ConnectionBuckets,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            shaken: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            going: CancellationToken::new(),
            rlqs_buckets: Arc::default(),
        }
    }

    fn shaken(&self) -> bool {
        self.shaken.load(Ordering::Relaxed)
    }

    /// The client's preface and first SETTINGS are in.
    pub(super) fn shake(&self) {
        self.shaken.store(true, Ordering::Relaxed);
    }

    /// Since when no stream is open, if none is.
    fn idle_since(&self) -> Option<Instant> {
        (self.open.load(Ordering::Acquire) == 0).then(|| {
            let ms = self.last_end_ms.load(Ordering::Acquire);
            after(self.started, Duration::from_millis(ms))
        })
    }

    /// Counts a stream as open until the guard drops.
    pub(super) fn stream_opened(self: &Arc<Self>) -> OpenStream {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenStream(self.clone())
    }
}

/// A stream counted as open on its connection.
pub(super) struct OpenStream(Arc<Activity>);

impl OpenStream {
    /// Cancelled when the stream's connection is asked to go (a drain, its maximum age).
    pub(super) fn going(&self) -> &CancellationToken {
        &self.0.going
    }

    /// The count of RLQS buckets the connection's streams keep.
    pub(super) fn rlqs_buckets(&self) -> super::rlqs::budget::ConnectionBuckets {
        Arc::clone(&self.0.rlqs_buckets)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

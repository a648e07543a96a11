//! Serves a router on any listener (TCP or Unix socket) with a drain that is ours to end: on
//! drain, stop accepting and let each connection finish its request; connections still open after
//! the grace period are closed (axum's own `serve` cannot close them once spawned). At most
//! `max_connections` are open at once: past it, accepting waits for one to close (the kernel's
//! backlog holds the newcomers), so a flood of idle or stalled clients costs bounded memory.
//! The accept loop itself ([`accept_loop`]) is shared with the gRPC listeners; accept errors
//! (`EMFILE`/`ENFILE` at the file-descriptor limit) back off for a second instead of spinning
//! (axum's `Listener` does that for both TCP and Unix listeners).
//! A listener that logs who asked (the admin listener: counter resets) hands each request its
//! peer's address (axum's `ConnectInfo`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::Response;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::request_caps::{Capped, HYPER_MAX_BUF};

/// Longest a client may take to send a request's headers (slow clients hold a connection).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether handlers see the peer's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// Each request carries `ConnectInfo(peer address)`.
    Record,
    /// Nothing is added (the check listeners: no work a handler does not use).
    Ignore,
}

/// Serves `router` on `listener` until `drain`, with at most `max_connections` open; then waits
/// up to `grace` for open connections to finish and closes the rest.
pub async fn serve<L: Listener>(
    listener: L,
    router: Router,
    drain: CancellationToken,
    grace: Duration,
    max_connections: usize,
    peers: Peers,
) where
    L::Addr: Clone + Send + Sync + 'static,
{
    let service = TowerToHyperService::new(router);
    serve_service(listener, service, drain, grace, max_connections, peers).await;
}

/// [`serve`] for any hyper service (the check API answers `POST /v1/check` before its router).
pub async fn serve_service<L, S>(
    listener: L,
    service: S,
    drain: CancellationToken,
    grace: Duration,
    max_connections: usize,
    peers: Peers,
) where
    L: Listener,
    L::Addr: Clone + Send + Sync + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let bounds = Bounds {
        grace,
        max_connections,
    };
    accept_loop(listener, drain, bounds, move |io, peer, drain| {
        let service = Capped(WithPeer {
            inner: service.clone(),
            peer: (peers == Peers::Record).then_some(peer),
        });
        async move {
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(HYPER_MAX_BUF)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = drain.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        }
    })
    .await;
}

/// What every accept loop is bounded by.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// How long open connections get to finish once the drain starts.
    pub grace: Duration,
    /// Most connections open at once (`limits.max_connections`).
    pub max_connections: usize,
}

/// Accepts on `listener` until `drain`, with at most `bounds.max_connections` open at once (past
/// it, accepting waits for one to close); each connection is served by the future `connection`
/// makes of it (given the drain, to finish gracefully). After the drain, open connections get
/// `bounds.grace` and are then closed.
pub async fn accept_loop<L, F, Fut>(
    mut listener: L,
    drain: CancellationToken,
    bounds: Bounds,
    mut connection: F,
) where
    L: Listener,
    F: FnMut(L::Io, L::Addr, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    loop {
        let slot = tokio::select! {
            () = drain.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
            // Reap finished connections so the set does not grow with the daemon's age.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok(slot) = slot else { break };
        tokio::select! {
            () = drain.cancelled() => break,
            (io, peer) = listener.accept() => {
                let served = connection(io, peer, drain.clone());
                connections.spawn(async move {
                    let _slot = slot;
                    served.await;
                });
            }
            // Reap finished connections so the set does not grow with the daemon's age.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let grace = bounds.grace;
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(
            open = connections.len(),
            ?grace,
            "grace period over; closing connections"
        );
        connections.shutdown().await;
    }
}

/// Inserts `ConnectInfo(peer)` into every request, when there is a peer to record.
#[derive(Clone)]
struct WithPeer<S, A> {
    inner: S,
    peer: Option<A>,
}

impl<S, A, B> hyper::service::Service<Request<B>> for WithPeer<S, A>
where
    S: hyper::service::Service<Request<B>>,
    A: Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: Request<B>) -> Self::Future {
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(ConnectInfo(peer.clone()));
        }
        self.inner.call(request)
    }
}

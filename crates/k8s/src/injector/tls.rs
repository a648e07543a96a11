//! The webhook's TLS: the serving certificate and key, loaded at start and re-read when their
//! files change on disk (cert-manager renews the Secret, the kubelet swaps the mounted files), so
//! a rotation needs no restart. A new pair that does not load (half-written, a key that does not
//! match, not PEM) is logged and counted, and the last good pair keeps serving until the files
//! change again. Reads are bounded (`config::bounded_read`: regular files, size, time).
//!
//! Handshakes run in each connection's task, not in the accept loop: [`TlsListener`] hands out
//! a [`LazyTls`] that completes its handshake on first use, so a client that stalls mid-handshake
//! holds only its own connection slot, and hyper's header read timeout bounds it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{Accept, TlsAcceptor};

use super::metrics::{InjectorMetrics, Reload};
use sluice::config::bounded_read::{self, FileStamp};
use sluice::config::{FileLimits, HumanDuration};
use tokio_util::sync::CancellationToken;

/// Bounds on reading the PEM files (a certificate chain is a few KiB).
const PEM_LIMITS: FileLimits = FileLimits {
    max_bytes: 1 << 20,
    read_timeout: HumanDuration(2_000_000),
};

/// The certificate chain and key files (PEM), as cert-manager's Secret mounts them.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The chain, leaf first (`tls.crt`).
    pub cert: PathBuf,
    /// The private key (`tls.key`).
    pub key: PathBuf,
}

/// What identifies the version of both files on disk (`None`: a file is not there).
pub type Stamps = (Option<FileStamp>, Option<FileStamp>);

impl CertFiles {
    /// Reads and checks both files: at least one certificate, a private key, and the key matches
    /// the leaf's public key.
    pub async fn load(&self) -> Result<(CertifiedKey, Stamps), String> {
        let (cert, cert_stamp) = bounded_read::read_async(self.cert.clone(), PEM_LIMITS)
            .await
            .map_err(|e| e.to_string())?;
        let (key, key_stamp) = bounded_read::read_async(self.key.clone(), PEM_LIMITS)
            .await
            .map_err(|e| e.to_string())?;
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", self.cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no CERTIFICATE in it", self.cert.display()));
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| format!("{}: no private key in it ({e})", self.key.display()))?;
        sluice::store::redis::access::install_crypto_provider();
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| format!("{} and {}: {e}", self.cert.display(), self.key.display()))?;
        Ok((certified, (Some(cert_stamp), Some(key_stamp))))
    }

    async fn stamps(&self) -> Stamps {
        let stamp = |path: &PathBuf| bounded_read::stamp_async(path.clone(), PEM_LIMITS);
        let (cert, key) = tokio::join!(stamp(&self.cert), stamp(&self.key));
        (cert.ok(), key.ok())
    }
}

/// The pair served now; swapped whole by the reload task.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    /// Starts serving `pair`.
    pub fn new(pair: CertifiedKey) -> Self {
        Self {
            current: RwLock::new(Arc::new(pair)),
        }
    }

    fn set(&self, pair: CertifiedKey) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = Arc::new(pair);
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// The rustls acceptor serving whatever `cert` holds at each handshake; HTTP/1.1 only.
pub fn acceptor(cert: Arc<ServingCert>) -> TlsAcceptor {
    sluice::store::redis::access::install_crypto_provider();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// Polls the files' metadata every `interval` (not reading them unless it changed) and swaps a
/// new valid pair in, until `stop`.
pub async fn watch_files(
    files: CertFiles,
    serving: Arc<ServingCert>,
    mut seen: Stamps,
    interval: Duration,
    metrics: InjectorMetrics,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let now = files.stamps().await;
        if now == seen {
            continue;
        }
        // Remembered whatever happens next: a bad pair is reported once, then retried only
        // when the files change again.
        seen = now;
        match files.load().await {
            Ok((pair, stamps)) => {
                if let Some(leaf) = pair.cert.first() {
                    metrics.certificate(leaf);
                }
                serving.set(pair);
                seen = stamps;
                metrics.reload(Reload::Loaded);
                tracing::info!(cert = %files.cert.display(), "serving certificate reloaded");
            }
            Err(error) => {
                metrics.reload(Reload::Rejected);
                tracing::warn!(
                    %error,
                    "new serving certificate not loaded; the previous one is still served"
                );
            }
        }
    }
}

/// A TCP listener whose connections speak TLS (handshake deferred to the connection's task).
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl TlsListener {
    /// Wraps a bound listener.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> Self {
        Self { tcp, acceptor }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = LazyTls;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.tcp).await;
        let _ = tcp.set_nodelay(true);
        (
            LazyTls(Handshake::Pending(Box::new(self.acceptor.accept(tcp)))),
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A server TLS stream whose handshake runs on its first read or write.
pub struct LazyTls(Handshake);

enum Handshake {
    Pending(Box<Accept<TcpStream>>),
    Done(Box<TlsStream<TcpStream>>),
    Failed,
}

impl LazyTls {
    fn poll_stream(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut TlsStream<TcpStream>>> {
        if let Handshake::Pending(accept) = &mut self.0 {
            match ready!(Pin::new(&mut **accept).poll(cx)) {
                Ok(stream) => self.0 = Handshake::Done(Box::new(stream)),
                Err(error) => {
                    self.0 = Handshake::Failed;
                    tracing::debug!(%error, "TLS handshake failed");
                    return Poll::Ready(Err(error));
                }
            }
        }
        match &mut self.0 {
            Handshake::Done(stream) => Poll::Ready(Ok(stream)),
            _ => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            ))),
        }
    }
}

impl AsyncRead for LazyTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let stream = ready!(self.get_mut().poll_stream(cx))?;
        Pin::new(stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LazyTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.get_mut().poll_stream(cx))?;
        Pin::new(stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Handshake::Done(stream) => Pin::new(stream).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Never finish a handshake only to close the connection.
        match &mut self.get_mut().0 {
            Handshake::Done(stream) => Pin::new(stream).poll_shutdown(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}

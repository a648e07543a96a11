//! `sluice bench --tracing`: a local OTLP/HTTP sink for the traced daemon to export to. It
//! answers every request `200` with an empty `ExportTraceServiceResponse` (zero bytes) after
//! reading the body, so the daemon pays the whole cost of tracing (spans, encoding, the export
//! request) while the collector costs next to nothing, and in the bench process, not the
//! daemon's. Connections are bounded by the exporter (one export at a time).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running sink; stopped on drop.
pub struct TraceSink {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Export requests received.
    exports: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl TraceSink {
    /// Starts on a free loopback port.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let exports = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&exports);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let counter = Arc::clone(&counter);
                        async move {
                            // Read (and drop) the body as a collector would.
                            let _ = request.into_body().collect().await;
                            counter.fetch_add(1, Ordering::Relaxed);
                            let mut response = Response::new(Full::new(bytes::Bytes::new()));
                            response.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static("application/x-protobuf"),
                            );
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            exports,
            task,
        })
    }

    /// The `[tracing]` section pointing a daemon here (every trace sampled: the worst case).
    pub fn settings(&self) -> String {
        format!(
            "[tracing]\nendpoint = \"http://{}\"\nprotocol = \"http-protobuf\"\nsampling_ratio = 1.0\n",
            self.addr
        )
    }

    /// Export requests received so far.
    pub fn exports(&self) -> u64 {
        self.exports.load(Ordering::Relaxed)
    }
}

impl Drop for TraceSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! A real OTLP trace receiver for the tracing tests, built from the published OTLP protos: the
//! gRPC `TraceService` (tonic's server) and OTLP/HTTP `POST /v1/traces` (protobuf bodies), both
//! on loopback port 0, keeping what they receive (bounded), stopped on drop.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Most export requests kept.
const MAX_REQUESTS: usize = 1_000;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct GotSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// Attributes with their values as text.
    pub attributes: Vec<(String, String)>,
    /// Linked spans as (trace id, span id).
    pub links: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service: String,
}

impl GotSpan {
    /// The value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What a receiver got.
#[derive(Default)]
struct Got {
    requests: Vec<ExportTraceServiceRequest>,
}

/// A running receiver.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    got: Arc<Mutex<Got>>,
    task: JoinHandle<()>,
}

fn keep(got: &Mutex<Got>, request: ExportTraceServiceRequest) {
    let mut got = got.lock().unwrap_or_else(|p| p.into_inner());
    if got.requests.len() < MAX_REQUESTS {
        got.requests.push(request);
    }
}

struct Grpc(Arc<Mutex<Got>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// OTLP/gRPC.
    pub async fn grpc() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Got::default()));
        let service = TraceServiceServer::new(Grpc(Arc::clone(&got)));
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        Self { addr, got, task }
    }

    /// OTLP/HTTP with protobuf bodies on `/v1/traces`.
    pub async fn http() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Got::default()));
        let sink = Arc::clone(&got);
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let sink = Arc::clone(&sink);
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            keep(&sink, request);
                            let reply = ExportTraceServiceResponse {
                                partial_success: None,
                            };
                            (
                                axum::http::StatusCode::OK,
                                [("content-type", "application/x-protobuf")],
                                reply.encode_to_vec(),
                            )
                        }
                        Err(_) => (
                            axum::http::StatusCode::BAD_REQUEST,
                            [("content-type", "text/plain")],
                            b"not an ExportTraceServiceRequest".to_vec(),
                        ),
                    }
                }
            }),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, got, task }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything received, as one text (to look for what must never be exported).
    pub fn dump(&self) -> String {
        format!(
            "{:?}",
            self.got.lock().unwrap_or_else(|p| p.into_inner()).requests
        )
    }

    /// Every span received.
    pub fn spans(&self) -> Vec<GotSpan> {
        let got = self.got.lock().unwrap_or_else(|p| p.into_inner());
        let mut spans = Vec::new();
        for resource in got.requests.iter().flat_map(|r| &r.resource_spans) {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                .unwrap_or_default();
            for span in resource.scope_spans.iter().flat_map(|s| &s.spans) {
                spans.push(GotSpan {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
                            (kv.key.clone(), text(value))
                        })
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
        spans
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// A collector that accepts connections and never answers (nor reads): the worst a dead
/// collector can do to an exporter. Connections are held until it is dropped, and counted.
pub struct BlackHole {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl BlackHole {
    /// Starts one on loopback port 0, holding at most 64 connections.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if held.len() < 64 {
                    held.push(stream);
                }
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! A daemon with Envoy's rate limit service (gRPC) on loopback and a Unix socket, and a tonic
//! client built from the same public protos, for the `grpc*` scenarios.

use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use sluice::app::App;
use sluice::clock::ManualClock;
use sluice::config::{parse_policies, Settings};
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry, RateLimitOverride},
    RateLimitDescriptor,
};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::{
    rate_limit_service_client::RateLimitServiceClient, RateLimitRequest, RateLimitResponse,
};
use tempfile::TempDir;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::helpers::{run_app, test_settings, TestApp, START_US};
use crate::stores::{Backend, OnStore, Store};

/// A daemon with its gRPC listeners.
pub struct GrpcApp {
    /// The daemon (its HTTP listeners too).
    pub app: TestApp,
    /// The gRPC TCP address.
    pub addr: std::net::SocketAddr,
    /// The gRPC Unix socket.
    pub socket: PathBuf,
}

/// Settings with both gRPC listeners on (port 0, a socket in `dir`).
pub fn grpc_settings(dir: &TempDir) -> Settings {
    let mut settings = test_settings(dir.path());
    settings.listen.grpc = "127.0.0.1:0".into();
    settings.listen.grpc_socket = Some(dir.path().join("rls.sock"));
    settings
}

/// A daemon enforcing `policies_yaml` (a sluice or an envoyproxy/ratelimit file).
pub async fn spawn_grpc(policies_yaml: &str) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = grpc_settings(&dir);
    spawn_grpc_in(dir, settings, policies_yaml).await
}

/// A daemon with these settings (see [`grpc_settings`]).
pub async fn spawn_grpc_in(dir: TempDir, settings: Settings, policies_yaml: &str) -> GrpcApp {
    let policies = parse_policies(std::path::Path::new("t.yaml"), policies_yaml).expect("valid");
    let clock = Arc::new(ManualClock::new(START_US));
    let app = App::build_with(&settings, policies, clock.clone())
        .await
        .expect("daemon builds");
    let addr = app.grpc_addr().expect("gRPC TCP on");
    let socket = app
        .grpc_socket_path()
        .expect("gRPC socket on")
        .to_path_buf();
    GrpcApp {
        app: run_app(app, clock, dir),
        addr,
        socket,
    }
}

/// A daemon enforcing `policies_yaml` on the shared store of `backend`, keys under `prefix`,
/// once the store takes calls.
pub async fn spawn_grpc_on(
    backend: Backend,
    policies_yaml: &str,
    prefix: &str,
) -> OnStore<GrpcApp> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    let store = Store::shared(backend);
    store.configure(&mut settings, prefix);
    let daemon = spawn_grpc_in(dir, settings, policies_yaml).await;
    daemon.app.wait_for_store().await;
    OnStore {
        daemon,
        store,
        prefix: prefix.to_owned(),
    }
}

impl GrpcApp {
    /// A client over TCP.
    pub async fn tcp(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(tcp_channel(self.addr).await)
    }

    /// A client over the Unix socket.
    pub async fn uds(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(uds_channel(self.socket.clone()).await)
    }
}

/// A channel to a TCP address.
pub async fn tcp_channel(addr: std::net::SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects over TCP")
}

/// A channel over a Unix socket (the URI is a placeholder).
pub async fn uds_channel(path: PathBuf) -> Channel {
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .expect("connects over the socket")
}

/// A descriptor from `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

/// The same descriptor with a limit override (`unit` as Envoy's `RateLimitUnit`).
pub fn with_override(mut d: RateLimitDescriptor, per_unit: u32, unit: i32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit: per_unit,
        unit,
    });
    d
}

/// A request for `domain`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// Asks and expects an answer (not a gRPC error).
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("answered")
        .into_inner()
}

/// `OK` and `OVER_LIMIT` as the wire numbers.
pub const OK: i32 = 1;
/// See [`OK`].
pub const OVER_LIMIT: i32 = 2;

/// A response header's value, if present.
pub fn response_header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

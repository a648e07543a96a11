//! The gRPC transport's bench clients: Envoy's `ShouldRateLimit`, one descriptor per request,
//! over at most [`CONNECTIONS`] HTTP/2 connections shared by all clients, as an Envoy with that
//! many workers keeps one connection per worker to its rate limit cluster (64 callers: 16
//! streams on each connection).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tonic::transport::{Channel, Endpoint};

use super::load::{CallFuture, Client, Factory};
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::{
    rate_limit_service_client::RateLimitServiceClient, RateLimitRequest,
};

/// The bench policies again, keyed on a descriptor of their own (`g<policy>`), so that a gRPC
/// request (which cannot name a policy) selects exactly one of them, with the same quota.
pub const POLICIES: &str = "
  - {name: grpc_tb, key: [gtb], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
  - {name: grpc_sl, key: [gsl], algorithm: sliding_log, limit: 10000, period: 100ms, failure_mode: closed}
  - {name: grpc_fw, key: [gfw], algorithm: fixed_window, limit: 1000000000, period: 1s, failure_mode: closed}
";

/// Connections the clients share (Envoy's worker count on a 4-core node).
const CONNECTIONS: usize = 4;

struct Grpc {
    client: RateLimitServiceClient<Channel>,
    requests: Arc<Vec<RateLimitRequest>>,
}

impl Client for Grpc {
    fn call(&mut self, key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let request = self.requests[key % self.requests.len()].clone();
            let answer = self.client.should_rate_limit(request).await?.into_inner();
            Ok(matches!(answer.overall_code, 1 | 2))
        })
    }
}

/// Clients of the daemon's gRPC listener at `addr`, asking the `grpc_<policy>` policy for key
/// number `k`.
pub fn sluice(addr: SocketAddr, policy: &str, keys: usize) -> Factory {
    let key = format!("g{policy}");
    let requests: Arc<Vec<RateLimitRequest>> = Arc::new(
        (0..keys.max(1))
            .map(|k| RateLimitRequest {
                domain: "bench".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.clone(),
                        value: k.to_string(),
                    }],
                    limit: None,
                    hits_addend: None,
                }],
                hits_addend: 0,
            })
            .collect(),
    );
    // Client n uses connection n % CONNECTIONS, opened by the first client that needs it.
    let channels: Arc<tokio::sync::Mutex<Vec<Channel>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    Arc::new(move || {
        let requests = Arc::clone(&requests);
        let channels = Arc::clone(&channels);
        let n = next.fetch_add(1, Ordering::Relaxed) % CONNECTIONS;
        Box::pin(async move {
            let mut open = channels.lock().await;
            while open.len() <= n {
                let channel = Endpoint::from_shared(format!("http://{addr}"))?
                    .tcp_nodelay(true)
                    .connect()
                    .await?;
                open.push(channel);
            }
            let client = RateLimitServiceClient::new(open[n].clone());
            Ok(Box::new(Grpc { client, requests }) as Box<dyn Client>)
        })
    })
}

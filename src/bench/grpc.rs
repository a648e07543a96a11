//! The gRPC transport's bench clients: Envoy's `ShouldRateLimit` over one HTTP/2 connection per
//! client (as an Envoy worker keeps one to its rate limit cluster), one descriptor per request.

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::transport::{Channel, Endpoint};

use super::load::{CallFuture, Client, Factory};
use crate::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use crate::transport::grpc::proto::envoy::service::ratelimit::v3::{
    rate_limit_service_client::RateLimitServiceClient, RateLimitRequest,
};

/// The bench policies again, keyed on a descriptor of their own (`g<policy>`), so that a gRPC
/// request (which cannot name a policy) selects exactly one of them, with the same quota.
pub const POLICIES: &str = "
  - {name: grpc_tb, key: [gtb], algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000, failure_mode: closed}
  - {name: grpc_sl, key: [gsl], algorithm: sliding_log, limit: 10000, period: 100ms, failure_mode: closed}
  - {name: grpc_fw, key: [gfw], algorithm: fixed_window, limit: 1000000000, period: 1s, failure_mode: closed}
";

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
    Arc::new(move || {
        let requests = Arc::clone(&requests);
        Box::pin(async move {
            let channel = Endpoint::from_shared(format!("http://{addr}"))?
                .tcp_nodelay(true)
                .connect()
                .await?;
            let client = RateLimitServiceClient::new(channel);
            Ok(Box::new(Grpc { client, requests }) as Box<dyn Client>)
        })
    })
}

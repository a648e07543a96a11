//! The gRPC transport's bench clients: Envoy's `ShouldRateLimit`, one descriptor per request,
//! over at most [`CONNECTIONS`] HTTP/2 connections shared by all clients, as an Envoy with that
//! many workers keeps one connection per worker to its rate limit cluster (64 callers: 16
//! streams on each connection).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use hyper::{Request, Uri};
use prost::Message;

use super::load::{CallFuture, Client, Factory};
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
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

/// One caller: `ShouldRateLimit` straight over h2 (an HTTP/2 codec and nothing else, as
/// Envoy's gRPC client is), not tonic's channel, whose buffer task and tower layers cost the
/// load generator about as much as the call and moved the daemon's arrival pattern with it.
struct Grpc {
    send: SendRequest<Bytes>,
    uri: Uri,
    /// Each key's request, framed (the 5-byte gRPC prefix, then the message).
    requests: Arc<Vec<Bytes>>,
}

impl Client for Grpc {
    fn call(&mut self, key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let framed = self.requests[key % self.requests.len()].clone();
            let request = Request::post(self.uri.clone())
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())?;
            let mut send = self.send.clone().ready().await?;
            let (answer, mut body) = send.send_request(request, false)?;
            body.send_data(framed, true)?;
            let mut answer = answer.await?.into_body();
            let mut message = BytesMut::new();
            while let Some(chunk) = answer.data().await {
                let chunk = chunk?;
                let _ = answer.flow_control().release_capacity(chunk.len());
                message.extend_from_slice(&chunk);
            }
            let trailers = answer.trailers().await?.context("no trailers")?;
            if trailers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"0") {
                bail!("grpc-status {:?}", trailers.get("grpc-status"));
            }
            let answer = RateLimitResponse::decode(message.get(5..).unwrap_or_default())?;
            Ok(matches!(answer.overall_code, 1 | 2))
        })
    }
}

/// `request` as a gRPC message: uncompressed, its length, its bytes.
fn framed(request: &RateLimitRequest) -> Bytes {
    let message = request.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(&message);
    framed.freeze()
}

/// Clients of the daemon's gRPC listener at `addr`, asking the `grpc_<policy>` policy for key
/// number `k`.
pub fn sluice(addr: SocketAddr, policy: &str, keys: usize) -> Factory {
    let key = format!("g{policy}");
    let requests: Arc<Vec<Bytes>> = Arc::new(
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
            .map(|request| framed(&request))
            .collect(),
    );
    let uri: Uri =
        format!("http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .parse()
            .expect("a valid URI");
    // Client n uses connection n % CONNECTIONS, opened by the first client that needs it.
    let channels: Arc<tokio::sync::Mutex<Vec<SendRequest<Bytes>>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    Arc::new(move || {
        let (requests, uri) = (Arc::clone(&requests), uri.clone());
        let channels = Arc::clone(&channels);
        let n = next.fetch_add(1, Ordering::Relaxed) % CONNECTIONS;
        Box::pin(async move {
            let mut open = channels.lock().await;
            while open.len() <= n {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let (send, connection) = h2::client::handshake(tcp).await?;
                // Ends when every caller's handle is dropped.
                tokio::spawn(connection);
                open.push(send);
            }
            let send = open[n].clone();
            Ok(Box::new(Grpc {
                send,
                uri,
                requests,
            }) as Box<dyn Client>)
        })
    })
}

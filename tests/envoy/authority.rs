//! An Istio-style cluster name (`outbound|8081||sluice.default.svc.cluster.local`), which Envoy's
//! `envoy_grpc` sends as `:authority` when `authority` is not set: sluice answers it over TCP and
//! over the Unix socket (h2 alone resets such a stream, and Envoy then lets every request through
//! by default). A raw HTTP/2 client sends a few other spellings no URI authority allows.

use serde_json::{json, Value};

use crate::grpc_client::{spawn_grpc, GrpcApp};
use crate::proxy::{self, count, statuses, Envoy};
use crate::rls::{rls_example, Via};

const ISTIO_NAME: &str = "outbound|8081||sluice.default.svc.cluster.local";

const POLICIES: &str = "
policies:
  - {name: per-key, match: {api_key: '*'}, key: [api_key], algorithm: fixed_window, limit: 10, period: 1h}
";

/// The example with the filter's cluster renamed to the Istio name and no `authority`.
fn istio_named(daemon: &GrpcApp, via: Via) -> Value {
    let mut config = rls_example(daemon, via);
    let used = match via {
        Via::Socket => "sluice_rls",
        Via::Tcp => "sluice_rls_tcp",
    };
    let cluster = proxy::cluster(&mut config, used);
    cluster["name"] = json!(ISTIO_NAME);
    cluster["load_assignment"]["cluster_name"] = json!(ISTIO_NAME);
    let filter = proxy::filter(&mut config, "envoy.filters.http.ratelimit");
    filter["rate_limit_service"]["grpc_service"]["envoy_grpc"] =
        json!({ "cluster_name": ISTIO_NAME });
    let host = &mut proxy::manager(&mut config)["route_config"]["virtual_hosts"][0];
    host["rate_limits"] = json!([{ "actions": [
        { "request_headers": { "header_name": "x-api-key", "descriptor_key": "api_key" } }
    ] }]);
    config
}

async fn enforced_with_an_istio_cluster_name(via: Via) {
    let daemon = spawn_grpc(POLICIES).await;
    let Some(envoy) = Envoy::start(istio_named(&daemon, via)).await else {
        return;
    };
    let answers = statuses(&envoy, 12, "/api", &[("x-api-key", "k1")]).await;
    assert_eq!(
        count(&answers, 200),
        10,
        "{via:?}: {answers:?}\n{}",
        envoy.log()
    );
    assert_eq!(&answers[10..], [429, 429]);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}

#[tokio::test]
async fn istio_cluster_name_over_tcp() {
    enforced_with_an_istio_cluster_name(Via::Tcp).await;
}

#[tokio::test]
async fn istio_cluster_name_over_the_socket() {
    enforced_with_an_istio_cluster_name(Via::Socket).await;
}

/// One `ShouldRateLimit` on a new connection, written as raw HTTP/2 frames with `authority`
/// (uncompressed HPACK literals); whether the stream was answered (a DATA frame on it) rather
/// than reset.
async fn raw_h2_answered(
    connect: impl std::future::Future<Output = Box<dyn RawIo>>,
    authority: &str,
) -> bool {
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let literal = |out: &mut Vec<u8>, index: u8, value: &str| {
        // Without indexing, static name index (< 15), raw value (< 127 bytes).
        out.extend([index, value.len() as u8]);
        out.extend_from_slice(value.as_bytes());
    };
    let frame = |out: &mut Vec<u8>, kind: u8, flags: u8, stream: u8, payload: &[u8]| {
        let len = payload.len();
        out.extend([
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            stream,
        ]);
        out.extend_from_slice(payload);
    };
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    literal(
        &mut block,
        4,
        &format!("/{}/ShouldRateLimit", sluice::transport::grpc::SERVICE_NAME),
    );
    literal(&mut block, 1, authority);
    // content-type (static 31) and te (literal name).
    block.extend([0x0F, 0x10, 16]);
    block.extend_from_slice(b"application/grpc");
    block.extend([0x00, 2, b't', b'e', 8]);
    block.extend_from_slice(b"trailers");
    let question = crate::grpc_client::request(
        "edge",
        vec![crate::grpc_client::descriptor(&[("api_key", "raw")])],
    )
    .encode_to_vec();
    let mut message = vec![0];
    message.extend((question.len() as u32).to_be_bytes());
    message.extend(question);
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut bytes, 0x4, 0, 0, &[]);
    frame(&mut bytes, 0x1, 0x4, 1, &block);
    frame(&mut bytes, 0x0, 0x1, 1, &message);
    let mut io = connect.await;
    io.write_all(&bytes).await.expect("write");
    let mut seen = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        // Bounded: frames until an answer, a reset, or the end (at most 64 reads).
        for _ in 0..64 {
            let n = io.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            seen.extend_from_slice(&chunk[..n]);
            let mut at = 0;
            while seen.len() >= at + 9 {
                let len = usize::from(seen[at]) << 16
                    | usize::from(seen[at + 1]) << 8
                    | usize::from(seen[at + 2]);
                let (kind, stream) = (seen[at + 3], seen[at + 8]);
                if stream == 1 && kind == 0x0 {
                    return true;
                }
                if stream == 1 && kind == 0x3 {
                    return false;
                }
                at += 9 + len;
            }
        }
        false
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .unwrap_or(false)
}

/// A connection a raw client writes and reads.
trait RawIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> RawIo for T {}

#[tokio::test]
async fn any_authority_from_a_raw_http2_client() {
    let daemon = spawn_grpc(POLICIES).await;
    for authority in [ISTIO_NAME, "/var/run/sluice/rls.sock", "a b", "localhost"] {
        let addr = daemon.addr;
        let tcp = async move {
            Box::new(tokio::net::TcpStream::connect(addr).await.expect("tcp")) as Box<dyn RawIo>
        };
        assert!(raw_h2_answered(tcp, authority).await, "TCP, {authority:?}");
        let path = daemon.socket.clone();
        let uds = async move {
            Box::new(tokio::net::UnixStream::connect(path).await.expect("uds")) as Box<dyn RawIo>
        };
        assert!(
            raw_h2_answered(uds, authority).await,
            "socket, {authority:?}"
        );
    }
}

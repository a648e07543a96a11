//! What a hostile or broken HTTP/2 client tried on the gRPC listeners, driven with a raw h2
//! client: floods of idle connections (past `limits.max_connections` none is held, and each is
//! dropped after the handshake timeout), stalled streams (answered `DEADLINE_EXCEEDED` and reset
//! after `limits.body_read_timeout`), malformed messages (`INVALID_ARGUMENT`), idle and old
//! connections (GOAWAY) and a peer that stops answering PINGs (closed). The file-descriptor
//! limit is in `grpc_fd_limit.rs`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, Request};
use bytes::Bytes;
use prost::Message;
use sluice::config::HumanDuration;
use sluice::transport::grpc::SERVICE_NAME;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::grpc_client::{descriptor, grpc_settings, request, spawn_grpc_in, GrpcApp};
use crate::helpers::{metric_value, SHIPPED_POLICIES};

/// Longest any single wait here may take (bounds every loop; far above every timeout set).
const WAIT: Duration = Duration::from_secs(20);

const INVALID_ARGUMENT: &str = "3";
const DEADLINE_EXCEEDED: &str = "4";

async fn daemon(tune: impl FnOnce(&mut sluice::config::Settings)) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    tune(&mut settings);
    spawn_grpc_in(dir, settings, SHIPPED_POLICIES).await
}

fn ms(n: u64) -> HumanDuration {
    HumanDuration(n * 1_000)
}

/// A raw HTTP/2 connection; the task ends when the connection does.
async fn h2_connect(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    (send, tokio::spawn(conn))
}

fn should_rate_limit() -> Request<()> {
    Request::post(format!("http://localhost/{SERVICE_NAME}/ShouldRateLimit"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// `message` with the gRPC prefix (uncompressed).
fn framed(message: &[u8]) -> Bytes {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

fn valid_message() -> Vec<u8> {
    request(
        "edge",
        vec![descriptor(&[("tenant", "t"), ("api_key", "k")])],
    )
    .encode_to_vec()
}

/// The grpc-status and grpc-message of an answer (trailers-only or in trailers).
async fn status_of(
    response: impl std::future::Future<Output = Result<axum::http::Response<h2::RecvStream>, h2::Error>>,
) -> (String, String) {
    let response = tokio::time::timeout(WAIT, response)
        .await
        .expect("answered in time")
        .expect("a response, not a reset");
    let read = |headers: &HeaderMap| {
        let value = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().expect("ascii").to_owned())
        };
        value("grpc-status").map(|s| (s, value("grpc-message").unwrap_or_default()))
    };
    if let Some(status) = read(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await.expect("body") {
        let chunk = chunk.expect("data");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = tokio::time::timeout(WAIT, body.trailers())
        .await
        .expect("trailers in time")
        .expect("trailers")
        .expect("present");
    read(&trailers).expect("grpc-status in trailers")
}

/// A new `ShouldRateLimit` stream that has sent `body` (and its end, if `end`).
async fn open_stream(
    send: &h2::client::SendRequest<Bytes>,
    body: Bytes,
    end: bool,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut ready = tokio::time::timeout(WAIT, send.clone().ready())
        .await
        .expect("a stream slot in time")
        .expect("connection usable");
    let (response, mut stream) = ready
        .send_request(should_rate_limit(), false)
        .expect("send");
    stream.send_data(body, end).expect("send body");
    (response, stream)
}

/// Sends `body` (whole) on a new stream and returns its status.
async fn ask_raw(send: &mut h2::client::SendRequest<Bytes>, body: Bytes) -> (String, String) {
    status_of(open_stream(send, body, true).await.0).await
}

/// Sockets of this process accepted by the listener on `port` (its server side).
fn held_by_server(port: u16) -> usize {
    let mut inodes = HashSet::new();
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields[1].rsplit(':').next().expect("port");
        // State 0A is the listening socket itself.
        if u16::from_str_radix(local_port, 16) == Ok(port) && fields[3] != "0A" {
            inodes.insert(format!("socket:[{}]", fields[9]));
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|link| inodes.contains(link.to_string_lossy().as_ref()))
        .count()
}

/// 2,000 stuck TCP connections (half the HTTP/2 preface, then nothing): at most `limits.max_connections` are ever
/// held, each is dropped after the handshake timeout, and checks are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_is_bounded_and_dropped() {
    const CAP: usize = 200;
    const FLOOD: usize = 2_000;
    let daemon = daemon(|s| {
        s.limits.max_connections = CAP;
        // The flood lasts at least FLOOD / CAP handshake timeouts (5 s): long enough for the
        // sampler below to look several times even on a starved machine (at 100 ms the whole
        // flood once passed within one slow look at /proc, and the count saw nothing).
        s.envoy.handshake_timeout = ms(500);
    })
    .await;
    let addr = daemon.addr;
    let mut clients = JoinSet::new();
    for _ in 0..FLOOD {
        clients.spawn(async move {
            let mut tcp = tokio::time::timeout(Duration::from_secs(60), TcpStream::connect(addr))
                .await
                .expect("connected in time (kernel backlog or accepted)")
                .expect("connect");
            // Half the preface, then nothing (a slow or stuck client). The server (which may
            // send its SETTINGS first) closes it: end of stream, or a reset.
            tcp.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
            let mut sent = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut sent)).await;
            closed.is_ok()
        });
    }
    // Counted from a thread of its own every 20 ms (at most 60 s): on a loaded machine a sampler
    // on the test's runtime could miss the whole flood.
    let flooding = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (flooding, port) = (Arc::clone(&flooding), addr.port());
        std::thread::spawn(move || {
            let (mut most, started) = (0, std::time::Instant::now());
            while flooding.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                most = most.max(held_by_server(port));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let mut closed = 0;
    while let Some(done) = clients.join_next().await {
        closed += usize::from(done.expect("joined"));
    }
    flooding.store(false, Ordering::Relaxed);
    let most = sampler.join().expect("the sampler ran");
    assert_eq!(
        closed, FLOOD,
        "every idle connection is closed by the server"
    );
    assert!(most > 0, "the count sees accepted connections");
    assert!(
        most <= CAP,
        "{most} connections held, over the cap of {CAP}"
    );
    eprintln!("{FLOOD} stuck connections: at most {most} held at once, all closed");
    let (mut send, _conn) = h2_connect(addr).await;
    assert_eq!(ask_raw(&mut send, framed(&valid_message())).await.0, "0");
}

/// Stalled streams (headers and part of a message, never the end) on 4 connections are answered
/// `DEADLINE_EXCEEDED` and reset after `limits.body_read_timeout`, and free their slots: more
/// streams than `envoy.max_concurrent_streams` get their turn, and a whole request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_streams_are_reset_after_the_body_read_timeout() {
    const STREAMS: u32 = 32;
    let daemon = daemon(|s| {
        s.limits.body_read_timeout = ms(300);
        s.envoy.max_concurrent_streams = STREAMS;
    })
    .await;
    let mut stalled = JoinSet::new();
    let mut connections = Vec::new();
    for _ in 0..4 {
        let (send, conn) = h2_connect(daemon.addr).await;
        // Twice the cap: the second half waits for slots the first half frees.
        for _ in 0..2 * STREAMS {
            let send = send.clone();
            stalled.spawn(async move {
                // A stream opened as a reset one is released may be refused (REFUSED_STREAM:
                // not processed, clients retry it); bounded retries.
                for _ in 0..20 {
                    let part = Bytes::from_static(&[0, 0, 0, 0, 40, 10]);
                    let (response, mut stream) = open_stream(&send, part, false).await;
                    let response = tokio::time::timeout(WAIT, response)
                        .await
                        .expect("answered in time");
                    if response
                        .as_ref()
                        .is_err_and(|e| e.reason() == Some(h2::Reason::REFUSED_STREAM))
                    {
                        continue;
                    }
                    let status = status_of(async { response }).await;
                    let reset = tokio::time::timeout(
                        WAIT,
                        std::future::poll_fn(|cx| stream.poll_reset(cx)),
                    )
                    .await
                    .expect("the stream is reset in time");
                    return (status, reset.is_ok());
                }
                panic!("refused 20 times");
            });
        }
        connections.push((send, conn));
    }
    let mut answered = 0;
    while let Some(done) = stalled.join_next().await {
        let ((code, message), reset) = done.expect("joined");
        assert_eq!(code, DEADLINE_EXCEEDED, "{message}");
        assert!(message.contains("body_read_timeout"), "{message}");
        assert!(reset, "reset");
        answered += 1;
    }
    assert_eq!(answered, 4 * 2 * STREAMS);
    for (mut send, conn) in connections {
        assert_eq!(ask_raw(&mut send, framed(&valid_message())).await.0, "0");
        assert!(!conn.is_finished(), "the connection itself stays");
    }
}

/// Every malformed request is `INVALID_ARGUMENT` with a reason, never `INTERNAL`.
#[tokio::test]
async fn malformed_messages_are_invalid_arguments() {
    let daemon = daemon(|_| {}).await;
    let (mut send, _conn) = h2_connect(daemon.addr).await;
    // Field 1 (domain) of 2 bytes that are not UTF-8; then an entry value (descriptors[0]
    // .entries[0].value) that is not.
    let bad_domain = framed(&[0x0a, 0x02, 0xff, 0xfe]);
    let mut bad_value = request("edge", vec![descriptor(&[("ip", "VALUE")])]).encode_to_vec();
    let at = bad_value
        .windows(5)
        .position(|w| w == b"VALUE")
        .expect("value");
    bad_value[at] = 0xff;
    let valid = framed(&valid_message());
    let truncated = valid.slice(..valid.len() - 3);
    let mut compressed = valid.to_vec();
    compressed[0] = 1;
    let twice = [valid.to_vec(), valid.to_vec()].concat();
    for (name, body) in [
        ("invalid UTF-8 in the domain", bad_domain),
        ("invalid UTF-8 in an entry value", framed(&bad_value)),
        ("a truncated message", truncated),
        ("a truncated prefix", Bytes::from_static(&[0, 0, 0])),
        ("no message", Bytes::new()),
        ("a compressed flag without grpc-encoding", compressed.into()),
        ("two messages", twice.into()),
        ("not protobuf", framed(b"\xff\xff\xff\xff")),
    ] {
        let (code, message) = ask_raw(&mut send, body).await;
        assert_eq!(code, INVALID_ARGUMENT, "{name}: {message}");
        assert!(!message.is_empty(), "{name}: a reason");
    }
    assert_eq!(ask_raw(&mut send, valid).await.0, "0", "still answers");
    // Every refusal is counted: the five framing ones and the three that do not decode.
    let metrics = daemon.app.metrics().await;
    let labels = [("transport", "grpc"), ("code", "invalid_argument")];
    assert_eq!(
        metric_value(&metrics, "sluice_http_responses_total", &labels),
        8.0
    );
}

/// A connection with no stream open for `envoy.idle_timeout` gets GOAWAY and is closed; one
/// busy past `envoy.max_connection_age` too (Envoy opens a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_old_connections_are_asked_to_go() {
    let idle = daemon(|s| s.envoy.idle_timeout = ms(300)).await;
    let (mut send, conn) = h2_connect(idle.addr).await;
    assert_eq!(ask_raw(&mut send, framed(&valid_message())).await.0, "0");
    let ended = tokio::time::timeout(WAIT, conn).await;
    assert!(ended.is_ok(), "the idle connection is closed");
    // The Unix socket listener is bounded the same way.
    let unix = tokio::net::UnixStream::connect(&idle.socket)
        .await
        .expect("connect");
    let (send, conn) = h2::client::handshake(unix).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    assert_eq!(
        ask_raw(&mut send.clone(), framed(&valid_message())).await.0,
        "0"
    );
    let ended = tokio::time::timeout(WAIT, conn).await;
    assert!(ended.is_ok(), "the idle connection on the socket is closed");

    let old = daemon(|s| s.envoy.max_connection_age = ms(500)).await;
    let (send, conn) = h2_connect(old.addr).await;
    let mut answered = 0;
    // Busy all along (one check every 20 ms, bounded): age, not idleness, ends it.
    for _ in 0..1_000 {
        let Ok(Ok(mut ready)) = tokio::time::timeout(WAIT, send.clone().ready()).await else {
            break;
        };
        let Ok((response, mut stream)) = ready.send_request(should_rate_limit(), false) else {
            break;
        };
        if stream.send_data(framed(&valid_message()), true).is_err() {
            break;
        }
        match tokio::time::timeout(WAIT, response).await.expect("in time") {
            Ok(_) => answered += 1,
            Err(_) => break,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered > 0, "answered while young");
    let ended = tokio::time::timeout(WAIT, conn).await;
    assert!(ended.is_ok(), "the old connection is closed");
    assert!(answered < 1_000, "not after its age");
}

/// A peer that completes the handshake and then answers nothing (no PING ACK) is closed after
/// the keepalive interval and timeout, well before the idle timeout.
#[tokio::test]
async fn a_peer_that_stops_answering_pings_is_closed() {
    let daemon = daemon(|s| {
        s.envoy.keepalive_interval = ms(200);
        s.envoy.keepalive_timeout = ms(200);
    })
    .await;
    let mut tcp = TcpStream::connect(daemon.addr).await.expect("connect");
    // The preface and an empty SETTINGS frame; never an ACK of anything.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    tcp.write_all(&hello).await.expect("write");
    let mut sent = Vec::new();
    let closed = tokio::time::timeout(WAIT, tcp.read_to_end(&mut sent)).await;
    assert!(closed.is_ok(), "closed by the server");
    // Among what it sent: a PING (type 6) the peer never answered.
    assert!(
        sent.windows(4).any(|w| w[0..3] == [0, 0, 8] && w[3] == 6),
        "a PING was sent"
    );
}

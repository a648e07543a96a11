//! What a hostile or broken HTTP/2 client tried on the gRPC listeners, driven with a raw h2
//! client: floods of idle connections (past `limits.max_connections` none is held, and each is
//! dropped after the handshake timeout), stalled streams (answered `DEADLINE_EXCEEDED` and reset
//! after `limits.body_read_timeout`), malformed messages (`INVALID_ARGUMENT`), idle and old
//! connections (GOAWAY), a peer that stops answering PINGs (closed), and the real binary at
//! its file-descriptor limit (accepting pauses, then recovers).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, Method, Request};
use bytes::Bytes;
use prost::Message;
use sluice::client::{self, Target};
use sluice::config::HumanDuration;
use sluice::transport::grpc::SERVICE_NAME;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::grpc_client::{descriptor, grpc_settings, request, spawn_grpc_in, GrpcApp};
use crate::helpers::{repo_root, sluice_bin, ChildGuard, SHIPPED_POLICIES};
use crate::redis_server::free_port;

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
async fn status_of(response: h2::client::ResponseFuture) -> (String, String) {
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

/// Sends `body` (whole) on a new stream and returns its status.
async fn ask_raw(send: &mut h2::client::SendRequest<Bytes>, body: Bytes) -> (String, String) {
    let mut ready = tokio::time::timeout(WAIT, send.clone().ready())
        .await
        .expect("a stream slot in time")
        .expect("connection usable");
    let (response, mut stream) = ready
        .send_request(should_rate_limit(), false)
        .expect("send");
    stream.send_data(body, true).expect("send body");
    status_of(response).await
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
        s.envoy.handshake_timeout = ms(100);
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
    let mut most = 0;
    let mut closed = 0;
    let mut check = tokio::time::interval(Duration::from_millis(100));
    while !clients.is_empty() {
        tokio::select! {
            done = clients.join_next() => {
                closed += usize::from(done.expect("one").expect("joined"));
            }
            _ = check.tick() => {
                let port = addr.port();
                let held = tokio::task::spawn_blocking(move || held_by_server(port));
                most = most.max(held.await.expect("counted"));
            }
        }
    }
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
                let mut ready = tokio::time::timeout(WAIT, send.ready())
                    .await
                    .expect("a slot in time")
                    .expect("usable");
                let (response, mut stream) = ready
                    .send_request(should_rate_limit(), false)
                    .expect("send");
                stream
                    .send_data(Bytes::from_static(&[0, 0, 0, 0, 40, 10]), false)
                    .expect("part of a message");
                let status = status_of(response).await;
                let reset =
                    tokio::time::timeout(WAIT, std::future::poll_fn(|cx| stream.poll_reset(cx)))
                        .await
                        .expect("the stream is reset in time");
                (status, reset.is_ok())
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

/// CPU time (user + system, in clock ticks of 10 ms) of process `pid` so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15, counted from 1 with pid and comm.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// The real binary with 64 file descriptors and stuck gRPC clients past them: accepting pauses
/// instead of spinning a core, and once the stuck connections are dropped (handshake timeout)
/// the HTTP check listener answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_descriptor_limit_accepting_pauses_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, http) = (free_port(), free_port());
    let settings = format!(
        "policies = {:?}\nworker_threads = 1\n[listen]\nhttp = \"127.0.0.1:{http}\"\n\
         admin = \"127.0.0.1:0\"\nsocket = {:?}\ngrpc = \"127.0.0.1:{grpc}\"\n\
         [envoy]\nhandshake_timeout = \"2s\"\n",
        repo_root().join("config/policies.yaml"),
        dir.path().join("s.sock"),
    );
    let file = dir.path().join("s.toml");
    std::fs::write(&file, settings).expect("settings");
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", "ulimit -n 64 && exec \"$0\" serve --config \"$1\""])
        .arg(sluice_bin())
        .arg(&file)
        .current_dir(dir.path())
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let daemon = ChildGuard(Some(command.spawn().expect("spawn")));
    let check = Target::Tcp(SocketAddr::from(([127, 0, 0, 1], http)));
    let probe = br#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "dry_run": true}"#;
    let answered = |wait: Duration| {
        let check = check.clone();
        async move {
            let asked = client::request(&check, Method::POST, "/v1/check", Some(probe.to_vec()));
            matches!(tokio::time::timeout(wait, asked).await, Ok(Ok(reply)) if reply.status == 200)
        }
    };
    let mut up = false;
    for _ in 0..100 {
        up = answered(Duration::from_millis(500)).await;
        if up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the daemon starts");
    let mut stuck = Vec::new();
    for _ in 0..100 {
        let mut tcp = TcpStream::connect(("127.0.0.1", grpc))
            .await
            .expect("queued");
        tcp.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
        stuck.push(tcp);
    }
    // Past the descriptors: the next accepts fail with EMFILE for as long as these are held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = cpu_ticks(daemon.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spent = cpu_ticks(daemon.id()) - before;
    eprintln!("at the descriptor limit: {spent} ticks (10 ms) of CPU in 1 s");
    assert!(
        spent < 50,
        "{spent} ticks of CPU in 1 s at the descriptor limit"
    );
    let mut recovered = false;
    for _ in 0..20 {
        recovered = answered(Duration::from_secs(1)).await;
        if recovered {
            break;
        }
    }
    assert!(
        recovered,
        "checks are answered once the stuck connections are dropped"
    );
    drop(stuck);
}

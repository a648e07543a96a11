//! Shutdown: `run` returns promptly, removes the socket file and stops listening; a check already
//! in flight is answered in full; a check that never completes is cut off after the grace period.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::client::Target;
use sluice::config::HumanDuration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::helpers::{
    check_on, connect, is_complete, spawn_app, spawn_app_in, test_settings, TestApp,
    SHIPPED_POLICIES, STOP_TIMEOUT,
};
use crate::wait::until;

fn tcp_addr(app: &TestApp) -> SocketAddr {
    match app.tcp {
        Target::Tcp(addr) => addr,
        Target::Unix(_) => unreachable!("tcp is a TCP target"),
    }
}

/// Reads from `stream` until `done(bytes)` holds, the peer closes, or 5 s pass.
async fn read_until(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while !done(&bytes) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    bytes
}

/// Opens a raw connection and sends the head of a check whose body is `body`, asking for
/// `100 Continue`: the server sends it when the handler starts reading the body, so once it has
/// arrived the request is certainly in flight.
async fn start_check(addr: SocketAddr, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n\
         Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    let interim = read_until(&mut stream, |b| b.windows(4).any(|w| w == b"\r\n\r\n")).await;
    let interim = String::from_utf8_lossy(&interim);
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue\r\n\r\n"),
        "handler is reading the body: {interim:?}"
    );
    stream
}

async fn wait_unready(app: &TestApp) {
    let within = Duration::from_secs(5);
    let reply = until("readiness turns false while draining", within, || async {
        let reply = app.admin_get("/readyz").await;
        match reply.status == 503 {
            true => Ok(reply),
            false => Err(reply.status),
        }
    })
    .await;
    let body: Value = serde_json::from_slice(&reply.body).expect("JSON");
    assert_eq!(body["ready"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_prompt_removes_the_socket_and_stops_listening() {
    let mut app = spawn_app().await;
    let socket = app.socket_path();
    let addr = tcp_addr(&app);
    assert!(socket.exists());
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.1"}});
    // Idle keep-alive connections on both transports must not hold shutdown up.
    let mut idle_tcp = connect(&app.tcp).await;
    let mut idle_uds = connect(&app.uds).await;
    assert_eq!(check_on(&mut idle_tcp, &body).await.status, 200);
    assert_eq!(check_on(&mut idle_uds, &body).await.status, 200);

    let started = Instant::now();
    app.stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "idle connections are closed at once: {took:?}"
    );
    assert!(!socket.exists(), "socket file removed");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "TCP check listener closed"
    );
    assert!(
        UnixStream::connect(&socket).await.is_err(),
        "Unix listener closed"
    );
    assert!(
        TcpStream::connect(app.admin).await.is_err(),
        "admin listener closed"
    );
    // The idle connections were closed by the server.
    assert!(idle_tcp.post_json("/v1/check", &body).await.is_err());
    assert!(idle_uds.post_json("/v1/check", &body).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_check_is_answered_during_shutdown() {
    let mut app = spawn_app().await;
    let socket = app.socket_path();
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.7"}}).to_string();
    let (part, rest) = body.split_at(body.len() / 2);

    let mut stream = start_check(tcp_addr(&app), &body).await;
    stream.write_all(part.as_bytes()).await.expect("write part");
    app.trigger_shutdown();
    // Draining: not ready any more, while the admin listener still answers.
    wait_unready(&app).await;
    assert!(
        !app.handle.is_finished(),
        "run waits for the in-flight check"
    );

    stream.write_all(rest.as_bytes()).await.expect("write rest");
    let response = read_until(&mut stream, is_complete).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    let (_, json_body) = response.split_once("\r\n\r\n").expect("head and body");
    let answer: Value = serde_json::from_str(json_body).expect("complete JSON body");
    assert_eq!(answer["allowed"], true);
    assert_eq!(answer["policy"], "login");
    assert_eq!(answer["remaining"], 9);
    drop(stream);

    tokio::time::timeout(STOP_TIMEOUT, &mut app.handle)
        .await
        .expect("run returns once the check is answered")
        .expect("no panic");
    assert!(!socket.exists(), "socket file removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_never_completes_does_not_outlast_the_grace_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.shutdown_grace = HumanDuration(300_000);
    let mut app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let socket = app.socket_path();
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.8"}}).to_string();
    let mut stalled = start_check(tcp_addr(&app), &body).await;
    stalled
        .write_all(&body.as_bytes()[..5])
        .await
        .expect("write part");

    let started = Instant::now();
    app.trigger_shutdown();
    tokio::time::timeout(STOP_TIMEOUT, &mut app.handle)
        .await
        .expect("run returns after the grace period")
        .expect("no panic");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "the grace period is honoured: {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "and not much exceeded: {took:?}"
    );
    assert!(!socket.exists(), "socket file removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_left_after_the_grace_period_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.shutdown_grace = HumanDuration(100_000);
    let mut app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.9"}}).to_string();
    let mut stalled = start_check(tcp_addr(&app), &body).await;
    stalled
        .write_all(&body.as_bytes()[..5])
        .await
        .expect("write part");
    app.stop().await;

    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), stalled.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the server closed the stalled connection: {read:?}"
    );
}

//! What a hostile client tried: arrays read as positional fields, duplicate descriptor names,
//! stalled bodies, floods of connections, oversized targets and headers, and unknown admin
//! paths. Each gets a JSON refusal (or waits its turn) and spends nothing.

use std::time::Duration;

use axum::http::Method;
use serde_json::json;
use sluice::client::{self, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    assert_error, post, remaining, spawn_app, spawn_app_in, test_settings, SHIPPED_POLICIES,
};

const IP: &str = "198.51.100.44";

fn probe() -> serde_json::Value {
    json!({"policy": "login", "descriptors": {"ip": IP}})
}

#[tokio::test]
async fn only_objects_are_requests() {
    let app = spawn_app().await;
    let positional = format!(r#"["login",{{"ip":"{IP}"}},1,false]"#);
    for body in ["[]", " []", positional.as_str()] {
        for target in [&app.tcp, &app.uds] {
            let reply = post(target, "/v1/check", body.as_bytes().to_vec()).await;
            assert_error(&reply, 400, "bad_request");
        }
        let batch = format!(r#"{{"checks": [{body}]}}"#);
        let reply = post(&app.tcp, "/v1/check/batch", batch.into_bytes()).await;
        let reason = assert_error(&reply, 400, "bad_request");
        assert!(reason.contains("checks[0]"), "{reason}");
        let admin = Target::Tcp(app.admin);
        let reply = post(&admin, "/v1/explain", body.as_bytes().to_vec()).await;
        assert_error(&reply, 400, "bad_request");
    }
    let reply = post(&app.tcp, "/v1/check/batch", b"[[]]".to_vec()).await;
    assert_error(&reply, 400, "bad_request");
    assert_eq!(remaining(&app.dry_run(&probe()).await), 9, "nothing spent");
}

#[tokio::test]
async fn a_descriptor_named_twice_is_refused() {
    let app = spawn_app().await;
    let single =
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.44", "ip": "192.0.2.1"}}"#;
    let reply = post(&app.tcp, "/v1/check", single.as_bytes().to_vec()).await;
    let reason = assert_error(&reply, 400, "bad_request");
    assert!(reason.contains("`ip`"), "{reason}");
    for item in [
        single,
        r#"{"policy": "login", "policy": "public_api", "descriptors": {"ip": "198.51.100.44"}}"#,
    ] {
        let batch = format!(r#"{{"checks": [{item}]}}"#);
        let reply = post(&app.tcp, "/v1/check/batch", batch.into_bytes()).await;
        assert_error(&reply, 400, "bad_request");
    }
    assert_eq!(remaining(&app.dry_run(&probe()).await), 9, "nothing spent");
}

/// Reads what the server sends on `stream` until it closes, at most `limit`.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut answer = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_408_and_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.limits.body_read_timeout = sluice::config::HumanDuration(200_000);
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let Target::Tcp(addr) = app.tcp else {
        unreachable!()
    };
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Length: 100\r\n\r\n{\"policy\"";
    stream.write_all(head.as_bytes()).await.expect("write");
    let answer = read_until_closed(&mut stream, Duration::from_secs(5))
        .await
        .expect("answered and closed well before the headers' 10 s");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.limits.max_connections = 2;
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let Target::Tcp(addr) = app.tcp.clone() else {
        unreachable!()
    };
    // Two clients that hold their connections with half a request.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"POST /v1/check HTTP/1.1\r\n")
            .await
            .expect("write");
        held.push(stream);
    }
    let third = tokio::spawn({
        let target = app.tcp.clone();
        async move {
            client::request(
                &target,
                Method::POST,
                "/v1/check",
                Some(probe().to_string().into_bytes()),
            )
            .await
        }
    });
    // While both slots are held, the third is not served (bounded wait, not a window).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap"
    );
    // The Unix socket has its own cap: it still answers.
    let reply = post(&app.uds, "/v1/check", probe().to_string().into_bytes()).await;
    assert_eq!(reply.status, 200);
    drop(held.pop());
    let reply = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served once a slot is free")
        .expect("join")
        .expect("reply");
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn oversized_targets_and_headers_get_json_errors() {
    let app = spawn_app().await;
    let long = format!("/v1/check?{}", "q".repeat(9000));
    for target in [&app.tcp, &app.uds, &Target::Tcp(app.admin)] {
        let reply = client::request(target, Method::POST, &long, None)
            .await
            .expect("send");
        assert_error(&reply, 414, "uri_too_long");
    }
    let Target::Tcp(addr) = app.tcp else {
        unreachable!()
    };
    for headers in [
        format!("X-Big: {}\r\n", "h".repeat(20_000)),
        (0..80)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>(),
    ] {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n{headers}Content-Length: 2\r\n\r\n{{}}"
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let answer = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .expect("answered");
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert!(answer.contains("headers_too_large"), "{answer}");
    }
    assert_eq!(remaining(&app.dry_run(&probe()).await), 9, "nothing spent");
}

#[tokio::test]
async fn the_admin_listener_answers_unknown_paths_and_methods_in_json() {
    let app = spawn_app().await;
    let admin = Target::Tcp(app.admin);
    let reply = client::request(&admin, Method::GET, "/nope", None)
        .await
        .expect("send");
    assert_error(&reply, 404, "not_found");
    let reply = client::request(&admin, Method::DELETE, "/metrics", None)
        .await
        .expect("send");
    assert_error(&reply, 405, "method_not_allowed");
}

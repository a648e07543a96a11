//! Requests the check API refuses: every refusal is a JSON `{error, reason}` with the right status,
//! and none of them changes any counter.

use std::time::Duration;

use axum::http::Method;
use serde_json::{json, Value};
use sluice::client::{self, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{assert_error, is_complete, post, remaining, spawn_app, TestApp};

const IP: &str = "198.51.100.9";

fn probe() -> Value {
    json!({"policy": "login", "descriptors": {"ip": IP}})
}

/// Spends 3 of the probe's 10 and returns what a dry run sees (6).
async fn prepare(app: &TestApp) -> u64 {
    for _ in 0..3 {
        assert_eq!(app.check_tcp(&probe()).await.status, 200);
    }
    let seen = remaining(&app.dry_run(&probe()).await);
    assert_eq!(seen, 6);
    seen
}

/// Sends `body` as is to `/v1/check` on both transports and asserts the refusal; then asserts the
/// probe's counter did not move.
async fn refused(app: &TestApp, before: u64, body: &[u8], status: u16, code: &str) -> String {
    let mut reason = String::new();
    for target in [&app.tcp, &app.uds] {
        let reply = post(target, "/v1/check", body.to_vec()).await;
        reason = assert_error(&reply, status, code);
    }
    let after = remaining(&app.dry_run(&probe()).await);
    assert_eq!(
        after,
        before,
        "state changed after {}",
        String::from_utf8_lossy(body)
    );
    reason
}

#[tokio::test]
async fn malformed_json_unknown_fields_and_wrong_types_are_400() {
    let app = spawn_app().await;
    let before = prepare(&app).await;
    let bodies: [&str; 14] = [
        "",
        "{",
        "{\"policy\": \"login\", \"descriptors\": {\"ip\": \"198.51.100.9\"}",
        "[1, 2]",
        "null",
        "\"login\"",
        // Wrong types.
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "cost": "1"}"#,
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "cost": -1}"#,
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "cost": 1.5}"#,
        r#"{"policy": "login", "descriptors": {"ip": 198}}"#,
        r#"{"policy": "login", "descriptors": [["ip", "198.51.100.9"]]}"#,
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "dry_run": "yes"}"#,
        r#"{"policy": 5, "descriptors": {"ip": "198.51.100.9"}}"#,
        // Trailing garbage.
        r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}} {}"#,
    ];
    for body in bodies {
        refused(&app, before, body.as_bytes(), 400, "bad_request").await;
    }
    let invalid_utf8 = b"{\"policy\": \"login\", \"descriptors\": {\"ip\": \"\xff\xfe\"}}";
    refused(&app, before, invalid_utf8, 400, "bad_request").await;

    // Unknown fields are refused, and the reason names them.
    let body = r#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "colour": "red"}"#;
    let reason = refused(&app, before, body.as_bytes(), 400, "bad_request").await;
    assert!(reason.contains("colour"), "{reason}");
}

#[tokio::test]
async fn caps_and_descriptor_syntax_are_enforced() {
    let app = spawn_app().await;
    let before = prepare(&app).await;
    let with = |descriptors: Value, cost: u64| {
        json!({"policy": "login", "descriptors": descriptors, "cost": cost}).to_string()
    };
    let mut many = serde_json::Map::new();
    many.insert("ip".into(), json!(IP));
    for i in 0..32 {
        many.insert(format!("d{i}"), json!("v"));
    }
    let cases: Vec<(String, &str)> = vec![
        (with(json!({"ip": IP}), 0), "cost"),
        (with(json!({"ip": IP}), 1_000_001), "cost"),
        (with(Value::Object(many), 1), "descriptors"),
        (with(json!({"ip": IP, "x": "v".repeat(257)}), 1), "256"),
        (with(json!({"ip": IP, "x": ""}), 1), "`x`"),
        (with(json!({"ip": IP, "bad name": "v"}), 1), "bad name"),
        (with(json!({"ip": IP, "": "v"}), 1), "descriptor name"),
        (
            with(json!({"ip": IP, "caf\u{e9}": "v"}), 1),
            "descriptor name",
        ),
        (with(json!({"ip": IP, "a/b": "v"}), 1), "a/b"),
        (
            with(json!({"ip": IP, "n".repeat(65): "v"}), 1),
            "descriptor name",
        ),
    ];
    for (body, needle) in cases {
        let reason = refused(&app, before, body.as_bytes(), 400, "bad_request").await;
        assert!(
            reason.contains(needle),
            "reason {reason:?} mentions {needle:?} ({body})"
        );
    }
    // Matched (not named) requests are validated the same way.
    let body = json!({"descriptors": {"path": "/login", "ip": IP}, "cost": 0}).to_string();
    refused(&app, before, body.as_bytes(), 400, "bad_request").await;

    // The boundaries themselves are accepted: 32 descriptors, a 256-byte value, a 64-byte name.
    let mut max = serde_json::Map::new();
    for i in 0..31 {
        max.insert(format!("d{i}"), json!("v"));
    }
    max.insert("ip".into(), json!("v".repeat(256)));
    let ok = json!({"policy": "login", "descriptors": max});
    assert_eq!(app.check_tcp(&ok).await.status, 200);
    let name64 = json!({"descriptors": {"n".repeat(64): "v", "Aa0_-.": "v"}});
    assert_eq!(app.check_tcp(&name64).await.status, 200);
}

#[tokio::test]
async fn policy_level_refusals_have_their_own_codes() {
    let app = spawn_app().await;
    let before = prepare(&app).await;
    let cases = [
        (
            json!({"policy": "nope", "descriptors": {"ip": IP}}),
            "unknown_policy",
            "nope",
        ),
        (
            json!({"policy": "login", "descriptors": {"path": "/login"}}),
            "missing_descriptor",
            "ip",
        ),
        (
            json!({"policy": "public_api", "descriptors": {"api_key": "k"}}),
            "missing_descriptor",
            "tenant",
        ),
        (
            json!({"policy": "login", "descriptors": {"ip": IP}, "cost": 11}),
            "cost_exceeds_limit",
            "10",
        ),
        (
            json!({"descriptors": {"path": "/login", "ip": IP}, "cost": 11}),
            "cost_exceeds_limit",
            "login",
        ),
        (
            json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 151}),
            "cost_exceeds_limit",
            "150",
        ),
        (
            json!({"descriptors": {"tenant": "t", "api_key": "k", "tier": "enterprise"}, "cost": 1501}),
            "cost_exceeds_limit",
            "1500",
        ),
    ];
    for (body, code, needle) in cases {
        let reason = refused(&app, before, body.to_string().as_bytes(), 400, code).await;
        assert!(
            reason.contains(needle),
            "reason {reason:?} mentions {needle:?}"
        );
    }
    // The public_api bucket used above was never touched either.
    let api = json!({"descriptors": {"tenant": "t", "api_key": "k"}});
    assert_eq!(remaining(&app.dry_run(&api).await), 149);
}

#[tokio::test]
async fn body_over_max_body_bytes_is_413() {
    let app = spawn_app().await;
    let before = prepare(&app).await;
    // limits.max_body_bytes defaults to 65536; pad a valid request just past it.
    let mut body = json!({"policy": "login", "descriptors": {"ip": IP, "pad": ""}}).to_string();
    let pad = 65_537 - body.len();
    body =
        json!({"policy": "login", "descriptors": {"ip": IP, "pad": "p".repeat(pad)}}).to_string();
    assert_eq!(body.len(), 65_537);
    refused(&app, before, body.as_bytes(), 413, "payload_too_large").await;

    // Declared too large, nothing sent: refused on the header alone.
    let Target::Tcp(addr) = app.tcp else {
        unreachable!()
    };
    let head = "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n";
    let response = raw_exchange(addr, head.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("payload_too_large"), "{response}");

    // Chunked, no length declared: cut off at the cap while reading.
    let chunk = format!("{:x}\r\n{}\r\n", 70_000, " ".repeat(70_000));
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}0\r\n\r\n"
    );
    let response = raw_exchange(addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("payload_too_large"), "{response}");
    assert_eq!(remaining(&app.dry_run(&probe()).await), before);
}

/// Writes `request` on a new TCP connection (in the background: the server may answer before it
/// has read everything) and reads the response until the connection closes or 5 s pass.
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let request = request.to_vec();
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&request).await;
        write
    });
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
            if is_complete(&response) {
                break;
            }
        }
    })
    .await;
    writer.abort();
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let app = spawn_app().await;
    let before = prepare(&app).await;
    for target in [&app.tcp, &app.uds] {
        for path in [
            "/",
            "/v1",
            "/v1/checks",
            "/v2/check",
            "/metrics",
            "/livez",
            "/readyz",
            "/v1/policies",
        ] {
            let reply = client::request(target, Method::GET, path, None)
                .await
                .expect("GET");
            assert_error(&reply, 404, "not_found");
            let body = probe().to_string().into_bytes();
            let reply = client::request(target, Method::POST, path, Some(body))
                .await
                .expect("POST");
            assert_error(&reply, 404, "not_found");
        }
        for path in ["/v1/check", "/v1/check/batch"] {
            for method in [Method::GET, Method::PUT, Method::DELETE] {
                let reply = client::request(target, method.clone(), path, None)
                    .await
                    .expect("send");
                assert_error(&reply, 405, "method_not_allowed");
            }
        }
    }
    assert_eq!(remaining(&app.dry_run(&probe()).await), before);
}

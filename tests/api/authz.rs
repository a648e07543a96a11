//! `/v1/authz`: the check API as an nginx `auth_request`, Envoy `ext_authz` (HTTP) or Traefik
//! `forwardAuth` target, with descriptors in headers and the original method and path.

use axum::http::{Method, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::helpers::{spawn_app, TestApp};

/// Sends `method path` with `headers` over TCP; returns (status, Retry-After, body).
async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, serde_json::Value) {
    let sluice::client::Target::Tcp(addr) = &app.tcp else {
        unreachable!("tcp target")
    };
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sluice");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).expect("request"))
        .await
        .expect("response");
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        retry,
        serde_json::from_slice(&body).unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_style_with_the_original_uri_and_a_403_denial() {
    let app = spawn_app().await;
    let headers = [
        ("x-original-uri", "/login?next=%2Fhome"),
        ("x-original-method", "POST"),
        ("x-sluice-descriptor-ip", "192.0.2.50"),
        ("x-sluice-deny-status", "403"),
    ];
    for i in 0..10 {
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(status, 200, "attempt {i}: {body}");
        assert_eq!(body["policy"], "login");
    }
    let (status, retry, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!(status, 403, "the denial status nginx understands");
    assert_eq!(retry.as_deref(), Some("300"));
    assert_eq!(body["error"], "rate_limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_ext_authz_style_with_a_path_prefix() {
    let app = spawn_app().await;
    let headers = [("x-sluice-descriptor-ip", "192.0.2.51")];
    for _ in 0..10 {
        assert_eq!(
            send(&app, Method::POST, "/v1/authz/login", &headers)
                .await
                .0,
            200
        );
    }
    let (status, retry, body) = send(&app, Method::POST, "/v1/authz/login", &headers).await;
    assert_eq!(status, 429);
    assert_eq!(
        retry.as_deref(),
        Some(body["retry_after_sec"].to_string().as_str())
    );
    // The public API policy, by tenant and key headers, on any path.
    let api = [
        ("x-sluice-descriptor-tenant", "acme"),
        ("x-sluice-descriptor-api_key", "k"),
    ];
    let (status, _, body) = send(&app, Method::GET, "/v1/authz/v1/orders", &api).await;
    assert_eq!((status, body["policy"].as_str()), (200, Some("public_api")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_headers_are_400_with_a_reason() {
    let app = spawn_app().await;
    for headers in [
        [("x-sluice-cost", "lots")],
        [("x-sluice-deny-status", "200")],
        [("x-sluice-policy", "nope")],
    ] {
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(status, 400, "{headers:?}: {body}");
        assert!(body["reason"].is_string());
    }
}

//! `/v1/authz`: the check API as an nginx `auth_request`, Envoy `ext_authz` (HTTP) or Traefik
//! `forwardAuth` target, with descriptors in headers and the original method and path.

use axum::http::{Method, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use sluice::config::{ControlHeader, OriginalFrom};

use crate::helpers::{spawn_app, spawn_app_in, test_settings, TestApp, SHIPPED_POLICIES};

/// A daemon whose `/v1/authz` takes the original request as `original` says and honours the
/// control headers `control`.
async fn spawn_authz(original: OriginalFrom, control: &[ControlHeader]) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.authz.original = original;
    settings.authz.control = control.to_vec();
    spawn_app_in(dir, settings, SHIPPED_POLICIES).await
}

/// The nginx headers for `uri` from `ip`, plus `extra`.
fn nginx<'a>(uri: &'a str, ip: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("x-original-uri", uri),
        ("x-original-method", "POST"),
        ("x-sluice-descriptor-ip", ip),
    ];
    headers.extend_from_slice(extra);
    headers
}

/// Sends `method path` with `headers` over TCP; returns (status, Retry-After, body).
pub(crate) async fn send(
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
    let app = spawn_authz(OriginalFrom::Path, &[]).await;
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
    let app = spawn_authz(OriginalFrom::Nginx, &ControlHeader::ALL).await;
    for extra in [
        [("x-sluice-cost", "lots")],
        [("x-sluice-deny-status", "200")],
        [("x-sluice-policy", "nope")],
        [("x-sluice-dry-run", "yes")],
    ] {
        let headers = nginx("/login", "192.0.2.52", &extra);
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(status, 400, "{headers:?}: {body}");
        assert!(body["reason"].is_string());
    }
}

/// What a client can put in its own request (nginx copies it into the subrequest unless the
/// configuration clears it) changes nothing by default: control headers, descriptors the
/// operator did not list, `method`/`path` descriptors and a second copy of a header are all 400,
/// and none of them spends or skips a unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_headers_cannot_switch_the_limit_off() {
    let app = spawn_app().await;
    let ip = "192.0.2.60";
    for extra in [
        ("x-sluice-dry-run", "true"),
        ("x-sluice-policy", "public_api"),
        ("x-sluice-cost", "10"),
        ("x-sluice-descriptor-path", "/x"),
        ("x-sluice-descriptor-method", "GET"),
        ("x-sluice-descriptor-tier", "enterprise"),
        ("x-sluice-descriptor-ip", "192.0.2.99"),
    ] {
        let headers = nginx("/login", ip, &[extra]);
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(status, 400, "{extra:?}: {body}");
        assert!(body["reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
    // Missing original URI: not a guess at "/".
    let (status, _, _) = send(
        &app,
        Method::GET,
        "/v1/authz",
        &[("x-sluice-descriptor-ip", ip)],
    )
    .await;
    assert_eq!(status, 400);
    // Nothing above was spent: the full ten logins remain.
    for i in 0..10 {
        let (status, _, body) =
            send(&app, Method::GET, "/v1/authz", &nginx("/login", ip, &[])).await;
        assert_eq!(status, 200, "login {i}: {body}");
    }
    let (status, _, _) = send(&app, Method::GET, "/v1/authz", &nginx("/login", ip, &[])).await;
    assert_eq!(status, 429);
}

/// Path variants the application serves as its login page are the login path to sluice, with
/// the default settings: `/LOGIN` (case-insensitive routing) and `/login;x=1` (Servlet path
/// parameters) too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_variants_are_one_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = test_settings(dir.path());
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let ip = "192.0.2.61";
    let variants = [
        "/login",
        "//login",
        "/login/",
        "/./login",
        "/LOGIN",
        "/x/../login",
        "/%6Cogin",
        "/login;x=1",
        "/Login;jsessionid=1/",
        "/login?a=1",
    ];
    for (i, uri) in variants.iter().enumerate() {
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &nginx(uri, ip, &[])).await;
        assert_eq!(
            (status, body["policy"].as_str()),
            (200, Some("login")),
            "{i}: {uri}"
        );
    }
    let (status, _, _) = send(&app, Method::GET, "/v1/authz", &nginx("//LOGIN/", ip, &[])).await;
    assert_eq!(status, 429, "the eleventh, whatever its spelling");
    let (status, _, _) = send(&app, Method::GET, "/v1/authz", &nginx("/../login", ip, &[])).await;
    assert_eq!(status, 400, "above the root");
}

/// With the control headers turned on, they work, and dry run takes only documented values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_headers_work_when_the_operator_enables_them() {
    let app = spawn_authz(OriginalFrom::Nginx, &ControlHeader::ALL).await;
    let ip = "192.0.2.62";
    for value in ["true", "TRUE", "1"] {
        let headers = nginx("/login", ip, &[("x-sluice-dry-run", value)]);
        let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(
            (status, body["remaining"].as_u64()),
            (200, Some(9)),
            "{value}"
        );
    }
    for value in ["yes", "on", "2", ""] {
        let headers = nginx("/login", ip, &[("x-sluice-dry-run", value)]);
        let (status, _, _) = send(&app, Method::GET, "/v1/authz", &headers).await;
        assert_eq!(status, 400, "dry run {value:?} is refused, not spent");
    }
    let headers = nginx("/login", ip, &[("x-sluice-dry-run", "false")]);
    let (_, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!(body["remaining"], 9, "false spends");
    let headers = nginx("/login", ip, &[("x-sluice-cost", "9")]);
    let (status, _, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!((status, body["remaining"].as_u64()), (200, Some(0)));
}

/// A fail-closed policy whose store is down: `/v1/authz` denies with the deny status (429, or
/// nginx's 403) and `Retry-After: 1`, naming the cause, never a 5xx a proxy would read as its
/// authorization service failing (Envoy's ext_authz with `failure_mode_allow` lets it through);
/// `/v1/check` still answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_with_the_store_down_is_a_denial() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(format!(
        "redis://127.0.0.1:{}",
        crate::redis_server::free_port()
    ));
    settings.redis.connect_timeout = sluice::config::HumanDuration(300_000);
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let headers = nginx("/login", "192.0.2.60", &[]);
    let (status, retry, body) = send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!((status, retry.as_deref()), (429, Some("1")), "{body}");
    assert_eq!(body["error"], "limiter_unavailable");
    let headers = nginx("/login", "192.0.2.60", &[("x-sluice-deny-status", "403")]);
    let (status, retry, _) = send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!((status, retry.as_deref()), (403, Some("1")));
    let check = app
        .check_tcp(&serde_json::json!({"descriptors": {"ip": "192.0.2.60", "path": "/login"}}))
        .await;
    assert_eq!(check.status.as_u16(), 503, "/v1/check keeps its 503");
}

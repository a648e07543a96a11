//! Which admin clients are local: `127.0.0.1` and `::1` only, unless `listen.local_peers` widens
//! it. Istio in REDIRECT mode delivers inbound mesh traffic from `127.0.0.6`: such a client (a
//! remote peer, as far as the pod knows) sees fingerprints only in `/v1/top` and may not reset
//! counters. The clients here bind their socket to `127.0.0.6` (Linux routes all of
//! `127.0.0.0/8` to the loopback interface).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::helpers::{spawn_app_in, test_settings, TestApp};

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], match: {route: login}, algorithm: sliding_log, limit: 1, period: 1h}
";

/// One HTTP/1.1 request to `admin` from a socket bound to `from`: the status and the JSON body.
async fn ask_from(from: &str, admin: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let exchange = async {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{from}:0").parse().expect("address"))
            .expect("bind the client to its loopback address");
        let mut stream = socket.connect(admin).await.expect("connect");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.expect("read");
        reply
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the admin listener answers within 10 s");
    let text = String::from_utf8_lossy(&reply);
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {text}"));
    let (_, body) = text.split_once("\r\n\r\n").expect("head and body");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn daemon(local_peers: Option<&str>) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    if let Some(peers) = local_peers {
        settings.listen.local_peers = serde_json::from_str(peers).expect("local_peers");
    }
    let app = spawn_app_in(dir, settings, POLICIES).await;
    for _ in 0..3 {
        let body = json!({"descriptors": {"route": "login", "ip": "203.0.113.7"}});
        app.check_tcp(&body).await;
    }
    app
}

const RESET: &str = "/v1/counters?policy=login&d.ip=203.0.113.7";

#[tokio::test]
async fn a_mesh_peer_on_127_0_0_6_sees_no_raw_partition_and_resets_nothing() {
    let app = daemon(None).await;
    let (status, top) = ask_from("127.0.0.6", app.admin, "GET", "/v1/top").await;
    assert_eq!(status, 200, "{top}");
    assert_eq!(top["raw_partitions"], json!(false), "{top}");
    let entry = &top["policies"][0]["entries"][0];
    assert!(entry["partition"].is_null(), "{top}");
    assert!(entry["fingerprint"].is_string(), "{top}");
    assert!(!top.to_string().contains("203.0.113.7"), "{top}");

    let (status, refused) = ask_from("127.0.0.6", app.admin, "DELETE", RESET).await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["error"], json!("forbidden"), "{refused}");
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("listen.local_peers")),
        "{refused}"
    );
    // Still limited: nothing was reset.
    let body = json!({"descriptors": {"route": "login", "ip": "203.0.113.7"}});
    assert_eq!(app.check_tcp(&body).await.status, 429);

    // 127.0.0.1 is local.
    let (_, top) = ask_from("127.0.0.1", app.admin, "GET", "/v1/top").await;
    assert_eq!(top["raw_partitions"], json!(true), "{top}");
    assert_eq!(
        top["policies"][0]["entries"][0]["partition"],
        json!("203.0.113.7")
    );
    let (status, reset) = ask_from("127.0.0.1", app.admin, "DELETE", RESET).await;
    assert_eq!(status, 200, "{reset}");
}

#[tokio::test]
async fn an_operator_may_widen_local_peers_to_all_of_127_0_0_0_8() {
    let app = daemon(Some(r#"["127.0.0.0/8", "::1"]"#)).await;
    let (_, top) = ask_from("127.0.0.6", app.admin, "GET", "/v1/top").await;
    assert_eq!(top["raw_partitions"], json!(true), "{top}");
    let (status, reset) = ask_from("127.0.0.6", app.admin, "DELETE", RESET).await;
    assert_eq!(status, 200, "{reset}");
}

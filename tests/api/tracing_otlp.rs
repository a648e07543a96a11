//! `[tracing]` against real OTLP receivers started here (gRPC and HTTP/protobuf, built from the
//! published protos): a check over HTTP and one over gRPC sent with a W3C `traceparent` arrive as
//! spans of the caller's trace, children of the caller's span, with the policy and never a
//! descriptor value; a Redis batch call is a span related to its checks; with tracing off nothing
//! is sent (`tracing_off.rs`); a dead collector fails no check and does not hold up shutdown
//! beyond its bound.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::{HumanDuration, OtlpEndpoint, OtlpProtocol, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::grpc_client::{descriptor, grpc_settings, request, spawn_grpc_in, OK};
use crate::helpers::{spawn_app_in, test_settings, SHIPPED_POLICIES, STOP_TIMEOUT};
use crate::otlp_receiver::{BlackHole, GotSpan, Receiver};
use crate::redis_server::{free_port, RedisServer};

pub(crate) const TENANT: &str = "tenant-SECRET-acme";
pub(crate) const API_KEY: &str = "key-SECRET-4711";

pub(crate) fn traceparent(trace: &str, parent: &str) -> String {
    format!("00-{trace}-{parent}-01")
}

fn traced(settings: &mut Settings, receiver: &str, protocol: OtlpProtocol) {
    settings.tracing.endpoint = Some(OtlpEndpoint::parse(receiver).expect("endpoint"));
    settings.tracing.protocol = protocol;
    settings.tracing.service_name = "sluice-under-test".into();
}

/// `POST path` with `body` and a `traceparent` header, over a fresh TCP connection; the status
/// and the JSON body.
pub(crate) async fn post_traced(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    parent: &str,
) -> (u16, Value) {
    post_with(addr, path, body, parent, &[]).await
}

/// As [`post_traced`], with `extra` headers.
async fn post_with(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    parent: &str,
    extra: &[(&str, &str)],
) -> (u16, Value) {
    let body = body.to_string();
    let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n\
         traceparent: {parent}\r\ntracestate: vendor=opaque\r\n{extra}content-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("write");
        stream.write_all(body.as_bytes()).await.expect("write");
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.expect("read");
        reply
    };
    let reply = tokio::time::timeout(STOP_TIMEOUT, exchange)
        .await
        .expect("answered in time");
    let text = String::from_utf8_lossy(&reply);
    let status = text[9..12].parse().expect("status code");
    let (_, json) = text.split_once("\r\n\r\n").expect("a body");
    (status, serde_json::from_str(json).expect("JSON body"))
}

pub(crate) fn public_api_body() -> Value {
    json!({"descriptors": {"tenant": TENANT, "api_key": API_KEY}})
}

fn find<'a>(spans: &'a [GotSpan], name: &str, trace: &str) -> Vec<&'a GotSpan> {
    spans
        .iter()
        .filter(|s| s.name == name && s.trace_id == trace)
        .collect()
}

/// HTTP and gRPC checks with a caller's `traceparent` (gRPC metadata for Envoy's API) arrive at
/// an OTLP/gRPC receiver as server spans of the caller's trace, children of its span, with
/// policy, outcome, mode and transport, and no descriptor value anywhere in what was sent.
#[tokio::test]
async fn http_and_grpc_checks_become_spans_of_the_callers_traces() {
    let receiver = Receiver::grpc().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    traced(&mut settings, &receiver.url(), OtlpProtocol::Grpc);
    let mut daemon = spawn_grpc_in(dir, settings, SHIPPED_POLICIES).await;
    let addr = match &daemon.app.tcp {
        sluice::client::Target::Tcp(addr) => *addr,
        other => panic!("not TCP: {other}"),
    };

    let (http_trace, http_parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (status, reply) = post_traced(
        addr,
        "/v1/check",
        &public_api_body(),
        &traceparent(http_trace, http_parent),
    )
    .await;
    assert_eq!((status, &reply["policy"]), (200, &json!("public_api")));

    let (grpc_trace, grpc_parent) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let mut client = daemon.tcp().await;
    let mut ask = tonic::Request::new(request(
        "edge",
        vec![descriptor(&[("tenant", TENANT), ("api_key", API_KEY)])],
    ));
    ask.metadata_mut().insert(
        "traceparent",
        traceparent(grpc_trace, grpc_parent).parse().expect("ascii"),
    );
    let answer = client.should_rate_limit(ask).await.expect("answered");
    assert_eq!(answer.into_inner().overall_code, OK);

    let (authz_trace, authz_parent) = ("5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a", "1234567890abcdef");
    let nginx = [
        ("x-original-uri", "/login?user=SECRET"),
        ("x-original-method", "POST"),
        ("x-sluice-descriptor-ip", "203.0.113.77"),
    ];
    let (status, _) = post_with(
        addr,
        "/v1/authz",
        &json!({}),
        &traceparent(authz_trace, authz_parent),
        &nginx,
    )
    .await;
    assert_eq!(status, 200);

    // Shutdown flushes what is queued (within tracing.export_timeout).
    daemon.app.stop().await;
    let spans = receiver.spans();
    let http = find(&spans, "sluice.check", http_trace);
    assert_eq!(http.len(), 1, "one HTTP check span: {spans:#?}");
    let http = http[0];
    assert_eq!(
        http.parent_span_id, http_parent,
        "child of the caller's span"
    );
    assert_eq!(http.attr("sluice.policy"), Some("public_api"));
    assert_eq!(http.attr("sluice.outcome"), Some("allowed"));
    assert_eq!(http.attr("sluice.mode"), Some("enforced"));
    assert_eq!(http.attr("sluice.transport"), Some("tcp"));
    assert_eq!(http.service, "sluice-under-test");

    let grpc = find(&spans, "sluice.should_rate_limit", grpc_trace);
    assert_eq!(grpc.len(), 1, "one gRPC check span: {spans:#?}");
    assert_eq!(grpc[0].parent_span_id, grpc_parent);
    assert_eq!(grpc[0].attr("sluice.policy"), Some("public_api"));
    assert_eq!(grpc[0].attr("sluice.transport"), Some("grpc"));

    let authz = find(&spans, "sluice.authz", authz_trace);
    assert_eq!(authz.len(), 1, "one authz span: {spans:#?}");
    assert_eq!(authz[0].parent_span_id, authz_parent);
    assert_eq!(authz[0].attr("sluice.policy"), Some("login"));

    let dump = receiver.dump();
    for secret in [TENANT, API_KEY, "SECRET", "203.0.113.77", "/login"] {
        assert!(!dump.contains(secret), "{secret} was exported: {dump}");
    }
}

/// With Redis, each batch call is a `redis.batch` client span: the child of the first sampled
/// check in it, linked to the others, so every traced check reaches the call that decided it.
/// A `/v1/check/batch` request is a span with one child per item. Exported over OTLP/HTTP.
#[tokio::test]
async fn redis_batch_calls_are_spans_related_to_every_check_they_serve() {
    let redis = RedisServer::start();
    let receiver = Receiver::http().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = "trace".into();
    settings.redis.timeout = HumanDuration(2_000_000);
    // One call at a time, so concurrent checks share calls.
    settings.redis.pipelines_in_flight = 1;
    traced(&mut settings, &receiver.url(), OtlpProtocol::HttpProtobuf);
    let mut app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let addr = match &app.tcp {
        sluice::client::Target::Tcp(addr) => *addr,
        other => panic!("not TCP: {other}"),
    };
    // The connection is made in the background: until then the failure mode answers.
    let warmup = json!({"policy": "login", "descriptors": {"ip": "192.0.2.1"}, "dry_run": true});
    crate::wait::wait_enforced(&app.tcp, &warmup).await;

    let traces: Vec<(String, String)> = (0..12u64)
        .map(|i| {
            (
                format!("{:032x}", 0xabc0 + i),
                format!("{:016x}", 0x100 + i),
            )
        })
        .collect();
    let body = public_api_body();
    let parents: Vec<String> = traces.iter().map(|(t, p)| traceparent(t, p)).collect();
    let checks = parents
        .iter()
        .map(|parent| post_traced(addr, "/v1/check", &body, parent));
    for (status, reply) in futures_util::future::join_all(checks).await {
        assert_eq!((status, &reply["mode"]), (200, &json!("enforced")));
    }
    let (batch_trace, batch_parent) = ("11111111111111111111111111111111", "2222222222222222");
    let batch = json!({"checks": [public_api_body(), {"descriptors": {"path": "/login", "ip": "198.51.100.9"}}]});
    let (status, _) = post_traced(
        addr,
        "/v1/check/batch",
        &batch,
        &traceparent(batch_trace, batch_parent),
    )
    .await;
    assert_eq!(status, 200);

    app.stop().await;
    let spans = receiver.spans();
    let calls: Vec<&GotSpan> = spans.iter().filter(|s| s.name == "redis.batch").collect();
    for (trace, parent) in &traces {
        let check = find(&spans, "sluice.check", trace);
        assert_eq!(check.len(), 1, "trace {trace}: {spans:#?}");
        assert_eq!(&check[0].parent_span_id, parent);
        let check_id = (trace.clone(), check[0].span_id.clone());
        let related = calls.iter().filter(|call| {
            (call.trace_id == check_id.0 && call.parent_span_id == check_id.1)
                || call.links.contains(&check_id)
        });
        assert_eq!(
            related.count(),
            1,
            "check of trace {trace} reaches one Redis call: {calls:#?}"
        );
    }
    for call in &calls {
        let size: usize = call
            .attr("sluice.batch.size")
            .expect("size")
            .parse()
            .expect("number");
        assert!(size > call.links.len(), "{call:?}");
        assert_eq!(call.attr("db.system.name"), Some("redis"));
    }

    let request = find(&spans, "sluice.check_batch", batch_trace);
    assert_eq!(request.len(), 1, "{spans:#?}");
    assert_eq!(request[0].parent_span_id, batch_parent);
    assert_eq!(request[0].attr("sluice.batch.checks"), Some("2"));
    let mut items: Vec<(&str, &str)> = find(&spans, "sluice.check", batch_trace)
        .iter()
        .inspect(|item| assert_eq!(item.parent_span_id, request[0].span_id))
        .map(|item| {
            (
                item.attr("sluice.batch.index").expect("index"),
                item.attr("sluice.policy").expect("policy"),
            )
        })
        .collect();
    items.sort();
    assert_eq!(items, [("0", "public_api"), ("1", "login")]);
    assert!(calls
        .iter()
        .any(|c| c.trace_id == batch_trace && c.parent_span_id == request[0].span_id));
    assert!(
        !receiver.dump().contains("SECRET"),
        "a descriptor value was exported"
    );
    assert!(
        !receiver.dump().contains("198.51.100.9"),
        "an address was exported"
    );
}

/// A collector that accepts and never answers, and one that is not there: every check is
/// answered by the store as usual, including while an export hangs (the second round runs after
/// the exporter's 1 s timer has sent the first round's spans into the black hole) and the queue
/// of 16 overflows; shutdown's flush gives up within its bound.
#[tokio::test]
async fn a_dead_collector_fails_no_check_and_does_not_hold_up_shutdown() {
    let hole = BlackHole::start().await;
    let closed = format!("http://127.0.0.1:{}", free_port());
    for (endpoint, protocol, reaches_hole) in [
        (hole.url(), OtlpProtocol::Grpc, true),
        (hole.url(), OtlpProtocol::HttpProtobuf, true),
        (closed.clone(), OtlpProtocol::Grpc, false),
    ] {
        let before = hole.accepted();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = test_settings(dir.path());
        traced(&mut settings, &endpoint, protocol);
        settings.tracing.queue_size = 16;
        settings.tracing.export_timeout = HumanDuration(1_000_000);
        let mut app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
        let addr = match &app.tcp {
            sluice::client::Target::Tcp(addr) => *addr,
            other => panic!("not TCP: {other}"),
        };
        for round in 0..2u64 {
            if round == 1 {
                // The exporter's own timer (1 s), not a limit's window.
                tokio::time::sleep(Duration::from_millis(1_500)).await;
            }
            for i in 0..60u64 {
                let body = public_api_body();
                let trace = format!("{:032x}", 0xfeed00 + round * 100 + i);
                let parent = traceparent(&trace, "00f067aa0ba902b7");
                let (status, reply) = post_traced(addr, "/v1/check", &body, &parent).await;
                assert_eq!(status, 200, "{endpoint} {protocol:?}: {reply}");
                assert_eq!(reply["mode"], "enforced");
            }
        }
        // `stop` fails the test if `run` (and so the flush) takes over STOP_TIMEOUT.
        app.stop().await;
        if reaches_hole {
            assert!(
                hole.accepted() > before,
                "{protocol:?}: the exporter never tried"
            );
        }
    }
}

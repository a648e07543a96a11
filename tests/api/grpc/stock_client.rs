//! A stock gRPC client (Python grpcio + protobuf, message classes built from the vendored public
//! protos, no sluice code) gets the same answers as the tonic client for the same questions, over
//! the Unix socket and TCP: the seed's routes, all-or-nothing, hits_addend, overrides and a bad
//! request. Skipped outside CI when grpcio is missing; `.ci/run` installs it.

use std::io::Write;
use std::process::{Command, Stdio};

use prost::Message;
use serde_json::{json, Value};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::grpc_client::{descriptor, request, spawn_grpc, with_override};
use crate::helpers::{repo_root, SHIPPED_POLICIES};

/// One question: domain, descriptors (entries, hits_addend, override per unit and unit), hits.
type Question = (
    &'static str,
    Vec<(
        Vec<(&'static str, &'static str)>,
        Option<u64>,
        Option<(u32, i32)>,
    )>,
    u32,
);

fn questions() -> Vec<Question> {
    let login = || (vec![("path", "/login"), ("ip", "203.0.113.9")], None, None);
    let api = || (vec![("tenant", "t"), ("api_key", "k")], None, None);
    let mut all: Vec<Question> = (0..11).map(|_| ("edge", vec![login()], 0)).collect();
    all.push(("edge", vec![api(), login()], 0));
    all.push(("edge", vec![api()], 5));
    all.push((
        "edge",
        vec![(vec![("tenant", "t"), ("api_key", "k")], Some(0), None)],
        0,
    ));
    all.push((
        "edge",
        vec![(vec![("tenant", "t"), ("api_key", "o")], None, Some((2, 2)))],
        0,
    ));
    all.push((
        "edge",
        vec![(vec![("tenant", "t"), ("api_key", "o")], None, Some((2, 2)))],
        0,
    ));
    all.push((
        "edge",
        vec![(vec![("tenant", "t"), ("api_key", "o")], None, Some((2, 2)))],
        0,
    ));
    all.push(("", vec![api()], 0));
    all.push(("edge", vec![(vec![("color", "red")], None, None)], 0));
    all
}

fn as_json((domain, descriptors, hits): &Question) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(entries, hits, limit)| {
            let mut d = json!({"entries": entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()});
            if let Some(hits) = hits {
                d["hits_addend"] = json!(hits);
            }
            if let Some((per_unit, unit)) = limit {
                d["limit"] = json!({"requests_per_unit": per_unit, "unit": unit});
            }
            d
        })
        .collect();
    json!({"domain": domain, "descriptors": descriptors, "hits_addend": hits})
}

fn as_proto((domain, descriptors, hits): &Question) -> RateLimitRequest {
    let mut r = request(
        domain,
        descriptors
            .iter()
            .map(|(entries, hits, limit)| {
                let mut d = descriptor(entries);
                d.hits_addend = *hits;
                match limit {
                    Some((per_unit, unit)) => with_override(d, *per_unit, *unit),
                    None => d,
                }
            })
            .collect(),
    );
    r.hits_addend = *hits;
    r
}

/// An answer reduced to what both clients see the same way (protobuf JSON omits defaults).
fn normalize(answer: &Value) -> Value {
    if let Some(error) = answer.get("error") {
        return json!({"error": error, "message": answer["message"]});
    }
    let code = |v: &Value| match v.as_str() {
        Some("OK") => 1,
        Some("OVER_LIMIT") => 2,
        _ => v.as_i64().unwrap_or(0),
    };
    let unit = |v: &Value| {
        let names = [
            "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR",
        ];
        v.as_str()
            .and_then(|n| names.iter().position(|x| *x == n))
            .map_or_else(|| v.as_i64().unwrap_or(0), |i| i as i64)
    };
    let statuses: Vec<Value> = answer["statuses"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|s| {
                    json!({
                        "code": code(&s["code"]),
                        "remaining": s["limit_remaining"].as_u64().unwrap_or(0),
                        "name": s["current_limit"]["name"],
                        "per_unit": s["current_limit"]["requests_per_unit"].as_u64().unwrap_or(0),
                        "unit": unit(&s["current_limit"]["unit"]),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"overall": code(&answer["overall_code"]), "statuses": statuses, "headers": answer["response_headers_to_add"]})
}

/// Whether python3 can import grpcio and protobuf (panics under CI when not).
pub fn python_has_grpc() -> bool {
    let works = crate::tools::which("python3").is_some()
        && Command::new("python3")
            .args(["-c", "import grpc, google.protobuf"])
            .output()
            .is_ok_and(|out| out.status.success());
    if !works {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 grpcio/protobuf missing; .ci/run installs them"
        );
        eprintln!("SKIPPED: python3 cannot import grpc and google.protobuf (CI installs them)");
    }
    works
}

async fn stock_answers(target: String) -> Vec<Value> {
    let files = protox::compile(
        ["envoy/service/ratelimit/v3/rls.proto"],
        [repo_root().join("crates/daemon/proto")],
    )
    .expect("protos compile");
    let dir = tempfile::tempdir().expect("tempdir");
    let fds = dir.path().join("rls.fds");
    std::fs::write(&fds, files.encode_to_vec()).expect("write descriptor set");
    let script = repo_root().join("tests/envoy/stock_client.py");
    let input: String = questions()
        .iter()
        .map(|q| format!("{}\n", as_json(q)))
        .collect();
    let output = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&fds)
            .arg(target)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("send questions");
        child.wait_with_output().expect("python3 finishes")
    })
    .await
    .expect("joined");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(|line| normalize(&serde_json::from_str(line).expect("JSON answer")))
        .collect()
}

async fn tonic_answers() -> Vec<Value> {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut client = daemon.tcp().await;
    let mut answers = Vec::new();
    for question in questions() {
        let answer = match client.should_rate_limit(as_proto(&question)).await {
            Ok(answer) => {
                let a = answer.into_inner();
                json!({
                    "overall_code": a.overall_code,
                    "statuses": a.statuses.iter().map(|s| json!({
                        "code": s.code,
                        "limit_remaining": s.limit_remaining,
                        "current_limit": s.current_limit.as_ref().map(|l| json!({"name": l.name, "requests_per_unit": l.requests_per_unit, "unit": l.unit})),
                    })).collect::<Vec<_>>(),
                    "response_headers_to_add": if a.response_headers_to_add.is_empty() { Value::Null } else {
                        Value::Array(a.response_headers_to_add.iter().map(|h| json!({"key": h.key, "value": h.value})).collect())
                    },
                })
            }
            Err(status) => {
                json!({"error": "INVALID_ARGUMENT", "message": status.message(), "code": status.code() as i32})
            }
        };
        answers.push(normalize(&answer));
    }
    answers
}

#[tokio::test]
async fn a_stock_python_client_gets_the_same_answers_as_tonic() {
    if !python_has_grpc() {
        return;
    }
    let expected = tonic_answers().await;
    assert_eq!(expected[10]["overall"], 2, "the scenario reaches a denial");
    assert!(
        expected.iter().any(|a| a.get("error").is_some()),
        "and a refusal"
    );
    for over_socket in [true, false] {
        let daemon = spawn_grpc(SHIPPED_POLICIES).await;
        let target = if over_socket {
            format!("unix:{}", daemon.socket.display())
        } else {
            daemon.addr.to_string()
        };
        let answers = stock_answers(target).await;
        assert_eq!(answers.len(), expected.len());
        for (i, (got, want)) in answers.iter().zip(&expected).enumerate() {
            assert_eq!(got, want, "question {i} (socket: {over_socket})");
        }
    }
}

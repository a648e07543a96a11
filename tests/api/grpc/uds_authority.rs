//! A gRPC C-core client (Python grpcio) over the Unix socket: C-core (and Ruby, C++, PHP,
//! grpc-java) sends the socket path as `:authority`, which the h2 crate under hyper alone refuses
//! (`PROTOCOL_ERROR`, hyperium/h2#487); sluice accepts any `:authority`, so it is answered with
//! and without `grpc.default_authority`. Raw bytes both ways (no protobuf package on the Python side).
//! Skipped outside CI when grpcio is missing; `.ci/run` installs it.

use std::process::Command;

use prost::Message;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice::transport::grpc::SERVICE_NAME;

use crate::grpc::stock_client::python_has_grpc;
use crate::grpc_client::{descriptor, request, spawn_grpc, OK};
use crate::helpers::SHIPPED_POLICIES;

/// argv: target, authority ("" for the client's default), request as hex. Prints `ok <hex>` or
/// `error <CODE> <details>`.
const CLIENT: &str = r#"
import sys, grpc
target, authority, question = sys.argv[1:4]
options = [("grpc.default_authority", authority)] if authority else []
with grpc.insecure_channel(target, options=options) as channel:
    call = channel.unary_unary(sys.argv[4])
    try:
        print("ok", call(bytes.fromhex(question), timeout=10).hex())
    except grpc.RpcError as error:
        print("error", error.code().name, error.details())
"#;

async fn ask(target: String, authority: &'static str) -> String {
    let question = request(
        "edge",
        vec![descriptor(&[("tenant", "t"), ("api_key", "k")])],
    );
    let hex: String = question
        .encode_to_vec()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let method = format!("/{SERVICE_NAME}/ShouldRateLimit");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", CLIENT, &target, authority, &hex, &method])
            .output()
            .expect("python3 runs")
    })
    .await
    .expect("joined");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

fn decoded(answer: &str) -> RateLimitResponse {
    let hex = answer
        .strip_prefix("ok ")
        .unwrap_or_else(|| panic!("not answered: {answer}"));
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    RateLimitResponse::decode(bytes.as_slice()).expect("a RateLimitResponse")
}

#[tokio::test]
async fn a_c_core_client_over_the_socket_is_answered_with_any_authority() {
    if !python_has_grpc() {
        return;
    }
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let target = format!("unix:{}", daemon.socket.display());
    let answer = decoded(&ask(target.clone(), "localhost").await);
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses[0].limit_remaining, 149);
    // Without it, grpcio sends the socket path as `:authority`, which h2 alone refuses
    // (PROTOCOL_ERROR, seen by grpcio as INTERNAL); sluice accepts any `:authority`
    // (transport::grpc::authority), so it is answered all the same.
    let without = decoded(&ask(target, "").await);
    assert_eq!(without.overall_code, OK);
    assert_eq!(without.statuses[0].limit_remaining, 148);
}

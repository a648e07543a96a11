//! Envoy's `ShouldRateLimit` has no release: a request a concurrency policy applies to is
//! refused with `INVALID_ARGUMENT` and a reason, and spends nothing; the same daemon's other
//! policies answer as usual.

use tonic::Code;

use crate::grpc_client::{ask, descriptor, request, spawn_grpc, OK};

const POLICIES: &str = "
policies:
  - {name: gen, key: [tenant], match: {route: gen}, algorithm: concurrency, limit: 2}
  - {name: plain, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}
";

#[tokio::test]
async fn should_rate_limit_refuses_a_concurrency_policy() {
    let daemon = spawn_grpc(POLICIES).await;
    let mut client = daemon.tcp().await;
    let held = request("d", vec![descriptor(&[("route", "gen"), ("tenant", "a")])]);
    let refused = client
        .should_rate_limit(held)
        .await
        .expect_err("a concurrency policy cannot be checked without a release");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("concurrency limit")
            && refused.message().contains("/v1/release"),
        "{}",
        refused.message()
    );
    let plain = ask(&mut client, request("d", vec![descriptor(&[("ip", "p")])])).await;
    assert_eq!(
        (plain.overall_code, plain.statuses[0].limit_remaining),
        (OK, 4)
    );
}

//! `examples/envoy/rls.yaml` as it ships: Envoy's rate limit filter calling sluice's gRPC rate
//! limit service over the Unix socket (cluster `sluice_rls`) and over TCP (cluster
//! `sluice_rls_tcp`, with its gRPC health checks), enforcing the shipped policies.

use serde_json::json;

use crate::grpc_client::{spawn_grpc, GrpcApp};
use crate::helpers::SHIPPED_POLICIES;
use crate::proxy::{self, count, statuses, Envoy};

/// Which of the example's two clusters the filter calls.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    /// `sluice_rls`: the Unix socket.
    Socket,
    /// `sluice_rls_tcp`: loopback TCP.
    Tcp,
}

/// The shipped `rls.yaml`, its sluice clusters pointed at `daemon`, the filter at the cluster
/// of `via`.
pub fn rls_example(daemon: &GrpcApp, via: Via) -> serde_json::Value {
    let mut config = proxy::example("rls.yaml");
    proxy::point(&mut config, "sluice_rls", proxy::pipe(&daemon.socket));
    proxy::point(
        &mut config,
        "sluice_rls_tcp",
        proxy::tcp(daemon.addr.port()),
    );
    let cluster = match via {
        Via::Socket => "sluice_rls",
        Via::Tcp => "sluice_rls_tcp",
    };
    proxy::filter(&mut config, "envoy.filters.http.ratelimit")["rate_limit_service"]
        ["grpc_service"]["envoy_grpc"]["cluster_name"] = json!(cluster);
    config
}

async fn shipped_example_enforces_the_shipped_policies(via: Via) {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let Some(envoy) = Envoy::start(rls_example(&daemon, via)).await else {
        return;
    };
    // login: 10 per 5 minutes per client address, then 429 with sluice's Retry-After.
    let login = statuses(&envoy, 10, "/login", &[]).await;
    assert_eq!(
        count(&login, 200),
        10,
        "{via:?}: {login:?}\n{}",
        envoy.log()
    );
    let denied = envoy.send("POST", "/login", &[]).await;
    assert_eq!(denied.status, 429, "{via:?}: {denied:?}");
    let retry: u64 = denied
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("secs");
    assert!((1..=300).contains(&retry), "{retry}");
    assert_eq!(denied.header("x-ratelimit-limit"), Some("10"));
    // Another path is not the login page.
    assert_eq!(envoy.send("GET", "/", &[]).await.body, proxy::APP_BODY);
    // public_api: a burst of 150 per key, whatever tenant and tier the client claims.
    let mut api = Vec::new();
    for i in 0..160 {
        let tenant = ["acme", "globex", "initech"][i % 3];
        let headers = [
            ("x-tenant", tenant),
            ("x-tier", "enterprise"),
            ("x-api-key", "k1"),
        ];
        api.push(envoy.send("GET", "/v1/things", &headers).await.status);
    }
    assert_eq!(count(&api, 200), 150, "{via:?}: {api:?}");
    assert_eq!(count(&api[150..], 429), 10);
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 11);
    assert_eq!(envoy.stat("cluster.app.ratelimit.error").await, 0);
}

/// Every spelling an application routes to its login page spends the login limit.
#[tokio::test]
async fn login_path_spellings_behind_the_shipped_rls_example() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let Some(envoy) = Envoy::start(rls_example(&daemon, Via::Socket)).await else {
        return;
    };
    let spellings = [
        "/LOGIN",
        "/login/",
        "//login",
        "/%6Cogin",
        "/./login",
        "/x/../login",
        "/Login?a=1",
        "/login;x=1",
        "/%2e/login",
        "/login",
    ];
    let mut codes = Vec::new();
    for path in spellings {
        codes.push((path, envoy.send("POST", path, &[]).await.status));
    }
    let next = envoy.send("POST", "/login", &[]).await;
    assert_eq!(next.status, 429, "after {codes:?}\n{}", envoy.log());
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit").await, 1);
}

#[tokio::test]
async fn shipped_rls_example_over_the_socket() {
    shipped_example_enforces_the_shipped_policies(Via::Socket).await;
}

#[tokio::test]
async fn shipped_rls_example_over_tcp() {
    shipped_example_enforces_the_shipped_policies(Via::Tcp).await;
}

//! `examples/envoy/envoy.yaml` as it ships: a Lua filter POSTing sluice's `/v1/check` on the
//! Unix socket, with the shipped policies. The path Envoy normalises, the tenant is the
//! listener's (never the client's `X-Tenant`).

use crate::helpers::{spawn_app, TestApp};
use crate::proxy::{self, count, statuses, Envoy};

fn example(daemon: &TestApp) -> serde_json::Value {
    let mut config = proxy::example("envoy.yaml");
    proxy::point(&mut config, "sluice", proxy::pipe(&daemon.socket_path()));
    config
}

#[tokio::test]
async fn shipped_lua_example_enforces_the_shipped_policies() {
    let daemon = spawn_app().await;
    let Some(envoy) = Envoy::start(example(&daemon)).await else {
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
    assert!(
        codes.iter().all(|(_, c)| *c == 200),
        "{codes:?}\n{}",
        envoy.log()
    );
    let denied = envoy.send("POST", "/login", &[]).await;
    assert_eq!(denied.status, 429, "after {codes:?}: {denied:?}");
    assert!(denied.header("retry-after").is_some());
    // One key under invented tenants: one bucket of 150.
    let mut api = Vec::new();
    for i in 0..155 {
        let tenant = ["acme", "globex", "initech"][i % 3];
        let headers = [("x-tenant", tenant), ("x-api-key", "k1")];
        api.push(envoy.send("GET", "/v1/things", &headers).await.status);
    }
    assert_eq!(count(&api, 200), 150, "{api:?}");
    let other = statuses(&envoy, 1, "/v1/things", &[("x-api-key", "k2")]).await;
    assert_eq!(other, [200]);
}

//! The policy layer through the real API on the embedded store: matching and group precedence,
//! explain, cost tables, rollout, the tenant tier file, and hot reload (file edits, an invalid
//! file, a kubelet-style symlink swap).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::client::Target;
use sluice::config::HumanDuration;
use tempfile::TempDir;

use crate::helpers::{
    json_of, metric_value, post, spawn_app_in, spawn_app_with, test_settings, TestApp,
};
use crate::wait::{eventually_within, until};

/// How long a reload may take to be seen.
const RELOAD_WITHIN: Duration = Duration::from_secs(5);

const ROUTES: &str = "
policies:
  - {name: everyone, key: [ip], algorithm: fixed_window, limit: 1000, period: 1h}
  - {name: api_default, group: api, match: {path: '/v1/*'}, key: [ip], algorithm: fixed_window, limit: 100, period: 1h}
  - {name: api_search, group: api, match: {path: /v1/search, method: GET}, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}
  - {name: api_orders, group: api, match: {path: '/v1/orders/{id}'}, key: [ip, id], algorithm: fixed_window, limit: 2, period: 1h}
  - name: graphql
    match: {operation: '*'}
    key: [tenant]
    algorithm: token_bucket
    limit: 100
    period: 1h
    cost: {descriptor: operation, table: {search: 40, getUser: 1}}
";

fn request(path: &str, method: &str) -> Value {
    json!({"descriptors": {"ip": "198.51.100.4", "path": path, "method": method}})
}

fn policies_of(body: &Value) -> Vec<String> {
    body["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .filter(|p| p["applies"] == true)
        .map(|p| p["policy"].as_str().expect("name").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_specific_policy_of_a_group_applies_and_others_stack() {
    let app = spawn_app_with(ROUTES).await;
    let explain = |body: Value| {
        let admin = Target::Tcp(app.admin);
        async move { json_of(&post(&admin, "/v1/explain", body.to_string().into_bytes()).await) }
    };
    let search = explain(request("/v1/search", "GET")).await;
    assert_eq!(policies_of(&search), ["everyone", "api_search"]);
    let skipped = &search["policies"][1];
    assert_eq!(skipped["policy"], "api_default");
    assert_eq!(
        skipped["why"],
        "a more specific policy of group `api` applies"
    );
    // A POST to /v1/search does not meet api_search's method condition: the default applies.
    assert_eq!(
        policies_of(&explain(request("/v1/search", "POST")).await),
        ["everyone", "api_default"]
    );
    let orders = explain(request("/v1/orders/42", "GET")).await;
    assert_eq!(policies_of(&orders), ["everyone", "api_orders"]);
    assert_eq!(
        orders["policies"][3]["partition"], "198.51.100.4:42",
        "path parameter keys the counter"
    );
    let none = explain(request("/v2/x", "GET")).await;
    assert_eq!(
        none["policies"][1]["why"],
        "descriptor `path` does not match `/v1/*`"
    );

    // The deciding policy is the tightest that applies; explain spends nothing.
    for _ in 0..5 {
        assert_eq!(
            app.check_tcp(&request("/v1/search", "GET")).await.status,
            200
        );
    }
    let denied = json_of(&app.check_tcp(&request("/v1/search", "GET")).await);
    assert_eq!(denied["policy"], "api_search");
    assert_eq!(denied["allowed"], false);
    let after = explain(request("/v1/search", "GET")).await;
    assert_eq!(after["outcome"], "denied");
    assert_eq!(after["policies"][2]["remaining"], 0);
    // Orders are counted per id.
    for id in ["1", "2"] {
        for _ in 0..2 {
            assert_eq!(
                app.check_tcp(&request(&format!("/v1/orders/{id}"), "GET"))
                    .await
                    .status,
                200
            );
        }
    }
    assert_eq!(
        app.check_tcp(&request("/v1/orders/1", "GET")).await.status,
        429
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_table_charges_exactly() {
    let app = spawn_app_with(ROUTES).await;
    let query = |operation: &str, cost: u64| json!({"policy": "graphql", "descriptors": {"tenant": "t", "operation": operation}, "cost": cost});
    let remaining =
        |reply: &sluice::client::Reply| json_of(reply)["remaining"].as_u64().expect("remaining");
    assert_eq!(
        remaining(&app.check_tcp(&query("search", 1)).await),
        60,
        "search costs 40"
    );
    assert_eq!(remaining(&app.check_tcp(&query("getUser", 1)).await), 59);
    assert_eq!(
        remaining(&app.check_tcp(&query("other", 7)).await),
        52,
        "unlisted: the request's cost"
    );
    assert_eq!(remaining(&app.check_tcp(&query("search", 1)).await), 12);
    let over = json_of(&app.check_tcp(&query("search", 1)).await);
    assert_eq!(over["allowed"], false, "40 > 12 left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_percentage_enforces_a_stable_share_of_partitions() {
    let app = spawn_app_with(
        "policies:\n  - {name: rollout, key: [user], algorithm: fixed_window, limit: 1, period: 1h, enforce_percent: 50}\n",
    )
    .await;
    let mut enforced = 0;
    for user in 0..60 {
        let body = json!({"descriptors": {"user": user.to_string()}});
        app.check_tcp(&body).await;
        let second = json_of(&app.check_tcp(&body).await);
        match second["mode"].as_str() {
            Some("enforced") => {
                assert_eq!(second["allowed"], false);
                enforced += 1;
            }
            Some("shadow") => assert_eq!(second["allowed"], true),
            other => panic!("mode {other:?}"),
        }
    }
    assert!(
        (15..=45).contains(&enforced),
        "{enforced} of 60 enforced at 50%"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_tier_file_scales_limits_and_changes_are_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants = dir.path().join("tenants.yaml");
    std::fs::write(&tenants, "tenants:\n  acme: enterprise\n").expect("write");
    let mut settings = test_settings(dir.path());
    settings.tenants.file = Some(tenants.clone());
    settings.tenants.refresh = HumanDuration(100_000);
    let app = spawn_app_in(dir, settings, crate::helpers::SHIPPED_POLICIES).await;
    let limit = |tenant: &'static str| {
        let body = json!({"descriptors": {"tenant": tenant, "api_key": "k"}, "dry_run": true});
        let app = &app;
        async move { json_of(&app.check_tcp(&body).await)["limit"].clone() }
    };
    assert_eq!(
        limit("acme").await,
        1500,
        "enterprise by the table, no tier descriptor needed"
    );
    assert_eq!(limit("other").await, 150);
    std::fs::write(&tenants, "tenants:\n  other: enterprise\n").expect("write");
    eventually_within("the change is seen", RELOAD_WITHIN, || async {
        limit("other").await == 1500
    })
    .await;
    assert_eq!(limit("acme").await, 150);
}

/// A daemon built from a policy file, watching it every 50 ms.
async fn spawn_watching(dir: TempDir, policy_file: &Path) -> TestApp {
    let mut settings = test_settings(dir.path());
    settings.policies = policy_file.to_path_buf();
    settings.policies_poll = HumanDuration(50_000);
    crate::helpers::spawn_served(dir, settings).await
}

const ONE: &str =
    "policies:\n  - {name: one, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}\n";
const TWO: &str =
    "policies:\n  - {name: two, key: [ip], algorithm: fixed_window, limit: 2, period: 1h}\n";

async fn wait_for_policy(app: &TestApp, name: &str) {
    until(&format!("policy {name} loaded"), RELOAD_WITHIN, || async {
        let dump = json_of(&app.admin_get("/v1/policies").await);
        match dump["policies"][0]["name"] == name {
            true => Ok(()),
            false => Err(dump),
        }
    })
    .await;
}

async fn reloads(app: &TestApp, result: &str) -> f64 {
    metric_value(
        &app.metrics().await,
        "sluice_policy_reloads_total",
        &[("result", result)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_reload_and_an_invalid_file_keeps_the_old_policies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, ONE).expect("write");
    let app = spawn_watching(dir, &file).await;
    let version = json_of(&app.admin_get("/v1/policies").await)["version"].clone();

    // Replaced by a rename: an in-place write can be read half-done (empty, then written), and
    // that empty content would be a refused reload of its own (seen on a loaded machine).
    let next = file.with_extension("next");
    std::fs::write(&next, TWO).expect("write");
    std::fs::rename(&next, &file).expect("rename");
    wait_for_policy(&app, "two").await;
    assert_eq!(reloads(&app, "ok").await, 1.0);
    let dump = json_of(&app.admin_get("/v1/policies").await);
    assert_ne!(dump["version"], version, "the version follows the content");

    // Replaced by a rename too, for the same reason (it would be rejected a second time).
    std::fs::write(
        &next,
        "policies:\n  - {name: broken, key: [], algorithm: nope}\n",
    )
    .expect("write");
    std::fs::rename(&next, &file).expect("rename");
    eventually_within("the invalid file is rejected", RELOAD_WITHIN, || async {
        reloads(&app, "invalid").await >= 1.0
    })
    .await;
    app.wait_policy_polls(3.0).await;
    assert_eq!(
        reloads(&app, "invalid").await,
        1.0,
        "rejected once, not at every poll"
    );
    let body = json!({"policy": "two", "descriptors": {"ip": "1"}});
    let reply = post(&app.tcp, "/v1/check", body.to_string().into_bytes()).await;
    assert_eq!(reply.status, 200, "the old set keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_style_symlink_swap_is_picked_up() {
    // A ConfigMap volume: policies.yaml -> ..data/policies.yaml, ..data -> ..<timestamp>; an
    // update writes a new timestamped directory and renames a new ..data link over the old one.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let root = root.as_path();
    let first = root.join("..2026_12_02_10_00_00.1");
    std::fs::create_dir(&first).expect("mkdir");
    std::fs::write(first.join("policies.yaml"), ONE).expect("write");
    std::os::unix::fs::symlink("..2026_12_02_10_00_00.1", root.join("..data")).expect("link");
    std::os::unix::fs::symlink("..data/policies.yaml", root.join("policies.yaml")).expect("link");
    let app = spawn_watching(dir, &root.join("policies.yaml")).await;
    wait_for_policy(&app, "one").await;

    let second = root.join("..2026_12_02_10_05_00.2");
    std::fs::create_dir(&second).expect("mkdir");
    std::fs::write(second.join("policies.yaml"), TWO).expect("write");
    std::os::unix::fs::symlink("..2026_12_02_10_05_00.2", root.join("..data_tmp")).expect("link");
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("atomic swap");
    std::fs::remove_dir_all(&first).expect("old data removed");
    wait_for_policy(&app, "two").await;
}

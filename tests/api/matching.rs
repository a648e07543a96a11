//! Matching (issue 21): a `*` anywhere in a value is a glob, on the check API and in converted
//! envoyproxy/ratelimit files; the `path` descriptor cannot be sidestepped by case, `;`
//! parameters or a trailing slash on `/v1/check` or gRPC (`/v1/authz`: `authz.rs`, nginx:
//! `nginx.rs`); spellings sluice would read otherwise are refused with file:line; and
//! `config check` lists every problem of every policy in one run.

use serde_json::{json, Value};

use crate::grpc_client::{ask, descriptor, request, spawn_grpc};
use crate::helpers::{json_of, run, sluice_command, spawn_app_with, SHIPPED_POLICIES};

const GLOBS: &str = r#"
policies:
  - {name: items, group: api, match: {path: "/v1/orders/*/items"}, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}
  - {name: orders, group: api, match: {path: "/v1/orders/*"}, key: [ip], algorithm: fixed_window, limit: 100, period: 1h}
  - {name: hosts, match: {host: "*.example.com"}, key: [host], algorithm: fixed_window, limit: 100, period: 1h}
"#;

/// The policy that decided a check of `descriptors`, and the status.
async fn decided(app: &crate::helpers::TestApp, descriptors: Value) -> (u16, Value) {
    let reply = app.check_tcp(&json!({ "descriptors": descriptors })).await;
    (reply.status.as_u16(), json_of(&reply)["policy"].clone())
}

#[tokio::test]
async fn a_star_inside_a_value_matches_any_run_and_the_longer_glob_wins() {
    let app = spawn_app_with(GLOBS).await;
    let items = json!({"path": "/v1/orders/123/items", "ip": "10.0.0.1"});
    assert_eq!(decided(&app, items.clone()).await, (200, json!("items")));
    assert_eq!(
        decided(&app, items).await.0,
        429,
        "the items limit (1) applies, not the broader orders one"
    );
    let notes = json!({"path": "/v1/orders/123/notes", "ip": "10.0.0.1"});
    assert_eq!(decided(&app, notes).await, (200, json!("orders")));
    let host = json!({"host": "api.example.com"});
    assert_eq!(decided(&app, host).await, (200, json!("hosts")));
    let bare = json!({"host": "example.com"});
    assert_eq!(decided(&app, bare).await, (200, Value::Null));
}

#[tokio::test]
async fn login_spellings_spend_the_login_limit_on_the_check_api() {
    let app = spawn_app_with(SHIPPED_POLICIES).await;
    let ip = "198.51.100.20";
    let spellings = [
        "/LOGIN",
        "/Login/",
        "/login;jsessionid=1",
        "/login;x=1/",
        "//login",
        "/LoGiN;a=b",
        "/login",
        "/login/",
        "/LOGIN/",
        "/login",
    ];
    for (i, path) in spellings.iter().enumerate() {
        let got = decided(&app, json!({"path": path, "ip": ip})).await;
        assert_eq!(got, (200, json!("login")), "{i}: {path}");
    }
    let got = decided(&app, json!({"path": "/Login;jsessionid=2", "ip": ip})).await;
    assert_eq!(got.0, 429, "the eleventh attempt, whatever its spelling");
}

#[tokio::test]
async fn login_spellings_spend_the_login_limit_over_grpc() {
    let daemon = spawn_grpc(SHIPPED_POLICIES).await;
    let mut client = daemon.tcp().await;
    let attempt = |path: &'static str| {
        request(
            "edge",
            vec![descriptor(&[("path", path), ("ip", "203.0.113.70")])],
        )
    };
    for path in [
        "/LOGIN",
        "/login;jsessionid=1",
        "/Login/",
        "/login",
        "/LOGIN",
    ]
    .iter()
    .cycle()
    .take(10)
    {
        let answer = ask(&mut client, attempt(path)).await;
        let status = &answer.statuses[0];
        let name = status.current_limit.as_ref().map(|l| l.name.as_str());
        assert_eq!((answer.overall_code, name), (1, Some("login")), "{path}");
    }
    let answer = ask(&mut client, attempt("/lOgIn")).await;
    assert_eq!(answer.overall_code, 2, "OVER_LIMIT on the eleventh");
}

const CASES: &str = r#"
policies:
  - {name: exact, path_case: exact, match: {path: /Admin}, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}
  - {name: by_path, match: {route: by_path}, key: [path], algorithm: fixed_window, limit: 2, period: 1h}
  - {name: by_path_exact, path_case: exact, match: {route: by_path_exact}, key: [path], algorithm: fixed_window, limit: 2, period: 1h}
  - {name: order, match: {path: "/v1/orders/{id}"}, key: [id], algorithm: fixed_window, limit: 1, period: 1h}
"#;

#[tokio::test]
async fn exact_case_is_an_opt_in_and_keys_follow_the_match() {
    let app = spawn_app_with(CASES).await;
    // `path_case: exact`: letters must match, `;` parameters and a trailing slash still go.
    for (path, policy) in [
        ("/Admin", json!("exact")),
        ("/Admin/;v=1", json!("exact")),
        ("/admin", Value::Null),
        ("/ADMIN", Value::Null),
    ] {
        let got = decided(&app, json!({"path": path, "ip": "10.1.1.1"})).await;
        assert_eq!(got, (200, policy), "{path}");
    }
    // A `path` key is the path as matched: one partition for every spelling of it by default
    // (a brute force cannot split its budget over `/LOGIN` and `/login`), one per case in exact.
    let by_path = |route: &str, path: &str| json!({"route": route, "path": path});
    for path in ["/Login", "/login;x=1"] {
        assert_eq!(decided(&app, by_path("by_path", path)).await.0, 200);
    }
    assert_eq!(decided(&app, by_path("by_path", "/LOGIN/")).await.0, 429);
    for path in ["/Login", "/login", "/Login/", "/login;x=1"] {
        let got = decided(&app, by_path("by_path_exact", path)).await;
        assert_eq!(got.0, 200, "{path}");
    }
    assert_eq!(
        decided(&app, by_path("by_path_exact", "/LOGIN")).await.0,
        200
    );
    assert_eq!(
        decided(&app, by_path("by_path_exact", "/login")).await.0,
        429
    );
    // A template parameter keeps its case: order IDs `AbC` and `abc` are two orders.
    for path in ["/v1/orders/AbC", "/V1/ORDERS/abc"] {
        let got = decided(&app, json!({"path": path})).await;
        assert_eq!(got, (200, json!("order")), "{path}");
    }
    assert_eq!(
        decided(&app, json!({"path": "/v1/Orders/AbC/"})).await.0,
        429
    );
}

const ENVOY: &str = "
domain: edge
descriptors:
  - key: path
    value: /v1/orders/*/items
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: host
    value: '*.example.com'
    rate_limit: {unit: hour, requests_per_unit: 1}
";

#[tokio::test]
async fn a_converted_envoy_star_matches_anywhere_in_the_value() {
    let daemon = spawn_grpc(ENVOY).await;
    let mut client = daemon.tcp().await;
    for entries in [
        [("path", "/v1/orders/42/items")],
        [("host", "api.example.com")],
    ] {
        let first = ask(&mut client, request("edge", vec![descriptor(&entries)])).await;
        assert_eq!(
            first.overall_code, 1,
            "{entries:?} is limited, first passes"
        );
        let second = ask(&mut client, request("edge", vec![descriptor(&entries)])).await;
        assert_eq!(second.overall_code, 2, "{entries:?}: the limit of 1 holds");
    }
}

/// Writes `text` to `name` in `dir` and runs `sluice config check` on it.
fn config_check(dir: &std::path::Path, name: &str, text: &str) -> (Option<i32>, String, String) {
    let file = dir.join(name);
    std::fs::write(&file, text).expect("write");
    let file = file.display().to_string();
    let out = run(sluice_command(dir, &["config", "check", &file]));
    (out.code, out.stderr, file)
}

#[test]
fn values_sluice_would_read_otherwise_are_refused_with_their_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "policies:\n\
        \x20 - name: a\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    match: {path: \"/v1/**\"}\n\
        \x20 - name: b\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    match: {user: \"a\\\\*\"}\n\
        \x20 - name: c\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    match: {path: \"/v1/*/{id}\"}\n\
        \x20 - name: d\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    match: {path: \"/login;jsessionid=*\"}\n\
        \x20 - name: e\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    match: {path: /login/}\n\
        \x20 - name: f\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n    path_case: upper\n";
    let (code, stderr, file) = config_check(dir.path(), "ambiguous.yaml", text);
    assert_eq!(code, Some(64), "{stderr}");
    for (line, policy, field, says) in [
        (7, "a", "match", "`**`"),
        (13, "b", "match", "no escapes"),
        (19, "c", "match", "mixes `*` and `{name}`"),
        (25, "d", "match", "`;` parameters are removed"),
        (31, "e", "match", "write \"/login\""),
        (37, "f", "path_case", "unknown variant `upper`"),
    ] {
        let expected = format!("{file}:{line}: policy `{policy}`: field `{field}`: ");
        let shown = stderr.lines().find(|l| l.starts_with(&expected));
        assert!(
            shown.is_some_and(|l| l.contains(says)),
            "{expected}...{says} in\n{stderr}"
        );
    }
}

#[test]
fn config_check_lists_every_problem_of_every_policy_in_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "policies:\n\
        \x20 - name: Bad Name\n    key: []\n    algorithm: leaky\n    limit: x\n    colour: red\n\
        \x20 - name: b\n    key: [ip, ip]\n    algorithm: sliding_log\n    limit: 0\n    period: 1m\n    enforce_percent: 101\n    timeout: 11s\n\
        \x20 - name: b\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n    burst: 3\n\
        \x20 - name: d\n    algorithm: token_bucket\n    limit: 5\n    period: 1m\n    shadow: maybe\n";
    let (code, stderr, file) = config_check(dir.path(), "six.yaml", text);
    assert_eq!(code, Some(64), "{stderr}");
    let expected = [
        (4, "policy `Bad Name`: field `algorithm`"),
        (5, "policy `Bad Name`: field `limit`"),
        (6, "policy `Bad Name`: field `colour`"),
        (8, "policy `b`: field `key`"),
        (10, "policy `b`: field `limit`"),
        (12, "policy `b`: field `enforce_percent`"),
        (13, "policy `b`: field `timeout`"),
        (14, "policy `b`: field `name`: defined more than once"),
        (19, "policy `b`: field `burst`"),
        (24, "policy `d`: field `shadow`"),
        (20, "policy `d`: field `key`: missing"),
    ];
    for (line, says) in expected {
        let wanted = format!("{file}:{line}: {says}");
        assert!(stderr.contains(&wanted), "{wanted} in\n{stderr}");
    }
    let problems = stderr.lines().filter(|l| l.starts_with(&file)).count();
    assert!(problems >= expected.len(), "{stderr}");
    // A policy with an unknown field still has the fields that read checked: name, key, limit.
    let text = "policies:\n  - {name: Bad Name, key: [], algorithm: fixed_window, limit: 0, \
                period: 1m, colour: red}\n";
    let (_, stderr, file) = config_check(dir.path(), "names.yaml", text);
    for says in ["`colour`", "`name`", "`key`", "`limit`"] {
        let wanted = format!("{file}:2: policy `Bad Name`: field {says}");
        assert!(stderr.contains(&wanted), "{wanted} in\n{stderr}");
    }
}

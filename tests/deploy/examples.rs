//! The client examples in `examples/` run against a real daemon, over the Unix socket and TCP:
//! Python, Node.js and Go (each on its client library in `clients/`), and curl. Each must
//! report allowed (exit 0), denied with the daemon's retry time (exit 1), a rejected request
//! (exit 64) and an unreachable daemon (exit 69).

use serde_json::json;
use sluice::client::Target;

use crate::clients::build_go_example;
use crate::helpers::{run_async, spawn_app, Outcome, TestApp};
use crate::tools::{self, example};

fn tcp_url(app: &TestApp) -> String {
    match &app.tcp {
        Target::Tcp(addr) => format!("http://{addr}"),
        Target::Unix(_) => unreachable!("tcp is a TCP target"),
    }
}

fn assert_outcome(outcome: &Outcome, code: i32, stdout_has: &str) {
    assert_eq!(outcome.code, Some(code), "{outcome:?}");
    assert!(
        outcome.stdout.contains(stdout_has),
        "stdout lacks {stdout_has:?}: {outcome:?}"
    );
}

/// Spends what is left of the login quota for `ip` through the daemon's own client.
async fn exhaust_login(app: &TestApp, ip: &str) {
    for _ in 0..10 {
        let reply = app
            .check_tcp(&json!({"policy": "login", "descriptors": {"ip": ip}}))
            .await;
        if reply.status == 429 {
            return;
        }
    }
}

/// The common scenario for an example run as `PROGRAM PREFIX... SOCKET_FLAG P|URL_FLAG U
/// --policy login -d ip=...`.
async fn scenario(program: &str, prefix: &[&str], socket_flag: &str, url_flag: &str) {
    let app = spawn_app().await;
    let socket = app.socket_path().display().to_string();
    let url = tcp_url(&app);
    let login = |target_flag: &str, target: &str, ip: &str| {
        let ip = format!("ip={ip}");
        let args = [target_flag, target, "--policy", "login", "-d", &ip];
        example(program, &[prefix, &args].concat())
    };
    let over_socket = run_async(login(socket_flag, &socket, "203.0.113.7")).await;
    assert_outcome(&over_socket, 0, "allowed policy=login remaining=9");
    let over_tcp = run_async(login(url_flag, &url, "203.0.113.7")).await;
    assert_outcome(&over_tcp, 0, "allowed policy=login remaining=8");
    exhaust_login(&app, "203.0.113.7").await;
    let denied = run_async(login(socket_flag, &socket, "203.0.113.7")).await;
    assert_outcome(&denied, 1, "denied policy=login retry_after_sec=300");
    let args = [url_flag, url.as_str(), "--policy", "nope", "-d", "ip=1"];
    let unknown = run_async(example(program, &[prefix, &args].concat())).await;
    assert_eq!(unknown.code, Some(64), "{unknown:?}");
    let missing = app.dir.path().join("missing.sock").display().to_string();
    let unreachable = run_async(login(socket_flag, &missing, "198.51.100.1")).await;
    assert_eq!(unreachable.code, Some(69), "{unreachable:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_example_asks_over_socket_and_tcp() {
    if tools::required("python3") {
        scenario(
            "python3",
            &["examples/python/check.py"],
            "--socket",
            "--url",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_example_asks_over_socket_and_tcp() {
    if tools::required("node") {
        scenario("node", &["examples/node/check.js"], "--socket", "--url").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_example_asks_over_socket_and_tcp() {
    if !tools::required("curl") {
        return;
    }
    let app = spawn_app().await;
    let socket = app.socket_path().display().to_string();
    let body = r#"{"policy": "login", "descriptors": {"ip": "203.0.113.9"}}"#;
    let curl = |var: &str, value: &str, body: &str| {
        let mut command = example("sh", &["examples/curl/check.sh", body]);
        command.env(var, value);
        command
    };
    let over_socket = run_async(curl("SLUICE_SOCKET", &socket, body)).await;
    assert_outcome(&over_socket, 0, r#""remaining":9"#);
    let over_tcp = run_async(curl("SLUICE_URL", &tcp_url(&app), body)).await;
    assert_outcome(&over_tcp, 0, r#""remaining":8"#);
    exhaust_login(&app, "203.0.113.9").await;
    let denied = run_async(curl("SLUICE_SOCKET", &socket, body)).await;
    assert_outcome(&denied, 1, r#""retry_after_sec":300"#);
    let bad = run_async(curl(
        "SLUICE_SOCKET",
        &socket,
        r#"{"policy": "nope", "descriptors": {}}"#,
    ))
    .await;
    assert_outcome(&bad, 64, "unknown_policy");
    let missing = app.dir.path().join("missing.sock").display().to_string();
    let unreachable = run_async(curl("SLUICE_SOCKET", &missing, body)).await;
    assert_eq!(unreachable.code, Some(69), "{unreachable:?}");
}

/// Builds the Go example (stdlib and clients/go only: no module download) and runs it like the
/// others; usage errors exit 64. CI installs Go (`.ci/run`); elsewhere the test is skipped without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_example_builds_and_asks_over_socket_and_tcp() {
    if !tools::required("go") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let program = build_go_example(dir.path()).await.display().to_string();
    scenario(&program, &[], "--socket", "--url").await;
    for bad in [
        &["--url", "not a url"][..],
        &["--url", "https://127.0.0.1:7070"],
        &["--no-such-flag"],
        &["-d", "ip"],
    ] {
        let out = run_async(example(&program, bad)).await;
        assert_eq!(out.code, Some(64), "{bad:?}: {out:?}");
        assert!(out.stderr.contains("usage"), "{bad:?}: {out:?}");
    }
}

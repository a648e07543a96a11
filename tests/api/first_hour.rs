//! A new user's first hour: the CLI and the client examples take one address convention
//! (`http://127.0.0.1:7070`, `127.0.0.1:7070`, `localhost:7070`, `SLUICE_SOCKET`, `SLUICE_URL`),
//! and a usage error exits 64 with a message, never 1 or 2 (denied, unavailable) or a trace.

use sluice::client::Target;

use crate::helpers::{repo_root, run_async, sluice_command, spawn_app};
use crate::tools;
use crate::tools::example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_every_address_form_and_the_environment() {
    let app = spawn_app().await;
    let Target::Tcp(addr) = app.tcp.clone() else {
        unreachable!()
    };
    let port = addr.port();
    let cwd = app.dir.path().to_owned();
    let ask = |extra: &[&str]| {
        let mut args = vec!["check", "-p", "login", "-d", "ip=192.0.2.77"];
        args.extend_from_slice(extra);
        sluice_command(&cwd, &args)
    };
    for address in [
        format!("http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}/"),
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
    ] {
        for flag in ["--http", "--url"] {
            let out = run_async(ask(&[flag, &address])).await;
            assert_eq!(out.code, Some(0), "{flag} {address}: {out:?}");
        }
    }
    let mut command = ask(&[]);
    command.env("SLUICE_URL", format!("http://localhost:{port}"));
    let out = run_async(command).await;
    assert_eq!(out.code, Some(0), "SLUICE_URL: {out:?}");
    let mut command = ask(&[]);
    command.env("SLUICE_SOCKET", app.socket_path());
    command.env("SLUICE_URL", "http://127.0.0.1:1");
    let out = run_async(command).await;
    assert_eq!(
        out.code,
        Some(0),
        "SLUICE_SOCKET before SLUICE_URL: {out:?}"
    );

    for bad in [
        &["--http", "https://127.0.0.1:7070"][..],
        &["--http", "127.0.0.1"],
        &["--http", "http://127.0.0.1:7070/v1/check"],
        &["--no-such-flag"],
        &["--cost", "many"],
    ] {
        let out = run_async(ask(bad)).await;
        assert_eq!(out.code, Some(64), "{bad:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{bad:?}: says why");
    }
    let out = run_async(sluice_command(&repo_root(), &["--help"])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_take_the_same_addresses_and_exit_64_on_usage_errors() {
    let app = spawn_app().await;
    let Target::Tcp(addr) = app.tcp.clone() else {
        unreachable!()
    };
    let port = addr.port();
    for (program, script) in [
        ("python3", "examples/python/check.py"),
        ("node", "examples/node/check.js"),
    ] {
        if !tools::required(program) {
            continue;
        }
        for address in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
            let args = [
                script,
                "--url",
                &address,
                "-d",
                "ip=192.0.2.78",
                "--policy",
                "login",
            ];
            let out = run_async(example(program, &args)).await;
            assert_eq!(out.code, Some(0), "{program} {address}: {out:?}");
        }
        for bad in [
            &["--url", "not a url"][..],
            &["--url", "https://127.0.0.1:7070"],
            &["--url", "http://127.0.0.1"],
            &["--no-such-flag"],
            &["-d", "ip"],
            &["--url"],
        ] {
            let out = run_async(example(program, &[&[script][..], bad].concat())).await;
            assert_eq!(out.code, Some(64), "{program} {bad:?}: {out:?}");
            assert!(out.stderr.contains("usage"), "{program} {bad:?}: {out:?}");
            assert!(
                !out.stderr.contains("Traceback"),
                "{program} {bad:?}: {out:?}"
            );
            assert!(
                !out.stderr.contains("    at "),
                "{program} {bad:?}: {out:?}"
            );
        }
    }
}

/// A check that matches no policy is allowed, and counted where an operator looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_traffic_is_counted() {
    let app = spawn_app().await;
    let unmatched = |metrics: &str| {
        crate::helpers::metric_value(
            metrics,
            "sluice_decisions_total",
            &[("policy", ""), ("outcome", "unmatched")],
        )
    };
    assert_eq!(unmatched(&app.metrics().await), 0.0);
    let body = serde_json::json!({"descriptors": {"path": "/logout", "ip": "192.0.2.79"}});
    let reply = app.check_tcp(&body).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        crate::helpers::json_of(&reply)["policy"],
        serde_json::Value::Null
    );
    app.dry_run(&body).await;
    assert_eq!(
        unmatched(&app.metrics().await),
        1.0,
        "counted once, dry run not"
    );
}

/// The examples of the README and `docs/` run against the shipped files: the explain request
/// hits a shipped policy, the PodMonitor names the port the manifests name, and the quick
/// start's socket path follows `TMPDIR` like the daemon's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_agrees_with_the_shipped_files() {
    let readme: String = crate::helpers::doc_files()
        .iter()
        .map(|doc| std::fs::read_to_string(doc).expect("a doc"))
        .collect::<Vec<_>>()
        .join("\n");
    let explain = readme
        .lines()
        .find(|line| line.contains("/v1/explain") && line.starts_with("curl"))
        .expect("an explain example");
    let body = explain
        .split('\'')
        .nth(1)
        .expect("the example's body in single quotes");
    let app = spawn_app().await;
    let reply = crate::helpers::post(
        &Target::Tcp(app.admin),
        "/v1/explain",
        body.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(reply.status, 200, "{explain}");
    let answer = crate::helpers::json_of(&reply);
    let applied: Vec<&str> = answer["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .filter(|p| p["applies"] == true)
        .filter_map(|p| p["policy"].as_str())
        .collect();
    assert!(
        !applied.is_empty(),
        "the README's explain example hits no shipped policy: {answer}"
    );

    let monitor =
        std::fs::read_to_string(repo_root().join("deploy/k8s/monitoring/podmonitor.yaml"))
            .expect("podmonitor");
    let port = monitor
        .lines()
        .find_map(|l| l.trim().strip_prefix("- port: "))
        .expect("a port in the PodMonitor");
    assert!(
        readme.contains(&format!("{{port: {port}, path: /metrics")),
        "the README's PodMonitor names port {port}"
    );
    assert!(
        !readme.contains("--unix-socket /tmp/sluice"),
        "the quick start's socket path ignores TMPDIR"
    );
    assert!(
        !readme.contains("is proposed"),
        "an endpoint README calls proposed exists"
    );
}

//! The real binary: `sluice config check`, configuration errors of `sluice serve`, `sluice check`
//! against a running daemon, and a whole `sluice serve` process stopped by SIGTERM.

use std::path::Path;
use std::process::{Command, Stdio};

use axum::http::Method;
use serde_json::json;
use sluice::client::{self, Target};

use crate::helpers::{
    json_of, repo_root, run, run_async, sluice_command, spawn_app, ChildGuard, STOP_TIMEOUT,
};

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_str().expect("UTF-8 path").to_owned()
}

#[test]
fn config_check_accepts_the_shipped_files() {
    let root = repo_root();
    let out = run(sluice_command(
        &root,
        &["config", "check", "config/policies.yaml"],
    ));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("ok, 2 policies: public_api, login"),
        "{out:?}"
    );
    // A settings file is checked together with the policy file it names.
    let out = run(sluice_command(
        &root,
        &["config", "check", "config/sluice.toml"],
    ));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("config/policies.yaml: ok"), "{out:?}");
}

#[test]
fn config_check_names_file_policy_and_field_of_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        dir.path(),
        "bad.yaml",
        "policies:\n  - {name: broken, key: [ip], algorithm: sliding_log, limit: 0, period: 1m}\n  - {name: also_bad, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, burst: 3}\n",
    );
    let out = run(sluice_command(dir.path(), &["config", "check", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("{file}:2: policy `broken`: field `limit`")),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains(&format!("{file}:3: policy `also_bad`: field `burst`")),
        "{out:?}"
    );

    let file = write(dir.path(), "syntax.yaml", "policies: [\n");
    let out = run(sluice_command(dir.path(), &["config", "check", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains(&file), "{out:?}");

    let missing = dir.path().join("missing.yaml");
    let out = run(sluice_command(
        dir.path(),
        &["config", "check", missing.to_str().unwrap()],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("missing.yaml"), "{out:?}");
}

#[test]
fn config_check_validates_windows_and_warns_about_low_local_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(
        dir.path(),
        "windows.yaml",
        "policies:\n  - name: api\n    key: [k]\n    algorithm: fixed_window\n    limits:\n      - {limit: 10, period: 1s}\n      - {limit: 99, period: 1000ms}\n    local_limit: {limit: 0, period: 1s}\n",
    );
    let out = run(sluice_command(dir.path(), &["config", "check", &bad]));
    assert_eq!(out.code, Some(64), "{out:?}");
    for expected in [
        format!("{bad}:7: policy `api`: field `limits`: windows 0 and 1 both have period 1s"),
        format!("{bad}:8: policy `api`: field `local_limit`: limit: must be 1"),
    ] {
        assert!(out.stderr.contains(&expected), "{expected}\nin {out:?}");
    }

    // Valid, but 3 pods x 2 per second cannot fill 10 per second: a warning, exit 0.
    let policies = write(
        dir.path(),
        "low.yaml",
        "policies:\n  - {name: api, key: [k], algorithm: fixed_window, limits: [{limit: 10, period: 1s}, {limit: 99, period: 1h}], local_limit: {limit: 2, period: 1s}}\n",
    );
    let settings = write(
        dir.path(),
        "sluice.toml",
        &format!("policies = {policies:?}\n[local]\nreplicas = 3\n"),
    );
    let out = run(sluice_command(dir.path(), &["config", "check", &settings]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("ok, 1 policies: api"), "{out:?}");
    assert!(
        out.stderr
            .contains("warning: policy `api`: field `local_limit`: 2 per 1s on each of 3 pods"),
        "{out:?}"
    );
    // 3 pods and no Redis: each enforces the whole limit alone.
    assert!(
        out.stderr.contains(&format!(
            "{settings}: warning: local.replicas is 3 but no Redis is set"
        )),
        "{out:?}"
    );
    // With a Redis the pods share the limit: no such warning.
    let shared = write(
        dir.path(),
        "shared.toml",
        &format!("policies = {policies:?}\n[local]\nreplicas = 3\n[redis]\nurl = \"redis://127.0.0.1:1\"\n"),
    );
    let out = run(sluice_command(dir.path(), &["config", "check", &shared]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!out.stderr.contains("local.replicas is"), "{out:?}");
}

#[test]
fn config_check_refuses_a_settings_file_with_an_unknown_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = repo_root().join("config/policies.yaml");
    let file = write(
        dir.path(),
        "sluice.toml",
        &format!(
            "policies = {:?}\n[listen]\nhtpp = \"127.0.0.1:7070\"\n",
            policies
        ),
    );
    let out = run(sluice_command(dir.path(), &["config", "check", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("htpp"), "{out:?}");
}

#[test]
fn serve_refuses_bad_settings_with_exit_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = repo_root().join("config/policies.yaml");
    let socket = dir.path().join("s.sock");
    let safe = format!(
        "policies = {policies:?}\n[listen]\nadmin = \"127.0.0.1:0\"\nsocket = {socket:?}\n"
    );

    // A listen address that is not one.
    let file = write(
        dir.path(),
        "bad.toml",
        &safe.replace("[listen]\n", "[listen]\nhttp = \"nowhere\"\n"),
    );
    let out = run(sluice_command(dir.path(), &["serve", "--config", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("listen.http"), "{out:?}");

    // A settings file that does not exist.
    let missing = dir.path().join("nope.toml");
    let out = run(sluice_command(
        dir.path(),
        &["serve", "--config", missing.to_str().unwrap()],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("nope.toml"), "{out:?}");

    // A policy file that is invalid.
    let bad_policies = write(
        dir.path(),
        "p.yaml",
        "policies:\n  - {name: x, key: [], algorithm: fixed_window, limit: 1, period: 1m}\n",
    );
    let file = write(
        dir.path(),
        "p.toml",
        &format!(
            "{}http = \"127.0.0.1:0\"\n",
            safe.replace(&format!("{policies:?}"), &format!("{bad_policies:?}"))
        ),
    );
    let out = run(sluice_command(dir.path(), &["serve", "--config", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("policy `x`: field `key`"), "{out:?}");
    assert!(!socket.exists(), "nothing was bound");
}

/// Settings that are safe to start with (port 0, socket in `dir`): if an override under test is
/// ignored, the daemon starts harmlessly and the test fails on its time limit instead.
fn safe_settings(dir: &Path) -> String {
    let policies = repo_root().join("config/policies.yaml");
    let socket = dir.join("s.sock");
    format!(
        "policies = {policies:?}\n[listen]\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nsocket = {socket:?}\n"
    )
}

#[test]
fn serve_refuses_bad_settings_from_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(dir.path(), "ok.toml", &safe_settings(dir.path()));
    let mut command = sluice_command(dir.path(), &["serve", "--config", &file]);
    command.env("SLUICE_LISTEN__HTTP", "nonsense");
    let out = run(command);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("listen.http"), "{out:?}");

    // Without --config: the default file (config/sluice.toml in the working directory), then
    // the environment.
    std::fs::create_dir(dir.path().join("config")).expect("mkdir");
    write(
        &dir.path().join("config"),
        "sluice.toml",
        &safe_settings(dir.path()),
    );
    let mut command = sluice_command(dir.path(), &["serve"]);
    command.env("SLUICE_LISTEN__HTTP", "nonsense");
    let out = run(command);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("listen.http"), "{out:?}");

    // Any key, not only listen.*: a policy file named in the environment is the one loaded.
    let bad = write(dir.path(), "bad.yaml", "policies:\n  - {name: from_env, key: [ip], algorithm: fixed_window, limit: 0, period: 1m}\n");
    let mut command = sluice_command(dir.path(), &["serve", "--config", &file]);
    command.env("SLUICE_POLICIES", &bad);
    let out = run(command);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stderr.contains("policy `from_env`: field `limit`"),
        "{out:?}"
    );
}

#[test]
fn serve_config_may_come_from_sluice_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        dir.path(),
        "bad.toml",
        &safe_settings(dir.path()).replace("127.0.0.1:0\"\nadmin", "nowhere\"\nadmin"),
    );
    let mut command = sluice_command(dir.path(), &["serve"]);
    command.env("SLUICE_CONFIG", &file);
    let out = run(command);
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("listen.http"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_command_asks_a_running_daemon() {
    let app = spawn_app().await;
    let socket = app.socket_path();
    let socket = socket.to_str().expect("UTF-8 path");
    let cwd = app.dir.path().to_owned();
    let ask = |extra: &[&str]| {
        let mut args = vec![
            "check",
            "--socket",
            socket,
            "-p",
            "login",
            "-d",
            "ip=1.2.3.4",
        ];
        args.extend_from_slice(extra);
        sluice_command(&cwd, &args)
    };

    let out = run_async(ask(&[])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout
            .starts_with("allowed policy=login limit=10 remaining=9 "),
        "{out:?}"
    );
    let out = run_async(ask(&["--dry-run", "--json"])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let answer: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(answer["remaining"], 8);

    // Spend the rest through the API, then the command says denied and exits 1.
    for _ in 0..9 {
        let body = json!({"policy": "login", "descriptors": {"ip": "1.2.3.4"}});
        assert_eq!(app.check_tcp(&body).await.status, 200);
    }
    let out = run_async(ask(&[])).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stdout.starts_with("denied policy=login"), "{out:?}");

    // Over TCP too.
    let Target::Tcp(addr) = app.tcp else {
        unreachable!()
    };
    let addr = addr.to_string();
    let out = run_async(sluice_command(
        &cwd,
        &[
            "check",
            "--http",
            &addr,
            "-d",
            "path=/login",
            "-d",
            "ip=5.6.7.8",
        ],
    ))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.starts_with("allowed policy=login"), "{out:?}");

    // A request the daemon refuses, and one the command cannot even build.
    let out = run_async(sluice_command(
        &cwd,
        &["check", "--socket", socket, "-p", "nope"],
    ))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stdout.contains("unknown_policy"), "{out:?}");
    let out = run_async(sluice_command(
        &cwd,
        &["check", "--socket", socket, "-d", "ip"],
    ))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
}

#[test]
fn check_command_exits_69_when_the_daemon_is_unreachable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nonexistent.sock");
    let out = run(sluice_command(
        dir.path(),
        &[
            "check",
            "--socket",
            missing.to_str().unwrap(),
            "-p",
            "login",
            "-d",
            "ip=1.2.3.4",
        ],
    ));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("nonexistent.sock"), "{out:?}");
    let out = run(sluice_command(
        dir.path(),
        &["check", "--socket", "/nonexistent"],
    ));
    assert_eq!(out.code, Some(69), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_command_shows_and_resets_a_partition() {
    let app = spawn_app().await;
    let cwd = app.dir.path().to_owned();
    let admin = app.admin.to_string();
    let counters = |args: &[&str]| {
        let mut all = vec!["counters"];
        all.extend_from_slice(args);
        sluice_command(&cwd, &all)
    };
    let get = [
        "get",
        "-p",
        "login",
        "-d",
        "ip=192.0.2.7",
        "--admin",
        &admin,
    ];
    let out = run_async(counters(&get)).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout
            .starts_with("open policy=login key=login:192.0.2.7 remaining=10/10 reset_after_ms=0 "),
        "{out:?}"
    );

    for _ in 0..11 {
        let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.7"}});
        app.check_tcp(&body).await;
    }
    let json_get = [&get[..], &["--json"]].concat();
    let out = run_async(counters(&json_get)).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let answer: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(
        (&answer["remaining"], &answer["allowed"]),
        (&json!(0), &json!(false))
    );
    assert_eq!(answer["retry_after_ms"], 300_000);

    // The admin address from SLUICE_ADMIN_URL, in the http:// spelling.
    let mut reset = counters(&["reset", "-p", "login", "-d", "ip=192.0.2.7"]);
    reset.env("SLUICE_ADMIN_URL", format!("http://{admin}/"));
    let out = run_async(reset).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(
        out.stdout.trim(),
        "reset policy=login key=login:192.0.2.7 existed=true fleet=alone",
        "{out:?}"
    );
    let out = run_async(counters(&get)).await;
    assert!(
        out.stdout
            .starts_with("open policy=login key=login:192.0.2.7 remaining=10/10 "),
        "{out:?}"
    );
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.7"}});
    assert_eq!(app.check_tcp(&body).await.status, 200, "unblocked");
    // Without --admin or SLUICE_ADMIN_URL: listen.admin of the settings file.
    let settings = write(
        &cwd,
        "admin.toml",
        &format!("[listen]\nadmin = \"{admin}\"\n"),
    );
    let out = run_async(counters(&[
        "get",
        "-p",
        "login",
        "-d",
        "ip=192.0.2.7",
        "-c",
        &settings,
    ]))
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("remaining=9/10"), "{out:?}");

    // Refused by the daemon, refused before asking, and nobody listening.
    let out = run_async(counters(&[
        "get", "-p", "nope", "-d", "ip=1", "--admin", &admin,
    ]))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stdout.starts_with("error 400: unknown_policy: "),
        "{out:?}"
    );
    let out = run_async(counters(&[
        "reset", "-p", "login", "-d", "ip", "--admin", &admin,
    ]))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("NAME=VALUE"), "{out:?}");
    let out = run_async(counters(&["reset", "-d", "ip=1", "--admin", &admin])).await;
    assert_eq!(out.code, Some(64), "no policy: {out:?}");
    let out = run_async(counters(&[
        "get",
        "-p",
        "login",
        "-d",
        "ip=1",
        "--admin",
        "ftp://x:1",
    ]))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    let closed = format!("127.0.0.1:{}", free_port());
    let out = run_async(counters(&[
        "get", "-p", "login", "-d", "ip=1", "--admin", &closed,
    ]))
    .await;
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains(&closed), "{out:?}");
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    crate::redis_server::free_port()
}

#[tokio::test]
async fn serve_runs_answers_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = repo_root().join("config/policies.yaml");
    let socket = dir.path().join("run").join("sluice.sock");
    let (http_port, admin_port) = (free_port(), free_port());
    let settings = write(
        dir.path(),
        "sluice.toml",
        &format!(
            "policies = {policies:?}\nshutdown_grace = \"5s\"\nworker_threads = 1\n\
             [listen]\nhttp = \"127.0.0.1:{http_port}\"\nadmin = \"127.0.0.1:{admin_port}\"\n\
             socket = {socket:?}\n[local]\nreplicas = 2\n"
        ),
    );
    let log = std::fs::File::create(dir.path().join("log")).expect("log file");
    let mut command = sluice_command(dir.path(), &["serve", "--config", &settings]);
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log);
    let mut child = ChildGuard(Some(command.spawn().expect("spawn sluice serve")));

    let admin = Target::Tcp(format!("127.0.0.1:{admin_port}").parse().expect("addr"));
    let log = || std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    crate::wait::wait_answering(&admin, "/livez", &mut child, STOP_TIMEOUT, log).await;
    let ready = client::request(&admin, Method::GET, "/readyz", None)
        .await
        .expect("readyz");
    assert_eq!(json_of(&ready)["ready"], true);

    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.99"}}).to_string();
    let uds = Target::Unix(socket.clone());
    let reply = client::request(
        &uds,
        Method::POST,
        "/v1/check",
        Some(body.clone().into_bytes()),
    )
    .await
    .expect("check over the socket");
    assert_eq!(reply.status, 200);
    assert_eq!(json_of(&reply)["remaining"], 9);
    let tcp = Target::Tcp(format!("127.0.0.1:{http_port}").parse().expect("addr"));
    let reply = client::request(&tcp, Method::POST, "/v1/check", Some(body.into_bytes()))
        .await
        .expect("check over TCP");
    assert_eq!(json_of(&reply)["remaining"], 8);

    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(status.success());
    let (child, exit) = tokio::task::spawn_blocking(move || {
        let exit = child.wait_timeout(STOP_TIMEOUT);
        (child, exit)
    })
    .await
    .expect("waiter");
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let exit =
        exit.unwrap_or_else(|| panic!("sluice did not stop within {STOP_TIMEOUT:?}; log:\n{log}"));
    drop(child);
    assert!(exit.success(), "exit {exit:?}; log:\n{log}");
    assert!(!socket.exists(), "socket file removed; log:\n{log}");
    assert!(log.contains("SIGTERM"), "log says why it stopped:\n{log}");
    // Two pods meant to share a limit, no Redis: said at warn, once, at start.
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("local.replicas is 2 but no Redis is set"))
        .collect();
    assert_eq!(warned.len(), 1, "log:\n{log}");
    assert!(warned[0].contains("WARN"), "log:\n{log}");
}

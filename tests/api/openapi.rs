//! The published API (`docs/openapi.json`): served as is on the admin listener, OpenAPI 3.1, and
//! kept true by schemathesis fuzzing a real `sluice serve` (on Redis) on both listeners: every
//! answer matches the document (status codes, content types, schemas, headers), no 5xx, and a
//! refused request spends nothing while a report that names a policy does spend
//! (`tests/openapi/sluice_hooks.py` compares Redis' counter commands, `sluice_decisions_total`
//! and `sluice_reports_total` before and after each one).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{get, repo_root, sluice_command, spawn_app, ChildGuard, Outcome};
use crate::redis_server::{free_port, RedisServer};

/// The document as the repository holds it.
const DOCUMENT: &str = include_str!("../../docs/openapi.json");

/// Pinned in `.ci/run`.
const SCHEMATHESIS: &str = "schemathesis";

/// Longest one schemathesis run may take before it is killed (it is bounded by
/// `--max-examples` and normally takes well under this).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn the_admin_listener_serves_the_document_in_the_repository() {
    let app = spawn_app().await;
    let reply = get(&sluice::client::Target::Tcp(app.admin), "/v1/openapi.json").await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        crate::helpers::header(&reply, "content-type"),
        "application/json"
    );
    assert_eq!(reply.body.as_ref(), DOCUMENT.as_bytes(), "served as is");
    let document: Value = serde_json::from_slice(&reply.body).expect("JSON");
    let version = document["openapi"].as_str().expect("openapi field");
    assert!(version.starts_with("3.1."), "OpenAPI 3.1, got {version}");
    assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
    let paths = document["paths"].as_object().expect("paths");
    for path in [
        "/v1/check",
        "/v1/check/batch",
        "/v1/report",
        "/v1/release",
        "/v1/settle",
        "/v1/authz",
        "/livez",
        "/readyz",
        "/metrics",
        "/v1/policies",
        "/v1/explain",
        "/v1/counters",
        "/v1/top",
        "/v1/openapi.json",
    ] {
        assert!(paths.contains_key(path), "{path} is documented");
    }
}

/// Waits (bounded) until `url` answers 200.
fn wait_ready(admin: &str, log: &Path) {
    crate::wait::until_blocking("sluice starts", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        match std::net::TcpStream::connect(admin).is_ok() && text.contains("sluice ready") {
            true => Ok(()),
            false => Err(text),
        }
    });
}

/// Spends `login` past its limit for one IP by checks (it refuses reports: a 403), at most 11
/// (its limit is 10), so that the admin run's `GET /v1/top` has an entry to match against the
/// document (whatever the check run happened to deny).
fn deny_one_partition(http: &str) {
    let target = sluice::client::Target::Tcp(http.parse().expect("address"));
    let ip = serde_json::json!({"policy": "login", "descriptors": {"ip": "198.51.100.23"}});
    let mut report = ip.clone();
    report["cost"] = 25.into();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let refused = crate::helpers::post(&target, "/v1/report", report.to_string().into()).await;
        assert_eq!(refused.status, 403, "report: {:?}", refused.body);
        let mut statuses = Vec::new();
        for _ in 0..11 {
            let reply = crate::helpers::post(&target, "/v1/check", ip.to_string().into()).await;
            statuses.push(reply.status.as_u16());
            if reply.status == 429 {
                break;
            }
        }
        assert_eq!(statuses.last(), Some(&429), "checks: {statuses:?}");
    });
}

/// One schemathesis run against `base_url` over the operations tagged `tag`.
fn schemathesis(base_url: &str, tag: &str, admin: &str, redis_port: u16, check: bool) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let document = dir.path().join("openapi.json");
    std::fs::write(&document, DOCUMENT).expect("write document");
    let hooks = repo_root().join("tests/openapi");
    let mut command = Command::new(SCHEMATHESIS);
    command
        .current_dir(dir.path())
        .arg("--config-file")
        .arg(hooks.join("schemathesis.toml"))
        .arg("run")
        .arg(&document)
        .args(["--url", base_url, "--include-tag", tag])
        .args(["--max-examples", "10", "--workers", "1", "--seed", "1"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--request-timeout", "10", "--max-failures", "20"])
        .args(["--exclude-checks", "positive_data_acceptance"])
        .env("PYTHONPATH", &hooks)
        .env("SCHEMATHESIS_HOOKS", "sluice_hooks")
        .env("SLUICE_TEST_ADMIN", admin)
        .env("SLUICE_TEST_REDIS_PORT", redis_port.to_string())
        .env("SLUICE_TEST_EXPECT_SPENDING", if check { "1" } else { "0" })
        .env(
            "SLUICE_TEST_EXPECT_TOP_ENTRIES",
            if check { "0" } else { "1" },
        )
        .env("NO_COLOR", "1")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy");
    let out = dir.path().join("out");
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("out file"))
        .stderr(std::fs::File::create(dir.path().join("err")).expect("err file"));
    let mut child = ChildGuard(Some(command.spawn().expect("spawn schemathesis")));
    let status = child
        .wait_timeout(RUN_TIMEOUT)
        .unwrap_or_else(|| panic!("schemathesis ran over {RUN_TIMEOUT:?}"));
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(dir.path().join("err")).unwrap_or_default(),
    }
}

#[test]
fn schemathesis_finds_every_answer_as_documented_and_refusals_spend_nothing() {
    if !crate::tools::required(SCHEMATHESIS) || !crate::tools::required("redis-server") {
        return;
    }
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, crate::helpers::SHIPPED_POLICIES).expect("policies");
    let (http, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let settings = dir.path().join("sluice.toml");
    std::fs::write(
        &settings,
        format!(
            "policies = {policies:?}\n[listen]\nhttp = {http:?}\nadmin = {admin:?}\nsocket = \"\"\n\
             [redis]\nurl = \"redis://127.0.0.1:{}\"\n",
            redis.port
        ),
    )
    .expect("settings");
    let log = dir.path().join("serve.log");
    let log_file = std::fs::File::create(&log).expect("log");
    let mut command = sluice_command(
        dir.path(),
        &["serve", "--config", settings.to_str().expect("utf-8")],
    );
    command
        .stdout(log_file.try_clone().expect("log"))
        .stderr(log_file);
    let _daemon = ChildGuard(Some(command.spawn().expect("spawn sluice serve")));
    wait_ready(&admin, &log);

    for (listener, tag, check) in [(&http, "check", true), (&admin, "admin", false)] {
        if !check {
            deny_one_partition(&http);
        }
        let outcome = schemathesis(
            &format!("http://{listener}"),
            tag,
            &admin,
            redis.port,
            check,
        );
        assert_eq!(
            outcome.code,
            Some(0),
            "schemathesis found answers that differ from docs/openapi.json on the {tag} \
             listener:\n{}\n{}\ndaemon log:\n{}",
            outcome.stdout,
            outcome.stderr,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            outcome.stdout.contains("passed"),
            "no test case ran: {}",
            outcome.stdout
        );
    }
}

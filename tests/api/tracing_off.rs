//! Tracing off: `sluice serve` without `tracing.endpoint` opens no connection to a collector,
//! even with the standard `OTEL_*` variables pointing at listeners; bad `[tracing]` settings are
//! refused by `sluice config check`, naming the key.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::helpers::{run_async, sluice_command, ChildGuard, STOP_TIMEOUT};
use crate::otlp_receiver::BlackHole;
use crate::redis_server::free_port;
use crate::tracing_otlp::{post_traced, public_api_body, traceparent};

/// Tracing off (no `tracing.endpoint`): nothing reaches a collector, not even a connection,
/// with the standard `OTEL_EXPORTER_OTLP_*` variables pointing at listeners and callers sending
/// traceparent.
#[tokio::test]
async fn tracing_off_sends_nothing_even_with_otel_variables_set() {
    let grpc = BlackHole::start().await;
    let http = BlackHole::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, admin) = (free_port(), free_port());
    let settings = dir.path().join("sluice.toml");
    let policies = crate::helpers::repo_root().join("config/policies.yaml");
    std::fs::write(
        &settings,
        format!(
            "policies = {:?}\n[listen]\nhttp = \"127.0.0.1:{port}\"\nadmin = \"127.0.0.1:{admin}\"\nsocket = \"\"\n",
            policies.display().to_string()
        ),
    )
    .expect("settings");
    let mut command = sluice_command(
        dir.path(),
        &["serve", "--config", settings.to_str().expect("utf-8")],
    );
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", grpc.url())
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("{}/v1/traces", http.url()),
        )
        .env("OTEL_TRACES_SAMPLER", "always_on")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = ChildGuard(Some(command.spawn().expect("spawn sluice serve")));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    crate::wait::eventually_within("sluice serve listens", STOP_TIMEOUT, || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    for i in 0..5u64 {
        let parent = traceparent(&format!("{:032x}", 0xdead0 + i), "00f067aa0ba902b7");
        let (status, _) = post_traced(addr, "/v1/check", &public_api_body(), &parent).await;
        assert_eq!(status, 200);
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(term.success());
    let exited = tokio::task::spawn_blocking(move || child.wait_timeout(STOP_TIMEOUT))
        .await
        .expect("waiter");
    assert!(
        exited.is_some_and(|s| s.success()),
        "sluice serve stopped cleanly"
    );
    assert_eq!(
        (grpc.accepted(), http.accepted()),
        (0, 0),
        "nothing exported"
    );
}

/// `sluice config check` refuses bad `[tracing]` settings with exit 64, naming the key.
#[tokio::test]
async fn config_check_names_the_tracing_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = crate::helpers::repo_root().join("config/policies.yaml");
    for (section, key) in [
        ("endpoint = \"https://collector:4317\"", "tracing.endpoint"),
        (
            "endpoint = \"http://c:4317\"\nsampling_ratio = 2.0",
            "tracing.sampling_ratio",
        ),
        ("protocol = \"zipkin\"", "protocol"),
    ] {
        let file = dir.path().join("sluice.toml");
        std::fs::write(
            &file,
            format!(
                "policies = {:?}\n[tracing]\n{section}\n",
                policies.display().to_string()
            ),
        )
        .expect("write");
        let outcome = run_async(sluice_command(
            dir.path(),
            &["config", "check", file.to_str().expect("utf-8")],
        ))
        .await;
        assert_eq!(outcome.code, Some(64), "{section}: {outcome:?}");
        assert!(
            outcome.stderr.contains(key),
            "{section}: {}",
            outcome.stderr
        );
    }
}

//! Every YAML read is bounded before any value is built from it. An alias bomb of 1.8 KB (three
//! levels of 150 aliases: 3.4 million nodes once expanded) took `sluice config check DIR` to
//! 520 MB and a daemon whose policy directory received it about as much, because telling an
//! envoyproxy/ratelimit file from a policy file built the whole document first. Here it is
//! refused with its file and line by `config check` (file and directory) under a 400 MB address
//! space limit, and by a serving daemon's hot reload (file and directory source) whose peak RSS
//! (`VmHWM`) stays under 200 MB. A deeply nested envoyproxy/ratelimit file is refused for its
//! depth, not read as a policy file ("unknown field `domain`"). A policy path pointed at a secret
//! is refused without the secret in the log.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use sluice::client::Target;

use crate::helpers::{get, metric_value, run_async, sluice_command, ChildGuard};
use crate::wait::{until, wait_answering};

const ONE: &str =
    "policies:\n  - {name: one, key: [ip], algorithm: fixed_window, limit: 5, period: 1h}\n";

/// Three levels of 150 aliases: 1.8 KB of text, 3.4 million scalars once expanded.
fn alias_bomb() -> String {
    let list = |item: &str| vec![item; 150].join(",");
    format!(
        "a0: &a0 [{}]\na1: &a1 [{}]\na2: [{}]\n",
        list("lol"),
        list("*a0"),
        list("*a1")
    )
}

/// An envoyproxy/ratelimit file nested `levels` descriptors deep.
fn deep_envoy(levels: usize) -> String {
    let mut text = String::from("domain: edge\n");
    for level in 0..levels {
        let pad = "    ".repeat(level);
        text.push_str(&format!("{pad}descriptors:\n{pad}  - key: k{level}\n"));
    }
    let pad = "    ".repeat(levels);
    text.push_str(&format!(
        "{pad}rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    ));
    text
}

/// Peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

/// `sluice config check PATH` with its address space capped at 400 MB (`ulimit -v`).
async fn config_check_capped(dir: &Path, path: &Path) -> crate::helpers::Outcome {
    let mut command = std::process::Command::new("sh");
    command.current_dir(dir).args([
        "-c",
        "ulimit -v 400000 && exec \"$0\" config check \"$1\"",
        crate::helpers::sluice_bin(),
        path.to_str().expect("utf-8"),
    ]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLUICE_") {
            command.env_remove(&name);
        }
    }
    run_async(command).await
}

#[tokio::test]
async fn config_check_refuses_an_alias_bomb_in_a_file_or_a_directory_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("policies");
    std::fs::create_dir(&source).expect("mkdir");
    std::fs::write(source.join("ok.yaml"), ONE).expect("write");
    let bomb = source.join("bomb.yaml");
    std::fs::write(&bomb, alias_bomb()).expect("write");
    for path in [&source, &bomb] {
        let out = config_check_capped(dir.path(), path).await;
        assert_eq!(out.code, Some(64), "{path:?}: {out:?}");
        assert!(
            out.stderr
                .contains("bomb.yaml:1: anchors and aliases expand"),
            "{path:?}: {}",
            out.stderr
        );
    }
}

#[tokio::test]
async fn a_deeply_nested_envoy_file_is_refused_for_its_depth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deep = dir.path().join("deep.yaml");
    std::fs::write(&deep, deep_envoy(70)).expect("write");
    let out = run_async(sluice_command(
        dir.path(),
        &["config", "check", deep.to_str().expect("utf-8")],
    ))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stderr
            .contains("deep.yaml:65: nested deeper than 64 levels"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("unknown field"), "{}", out.stderr);
    // Nine levels: read as an envoyproxy/ratelimit file, refused by its converter's own bound.
    std::fs::write(&deep, deep_envoy(9)).expect("write");
    let out = run_async(sluice_command(
        dir.path(),
        &["config", "check", deep.to_str().expect("utf-8")],
    ))
    .await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stderr.contains("nested deeper than 8"),
        "{}",
        out.stderr
    );
}

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::redis_server::free_port()))
}

/// `sluice serve` on the policy source `policies` (polled every 20 ms), logging to `log`.
fn serve(dir: &Path, policies: &Path, log: &Path) -> (ChildGuard, Target) {
    let (http, admin) = (free_addr(), free_addr());
    let settings = dir.join("sluice.toml");
    let text = format!(
        "policies = {policies:?}\npolicies_poll = \"20ms\"\n[listen]\nhttp = \"{http}\"\n\
         admin = \"{admin}\"\nsocket = \"\"\n[log]\nlevel = \"warn\"\n",
        policies = policies.display().to_string(),
    );
    std::fs::write(&settings, text).expect("write settings");
    let child = sluice_command(dir, &["serve", "--config", &settings.display().to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn sluice serve");
    (ChildGuard(Some(child)), Target::Tcp(admin))
}

#[tokio::test]
async fn hot_reload_refuses_an_alias_bomb_in_a_directory_or_a_file_in_bounded_memory() {
    for as_dir in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("policies");
        std::fs::create_dir(&source).expect("mkdir");
        let file = source.join("ok.yaml");
        std::fs::write(&file, ONE).expect("write");
        let watched = if as_dir { &source } else { &file };
        let log = dir.path().join("sluice.log");
        let (mut child, admin) = serve(dir.path(), watched, &log);
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_answering(
            &admin,
            "/readyz",
            &mut child,
            Duration::from_secs(20),
            read_log,
        )
        .await;

        // A new key in the directory, or the file replaced by a rename.
        let target = if as_dir {
            source.join("bomb.yaml")
        } else {
            file.clone()
        };
        let next = dir.path().join("next.yaml");
        std::fs::write(&next, alias_bomb()).expect("write");
        std::fs::rename(&next, &target).expect("rename");
        until("the bomb is refused", Duration::from_secs(20), || async {
            let metrics = String::from_utf8_lossy(&get(&admin, "/metrics").await.body).into_owned();
            let invalid = metric_value(
                &metrics,
                "sluice_policy_reloads_total",
                &[("result", "invalid")],
            );
            if invalid >= 1.0 {
                Ok(())
            } else {
                Err(read_log())
            }
        })
        .await;
        let name = target.file_name().and_then(|n| n.to_str()).expect("name");
        let logged = read_log();
        assert!(
            logged.contains(&format!("{name}:1: anchors and aliases expand")),
            "{logged}"
        );
        let policies = get(&admin, "/v1/policies").await;
        assert!(
            String::from_utf8_lossy(&policies.body).contains("\"one\""),
            "the set in force serves"
        );
        let peak = peak_rss_kib(child.id());
        assert!(
            peak < 200 * 1024,
            "peak RSS {peak} KiB (directory: {as_dir})"
        );
    }
}

/// A policy path pointed at the wrong file (a symlinked secret) is refused with the file, line
/// and reason only: the secret's text never reaches the log.
#[tokio::test]
async fn a_symlinked_secret_is_refused_without_its_text_in_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (good, secret) = (dir.path().join("good.yaml"), dir.path().join("token"));
    std::fs::write(&good, ONE).expect("write");
    std::fs::write(&secret, "TOPSECRET-ab12cd34\n").expect("write");
    let link = dir.path().join("policies.yaml");
    std::os::unix::fs::symlink(&good, &link).expect("symlink");
    let log = dir.path().join("sluice.log");
    let (mut child, admin) = serve(dir.path(), &link, &log);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_answering(
        &admin,
        "/readyz",
        &mut child,
        Duration::from_secs(20),
        read_log,
    )
    .await;

    let next = dir.path().join("next-link");
    std::os::unix::fs::symlink(&secret, &next).expect("symlink");
    std::fs::rename(&next, &link).expect("swap the link");
    until("the secret is refused", Duration::from_secs(20), || async {
        let logged = read_log();
        match logged.contains("policy file rejected") {
            true => Ok(()),
            false => Err(logged),
        }
    })
    .await;
    let logged = read_log();
    assert!(!logged.contains("TOPSECRET"), "{logged}");
    assert!(
        logged.contains("policies.yaml:1: invalid type: a string (not shown)"),
        "{logged}"
    );
}

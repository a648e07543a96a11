//! What a broken file, a bad setting or a careless URL must not do to the real binary: leak a
//! password into the log, abort, pass `config check` and then fail `serve`, or lock the daemon.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::helpers::{repo_root, run, sluice_command, ChildGuard, STOP_TIMEOUT};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.display().to_string()
}

/// Settings that bind nothing outside `dir` and loopback port 0.
fn base(dir: &Path) -> String {
    let policies = repo_root().join("config/policies.yaml");
    let socket = dir.join("s.sock");
    format!(
        "policies = {policies:?}\nworker_threads = 1\n[listen]\nhttp = \"127.0.0.1:0\"\n\
         admin = \"127.0.0.1:0\"\nsocket = {socket:?}\n"
    )
}

/// A password in a Unix-socket Redis URL is masked at start and at every failed reconnect.
#[test]
fn redis_passwords_in_query_fields_never_reach_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-redis.sock");
    let settings = format!(
        "{}[redis]\nurl = \"redis+unix://{}?db=0&pass=s3cret-pw\"\n",
        base(dir.path()),
        missing.display()
    );
    let file = write(dir.path(), "s.toml", &settings);
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut command = sluice_command(dir.path(), &["serve", "--config", &file]);
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log);
    let mut child = ChildGuard(Some(command.spawn().expect("spawn")));
    let deadline = Instant::now() + STOP_TIMEOUT;
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        // The start line and at least one failed reconnection.
        if text.contains("using the Redis store") && text.contains("Redis unreachable") {
            break text;
        }
        assert!(Instant::now() < deadline, "no Redis log lines:\n{text}");
        assert!(
            child.wait_timeout(Duration::from_millis(50)).is_none(),
            "exited:\n{text}"
        );
    };
    assert!(!text.contains("s3cret-pw"), "password in the log:\n{text}");
    assert!(text.contains("pass=***"), "{text}");
}

/// `config check` and `serve` run the same validation: what one refuses, so does the other.
#[test]
fn config_check_refuses_what_serve_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, extra, named) in [
        (
            "http-url",
            "[redis]\nurl = \"http://127.0.0.1:6379\"\n",
            "redis",
        ),
        (
            "tls-client-cert-alone",
            "[redis]\nurl = \"rediss://127.0.0.1:6379\"\ntls = { cert_file = \"/nonexistent.pem\" }\n",
            "redis",
        ),
        ("level", "[log]\nlevel = \"verbose\"\n", "log.level"),
        ("threads", "", "worker_threads"),
        (
            "authz",
            "[authz]\ndescriptors = [\"path\"]\n",
            "authz.descriptors",
        ),
    ] {
        let mut settings = format!("{}{extra}", base(dir.path()));
        if name == "threads" {
            settings = settings.replace("worker_threads = 1", "worker_threads = 100000");
        }
        let file = write(dir.path(), &format!("{name}.toml"), &settings);
        for args in [
            &["config", "check", &file][..],
            &["serve", "--config", &file][..],
        ] {
            let out = run(sluice_command(dir.path(), args));
            assert_eq!(out.code, Some(64), "{name} {args:?}: {out:?}");
            assert!(out.stderr.contains(named), "{name} {args:?}: {out:?}");
            assert!(!out.stderr.contains("panicked"), "{name}: {out:?}");
        }
    }
}

/// A policy file that is a device (or too big) stops the start with exit 64 and a reason,
/// instead of reading forever.
#[test]
fn a_policy_file_that_never_ends_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let zero = dir.path().join("policies.yaml");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    let settings = base(dir.path()).replace(
        &format!("{:?}", repo_root().join("config/policies.yaml")),
        &format!("{zero:?}"),
    );
    let file = write(dir.path(), "s.toml", &settings);
    let started = Instant::now();
    let out = run(sluice_command(dir.path(), &["serve", "--config", &file]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("not a regular file"), "{out:?}");
    assert!(started.elapsed() < STOP_TIMEOUT);
    let out = run(sluice_command(
        dir.path(),
        &["config", "check", &zero.display().to_string()],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
}

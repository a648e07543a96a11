//! What an operator reads: settings errors in sluice's words (the key, its variable, the form it
//! takes), the ready line (version, settings file, policy file, store with the password masked,
//! no Rust debug output), and `sluice counters get`'s warning for a tiered policy asked without
//! its tier descriptor. All through the real binary.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{run, run_async, sluice_command, spawn_app, ChildGuard, Outcome};
use crate::redis_server::free_port;

/// Longest wait for the ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_str().expect("utf-8 path").to_owned()
}

/// `sluice config check FILE` and `sluice serve --config FILE`, each with `env`.
fn both_commands(dir: &Path, file: &str, env: &[(&str, &str)]) -> [Outcome; 2] {
    [
        vec!["config", "check", file],
        vec!["serve", "--config", file],
    ]
    .map(|args| {
        let mut command = sluice_command(dir, &args);
        command.envs(env.iter().copied());
        run(command)
    })
}

fn assert_refused_with(outcome: &Outcome, wanted: &[&str]) {
    assert_eq!(outcome.code, Some(64), "exit 64: {outcome:?}");
    for text in wanted {
        assert!(
            outcome.stderr.contains(text),
            "missing {text:?}: {}",
            outcome.stderr
        );
    }
    for library_words in ["default.", "expected a string", "usize"] {
        assert!(
            !outcome.stderr.contains(library_words),
            "figment's words {library_words:?} leak: {}",
            outcome.stderr
        );
    }
}

#[test]
fn a_bad_setting_names_sluice_key_its_variable_and_the_expected_form() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = write(dir.path(), "policies.yaml", "policies: []\n");
    let base = format!("policies = {policies:?}\n");
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "listen.toml",
            "[listen]\nhttp = 5\n",
            &[
                "listen.http",
                "SLUICE_LISTEN__HTTP",
                "an address such as \"127.0.0.1:7070\"",
            ],
        ),
        (
            "duration.toml",
            "shutdown_grace = 30\n",
            &[
                "shutdown_grace",
                "SLUICE_SHUTDOWN_GRACE",
                "a duration such as 250ms or 1m",
            ],
        ),
        (
            "number.toml",
            "[redis]\nmax_batch = \"lots\"\n",
            &[
                "redis.max_batch",
                "SLUICE_REDIS__MAX_BATCH",
                "a whole number",
            ],
        ),
        (
            "typo.toml",
            "[listen]\nhtpp = \"127.0.0.1:7070\"\n",
            &["listen.htpp", "unknown key `htpp`", "listen takes `http`"],
        ),
    ];
    for (name, text, wanted) in cases {
        let file = write(dir.path(), name, &format!("{base}{text}"));
        for outcome in both_commands(dir.path(), &file, &[]) {
            assert_refused_with(&outcome, wanted);
            assert!(
                outcome.stderr.contains(name),
                "names the file: {}",
                outcome.stderr
            );
        }
    }
    // From the environment, the message names the variable as its source.
    let file = write(dir.path(), "good.toml", &base);
    for outcome in both_commands(dir.path(), &file, &[("SLUICE_LISTEN__HTTP", "7070")]) {
        assert_refused_with(
            &outcome,
            &["listen.http, from SLUICE_LISTEN__HTTP", "an address"],
        );
    }
    for outcome in both_commands(dir.path(), &file, &[("SLUICE_POLICIES_POLL", "soon")]) {
        assert_refused_with(
            &outcome,
            &["policies_poll, from SLUICE_POLICIES_POLL", "\"soon\""],
        );
    }
}

/// Runs `sluice serve` with `settings` until its log has the ready line; the whole log.
fn ready_log(dir: &Path, settings: &str, env: &[(&str, &str)]) -> String {
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = sluice_command(dir, &["serve", "--config", settings]);
    command
        .envs(env.iter().copied())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
    let _daemon = ChildGuard(Some(command.spawn().expect("spawn sluice serve")));
    crate::wait::until_blocking("the ready line", READY_TIMEOUT, || {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        match text.contains("sluice ready") {
            true => Ok(text),
            false => Err(text),
        }
    })
}

fn settings_file(dir: &Path, policies: &str) -> String {
    let text = format!(
        "policies = {policies:?}\n[listen]\nhttp = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\nsocket = \"\"\n",
        free_port(),
        free_port()
    );
    write(dir, "sluice.toml", &text)
}

fn ready_line(log: &str) -> &str {
    log.lines()
        .find(|line| line.contains("sluice ready"))
        .expect("ready line")
}

#[test]
fn the_ready_line_names_version_files_and_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = write(
        dir.path(),
        "policies.yaml",
        crate::helpers::SHIPPED_POLICIES,
    );
    let settings = settings_file(dir.path(), &policies);
    let log = ready_log(dir.path(), &settings, &[]);
    let line = ready_line(&log);
    for wanted in [
        format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
        format!("settings=\"{settings}\""),
        format!("policies=\"{policies}\""),
        "store=\"embedded\"".to_owned(),
        "policy_count=2".to_owned(),
    ] {
        assert!(line.contains(&wanted), "missing {wanted}: {line}");
    }

    // Redis (not reachable: the line is written all the same), the password masked; a policy
    // directory is named as one. No Rust debug output anywhere in the log.
    let policy_dir = dir.path().join("policies.d");
    std::fs::create_dir(&policy_dir).expect("policy dir");
    write(&policy_dir, "login.yaml", crate::helpers::SHIPPED_POLICIES);
    let policy_dir = policy_dir.to_str().expect("utf-8").to_owned();
    let settings = settings_file(dir.path(), &policy_dir);
    let url = format!("redis://app:hunter2@127.0.0.1:{}", free_port());
    let log = ready_log(
        dir.path(),
        &settings,
        &[("SLUICE_REDIS__URL", url.as_str())],
    );
    let line = ready_line(&log);
    let masked = url.replace("hunter2", "***");
    for wanted in [
        format!("policies=\"{policy_dir} (directory)\""),
        format!("store=\"redis single {masked}\""),
    ] {
        assert!(line.contains(&wanted), "missing {wanted}: {line}");
    }
    assert!(!log.contains("hunter2"), "password in the log: {log}");
    for debug in ["TlsOptions", "Some(", " { "] {
        assert!(!log.contains(debug), "Rust debug output {debug:?}: {log}");
    }
}

#[tokio::test]
async fn counters_get_warns_when_a_tiered_policy_is_asked_without_its_tier() {
    let app = spawn_app().await;
    let admin = app.admin.to_string();
    let get = |extra: &[&str], json: bool| {
        let mut args = vec![
            "counters",
            "get",
            "--admin",
            admin.as_str(),
            "-p",
            "public_api",
        ];
        args.extend(["-d", "tenant=acme", "-d", "api_key=k-1"]);
        args.extend(extra);
        if json {
            args.push("--json");
        }
        sluice_command(Path::new("."), &args)
    };
    let untiered = run_async(get(&[], false)).await;
    assert_eq!(untiered.code, Some(0), "{untiered:?}");
    assert!(
        untiered.stdout.contains("remaining=150/150"),
        "{untiered:?}"
    );
    assert!(
        untiered.stderr.contains("warning") && untiered.stderr.contains("descriptor `tier`"),
        "{untiered:?}"
    );
    let json = run_async(get(&[], true)).await;
    let answer: Value = serde_json::from_str(&json.stdout).expect("JSON answer");
    let warning = answer["tier_warning"].as_str().expect("tier_warning");
    assert!(warning.contains("enterprise"), "{warning}");
    assert!(json.stderr.contains(warning), "{json:?}");

    let tiered = run_async(get(&["-d", "tier=enterprise"], true)).await;
    let answer: Value = serde_json::from_str(&tiered.stdout).expect("JSON answer");
    assert_eq!(answer["tier"], "enterprise");
    assert_eq!(answer["limit"], 1500);
    assert!(answer.get("tier_warning").is_none(), "{answer}");
    assert!(!tiered.stderr.contains("warning"), "{tiered:?}");

    // A policy without tiers has nothing to warn about.
    let login = sluice_command(
        Path::new("."),
        &[
            "counters",
            "get",
            "--admin",
            admin.as_str(),
            "-p",
            "login",
            "-d",
            "ip=192.0.2.1",
        ],
    );
    let login = run_async(login).await;
    assert_eq!(login.code, Some(0), "{login:?}");
    assert!(!login.stderr.contains("warning"), "{login:?}");
}

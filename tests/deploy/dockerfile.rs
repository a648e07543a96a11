//! The Dockerfile, read as data: its build stage's `COPY` lines and its final stage's runtime
//! layout (`COPY`, `ENV`, `USER`, `ENTRYPOINT`, `CMD`, `EXPOSE`). The image test (`image.rs`)
//! builds its offline image from this layout, so the Dockerfile stays the one place that says
//! what the image holds. No registry is reachable here, so `docker build` cannot run; instead
//! the build stage's inputs (exactly its `COPY` sources, less `.dockerignore`) are laid into an
//! empty directory and compiled there, which is what the build stage does first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{repo_root, ChildGuard};

/// One `COPY [--from=STAGE] SRC... DEST` line.
#[derive(Debug, Clone)]
pub struct Copy {
    /// `--from=` stage, if any.
    pub from: Option<String>,
    /// Sources (context paths, or paths in `from`).
    pub sources: Vec<String>,
    /// Destination.
    pub dest: String,
}

/// One stage: from `FROM` to the next.
#[derive(Debug, Default)]
pub struct Stage {
    /// The `FROM` line's image.
    pub base: String,
    /// `COPY` lines in order.
    pub copies: Vec<Copy>,
    /// The runtime instructions (`ENV`, `USER`, `ENTRYPOINT`, `CMD`, `EXPOSE`) as written.
    pub runtime: Vec<String>,
    /// `ENV` pairs.
    pub env: Vec<(String, String)>,
}

/// The Dockerfile's stages, in order.
pub fn stages() -> Vec<Stage> {
    let text = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("read Dockerfile");
    parse(&text)
}

fn parse(text: &str) -> Vec<Stage> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(&format!("{head} ")),
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in joined {
        let (word, rest) = line.split_once(' ').unwrap_or((&line, ""));
        match word {
            "FROM" => stages.push(Stage {
                base: rest.split_whitespace().next().unwrap_or_default().into(),
                ..Stage::default()
            }),
            "COPY" => {
                let mut words: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
                let from = words
                    .first()
                    .and_then(|w| w.strip_prefix("--from="))
                    .map(str::to_owned);
                if from.is_some() {
                    words.remove(0);
                }
                assert!(
                    words.len() >= 2 && !words.iter().any(|w| w.starts_with("--")),
                    "Dockerfile: `COPY {rest}`: keep COPY as `COPY [--from=S] SRC... DEST`"
                );
                let dest = words.pop().unwrap_or_default();
                let stage = stages.last_mut().expect("COPY after FROM");
                stage.copies.push(Copy {
                    from,
                    sources: words,
                    dest,
                });
            }
            "ENV" | "USER" | "ENTRYPOINT" | "CMD" | "EXPOSE" => {
                let stage = stages.last_mut().expect("after FROM");
                if word == "ENV" {
                    let (key, value) = rest
                        .split_once('=')
                        .unwrap_or_else(|| panic!("Dockerfile: `ENV {rest}`: write ENV KEY=value"));
                    stage.env.push((key.into(), value.into()));
                }
                stage.runtime.push(line.clone());
            }
            _ => {}
        }
    }
    stages
}

/// `.dockerignore`'s entries (directories and files, as written, without a trailing `/`).
fn ignored() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join(".dockerignore")).unwrap_or_default();
    text.lines()
        .map(|l| l.trim().trim_end_matches('/').to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Copies `from` (a file or a directory tree) to `to`.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// Lays the build stage's build context into `dir` the way its `COPY` lines do (relative to its
/// `WORKDIR`), leaving out what `.dockerignore` excludes from the context.
fn lay_build_context(stage: &Stage, dir: &Path) {
    let ignored = ignored();
    for copy in &stage.copies {
        assert!(
            copy.from.is_none(),
            "the build stage copies from the context"
        );
        for source in &copy.sources {
            let excluded = ignored
                .iter()
                .any(|i| source == i || source.starts_with(&format!("{i}/")));
            let path = repo_root().join(source);
            if excluded || !path.exists() {
                continue; // docker build would fail or copy nothing: the build below will tell
            }
            let dest = if copy.dest.ends_with('/') || copy.sources.len() > 1 {
                dir.join(copy.dest.trim_start_matches("./")).join(source)
            } else {
                dir.join(copy.dest.trim_start_matches("./"))
            };
            copy_tree(&path, &dest);
        }
    }
}

/// The features the image's binary is built with (the build stage's `cargo build` line).
const IMAGE_FEATURES: [&str; 3] = ["--no-default-features", "--features", "k8s"];

#[test]
fn the_build_stage_copies_everything_the_build_needs() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains(&format!("--bin sluice {}", IMAGE_FEATURES.join(" "))),
        "the Dockerfile's cargo build line names other features than {IMAGE_FEATURES:?}"
    );
    let stages = stages();
    let build = stages.first().expect("a build stage");
    let dir = tempfile::tempdir().expect("tempdir");
    lay_build_context(build, dir.path());
    // The same compilation as the stage's `cargo build`, without code generation, offline (the
    // registry is warm), sharing this run's target dir: the dependencies are checked already
    // (clippy), so only the copied package is compiled. Cargo holds no lock while tests run.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| repo_root().join("target"), PathBuf::from);
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("cargo.log");
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // Not this test's environment: cargo gives it `OUT_DIR` (the generated code a missing
    // `build.rs` would not make) and the package's `CARGO_*` variables.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name == "OUT_DIR" || (name.starts_with("CARGO_") && name != "CARGO_HOME") {
            command.env_remove(&*name);
        }
    }
    let child = command
        .args(["check", "--offline", "--locked", "--bin", "sluice"])
        .args(IMAGE_FEATURES)
        .arg("--quiet")
        .current_dir(dir.path())
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("cargo runs");
    let started = Instant::now();
    let status = ChildGuard(Some(child))
        .wait_timeout(Duration::from_secs(600))
        .expect("cargo check finishes within 10 minutes");
    let errors = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = errors.lines().rev().take(30).collect::<Vec<_>>();
    assert!(
        status.success(),
        "the Dockerfile's build stage would fail: its COPY lines miss something the build reads:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    println!("build stage inputs compile ({:?})", started.elapsed());
}

#[test]
fn the_final_stage_is_non_root_with_the_binary_policies_and_ca_bundle() {
    let stages = stages();
    let last = stages.last().expect("a final stage");
    assert!(last.base.starts_with("gcr.io/distroless/"), "{}", last.base);
    assert!(
        last.runtime.iter().any(|l| l == "USER 65532:65532"),
        "{:?}",
        last.runtime
    );
    let env = |key: &str| {
        last.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        env("SSL_CERT_FILE"),
        Some("/etc/ssl/certs/ca-certificates.crt"),
        "the system CA bundle distroless ships (Redis TLS trust)"
    );
    let policies = env("SLUICE_POLICIES").expect("SLUICE_POLICIES");
    assert!(
        last.copies.iter().any(|c| c.dest == policies),
        "SLUICE_POLICIES names a file the image copies"
    );
    let binary = last
        .copies
        .iter()
        .find(|c| c.from.is_some())
        .expect("the binary from the build stage");
    assert!(
        last.runtime
            .iter()
            .any(|l| *l == format!("ENTRYPOINT [\"{}\"]", binary.dest)),
        "ENTRYPOINT runs {}",
        binary.dest
    );
}

/// Paths the runtime layout uses, for `image.rs`.
pub fn final_stage() -> Stage {
    stages().pop().expect("a final stage")
}

/// Where a context path of a final-stage `COPY` is on this machine.
pub fn context_path(source: &str) -> PathBuf {
    repo_root().join(source)
}

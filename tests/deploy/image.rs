//! The runtime image, built and run offline with podman. No registry is reachable, so the image
//! is assembled from local files with the Dockerfile's final stage as the recipe: its `COPY`
//! lines (the release binary, stripped, for `--from=build`; context files as they are), then
//! what the distroless base provides (the shared libraries `ldd` names, the CA bundle at
//! `SSL_CERT_FILE`, `/etc/passwd` with user 65532, `/tmp`), on `FROM scratch` with the stage's
//! own `ENV`, `USER`, `ENTRYPOINT`, `CMD` and `EXPOSE` lines verbatim. The container then runs as
//! a pod would: read only, as 65532, host network, the socket directory a volume shared with a
//! second container (the application's side: the same image running `sluice check`), and
//! stopped by SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::dockerfile::{context_path, final_stage, Stage};
use crate::helpers::{repo_root, sluice_bin, ChildGuard};
use crate::redis_server::free_port;
use crate::tools;

/// podman's settings for this machine (no ulimits to set, cgroupfs), passed by `CONTAINERS_CONF`.
const CONTAINERS_CONF: &str = "[containers]\ndefault_ulimits = []\n\n[engine]\n\
                               cgroup_manager = \"cgroupfs\"\nruntime = \"runc\"\n";
/// Longest one podman command may take.
const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);
/// The daemon's drain grace in the container; SIGTERM must stop it well within this.
const GRACE_SECS: u64 = 5;

/// podman with this test's settings; every container and image it makes is removed on drop.
struct Podman {
    conf: tempfile::TempDir,
    image: String,
    containers: Vec<String>,
}

impl Podman {
    fn new(tag: &str) -> Self {
        let conf = tempfile::tempdir().expect("tempdir");
        std::fs::write(conf.path().join("containers.conf"), CONTAINERS_CONF).expect("conf");
        Self {
            conf,
            image: format!("localhost/sluice-test:{tag}"),
            containers: Vec::new(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command
            .env("CONTAINERS_CONF", self.conf.path().join("containers.conf"))
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
            .args(args);
        command
    }

    /// Runs podman to completion (bounded), with its output.
    fn run(&self, args: &[&str]) -> Output {
        let out = tempfile::tempdir().expect("tempdir");
        let (stdout, stderr) = (out.path().join("out"), out.path().join("err"));
        let child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("file"))
            .stderr(std::fs::File::create(&stderr).expect("file"))
            .spawn()
            .expect("podman runs");
        let status = ChildGuard(Some(child))
            .wait_timeout(PODMAN_TIMEOUT)
            .unwrap_or_else(|| panic!("podman {args:?} did not finish in {PODMAN_TIMEOUT:?}"));
        Output {
            status,
            stdout: std::fs::read(&stdout).unwrap_or_default(),
            stderr: std::fs::read(&stderr).unwrap_or_default(),
        }
    }

    /// Runs podman and expects success; returns its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "podman {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for name in &self.containers {
            let _ = self.run(&["rm", "--force", "--time", "0", name]);
        }
        let _ = self.run(&["rmi", "--force", &self.image]);
    }
}

/// The binary the image carries: CI's release build (`.ci/run` builds it first); outside CI the
/// test binary's `sluice` when there is no release build.
fn release_binary() -> PathBuf {
    let release = repo_root().join("target/release/sluice");
    if release.is_file() {
        return release;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing; .ci/run builds it before the tests",
        release.display()
    );
    eprintln!("note: no target/release/sluice; the image carries the test build of sluice");
    PathBuf::from(sluice_bin())
}

fn copy_file(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// Lays the final stage's file system into `root`: its `COPY` lines, then the base's files.
fn assemble(stage: &Stage, binary: &Path, root: &Path) {
    let inside = |path: &str| root.join(path.trim_start_matches('/'));
    for copy in &stage.copies {
        let [source] = copy.sources.as_slice() else {
            panic!("one source per final-stage COPY: {copy:?}");
        };
        match copy.from.as_deref() {
            Some("build") => {
                // The Dockerfile builds with symbols stripped and no debug info; CI's release
                // build keeps debug info for profiling, so strip the copy.
                copy_file(binary, &inside(&copy.dest));
                let stripped = Command::new("strip").arg(inside(&copy.dest)).status();
                assert!(stripped.is_ok_and(|s| s.success()), "strip {}", copy.dest);
            }
            Some(other) => panic!("COPY --from={other}: only the build stage is known"),
            None => copy_file(&context_path(source), &inside(&copy.dest)),
        }
    }
    // The base: shared libraries, the CA bundle, the non-root user, /tmp.
    let ldd = Command::new("ldd").arg(binary).output().expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(lib) = line.split_whitespace().find(|w| w.starts_with('/')) {
            copy_file(Path::new(lib), &inside(lib));
        }
    }
    let env = |key: &str| {
        stage
            .env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let bundle = env("SSL_CERT_FILE").expect("the Dockerfile sets SSL_CERT_FILE");
    copy_file(
        Path::new("/etc/ssl/certs/ca-certificates.crt"),
        &inside(&bundle),
    );
    std::fs::write(
        inside("/etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .expect("passwd");
    std::fs::write(inside("/etc/group"), "root:x:0:\nnonroot:x:65532:\n").expect("group");
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(inside("/tmp")).expect("tmp");
    std::fs::set_permissions(inside("/tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod");
}

/// GET `path` on the admin port until it answers 200 (bounded); returns the body.
async fn wait_200(admin: u16, path: &str, podman: &Podman, name: &str) -> String {
    let target = sluice::client::Target::Tcp(([127, 0, 0, 1], admin).into());
    let started = Instant::now();
    loop {
        let reply = sluice::client::request(&target, axum::http::Method::GET, path, None).await;
        if let Ok(reply) = reply {
            if reply.status == 200 {
                return String::from_utf8_lossy(&reply.body).into_owned();
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            let logs = podman.run(&["logs", name]);
            panic!(
                "{path} did not answer 200 within 30 s; container log:\n{}{}",
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_serves_read_only_as_non_root_over_a_shared_socket_and_drains_on_sigterm() {
    let tools = ["podman", "runc", "ldd", "strip"];
    if !tools.iter().all(|tool| tools::required(tool)) {
        return;
    }
    let binary = release_binary();
    let stage = final_stage();
    let tag = format!("{}-{}", std::process::id(), free_port());
    let mut podman = Podman::new(&tag);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("rootfs");
    assemble(&stage, &binary, &root);
    let mut recipe = String::from("FROM scratch\nCOPY rootfs/ /\n");
    for line in &stage.runtime {
        recipe.push_str(line);
        recipe.push('\n');
    }
    std::fs::write(dir.path().join("Containerfile"), &recipe).expect("Containerfile");
    let context = dir.path().display().to_string();
    let file = dir.path().join("Containerfile").display().to_string();
    podman.ok(&[
        "build",
        "--quiet",
        "--tag",
        &podman.image,
        "--file",
        &file,
        &context,
    ]);
    let user = podman.ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}",
        &podman.image,
    ]);
    assert_eq!(user, "65532:65532", "the image's USER");

    // The socket directory: an emptyDir in a pod, a host directory here, writable by 65532.
    let socket_dir = dir.path().join("socket");
    std::fs::create_dir(&socket_dir).expect("mkdir");
    std::os::unix::fs::chown(&socket_dir, Some(65532), Some(65532)).expect("chown");
    let volume = format!("{}:/var/run/sluice", socket_dir.display());
    let (http, admin) = (free_port(), free_port());
    let name = format!("sluice-test-{tag}");
    podman.containers.push(name.clone());
    let env = [
        format!("SLUICE_LISTEN__HTTP=127.0.0.1:{http}"),
        format!("SLUICE_LISTEN__ADMIN=127.0.0.1:{admin}"),
        "SLUICE_LISTEN__SOCKET=/var/run/sluice/sluice.sock".to_owned(),
        format!("SLUICE_SHUTDOWN_GRACE={GRACE_SECS}s"),
    ];
    let mut args: Vec<&str> = vec!["run", "--detach", "--name", &name, "--network=host"];
    args.extend(["--read-only", "--user", "65532:65532", "--volume", &volume]);
    for pair in &env {
        args.extend(["--env", pair]);
    }
    args.push(&podman.image);
    podman.ok(&args);

    assert_eq!(wait_200(admin, "/livez", &podman, &name).await.trim(), "ok");
    let ready = wait_200(admin, "/readyz", &podman, &name).await;
    assert!(ready.contains("\"ready\":true"), "{ready}");
    let pid = podman.ok(&["inspect", "--format", "{{.State.Pid}}", &name]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default();
    assert!(
        uid.split_whitespace().skip(1).all(|id| id == "65532"),
        "the daemon runs as 65532: {uid}"
    );

    // The application's side of the pod: another container with only the socket volume (no
    // network), asking over the socket. The shipped login policy allows 10 per 5 minutes.
    let ask = |cost: &str| {
        podman.run(&[
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--user",
            "65532:65532",
            "--volume",
            &volume,
            &podman.image,
            "check",
            "--socket",
            "/var/run/sluice/sluice.sock",
            "--policy",
            "login",
            "-d",
            "ip=203.0.113.7",
            "--cost",
            cost,
            "--json",
        ])
    };
    let allowed = ask("10");
    let answer = String::from_utf8_lossy(&allowed.stdout).into_owned();
    assert_eq!(allowed.status.code(), Some(0), "{answer}");
    assert!(answer.contains("\"remaining\":0"), "{answer}");
    let denied = ask("1");
    let answer = String::from_utf8_lossy(&denied.stdout).into_owned();
    assert_eq!(denied.status.code(), Some(1), "denied: {answer}");
    assert!(answer.contains("\"allowed\":false"), "{answer}");

    // SIGTERM: the daemon drains and exits 0 within its grace.
    let started = Instant::now();
    podman.ok(&["kill", "--signal", "TERM", &name]);
    let code = podman.ok(&["wait", &name]);
    let stopped_in = started.elapsed();
    assert_eq!(code, "0", "exit code after SIGTERM");
    assert!(
        stopped_in < Duration::from_secs(GRACE_SECS),
        "stopped in {stopped_in:?}, over the {GRACE_SECS} s grace"
    );
    let logs = podman.run(&["logs", &name]);
    let text =
        String::from_utf8_lossy(&logs.stdout).into_owned() + &String::from_utf8_lossy(&logs.stderr);
    assert!(
        text.contains("draining") && text.contains("sluice stopped"),
        "{text}"
    );
    let size = podman.ok(&["image", "inspect", "--format", "{{.Size}}", &podman.image]);
    println!(
        "image {}: {size} bytes (binary {} bytes unstripped); SIGTERM to exit {stopped_in:?}",
        podman.image,
        std::fs::metadata(&binary)
            .map(|m| m.len())
            .unwrap_or_default()
    );
}

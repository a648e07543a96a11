//! The shipped nginx example (`examples/nginx/sluice.conf`) in a real nginx, in front of a stub
//! application, against a real daemon: a hostile client's own headers and path spellings cannot
//! switch the login limit off, spend for someone else or escape it (`/LOGIN`, `/login;x=1`), over
//! TCP and over the Unix socket. nginx runs from a temporary prefix on free loopback ports (never
//! the system service) and is killed on drop; CI installs it (`.ci/run`), and under `CI` a missing
//! nginx fails the test. As root, nginx runs as on a plain VM: the master as root, the workers as
//! `nobody`, which is what needs `listen.socket_group` to reach a `0660` socket.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::{repo_root, spawn_app_in, test_settings, GroupGuard, SHIPPED_POLICIES};
use crate::tools;

/// Longest nginx may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Whether this process runs as root (then nginx's workers run as `nobody`, as on a VM).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// The name of the primary group of user `nobody` (`nogroup` on Debian, `nobody` elsewhere).
fn nobody_group() -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let gid = passwd
        .lines()
        .find_map(|l| l.strip_prefix("nobody:"))
        .and_then(|rest| rest.split(':').nth(2))
        .expect("user nobody")
        .to_owned();
    let groups = std::fs::read_to_string("/etc/group").expect("/etc/group");
    groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&gid.as_str())).then(|| f[0].to_owned())
        })
        .expect("nobody's group")
}

/// Writes `nginx.conf` in `dir`: the example, pointed at sluice on `sluice` (`host:port` or
/// `unix:/path`) and the stub app on `app_port`, listening on `port`; as root, with workers
/// running as `nobody`.
fn write_config(dir: &Path, sluice: &str, app_port: u16, port: u16) {
    let example =
        std::fs::read_to_string(repo_root().join("examples/nginx/sluice.conf")).expect("example");
    let replace = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "the example has {from:?}");
        text.replace(from, to)
    };
    let example = replace(
        example,
        "server unix:/var/run/sluice/sluice.sock;",
        &format!("server {sluice};"),
    );
    let example = replace(
        example,
        "server 127.0.0.1:8000;",
        &format!("server 127.0.0.1:{app_port};"),
    );
    let example = replace(
        example,
        "listen 8080;",
        &format!("listen 127.0.0.1:{port};"),
    );
    std::fs::write(dir.join("sluice.conf"), example).expect("write example");
    let d = dir.display();
    let processes = if is_root() {
        format!("user nobody {};\nworker_processes 1;\n", nobody_group())
    } else {
        "master_process off;\n".to_owned()
    };
    let main = format!(
        "daemon off;\n{processes}pid {d}/nginx.pid;\nerror_log stderr warn;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 server {{ listen 127.0.0.1:{app_port}; location / {{ return 200 \"app\\n\"; }} }}\n\
         \x20 include {d}/sluice.conf;\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).expect("write nginx.conf");
}

/// Sends `POST uri` with `headers` to nginx, written raw (so `//login` and `/./login` reach
/// nginx as spelled), on a new connection; returns the status.
async fn send(port: u16, uri: &str, headers: &[(&str, &str)]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to nginx");
    let mut request =
        format!("POST {uri} HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(START_TIMEOUT, stream.read_to_end(&mut answer))
        .await
        .expect("nginx answers in time")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// A running nginx with the example in front of the daemon at `sluice`; its master and workers
/// killed on drop.
struct Nginx {
    port: u16,
    _dir: tempfile::TempDir,
    _child: GroupGuard,
}

async fn start_nginx(sluice: &str) -> Nginx {
    let nginx_dir = tempfile::tempdir().expect("tempdir");
    // Workers running as `nobody` only need what the master hands them, but keep the prefix
    // readable like an installed one.
    std::fs::set_permissions(nginx_dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let (app_port, port) = (free_port(), free_port());
    write_config(nginx_dir.path(), sluice, app_port, port);
    let stderr = std::fs::File::create(nginx_dir.path().join("stderr")).expect("stderr file");
    let child = GroupGuard::spawn(
        Command::new(tools::which("nginx").expect("nginx"))
            .arg("-p")
            .arg(nginx_dir.path())
            .arg("-c")
            .arg(nginx_dir.path().join("nginx.conf"))
            .args(["-e", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr),
    )
    .expect("spawn nginx");
    let stderr = nginx_dir.path().join("stderr");
    crate::wait::until("nginx starts", START_TIMEOUT, || async {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(std::fs::read_to_string(&stderr).unwrap_or_default()),
        }
    })
    .await;
    Nginx {
        port,
        _dir: nginx_dir,
        _child: child,
    }
}

/// Ten attempts on the login page, each dressed up to escape or abuse the limit: every one must
/// be one login unit for 127.0.0.1 (the first would lock the IP out if the cost counted), and
/// the eleventh is denied.
async fn the_login_limit_holds(port: u16) {
    let attempts: [(&str, &[(&str, &str)]); 10] = [
        ("/login", &[("X-Sluice-Cost", "10")]),
        ("/login", &[("X-Sluice-Dry-Run", "true")]),
        ("/login", &[("X-Sluice-Policy", "public_api")]),
        ("/login", &[("X-Sluice-Descriptor-Path", "/x")]),
        ("/login", &[("X-Sluice-Descriptor-Ip", "198.51.100.1")]),
        ("//login", &[]),
        ("/./Login/", &[]),
        ("/login;x=1", &[]),
        ("/LOGIN", &[]),
        ("/x/../login?next=/", &[]),
    ];
    for (uri, headers) in attempts {
        assert_eq!(send(port, uri, headers).await, 200, "{uri} {headers:?}");
    }
    assert_eq!(
        send(port, "/LOGIN;jsessionid=2", &[]).await,
        429,
        "the eleventh login in 5 minutes"
    );
    assert_eq!(
        send(port, "/login", &[("X-Sluice-Dry-Run", "true")]).await,
        429,
        "a dry-run header does not get past the limit"
    );
    // Other pages are not limited by the login policy.
    assert_eq!(send(port, "/home", &[]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_example_holds_against_a_hostile_client_over_tcp() {
    if !tools::required("nginx") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = test_settings(dir.path());
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let sluice::client::Target::Tcp(sluice_addr) = app.tcp.clone() else {
        unreachable!("tcp target")
    };
    let nginx = start_nginx(&sluice_addr.to_string()).await;
    the_login_limit_holds(nginx.port).await;
    the_tenant_comes_from_the_key_not_the_client(nginx.port, app.admin).await;
}

/// A fail-closed policy whose Redis is down: sluice denies with the example's 403 naming the
/// cause (`X-Sluice-Denied-By: limiter_unavailable`), and the client gets the example's 503, not
/// a 429 "rate_limit" (nor the login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_policy_with_redis_down_is_a_503_through_nginx() {
    if !tools::required("nginx") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    // Nothing listens there: the circuit stays open, `login` (fail closed) answers its mode.
    settings.redis.url = Some(format!("redis://127.0.0.1:{}", free_port()));
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let sluice::client::Target::Tcp(sluice_addr) = app.tcp.clone() else {
        unreachable!("tcp target")
    };
    let nginx = start_nginx(&sluice_addr.to_string()).await;
    assert_eq!(send(nginx.port, "/login", &[]).await, 503);
}

/// The tenant is the API key's (the example's map), whatever `X-Tenant` the client sends: three
/// requests under three invented tenants spend three tokens of acme's one bucket (they were three
/// fresh buckets of 150 each when the example read `$http_x_tenant`).
async fn the_tenant_comes_from_the_key_not_the_client(port: u16, admin: std::net::SocketAddr) {
    for tenant in ["evil-1", "evil-2", "acme"] {
        let headers = [("X-Api-Key", "key-acme-1"), ("X-Tenant", tenant)];
        assert_eq!(send(port, "/api/items", &headers).await, 200, "{tenant}");
    }
    let remaining = |tenant: &str| {
        let path = format!("/v1/counters?policy=public_api&d.tenant={tenant}&d.api_key=key-acme-1");
        let admin = sluice::client::Target::Tcp(admin);
        async move {
            let reply = sluice::client::request(&admin, axum::http::Method::GET, &path, None)
                .await
                .expect("admin answers");
            assert_eq!(reply.status, 200, "{:?}", reply.json());
            reply.json()["remaining"].as_u64()
        }
    };
    assert_eq!(remaining("acme").await, Some(147));
    assert_eq!(
        remaining("evil-1").await,
        Some(150),
        "an invented tenant has no bucket"
    );
}

/// The socket as a VM install has it: a directory others can enter, the socket `0660`. nginx's
/// workers (`nobody`) cannot open it as sluice's own group's (every request a 503), and can once
/// `listen.socket_group` names their group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_example_holds_over_the_unix_socket_with_unprivileged_workers() {
    if !tools::required("nginx") {
        return;
    }
    if !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "under CI this test runs as root, to run nginx's workers as nobody"
        );
        eprintln!("SKIPPED: not root, so nginx's workers cannot run as another user");
        return;
    }
    for group in [None, Some(nobody_group())] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let mut settings = test_settings(dir.path());
        settings.listen.socket_group = group
            .as_deref()
            .map(|g| sluice::config::SocketGroup::resolve(g).expect("group"));
        let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
        let socket = app.socket_path();
        assert_eq!(
            std::fs::metadata(&socket)
                .expect("socket")
                .permissions()
                .mode()
                & 0o777,
            0o660
        );
        let nginx = start_nginx(&format!("unix:{}", socket.display())).await;
        match group {
            None => assert_eq!(
                send(nginx.port, "/login", &[]).await,
                503,
                "workers as nobody cannot open a 0660 socket of root's group"
            ),
            Some(_) => the_login_limit_holds(nginx.port).await,
        }
    }
}

#[test]
fn an_unknown_socket_group_is_a_settings_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, "[listen]\nsocket_group = \"no-such-group-here\"\n").expect("write");
    let out = crate::helpers::run(crate::helpers::sluice_command(
        dir.path(),
        &["config", "check", &file.display().to_string()],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(
        out.stderr
            .contains("listen.socket_group: no group \"no-such-group-here\""),
        "{out:?}"
    );
}

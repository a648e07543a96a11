//! The shipped nginx example (`examples/nginx/sluice.conf`) in a real nginx, in front of a stub
//! application, against a real daemon: a hostile client's own headers and path spellings cannot
//! switch the login limit off, spend for someone else or escape it. nginx runs from a temporary
//! prefix on free loopback ports (never the system service) and is killed on drop; CI installs
//! it (`.ci/run`), and under `CI` a missing nginx fails the test.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{repo_root, spawn_app_in, test_settings, ChildGuard, SHIPPED_POLICIES};
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

/// Writes `nginx.conf` in `dir`: the example, pointed at sluice on `sluice` and the stub app on
/// `app_port`, listening on `port`.
fn write_config(dir: &Path, sluice: std::net::SocketAddr, app_port: u16, port: u16) {
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
    let main = format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log stderr warn;\n\
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_example_holds_against_a_hostile_client() {
    if !tools::required("nginx") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = test_settings(dir.path());
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let sluice::client::Target::Tcp(sluice_addr) = app.tcp.clone() else {
        unreachable!("tcp target")
    };
    let nginx_dir = tempfile::tempdir().expect("tempdir");
    let (app_port, port) = (free_port(), free_port());
    write_config(nginx_dir.path(), sluice_addr, app_port, port);
    let stderr = std::fs::File::create(nginx_dir.path().join("stderr")).expect("stderr file");
    let _nginx = ChildGuard(Some(
        Command::new(tools::which("nginx").expect("nginx"))
            .arg("-p")
            .arg(nginx_dir.path())
            .arg("-c")
            .arg(nginx_dir.path().join("nginx.conf"))
            .args(["-e", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn nginx"),
    ));
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < START_TIMEOUT,
            "nginx did not start: {}",
            std::fs::read_to_string(nginx_dir.path().join("stderr")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Ten attempts on the login page, each dressed up to escape or abuse the limit: every one
    // must be one login unit for 127.0.0.1 (the first would lock the IP out if the cost counted).
    let attempts: [(&str, &[(&str, &str)]); 10] = [
        ("/login", &[("X-Sluice-Cost", "10")]),
        ("/login", &[("X-Sluice-Dry-Run", "true")]),
        ("/login", &[("X-Sluice-Policy", "public_api")]),
        ("/login", &[("X-Sluice-Descriptor-Path", "/x")]),
        ("/login", &[("X-Sluice-Descriptor-Ip", "198.51.100.1")]),
        ("//login", &[]),
        ("/login/", &[]),
        ("/./login", &[]),
        ("/LOGIN", &[]),
        ("/x/../login?next=/", &[]),
    ];
    for (uri, headers) in attempts {
        assert_eq!(send(port, uri, headers).await, 200, "{uri} {headers:?}");
    }
    assert_eq!(
        send(port, "/login", &[]).await,
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

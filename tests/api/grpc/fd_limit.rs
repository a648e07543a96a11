//! The real binary at its file-descriptor limit, flooded by stuck gRPC clients: the accept
//! loops pause on `EMFILE` instead of spinning a core, and once the stuck connections are
//! dropped (handshake timeout) the HTTP check listener answers again.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::Method;
use sluice::client::{self, Target};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::helpers::{repo_root, sluice_bin, ChildGuard};
use crate::redis_server::free_port;

/// CPU time (user + system, in clock ticks of 10 ms) of process `pid` so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15, counted from 1 with pid and comm.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// The real binary with 64 file descriptors and stuck gRPC clients past them: accepting pauses
/// instead of spinning a core, and once the stuck connections are dropped (handshake timeout)
/// the HTTP check listener answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_descriptor_limit_accepting_pauses_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, http) = (free_port(), free_port());
    let settings = format!(
        "policies = {:?}\nworker_threads = 1\n[listen]\nhttp = \"127.0.0.1:{http}\"\n\
         admin = \"127.0.0.1:0\"\nsocket = {:?}\ngrpc = \"127.0.0.1:{grpc}\"\n\
         [envoy]\nhandshake_timeout = \"2s\"\n",
        repo_root().join("config/policies.yaml"),
        dir.path().join("s.sock"),
    );
    let file = dir.path().join("s.toml");
    std::fs::write(&file, settings).expect("settings");
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", "ulimit -n 64 && exec \"$0\" serve --config \"$1\""])
        .arg(sluice_bin())
        .arg(&file)
        .current_dir(dir.path())
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let daemon = ChildGuard(Some(command.spawn().expect("spawn")));
    let check = Target::Tcp(SocketAddr::from(([127, 0, 0, 1], http)));
    let probe = br#"{"policy": "login", "descriptors": {"ip": "198.51.100.9"}, "dry_run": true}"#;
    let answered = |wait: Duration| {
        let check = check.clone();
        async move {
            let asked = client::request(&check, Method::POST, "/v1/check", Some(probe.to_vec()));
            matches!(tokio::time::timeout(wait, asked).await, Ok(Ok(reply)) if reply.status == 200)
        }
    };
    let mut up = false;
    for _ in 0..100 {
        up = answered(Duration::from_millis(500)).await;
        if up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the daemon starts");
    let mut stuck = Vec::new();
    for _ in 0..100 {
        let mut tcp = TcpStream::connect(("127.0.0.1", grpc))
            .await
            .expect("queued");
        tcp.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
        stuck.push(tcp);
    }
    // Past the descriptors: the next accepts fail with EMFILE for as long as these are held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = cpu_ticks(daemon.id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spent = cpu_ticks(daemon.id()) - before;
    eprintln!("at the descriptor limit: {spent} ticks (10 ms) of CPU in 1 s");
    assert!(
        spent < 50,
        "{spent} ticks of CPU in 1 s at the descriptor limit"
    );
    let mut recovered = false;
    for _ in 0..20 {
        recovered = answered(Duration::from_secs(1)).await;
        if recovered {
            break;
        }
    }
    assert!(
        recovered,
        "checks are answered once the stuck connections are dropped"
    );
    drop(stuck);
}

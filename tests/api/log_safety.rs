//! The real `sluice serve` writing its text log to a file: a client value that carries a line
//! break (a refused counter reset naming `login%0A<forged line>`) stays inside its own log line,
//! escaped, and a peer repeating refused resets gets one warn line per quiet period, not one per
//! request.

use std::process::Stdio;
use std::time::{Duration, Instant};

use axum::http::Method;
use sluice::client::{self, Target};

use crate::helpers::{sluice_command, ChildGuard};
use crate::redis_server::free_port;

const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 3, period: 1h, failure_mode: closed}
";

const FORGED: &str = "1999-01-01T00:00:00.000000Z  WARN sluice: counter reset by an operator";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_write_a_log_line_of_its_own_or_flood_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, POLICIES).expect("write policies");
    let admin_port = free_port();
    let settings = dir.path().join("sluice.toml");
    let toml = format!(
        "policies = {:?}\n[listen]\nhttp = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{admin_port}\"\n\
         socket = \"\"\nadmin_resets = \"off\"\n",
        policies.display().to_string(),
        free_port(),
    );
    std::fs::write(&settings, toml).expect("write settings");
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = sluice_command(
        dir.path(),
        &["serve", "--config", settings.to_str().expect("utf-8")],
    );
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log);
    let _child = ChildGuard(Some(command.spawn().expect("spawn sluice serve")));
    let admin = Target::Tcp(format!("127.0.0.1:{admin_port}").parse().expect("addr"));

    let forged = FORGED.replace(' ', "%20");
    let path = format!("/v1/counters?policy=login%0A{forged}%0D%1B%5B2K&d.ip=192.0.2.1");
    let started = Instant::now();
    let mut refused = 0;
    while refused < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "admin never answered"
        );
        match client::request(&admin, Method::DELETE, &path, None).await {
            Ok(reply) => {
                assert_eq!(u16::from(reply.status), 403);
                refused += 1;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let text = std::fs::read_to_string(&log_path).expect("read log");
    let forged_lines = text.lines().filter(|l| l.starts_with("1999-01-01")).count();
    assert_eq!(forged_lines, 0, "a client wrote a line of its own:\n{text}");
    assert!(
        !text.contains('\u{1b}'),
        "a control byte reached the log:\n{text}"
    );
    let refusals: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("counter reset refused"))
        .collect();
    assert_eq!(refusals.len(), 1, "one line per quiet period:\n{text}");
    assert!(
        refusals[0].contains(r"policy=login\n1999-01-01T00:00:00.000000Z"),
        "the value is kept, escaped:\n{text}"
    );
}

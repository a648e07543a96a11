//! The RLQS bucket budget under attack, on the real binary: streams that report buckets whose
//! ids are far over `limits.max_value_bytes` (each refused before anything of it is kept, and
//! never echoed back), and streams that report more valid buckets than their budget (refused
//! past it, per stream, per connection, per daemon). The daemon's resident memory, read from
//! `/proc/<pid>/status`, stays under a bound, another client's `/v1/check` and
//! `ShouldRateLimit` are answered meanwhile, and what the streams held is released when they end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::Method;
use sluice::client::{self, Target};
use sluice::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_service_client::RateLimitQuotaServiceClient,
    rate_limit_quota_usage_reports::BucketQuotaUsage, BucketId, RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::grpc_client::{descriptor, request};
use crate::helpers::{metric_value, sluice_bin, ChildGuard};
use crate::redis_server::free_port;

const POLICIES: &str = "
policies:
  - {name: window, match: {b: window}, key: [b], algorithm: fixed_window, limit: 1000000, period: 1h}
  - {name: user, key: [user], algorithm: fixed_window, limit: 1000000, period: 1h}
";
/// The issue's attack: bytes of each bucket id, buckets per stream, streams per connection.
const ID_BYTES: usize = 60_000;
const BUCKETS: usize = 1_000;
const STREAMS: usize = 4;
/// `envoy.rlqs.max_buckets_per_connection`'s default.
const PER_CONNECTION: usize = 2_000;
/// Resident memory the daemon must stay under, attacked or not: well under the 128 MiB limit
/// `sluice inject` sets (before the fix, the issue's attack alone took it past 500 MiB).
const RSS_BOUND_KIB: u64 = 96 * 1024;
/// Longest the test waits for the daemon to have read every attacking message.
const ATTACK_TIME: Duration = Duration::from_secs(180);

/// The real daemon with its check, admin and gRPC listeners on free loopback ports.
struct Daemon {
    child: ChildGuard,
    http: SocketAddr,
    admin: SocketAddr,
    grpc: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn spawn(extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let [http, admin, grpc] = [free_port(), free_port(), free_port()]
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
        std::fs::write(dir.path().join("p.yaml"), POLICIES).expect("policies");
        let settings = format!(
            "policies = \"p.yaml\"\nworker_threads = 2\n[listen]\nhttp = \"{http}\"\n\
             admin = \"{admin}\"\nsocket = {:?}\ngrpc = \"{grpc}\"\n{extra}",
            dir.path().join("s.sock"),
        );
        std::fs::write(dir.path().join("s.toml"), settings).expect("settings");
        let child = std::process::Command::new(sluice_bin())
            .args(["serve", "--config", "s.toml"])
            .current_dir(dir.path())
            .env_clear()
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        let daemon = Self {
            child: ChildGuard(Some(child)),
            http,
            admin,
            grpc,
            _dir: dir,
        };
        let started = Instant::now();
        while !daemon.check_answered(Duration::from_millis(500)).await {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the daemon starts"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        daemon
    }

    /// Resident memory now, in KiB.
    fn rss_kib(&self) -> u64 {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }

    async fn metrics(&self) -> String {
        let target = Target::Tcp(self.admin);
        let reply = client::request(&target, Method::GET, "/metrics", None)
            .await
            .expect("metrics answered");
        String::from_utf8_lossy(&reply.body).into_owned()
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.metrics().await, name, labels)
    }

    /// Whether a `/v1/check` on the HTTP listener is answered 200 within `wait`.
    async fn check_answered(&self, wait: Duration) -> bool {
        let body = br#"{"descriptors": {"user": "bystander"}}"#.to_vec();
        let target = Target::Tcp(self.http);
        let asked = client::request(&target, Method::POST, "/v1/check", Some(body));
        matches!(tokio::time::timeout(wait, asked).await, Ok(Ok(reply)) if reply.status == 200)
    }

    /// Whether a `ShouldRateLimit` on a connection of its own is answered `OK` within `wait`.
    async fn grpc_answered(&self, wait: Duration) -> bool {
        let asked = async {
            let mut client = RateLimitServiceClient::new(channel(self.grpc).await);
            let question = request("edge", vec![descriptor(&[("user", "bystander")])]);
            client.should_rate_limit(question).await
        };
        matches!(tokio::time::timeout(wait, asked).await, Ok(Ok(answer)) if answer.get_ref().overall_code == 1)
    }

    /// Asserts that another client's `/v1/check` and `ShouldRateLimit` are answered.
    async fn assert_bystanders_answered(&self, when: &str) {
        let wait = Duration::from_secs(10);
        assert!(self.check_answered(wait).await, "/v1/check answered {when}");
        assert!(
            self.grpc_answered(wait).await,
            "ShouldRateLimit answered {when}"
        );
    }

    /// Waits until `refusals{reason}` reaches `at_least`; false if it does not in time.
    async fn wait_refusals(&self, reason: &str, at_least: f64) -> bool {
        let started = Instant::now();
        while started.elapsed() < ATTACK_TIME {
            let seen = self
                .metric("sluice_rlqs_refusals_total", &[("reason", reason)])
                .await;
            if seen >= at_least {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects")
}

/// A report of two buckets: `{b: <index>, pad: <value_bytes bytes>}` and `{pace: <index>}`,
/// one request denied in each. The second, small and matching no policy, is answered on every
/// version of the daemon: the attacker waits for its answer before sending the next report (it
/// keeps to the stream's flow control, as the issue's attacker did).
fn report(index: usize, value_bytes: usize) -> RateLimitQuotaUsageReports {
    let usage = |bucket: &[(&str, String)]| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: bucket
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: 0,
        num_requests_denied: 1,
        last_report: None,
    };
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![
            usage(&[("b", format!("b{index}")), ("pad", "x".repeat(value_bytes))]),
            usage(&[("pace", index.to_string())]),
        ],
    }
}

/// Whether `answer` names the pace bucket of report `index`.
fn paces(answer: &RateLimitQuotaResponse, index: usize) -> bool {
    let pace = index.to_string();
    answer.bucket_action.iter().any(|action| {
        action
            .bucket_id
            .as_ref()
            .is_some_and(|id| id.bucket.get("pace") == Some(&pace))
    })
}

/// `streams` RLQS streams on one connection, each sending `buckets` reports (see [`report`]),
/// one at a time; returns once every report is answered (or a stream ended), the streams left
/// open until the returned handles are aborted.
async fn attack(
    addr: SocketAddr,
    streams: usize,
    buckets: usize,
    value_bytes: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    let channel = channel(addr).await;
    let mut held = Vec::new();
    let mut sent = Vec::new();
    for stream in 0..streams {
        let mut client = RateLimitQuotaServiceClient::new(channel.clone());
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        sent.push(finished);
        held.push(tokio::spawn(async move {
            let (reports, queued) = tokio::sync::mpsc::channel(1);
            let queued = futures_util::stream::unfold(queued, |mut queued| async move {
                queued.recv().await.map(|report| (report, queued))
            });
            let opened = client.stream_rate_limit_quotas(queued);
            let first = stream * buckets;
            let _ = reports.send(report(first, value_bytes)).await;
            let Ok(answers) = opened.await else {
                let _ = done.send(());
                return;
            };
            let mut answers = answers.into_inner();
            for index in first..first + buckets {
                if index > first && reports.send(report(index, value_bytes)).await.is_err() {
                    break;
                }
                let mut paced = false;
                loop {
                    match answers.message().await {
                        Ok(Some(answer)) if paces(&answer, index) => {
                            paced = true;
                            break;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(status) => {
                            eprintln!(
                                "stream {stream} after {} reports: {status:?}",
                                index - first
                            );
                            break;
                        }
                    }
                }
                if !paced {
                    break;
                }
            }
            let _ = done.send(());
            // Kept open, every answer read, until aborted.
            while let Ok(Some(_)) = answers.message().await {}
            drop(reports);
        }));
    }
    for finished in sent {
        let _ = tokio::time::timeout(ATTACK_TIME, finished).await;
    }
    held
}

/// The issue's attack (4 streams on one connection, each 1,000 buckets with a 60,000-byte id),
/// then 4 times it (4 such connections at once): RSS stays under the bound, bystanders are
/// answered throughout, and the ids are neither kept nor echoed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bucket_ids_are_refused_before_they_are_kept() {
    let daemon = Daemon::spawn("").await;
    let at_rest = daemon.rss_kib();
    let mut refused = 0.0;
    for (round, connections) in [1usize, 4].into_iter().enumerate() {
        let mut attackers = Vec::new();
        for _ in 0..connections {
            attackers.extend(attack(daemon.grpc, STREAMS, BUCKETS, ID_BYTES).await);
        }
        daemon.assert_bystanders_answered("during the attack").await;
        refused += (connections * STREAMS * BUCKETS) as f64;
        let read = daemon.wait_refusals("invalid", refused).await;
        let attacked = daemon.rss_kib();
        eprintln!(
            "round {round} ({connections} connections): RSS {at_rest} KiB at rest, {attacked} KiB attacked"
        );
        assert!(
            attacked < RSS_BOUND_KIB,
            "RSS {attacked} KiB under {connections}x the issue's attack (bound {RSS_BOUND_KIB} KiB)"
        );
        assert!(read, "every attacking bucket is read and refused in time");
        // Only the small pace buckets are kept, within the budget of each connection.
        let kept = daemon.metric("sluice_rlqs_buckets", &[]).await;
        assert!(
            kept <= (connections * PER_CONNECTION) as f64,
            "{kept} buckets kept"
        );
        let past = daemon
            .metric(
                "sluice_rlqs_refusals_total",
                &[("reason", "connection_budget")],
            )
            .await;
        assert!(
            past > 0.0,
            "the pace buckets past the connection's budget are refused"
        );
        daemon.assert_bystanders_answered("after the attack").await;
        for attacker in attackers {
            attacker.abort();
        }
    }
    let started = Instant::now();
    while daemon.metric("sluice_rlqs_streams", &[]).await > 0.0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the streams end"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("after the streams ended: RSS {} KiB", daemon.rss_kib());
    assert_eq!(
        daemon.metric("sluice_rlqs_buckets", &[]).await,
        0.0,
        "released with their streams"
    );
}

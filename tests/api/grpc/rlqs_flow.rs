//! An RLQS client that keeps to flow control is held back, never reset: the stream's window is
//! given back as the session takes its reports, so a burst of reports waits in the client
//! instead of piling up in the daemon (where it was reset `ENHANCE_YOUR_CALM` after about 30).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_service_client::RateLimitQuotaServiceClient,
    rate_limit_quota_usage_reports::BucketQuotaUsage, BucketId, RateLimitQuotaUsageReports,
};

use crate::grpc_client::{spawn_grpc, tcp_channel};

const POLICIES: &str = "
policies:
  - {name: window, match: {b: window}, key: [b], algorithm: fixed_window, limit: 1000, period: 1h}
";

/// Reports sent in one burst, each about 4 KiB (one bucket, padded).
const REPORTS: usize = 300;

fn report(n: usize) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [
                    ("b".to_owned(), "window".to_owned()),
                    ("pad".to_owned(), format!("{n:0>200}")),
                ]
                .into(),
            }),
            time_elapsed: None,
            num_requests_allowed: 1,
            num_requests_denied: 0,
            last_report: None,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reports_is_held_back_not_reset() {
    let daemon = spawn_grpc(POLICIES).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    // The stream stays open after the burst, as Envoy's does.
    let reports = futures_util::stream::iter(0..REPORTS)
        .map(move |n| {
            counted.fetch_add(1, Ordering::Relaxed);
            let mut report = report(n);
            // About 4 KiB a message: the burst is far over one stream window.
            for extra in 0..18 {
                report.bucket_quota_usages.push(BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: [("b".to_owned(), format!("other-{extra}-{:0>180}", n))].into(),
                    }),
                    ..report.bucket_quota_usages[0].clone()
                });
            }
            report
        })
        .chain(futures_util::stream::pending());
    let mut client = RateLimitQuotaServiceClient::new(tcp_channel(daemon.addr).await);
    let mut answers = tokio::time::timeout(
        Duration::from_secs(10),
        client.stream_rate_limit_quotas(reports),
    )
    .await
    .expect("the stream opens in time")
    .expect("opened")
    .into_inner();
    // Read answers until every report was taken (the client's stream polled to its end), at
    // most 30 s; a reset shows as an error here.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    while sent.load(Ordering::Relaxed) < REPORTS && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), answers.message()).await {
            Err(_) => {}
            Ok(Ok(Some(_))) => answered += 1,
            Ok(Ok(None)) => panic!("the stream ended after {answered} answers"),
            Ok(Err(status)) => panic!(
                "the stream failed after {} reports sent: {status:?}",
                sent.load(Ordering::Relaxed)
            ),
        }
    }
    // And the stream is still alive: any further answer is not an error.
    if let Ok(next) = tokio::time::timeout(Duration::from_millis(500), answers.message()).await {
        assert!(next.is_ok(), "{next:?}");
    }
    assert_eq!(sent.load(Ordering::Relaxed), REPORTS, "{answered} answers");
}

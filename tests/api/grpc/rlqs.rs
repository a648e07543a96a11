//! The rate limit quota service (RLQS) as a gRPC client sees it, over TCP and the Unix socket:
//! assignments on a long-lived stream, and the stream refused (with a status, not a hang) when
//! its first message names no domain or a message is over `limits.max_body_bytes`, and ended
//! (`OK`) as soon as its connection is asked to go.

use std::time::Duration;

use futures_util::StreamExt;
use sluice::transport::grpc::proto::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy,
};
use sluice::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::bucket_action::BucketAction as Action,
    rate_limit_quota_service_client::RateLimitQuotaServiceClient,
    rate_limit_quota_usage_reports::BucketQuotaUsage, BucketId, RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
};
use tonic::transport::Channel;

use crate::grpc_client::{grpc_settings, spawn_grpc, spawn_grpc_in, tcp_channel, uds_channel};

const POLICIES: &str = "
policies:
  - {name: window, match: {b: window}, key: [b], algorithm: fixed_window, limit: 10, period: 1h}
";
/// Longest a test waits for an answer on the stream.
const ANSWER: Duration = Duration::from_secs(10);

fn report(domain: &str, bucket: &str, padding: usize) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [
                    ("b".to_owned(), bucket.to_owned()),
                    ("pad".to_owned(), "x".repeat(padding.max(1))),
                ]
                .into(),
            }),
            time_elapsed: None,
            num_requests_allowed: 0,
            num_requests_denied: 1,
            last_report: None,
        }],
    }
}

/// Opens a stream on `channel`, sends `first`, and returns the first answer (or status).
async fn first_answer(
    channel: Channel,
    first: RateLimitQuotaUsageReports,
) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
    // The stream stays open after the first message, as Envoy's does.
    let reports = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let mut answers = tokio::time::timeout(ANSWER, client.stream_rate_limit_quotas(reports))
        .await
        .expect("the stream opens in time")?
        .into_inner();
    tokio::time::timeout(ANSWER, answers.message())
        .await
        .expect("an answer in time")
}

fn strategy(answer: &RateLimitQuotaResponse) -> Option<Strategy> {
    match answer.bucket_action.first()?.bucket_action.as_ref()? {
        Action::QuotaAssignmentAction(a) => a.rate_limit_strategy.as_ref()?.strategy,
        Action::AbandonAction(_) => None,
    }
}

#[tokio::test]
async fn a_report_is_answered_on_the_stream_over_tcp_and_the_socket() {
    let daemon = spawn_grpc(POLICIES).await;
    for channel in [
        tcp_channel(daemon.addr).await,
        uds_channel(daemon.socket.clone()).await,
    ] {
        let answer = first_answer(channel.clone(), report("edge", "window", 1))
            .await
            .expect("answered")
            .expect("a message");
        let Some(Strategy::TokenBucket(bucket)) = strategy(&answer) else {
            panic!("a token bucket: {answer:?}");
        };
        assert!((1..=10).contains(&bucket.max_tokens), "{bucket:?}");
        let answer = first_answer(channel, report("edge", "free", 1))
            .await
            .expect("answered")
            .expect("a message");
        assert_eq!(
            strategy(&answer),
            Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32))
        );
    }
}

#[tokio::test]
async fn a_stream_without_a_domain_or_with_an_oversized_message_is_refused() {
    let daemon = spawn_grpc(POLICIES).await;
    let channel = tcp_channel(daemon.addr).await;
    let refused = first_answer(channel.clone(), report("", "window", 1))
        .await
        .expect_err("no domain");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("domain"), "{refused:?}");
    // limits.max_body_bytes is 64 KiB by default.
    let refused = first_answer(channel, report("edge", "window", 70 * 1024))
        .await
        .expect_err("oversized");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
}

/// A connection past `envoy.max_connection_age` gets a GOAWAY, and its RLQS streams end then
/// with `OK` (Envoy opens the next one on its next report), not after the grace period.
#[tokio::test]
async fn a_stream_ends_with_ok_when_its_connection_is_asked_to_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.envoy.max_connection_age = sluice::config::HumanDuration(500_000);
    settings.shutdown_grace = sluice::config::HumanDuration(60_000_000);
    let daemon = spawn_grpc_in(dir, settings, POLICIES).await;
    let reports = futures_util::stream::iter([report("edge", "window", 1)])
        .chain(futures_util::stream::pending());
    let mut client = RateLimitQuotaServiceClient::new(tcp_channel(daemon.addr).await);
    let mut answers = tokio::time::timeout(ANSWER, client.stream_rate_limit_quotas(reports))
        .await
        .expect("the stream opens in time")
        .expect("opened")
        .into_inner();
    let first = tokio::time::timeout(ANSWER, answers.message()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    // Well before the 60 s grace: the stream ends, with OK.
    let ended = tokio::time::timeout(ANSWER, answers.message())
        .await
        .expect("the stream ends with its connection's age, not its grace");
    assert!(matches!(ended, Ok(None)), "{ended:?}");
}

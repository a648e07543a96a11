//! sluice as Envoy's Rate Limit Quota Service: the real Envoy 1.40
//! `envoy.filters.http.rate_limit_quota` filter streaming usage reports to sluice over TCP and
//! the Unix socket, and enforcing the assignments it gets back (the configuration docs/envoy.md
//! gives). Envoys together never admit more than the policy's limit: each assignment is backed
//! by units taken from the store first. Clients run until the limit is reached or a bounded
//! number of rounds has passed, then keep asking for a while: any request admitted past the
//! limit fails the test.

use std::time::Duration;

use serde_json::{json, Value};

use crate::grpc_client::{grpc_settings, spawn_grpc, spawn_grpc_in, spawn_grpc_on, GrpcApp};
use crate::proxy::{self, count, Envoy};
use crate::redis_server::RedisServer;
use crate::rls::Via;
use crate::stores::Backend;
use crate::wait::within_one_window;

const POLICIES: &str = "
policies:
  - {name: window, match: {bucket: window}, key: [bucket], algorithm: fixed_window, limit: 40, period: 1h}
  - {name: bucket, match: {bucket: bucket}, key: [bucket], algorithm: token_bucket, limit: 1, period: 1h, burst: 30}
  - {name: blocked, match: {bucket: blocked}, key: [bucket], deny: true, period: 1m}
  - {name: log, match: {bucket: log}, key: [bucket], algorithm: sliding_log, limit: 10, period: 1h}
  - {name: steady, match: {bucket: steady}, key: [bucket], algorithm: fixed_window, limit: 1000000, period: 1h}
";

/// Rounds of requests a scenario sends at most (each a few requests, then a short pause).
const ROUNDS: usize = 60;
/// Pause between rounds: Envoy reports every second, sluice answers each report.
const PAUSE: Duration = Duration::from_millis(250);
/// Rounds sent after the limit is reached, to catch any admission past it.
const AFTER_ROUNDS: usize = 12;

/// An Envoy whose every request falls in the quota bucket `{bucket: <bucket>}`, limited by the
/// rate limit quota filter talking to `daemon` over `via`.
pub fn rlqs_envoy_config(daemon: &GrpcApp, via: Via, bucket: &str) -> Value {
    let rlqs = json!({
        "name": "sluice_rlqs",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} }
            }
        },
        "load_assignment": {
            "cluster_name": "sluice_rlqs",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": match via {
                Via::Socket => proxy::pipe(&daemon.socket),
                Via::Tcp => proxy::tcp(daemon.addr.port()),
            } } }] }]
        }
    });
    let app = json!({
        "name": "app",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": "app",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": proxy::tcp(9) } }] }]
        }
    });
    let filter = json!({
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "rlqs_server": { "envoy_grpc": { "cluster_name": "sluice_rlqs" } },
            "domain": "edge",
            "bucket_matchers": {
                "on_no_match": {
                    "action": {
                        "name": "rate_limit_quota",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                            "bucket_id_builder": { "bucket_id_builder": {
                                "bucket": { "string_value": bucket }
                            } },
                            "reporting_interval": "1s",
                            "no_assignment_behavior": {
                                "fallback_rate_limit": { "blanket_rule": "DENY_ALL" }
                            }
                        }
                    }
                }
            }
        }
    });
    json!({
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": proxy::tcp(0),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        // A 429 closes the client's connection at once (not a second later).
                        "delayed_close_timeout": "0s",
                        "route_config": { "virtual_hosts": [{
                            "name": "app",
                            "domains": ["*"],
                            "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": "app" } }]
                        }] },
                        "http_filters": [filter, {
                            "name": "envoy.filters.http.router",
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                            }
                        }]
                    }
                }] }]
            }],
            "clusters": [app, rlqs]
        }
    })
}

/// Statuses of every request `envoys` got: `per_round` requests to each per round, until
/// `admitted` have passed (then [`AFTER_ROUNDS`] more rounds) or [`ROUNDS`] have been sent.
async fn drive(envoys: &[Envoy], per_round: usize, admitted: usize) -> Vec<u16> {
    let mut codes = Vec::new();
    let mut after = None;
    for _ in 0..ROUNDS {
        let sends = envoys.iter().flat_map(|envoy| {
            (0..per_round).map(move |_| proxy::request(envoy.port, "GET", "/", &[]))
        });
        let answers = futures_util::future::join_all(sends).await;
        for answer in answers {
            codes.push(answer.map_or(0, |a| a.status));
        }
        if after.is_none() && count(&codes, 200) >= admitted {
            after = Some(0);
        }
        if let Some(rounds) = &mut after {
            *rounds += 1;
            if *rounds > AFTER_ROUNDS {
                break;
            }
        }
        tokio::time::sleep(PAUSE).await;
    }
    codes
}

async fn envoys(daemons: &[&GrpcApp], n: usize, bucket: &str) -> Option<Vec<Envoy>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let daemon = daemons[i % daemons.len()];
        let via = if i % 2 == 0 { Via::Tcp } else { Via::Socket };
        out.push(Envoy::start(rlqs_envoy_config(daemon, via, bucket)).await?);
    }
    Some(out)
}

/// The limit is reached, never passed, and the rest is denied with 429.
fn assert_within(codes: &[u16], limit: usize, logs: impl Fn() -> String) {
    let admitted = count(codes, 200);
    eprintln!("admitted {admitted} of {} (limit {limit})", codes.len());
    assert!(
        admitted <= limit,
        "admitted {admitted} > {limit}: {codes:?}"
    );
    assert!(
        admitted * 4 >= limit * 3,
        "admitted {admitted}, far below {limit}: {codes:?}\n{}",
        logs()
    );
    assert_eq!(admitted + count(codes, 429), codes.len(), "{codes:?}");
}

async fn one_envoy_within_a_limit(via: Via, bucket: &str, limit: usize) {
    let daemon = spawn_grpc(POLICIES).await;
    let Some(envoy) = Envoy::start(rlqs_envoy_config(&daemon, via, bucket)).await else {
        return;
    };
    let envoys = [envoy];
    let codes = drive(&envoys, 4, limit).await;
    assert_within(&codes, limit, || envoys[0].log());
}

#[tokio::test]
async fn a_fixed_window_over_tcp_admits_its_limit_and_no_more() {
    one_envoy_within_a_limit(Via::Tcp, "window", 40).await;
}

#[tokio::test]
async fn a_token_bucket_over_the_socket_admits_its_burst_and_no_more() {
    one_envoy_within_a_limit(Via::Socket, "bucket", 30).await;
}

#[tokio::test]
async fn unlimited_buckets_pass_and_block_lists_and_sliding_logs_are_denied() {
    let daemon = spawn_grpc(POLICIES).await;
    for (bucket, via, passes) in [
        ("free", Via::Tcp, true),
        ("blocked", Via::Socket, false),
        ("log", Via::Tcp, false),
    ] {
        let Some(envoy) = Envoy::start(rlqs_envoy_config(&daemon, via, bucket)).await else {
            return;
        };
        let mut codes = Vec::new();
        // The first request has no assignment yet (deny all); the answer arrives at once.
        for _ in 0..20 {
            codes.extend(proxy::statuses(&envoy, 5, "/", &[]).await);
            if passes && codes.last() == Some(&200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if passes {
            let more = proxy::statuses(&envoy, 50, "/", &[]).await;
            assert_eq!(count(&more, 200), 50, "{bucket}: {more:?}\n{}", envoy.log());
        } else {
            assert_eq!(count(&codes, 429), codes.len(), "{bucket}: {codes:?}");
        }
    }
}

/// Steady demand far below the limit is admitted across Envoy 1.40's reports (every 5 s): a
/// running assignment is renewed with the same bucket before it ends, or replaced by a fresh
/// one (after a `DENY_ALL` that clears it) when its tokens will not last. Measured before:
/// assignments of 2 s followed by the next report left the bucket denying about 3 s in 5.
#[tokio::test]
async fn steady_demand_below_the_limit_keeps_its_assignment_across_reports() {
    const RUN: Duration = Duration::from_secs(18);
    /// The first assignment follows the bucket's first request (one request a second); the
    /// one sized by the demand follows Envoy's first periodic report, 5 s on.
    const SETTLED: Duration = Duration::from_secs(8);
    let daemon = spawn_grpc(POLICIES).await;
    let Some(envoy) = Envoy::start(rlqs_envoy_config(&daemon, Via::Socket, "steady")).await else {
        return;
    };
    let started = std::time::Instant::now();
    let (mut early, mut settled) = (Vec::new(), Vec::new());
    for _ in 0..400 {
        let at = started.elapsed();
        if at >= RUN {
            break;
        }
        let codes = proxy::statuses(&envoy, 2, "/", &[]).await;
        if at >= SETTLED {
            settled.extend(codes);
        } else {
            early.extend(codes);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let denied = count(&settled, 429);
    eprintln!(
        "first {SETTLED:?}: {} of {} admitted; then {} of {} admitted",
        count(&early, 200),
        early.len(),
        count(&settled, 200),
        settled.len()
    );
    assert!(settled.len() >= 40, "too few requests: {settled:?}");
    assert_eq!(count(&settled, 200) + denied, settled.len(), "{settled:?}");
    // Allow a stray denial on a starved machine (a report late past a renewal's headroom);
    // the gap this guards against denied over half.
    assert!(
        denied * 20 <= settled.len(),
        "{denied} of {} denied once settled: {settled:?}\n{}",
        settled.len(),
        envoy.log()
    );
}

#[tokio::test]
async fn six_envoys_on_one_daemon_share_the_limit_without_passing_it() {
    let daemon = spawn_grpc(POLICIES).await;
    let Some(envoys) = envoys(&[&daemon], 6, "window").await else {
        return;
    };
    let codes = drive(&envoys, 3, 40).await;
    assert_within(&codes, 40, || envoys[0].log());
}

#[tokio::test]
async fn six_envoys_on_six_daemons_on_one_redis_share_the_limit_without_passing_it() {
    if proxy::binary().is_none() {
        return;
    }
    // Redis counts in real time: the run stays inside one hour's window.
    within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let mut daemons = Vec::new();
    for _ in 0..6 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = grpc_settings(&dir);
        settings.redis.url = Some(redis.url());
        settings.redis.key_prefix = "rlqs".into();
        let daemon = spawn_grpc_in(dir, settings, POLICIES).await;
        daemon.app.wait_for_store().await;
        daemons.push(daemon);
    }
    let refs: Vec<&GrpcApp> = daemons.iter().collect();
    let Some(envoys) = envoys(&refs, 6, "window").await else {
        return;
    };
    let codes = drive(&envoys, 3, 40).await;
    assert_within(&codes, 40, || envoys[0].log());
}

/// Latency and throughput through Envoy with no limit filter, with RLQS and with
/// `ShouldRateLimit` (same daemon, same machine), printed for docs/envoy.md; measures, asserts
/// nothing about time. `cargo nextest run --test envoy --run-ignored only rlqs::measure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, run by hand"]
async fn measure_rlqs_against_should_rate_limit() {
    const MEASURE: &str = "
policies:
  - {name: wide, match: {bucket: wide}, key: [bucket], algorithm: fixed_window, limit: 1000000000, period: 1h}
  - {name: shared, match: {generic_key: shared}, key: [generic_key], algorithm: fixed_window, limit: 1000000000, period: 1h}
";
    const SEQUENTIAL: usize = 2_000;
    const CONCURRENT: usize = 16;
    const PER_WORKER: usize = 500;
    let daemon = spawn_grpc(MEASURE).await;
    let mut bare = rlqs_envoy_config(&daemon, Via::Tcp, "wide");
    proxy::http_filters(&mut bare).remove(0);
    let rlqs = rlqs_envoy_config(&daemon, Via::Socket, "wide");
    let mut rls = crate::rls::rls_example(&daemon, Via::Socket);
    let host = &mut proxy::manager(&mut rls)["route_config"]["virtual_hosts"][0];
    host["rate_limits"] =
        json!([{ "actions": [{ "generic_key": { "descriptor_value": "shared" } }] }]);
    host["routes"] = json!([{ "match": { "prefix": "/" }, "route": { "cluster": "app" } }]);
    let mut figures = Vec::new();
    for (name, config) in [("none", bare), ("rlqs", rlqs), ("should_rate_limit", rls)] {
        let Some(envoy) = Envoy::start(config).await else {
            return;
        };
        // Warm up until 200 requests in a row pass: RLQS assignments follow the demand Envoy
        // reports, a reporting interval behind.
        for _ in 0..40 {
            let codes = proxy::statuses(&envoy, 200, "/", &[]).await;
            if count(&codes, 200) == codes.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut took = Vec::with_capacity(SEQUENTIAL);
        let mut ok = 0;
        for _ in 0..SEQUENTIAL {
            let started = std::time::Instant::now();
            let status = proxy::request(envoy.port, "GET", "/", &[])
                .await
                .map(|a| a.status);
            took.push(started.elapsed());
            ok += usize::from(status == Some(200));
        }
        took.sort();
        let p50 = took[SEQUENTIAL / 2];
        let started = std::time::Instant::now();
        let port = envoy.port;
        let workers = (0..CONCURRENT).map(|_| {
            tokio::spawn(async move {
                for _ in 0..PER_WORKER {
                    let _ = proxy::request(port, "GET", "/", &[]).await;
                }
            })
        });
        futures_util::future::join_all(workers).await;
        let rps = (CONCURRENT * PER_WORKER) as f64 / started.elapsed().as_secs_f64();
        figures.push(format!(
            "{name}: p50 {p50:?} ({ok}/{SEQUENTIAL} ok), {rps:.0} req/s at {CONCURRENT}"
        ));
    }
    for line in figures {
        eprintln!("{line}");
    }
}

#[tokio::test]
async fn six_envoys_on_three_daemons_on_a_redis_cluster_share_the_limit_without_passing_it() {
    if proxy::binary().is_none() {
        return;
    }
    // Redis counts in real time: the run stays inside one hour's window.
    within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(spawn_grpc_on(Backend::Cluster, POLICIES, "rlqs_cluster").await);
    }
    let refs: Vec<&GrpcApp> = daemons.iter().map(|on| &on.daemon).collect();
    let Some(envoys) = envoys(&refs, 6, "window").await else {
        return;
    };
    let codes = drive(&envoys, 3, 40).await;
    assert_within(&codes, 40, || envoys[0].log());
}

#[tokio::test]
async fn a_refilling_token_bucket_on_redis_admits_no_more_than_burst_and_refill() {
    if proxy::binary().is_none() {
        return;
    }
    // Real time (Redis's clock): 2 a second, a burst of 10.
    const REFILLING: &str = "
policies:
  - {name: refill, match: {bucket: refill}, key: [bucket], algorithm: token_bucket, limit: 120, period: 1m, burst: 10}
";
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = "rlqs_refill".into();
    let daemon = spawn_grpc_in(dir, settings, REFILLING).await;
    daemon.app.wait_for_store().await;
    let Some(envoys) = envoys(&[&daemon, &daemon], 2, "refill").await else {
        return;
    };
    // The bucket may admit its burst plus what refills while the clients run: the wall time
    // of the whole run (from before the first request to after the last) bounds it from above.
    let started = std::time::Instant::now();
    let mut codes = Vec::new();
    for _ in 0..24 {
        let sends = envoys
            .iter()
            .flat_map(|envoy| (0..3).map(move |_| proxy::request(envoy.port, "GET", "/", &[])));
        for answer in futures_util::future::join_all(sends).await {
            codes.push(answer.map_or(0, |a| a.status));
        }
        tokio::time::sleep(PAUSE).await;
    }
    let elapsed = started.elapsed();
    let bound = 10 + (elapsed.as_secs_f64() * 2.0).ceil() as usize;
    let admitted = count(&codes, 200);
    eprintln!(
        "admitted {admitted} of {} in {elapsed:?} (at most {bound})",
        codes.len()
    );
    assert!(
        admitted <= bound,
        "admitted {admitted} > {bound}: {codes:?}"
    );
    // Each Envoy's first assignment is its burst share (2 of 10): a burst under the span of an
    // assignment (6.5 s of a rate of 2) backs no refill (docs/envoy.md).
    assert!(admitted >= 4, "not even two burst shares: {codes:?}");
    assert_eq!(admitted + count(&codes, 429), codes.len(), "{codes:?}");
}

//! envoyproxy/ratelimit's limit override and stats tests replayed: `TestConfigLimitOverride`
//! (a descriptor's `limit` over gRPC, on the embedded store and on Redis), and the lookups of
//! `TestDetailedMetric`, `TestValueToMetric_*` and `TestWildcardStatsBehavior`, and of their
//! README's examples 9 (middle and multiple wildcards) and 10 (`envoy_upstream/stats_cases.yaml`). Those stats tests assert stats keys, which sluice does
//! not have: its metrics are labelled by policy (a bounded set), never by a descriptor value, so
//! `detailed_metric` and `value_to_metric` are accepted and change nothing. What is observable is
//! replayed: the limit each lookup finds, the same policies with or without those fields, and
//! metric labels that stay policy names.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use sluice::config::envoy::convert;
use sluice::config::parse_policies;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tonic::Code;

use crate::envoy_upstream::{daemon, fixture, replay, Case, RawCase, Want};
use crate::grpc_client::{ask, descriptor, request, with_override, GrpcApp, OK, OVER_LIMIT};
use crate::redis_server::RedisServer;

#[derive(Deserialize)]
struct StatsCase {
    test: String,
    config: String,
    lookups: Vec<RawCase>,
}

/// The file without its metrics-only fields.
fn without_metrics_fields(config: &str) -> String {
    config
        .lines()
        .filter(|line| {
            let field = line.trim_start();
            !field.starts_with("detailed_metric:") && !field.starts_with("value_to_metric:")
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Every value of a `policy` label in a metrics text.
fn policy_labels(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let start = line.find("policy=\"")? + "policy=\"".len();
            let len = line[start..].find('"')?;
            Some(line[start..start + len].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn upstream_stats_tests_find_the_same_limits_and_labels_stay_policy_names() {
    let cases: Vec<StatsCase> =
        serde_yaml::from_str(&fixture("stats_cases.yaml")).expect("stats_cases.yaml");
    let (mut replayed, mut stripped_fields) = (0, 0);
    for case in &cases {
        let name = &case.test;
        let stripped = without_metrics_fields(&case.config);
        let fields = case.config.lines().count() - stripped.lines().count();
        stripped_fields += fields;
        let converted = convert(&case.config).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        // The accepted metrics-only fields change nothing that is enforced.
        assert_eq!(
            converted,
            convert(&stripped).expect("converts"),
            "{name} ({fields} fields)"
        );
        let lookups: Vec<Case> = case
            .lookups
            .iter()
            .cloned()
            .map(|(domain, entries, want)| (domain, entries, want.into()))
            .collect();
        let app = daemon(&case.config, None, &lookups).await;
        replayed += replay(&app, &lookups).await;
        let names: BTreeSet<String> = parse_policies(Path::new("t.yaml"), &case.config)
            .expect("valid")
            .iter()
            .map(|p| p.name().to_owned())
            .collect();
        let labels = policy_labels(&app.app.metrics().await);
        assert!(!labels.is_empty(), "{name}: no policy label");
        for label in labels {
            assert!(
                label.is_empty() || names.contains(&label),
                "{name}: label {label:?}"
            );
        }
    }
    assert_eq!((replayed, stripped_fields), (38, 38));
}

/// `(code, requests_per_unit, unit, remaining)` of the first status.
async fn first(app: &GrpcApp, domain: &str, d: RateLimitDescriptor) -> (i32, u32, Unit, u32) {
    let mut client = app.tcp().await;
    let answer = ask(&mut client, request(domain, vec![d])).await;
    let status = &answer.statuses[0];
    match &status.current_limit {
        Some(l) => (
            status.code,
            l.requests_per_unit,
            Unit::try_from(l.unit).expect("a unit"),
            status.limit_remaining,
        ),
        None => (status.code, 0, Unit::Unknown, status.limit_remaining),
    }
}

/// TestConfigLimitOverride on `basic_config.yaml`; returns how many lookups gave upstream's
/// answer.
async fn limit_override(app: &GrpcApp) -> usize {
    const DAY: i32 = 4;
    const HOUR: i32 = 3;
    let entries = |sub: &str| descriptor(&[("key1", "value1"), ("subkey1", sub)]);
    // No matching domain: no limit.
    let unknown = with_override(descriptor(&[("key1", "value1")]), 10, DAY);
    assert_eq!(
        first(app, "foo_domain", unknown).await,
        (OK, 0, Unit::Unknown, 0)
    );
    let asked = with_override(entries("something"), 10, DAY);
    assert_eq!(
        first(app, "test-domain", asked).await,
        (OK, 10, Unit::Day, 9)
    );
    // Another override value: its own limit.
    let asked = with_override(entries("something"), 42, HOUR);
    assert_eq!(
        first(app, "test-domain", asked).await,
        (OK, 42, Unit::Hour, 41)
    );
    // Another value: its own counter.
    let asked = with_override(entries("something_else"), 42, HOUR);
    assert_eq!(
        first(app, "test-domain", asked).await,
        (OK, 42, Unit::Hour, 41)
    );
    // The configured limit is untouched by the overridden requests.
    let own = first(app, "test-domain", entries("something")).await;
    assert_eq!(own, (OK, 5, Unit::Second, 4));
    // Deliberately stricter: upstream's test asks with an entry-less descriptor (unknown domain,
    // no limit); sluice refuses an entry-less descriptor as INVALID_ARGUMENT (Envoy never sends
    // one).
    let mut client = app.tcp().await;
    let empty = with_override(descriptor(&[]), 10, DAY);
    let refused = client
        .should_rate_limit(request("foo_domain", vec![empty]))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    4
}

/// Upstream's `GetLimit` applies a descriptor's override before it looks at the descriptor's
/// entries: any descriptor of a known domain, whatever limit (or none, `unlimited`, a
/// whitelisted value) its entries would select, counted per descriptor.
async fn override_on_any_descriptor(app: &GrpcApp) {
    // A day's window: a test never straddles its end in practice (a minute's could).
    const DAY: i32 = 4;
    let asked = |entries: &[(&str, &str)]| with_override(descriptor(entries), 3, DAY);
    // No limit of the domain selects these entries.
    let none = [("key9", "x")];
    for left in [2, 1, 0] {
        let answer = first(app, "test-domain", asked(&none)).await;
        assert_eq!(answer, (OK, 3, Unit::Day, left), "key9=x, {left} left");
    }
    let over = first(app, "test-domain", asked(&none)).await;
    assert_eq!(over, (OVER_LIMIT, 3, Unit::Day, 0));
    // Another value, and the same entries in another order: counters of their own.
    let other = first(app, "test-domain", asked(&[("key9", "y")])).await;
    assert_eq!(other, (OK, 3, Unit::Day, 2));
    let two = [("key9", "x"), ("key10", "z")];
    let swapped = [("key10", "z"), ("key9", "x")];
    assert_eq!(
        first(app, "test-domain", asked(&two)).await,
        (OK, 3, Unit::Day, 2)
    );
    assert_eq!(
        first(app, "test-domain", asked(&swapped)).await,
        (OK, 3, Unit::Day, 2)
    );
    // Overrides of one unit share a count, whatever their limit (upstream's key has the unit).
    let shared = |per_unit| with_override(descriptor(&[("key11", "x")]), per_unit, DAY);
    assert_eq!(
        first(app, "test-domain", shared(3)).await,
        (OK, 3, Unit::Day, 2)
    );
    assert_eq!(
        first(app, "test-domain", shared(5)).await,
        (OK, 5, Unit::Day, 3)
    );
    assert_eq!(
        first(app, "test-domain", shared(3)).await,
        (OK, 3, Unit::Day, 0)
    );
    // `unlimited` and a whitelisted value: the override applies.
    for entries in [[("key6", "v")], [("key2", "value3")]] {
        let answer = first(app, "test-domain", asked(&entries)).await;
        assert_eq!(answer, (OK, 3, Unit::Day, 2), "{entries:?}");
    }
    // Without the override, those are answered as before: no limit.
    let plain = first(app, "test-domain", descriptor(&[("key9", "x")])).await;
    assert_eq!(plain, (OK, 0, Unit::Unknown, 0));
    let unlimited = first(app, "test-domain", descriptor(&[("key6", "v")])).await;
    assert_eq!(unlimited, (OK, 0, Unit::Unknown, u32::MAX));
}

#[tokio::test]
async fn upstream_limit_override_on_the_embedded_store() {
    let probe = basic_probe();
    let app = daemon(&fixture("basic_config.yaml"), None, &probe).await;
    assert_eq!(limit_override(&app).await, 4);
    override_on_any_descriptor(&app).await;
}

#[tokio::test]
async fn upstream_limit_override_on_redis() {
    let redis = RedisServer::start();
    let app = daemon(
        &fixture("basic_config.yaml"),
        Some((&redis, "override")),
        &basic_probe(),
    )
    .await;
    // Per-second windows (the configured limit read at the end) follow Redis's clock.
    assert_eq!(limit_override(&app).await, 4);
    override_on_any_descriptor(&app).await;
}

/// A limited lookup of `basic_config.yaml` (the Redis readiness probe).
fn basic_probe() -> Vec<Case> {
    let entries = vec![("key3".to_owned(), "probe".to_owned())];
    vec![("test-domain".into(), entries, Want::Limit(1, Unit::Hour, 0))]
}

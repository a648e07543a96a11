//! The Grafana dashboard and the Prometheus alert rules name only metrics the daemon exports.
//! (tests/observability/run.sh proves the expressions themselves against a real Prometheus.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{metric_value, spawn_app_in, spawn_app_with, test_settings, TestApp};
use crate::redis_server::RedisServer;
use crate::wait::until;

const DASHBOARD: &str = include_str!("../../dashboards/sluice.json");
const ALERTS: &str = include_str!("../../deploy/prometheus/alerts.yaml");

/// The shipped policies, plus a shadow policy and a `local` one, so every outcome can occur.
const POLICIES: &str = "
policies:
  - {name: public_api, match: {api_key: '*'}, key: [tenant, api_key], algorithm: token_bucket, limit: 1000, period: 1m, burst: 150, failure_mode: open}
  - {name: login, match: {path: /login}, key: [ip], algorithm: sliding_log, limit: 2, period: 5m, failure_mode: closed}
  - {name: search_shadow, match: {path: /search}, key: [ip], algorithm: fixed_window, limit: 1, period: 1m, failure_mode: open, shadow: true}
  - {name: export_local, match: {path: /export}, key: [tenant], algorithm: fixed_window, limit: 2, period: 1m, failure_mode: local}
  - {name: feed_leased, match: {path: /feed}, key: [tenant], algorithm: fixed_window, limit: 1000, period: 1h, lease: true}
";

/// The test traffic: one request per policy, four times (a fourth login meets the local layer).
fn traffic() -> Vec<Value> {
    let one = [
        json!({"descriptors": {"tenant": "t", "api_key": "k"}}),
        json!({"descriptors": {"path": "/login", "ip": "192.0.2.1"}}),
        json!({"descriptors": {"path": "/search", "ip": "192.0.2.1"}}),
        json!({"descriptors": {"path": "/export", "tenant": "t"}}),
    ];
    (0..4).flat_map(|_| one.clone()).collect()
}

/// Every `sluice_*` / `process_*` name in a PromQL expression.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    for token in expr.split(|c: char| !is_name(c)) {
        if token.starts_with("sluice_") || token.starts_with("process_") {
            into.insert(token.to_owned());
        }
    }
}

/// The metric names of every target and variable query of the dashboard.
fn dashboard_metrics() -> BTreeSet<String> {
    fn walk(value: &Value, names: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "query" | "definition", Value::String(expr)) => {
                            metric_names(expr, names)
                        }
                        _ => walk(value, names),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, names)),
            _ => {}
        }
    }
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    let mut names = BTreeSet::new();
    walk(&dashboard, &mut names);
    names
}

/// The metric names of every alert rule's `expr`.
fn alert_metrics() -> BTreeSet<String> {
    let rules: serde_yaml::Value = serde_yaml::from_str(ALERTS).expect("alert rules are YAML");
    let mut names = BTreeSet::new();
    let groups = rules["groups"].as_sequence().expect("groups");
    for rule in groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
    {
        let expr = rule["expr"].as_str().expect("every rule has an expr");
        metric_names(expr, &mut names);
    }
    names
}

/// Metric families in a Prometheus text exposition, by name, with their type.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.trim().to_owned()))
        .collect()
}

/// Whether `name` is a family or a histogram's/summary's `_bucket`, `_sum` or `_count` series.
fn is_exported(families: &BTreeMap<String, String>, name: &str) -> bool {
    if families.contains_key(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        let Some(base) = name.strip_suffix(suffix) else {
            return false;
        };
        match families.get(base).map(String::as_str) {
            Some("histogram") => true,
            Some("summary") => *suffix != "_bucket",
            _ => false,
        }
    })
}

/// The admin `/metrics` text once `ready` holds for it, polling for at most 10 s.
async fn metrics_when(app: &TestApp, what: &str, ready: impl Fn(&str) -> bool) -> String {
    until(what, Duration::from_secs(10), || async {
        let text = app.metrics().await;
        match ready(&text) {
            true => Ok(text),
            false => Err(text),
        }
    })
    .await
}

#[tokio::test]
async fn dashboard_and_alerts_use_only_exported_metrics() {
    // Three daemons: on the embedded store (allowed, denied, shadow_denied); on a real Redis
    // (pipelines, local-layer hits, a policy file that changes: reloads); and one whose Redis is
    // a port where nothing listens (fail_open, fail_closed, local_*, errors, circuit open).
    let memory = spawn_app_with(POLICIES).await;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(redis.url());
    settings.policies = dir.path().join("policies.yaml");
    let policy_file = settings.policies.clone();
    std::fs::write(&policy_file, POLICIES).expect("policy file");
    let redis_up = crate::helpers::spawn_served(dir, settings).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(format!("redis://127.0.0.1:{}", RedisServer::free_port()));
    let redis_down = spawn_app_in(dir, settings, POLICIES).await;

    metrics_when(&redis_up, "Redis up", |t| t.contains("\nsluice_redis_up 1")).await;
    for app in [&memory, &redis_up, &redis_down] {
        for body in traffic() {
            app.check_tcp(&body).await;
        }
        app.check(&app.uds, &traffic()[0]).await;
    }
    // A policy change, picked up by the daemon's reloader if it has one.
    std::fs::write(&policy_file, format!("{POLICIES}# changed\n")).expect("policy file");
    // The prober's first failed connection attempt (at start) is counted by kind.
    let down_text = metrics_when(&redis_down, "a Redis error counted", |t| {
        t.contains("sluice_redis_errors_total{")
    })
    .await;
    let reloads = "# TYPE sluice_policy_reloads_total";
    let up_text = match tokio::time::timeout(
        Duration::from_secs(5),
        metrics_when(&redis_up, "a reload", |t| t.contains(reloads)),
    )
    .await
    {
        Ok(text) => text,
        Err(_) => redis_up.metrics().await,
    };
    let memory_text = memory.metrics().await;
    for (text, outcomes) in [
        (&memory_text, &["allowed", "denied", "shadow_denied"][..]),
        (&up_text, &["allowed", "denied"][..]),
        (
            &down_text,
            &["fail_open", "fail_closed", "local_allowed", "local_denied"][..],
        ),
    ] {
        for outcome in outcomes {
            assert!(
                metric_value(text, "sluice_decisions_total", &[("outcome", outcome)]) > 0.0,
                "no {outcome} decision:\n{text}"
            );
        }
    }
    assert!(
        metric_value(&up_text, "sluice_redis_batch_size_count", &[]) > 0.0,
        "no Redis pipeline:\n{up_text}"
    );

    let mut exported = families(&memory_text);
    exported.extend(families(&up_text));
    exported.extend(families(&down_text));
    // The injector's own metrics (its certificate alert), from the injector's registry.
    exported.extend(families(
        &sluice_k8s::injector::metrics::InjectorMetrics::new().render(),
    ));
    let referenced: BTreeSet<String> = dashboard_metrics()
        .union(&alert_metrics())
        .cloned()
        .collect();
    assert!(
        referenced.len() >= 15,
        "the dashboard and alerts name only {referenced:?}"
    );
    let missing: Vec<&String> = referenced
        .iter()
        .filter(|name| !is_exported(&exported, name))
        .collect();
    assert!(
        missing.is_empty(),
        "named in dashboards/sluice.json or deploy/prometheus/alerts.yaml but not exported: \
         {missing:?}\nexported: {:?}",
        exported.keys().collect::<Vec<_>>()
    );
}

#[test]
fn metric_names_are_found_in_expressions() {
    let mut names = BTreeSet::new();
    metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(sluice_check_duration_seconds_bucket{job=~\"$job\", outcome=\"fail_open\"}[5m]))) / process_open_fds",
        &mut names,
    );
    let expected: BTreeSet<String> = ["sluice_check_duration_seconds_bucket", "process_open_fds"]
        .map(String::from)
        .into();
    assert_eq!(names, expected);
    let families =
        families("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n# TYPE c counter\n");
    assert!(is_exported(&families, "h_bucket") && is_exported(&families, "h_count"));
    assert!(is_exported(&families, "c") && !is_exported(&families, "c_count"));
    assert!(!is_exported(&families, "nope"));
}

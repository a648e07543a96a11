//! envoyproxy/ratelimit configuration files loaded as they are (their README's examples) and
//! asked through the gRPC rate limit service; `sluice config convert` and `config check`.

use std::path::Path;

use sluice::config::parse_policies;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::grpc_client::{ask, descriptor, request, spawn_grpc, OK, OVER_LIMIT};
use crate::helpers::{repo_root, run, sluice_command, SEC_US};

const README: &str = include_str!("../../envoy/ratelimit-readme.yaml");

/// Asks `n` times; returns how many were OK before the first OVER_LIMIT (or `n`).
async fn admitted(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    n: usize,
) -> usize {
    for i in 0..n {
        let answer = ask(client, request(domain, vec![descriptor(entries)])).await;
        if answer.overall_code == OVER_LIMIT {
            return i;
        }
    }
    n
}

#[tokio::test]
async fn readme_examples_behave_as_documented() {
    let daemon = spawn_grpc(README).await;
    let mut c = daemon.tcp().await;
    // 1: 500 per second per listed database; other values are not limited.
    assert_eq!(
        admitted(&mut c, "mongo_cps", &[("database", "users")], 600).await,
        500
    );
    assert_eq!(
        admitted(&mut c, "mongo_cps", &[("database", "other")], 600).await,
        600
    );
    // The window is fixed and aligned: the next second starts afresh.
    daemon.app.advance(SEC_US);
    assert_eq!(
        admitted(&mut c, "mongo_cps", &[("database", "users")], 10).await,
        10
    );
    // 2: 5 marketing messages a day per number, 100 of any kind.
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(admitted(&mut c, "messaging", &marketing, 10).await, 5);
    assert_eq!(
        admitted(&mut c, "messaging", &[("to_number", "2061111111")], 200).await,
        100
    );
    // 4: a limit applies only to a descriptor of exactly its depth.
    assert_eq!(
        admitted(&mut c, "example4", &[("key", "value")], 400).await,
        400
    );
    let deep = [("key", "value"), ("subkey", "s")];
    assert_eq!(admitted(&mut c, "example4", &deep, 400).await, 300);
    // 5: unlimited and limited keys.
    assert_eq!(
        admitted(&mut c, "internal", &[("ldap", "x")], 200).await,
        200
    );
    assert_eq!(
        admitted(&mut c, "internal", &[("azure", "x")], 200).await,
        100
    );
    // 6: user-a is in shadow mode (never limited), user-b is limited to 20.
    let a = [("service", "auth"), ("user", "user-a")];
    let b = [("service", "auth"), ("user", "user-b")];
    assert_eq!(admitted(&mut c, "example6", &a, 50).await, 50);
    assert_eq!(admitted(&mut c, "example6", &b, 50).await, 20);
    // 8: the most specific match: value1 gets 20, any other value 10 (each its own counter).
    assert_eq!(
        admitted(&mut c, "example8", &[("key1", "value1")], 50).await,
        20
    );
    assert_eq!(
        admitted(&mut c, "example8", &[("key1", "v2")], 50).await,
        10
    );
    assert_eq!(
        admitted(&mut c, "example8", &[("key1", "v3")], 50).await,
        10
    );
    // 9: a wildcard value: each matching value has its own 20 per minute.
    assert_eq!(
        admitted(&mut c, "example9", &[("key1", "value_1")], 50).await,
        20
    );
    assert_eq!(
        admitted(&mut c, "example9", &[("key1", "value_2")], 50).await,
        20
    );
    assert_eq!(
        admitted(&mut c, "example9", &[("key1", "other")], 50).await,
        50
    );
    // An allow-listed address beats the per-address limit of its group.
    assert_eq!(
        admitted(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.1")],
            50
        )
        .await,
        50
    );
    assert_eq!(
        admitted(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.2")],
            50
        )
        .await,
        10
    );
    // Domains do not leak: the same entries in another domain are not limited.
    assert_eq!(
        admitted(&mut c, "elsewhere", &[("azure", "x")], 150).await,
        150
    );
    // Names and units come back as configured.
    let answer = ask(
        &mut c,
        request("internal", vec![descriptor(&[("azure", "y")])]),
    )
    .await;
    assert_eq!(answer.overall_code, OK);
    let limit = answer.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("internal_azure", 100, 2)
    );
}

/// Their README's example 3: `requests_per_unit: 0` blocks a value (OVER_LIMIT, a limit of 0),
/// the key's default limits the others; a blocked descriptor denies its request whole.
#[tokio::test]
async fn readme_example_3_blocks_a_listed_value() {
    let file = "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n";
    let daemon = spawn_grpc(file).await;
    let mut c = daemon.tcp().await;
    let d = "edge_proxy_per_ip";
    for _ in 0..3 {
        let answer = ask(
            &mut c,
            request(d, vec![descriptor(&[("remote_address", "50.0.0.5")])]),
        )
        .await;
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("a limit");
        assert_eq!(
            (
                answer.overall_code,
                status.code,
                limit.requests_per_unit,
                limit.unit,
                status.limit_remaining
            ),
            (OVER_LIMIT, OVER_LIMIT, 0, 1, 0)
        );
    }
    assert_eq!(
        admitted(&mut c, d, &[("remote_address", "10.1.1.1")], 20).await,
        10
    );
    // Next to a blocked one, a passing descriptor is not spent and reports what is left.
    let both = request(
        d,
        vec![
            descriptor(&[("remote_address", "10.2.2.2")]),
            descriptor(&[("remote_address", "50.0.0.5")]),
        ],
    );
    let answer = ask(&mut c, both).await;
    let figures: Vec<(i32, u32)> = answer
        .statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect();
    assert_eq!(
        (answer.overall_code, figures),
        (OVER_LIMIT, vec![(OK, 10), (OVER_LIMIT, 0)])
    );
}

/// `(code, current_limit as (requests_per_unit, unit), limit_remaining)`.
type Status = (i32, Option<(u32, i32)>, u32);

/// Example 3 with the blocked address in `shadow_mode`, as upstream's limiter answers it: OK
/// with a limit of 0 and remaining 0 (counted and logged as a shadow denial), the request's other
/// descriptors spent as usual; a `rate_limit` without `requests_per_unit` (upstream reads 0)
/// blocks; a probe (`hits_addend: 0`) of a blocked value is OK with a limit of 0.
#[tokio::test]
async fn a_blocked_value_in_shadow_mode_or_without_requests_per_unit() {
    let file = "domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: remote_address\n    value: 50.0.0.6\n    rate_limit: {unit: second}\n";
    let daemon = spawn_grpc(file).await;
    let mut c = daemon.tcp().await;
    let figures = |answer: &sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse| {
        let statuses: Vec<Status> = answer
            .statuses
            .iter()
            .map(|s| {
                let limit = s.current_limit.as_ref().map(|l| (l.requests_per_unit, l.unit));
                (s.code, limit, s.limit_remaining)
            })
            .collect();
        (answer.overall_code, statuses)
    };
    let at = |ip: &str| descriptor(&[("remote_address", ip)]);
    for round in 0..3u32 {
        let answer = ask(&mut c, request("d", vec![at("50.0.0.5"), at("10.0.0.1")])).await;
        assert_eq!(
            figures(&answer),
            (
                OK,
                vec![(OK, Some((0, 1)), 0), (OK, Some((10, 1)), 9 - round)]
            ),
            "round {round}"
        );
    }
    let policy = parse_policies(Path::new("t.yaml"), file)
        .expect("valid")
        .iter()
        .map(|p| p.name().to_owned())
        .find(|n| n.starts_with("rls-shadow-blocked-"))
        .expect("the shadow stand-in");
    let shadow_denied = crate::helpers::metric_value(
        &daemon.app.metrics().await,
        "sluice_decisions_total",
        &[("policy", policy.as_str()), ("outcome", "shadow_denied")],
    );
    assert_eq!(shadow_denied, 3.0);
    // No `requests_per_unit`: blocked, and the other descriptor is not spent.
    let answer = ask(&mut c, request("d", vec![at("50.0.0.6"), at("10.0.0.1")])).await;
    assert_eq!(
        figures(&answer),
        (
            OVER_LIMIT,
            vec![(OVER_LIMIT, Some((0, 1)), 0), (OK, Some((10, 1)), 7)]
        )
    );
    let mut probe = at("50.0.0.6");
    probe.hits_addend = Some(0);
    let answer = ask(&mut c, request("d", vec![probe])).await;
    assert_eq!(figures(&answer), (OK, vec![(OK, Some((0, 1)), 0)]));
}

#[test]
fn what_sluice_cannot_express_is_refused_with_a_reason() {
    let cases = [
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit \"fortnight\""),
        ("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "`quota_mode`"),
        ("domain: d\ndescriptors:\n  - key: \"bad key\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "key must be"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n", "unknown field"),
        ("domain: d\ndescriptors: []\n---\ndomain: d\ndescriptors: []\n", "duplicate domain 'd'"),
    ];
    for (yaml, reason) in cases {
        let error = parse_policies(Path::new("rl.yaml"), yaml).expect_err(reason);
        assert!(error.to_string().contains(reason), "{reason}: {error}");
        assert!(error.to_string().starts_with("rl.yaml: "), "{error}");
    }
}

#[test]
fn config_convert_prints_the_policies_that_are_loaded() {
    let file = repo_root().join("tests/envoy/ratelimit-readme.yaml");
    let converted = run(sluice_command(
        &repo_root(),
        &["config", "convert", file.to_str().expect("utf-8")],
    ));
    assert_eq!(converted.code, Some(0), "{}", converted.stderr);
    let from_output =
        parse_policies(Path::new("out.yaml"), &converted.stdout).expect("valid sluice policies");
    let loaded = parse_policies(Path::new("in.yaml"), README).expect("valid");
    let names = |set: &sluice::limit::PolicySet| {
        set.iter().map(|p| p.name().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(names(&from_output), names(&loaded));
    assert!(
        converted.stdout.contains("domain: messaging"),
        "{}",
        converted.stdout
    );

    let checked = run(sluice_command(
        &repo_root(),
        &["config", "check", file.to_str().expect("utf-8")],
    ));
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    assert!(
        checked.stdout.contains("ok, 22 policies"),
        "{}",
        checked.stdout
    );

    let shipped = repo_root().join("config/policies.yaml");
    let refused = run(sluice_command(
        &repo_root(),
        &["config", "convert", shipped.to_str().expect("utf-8")],
    ));
    assert_eq!(refused.code, Some(64));
    assert!(
        refused.stderr.contains("not an envoyproxy/ratelimit file"),
        "{}",
        refused.stderr
    );
}

/// An envoyproxy/ratelimit file given as `policies` is hot reloaded like a policy file: an edit
/// takes effect, a file sluice cannot convert is rejected and the old limits keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn their_file_is_hot_reloaded_and_validated() {
    use std::sync::Arc;
    use std::time::Duration;

    use sluice::app::App;
    use sluice::clock::ManualClock;
    use sluice::config::HumanDuration;

    use crate::grpc_client::grpc_settings;
    use crate::helpers::{metric_value, run_app, START_US};

    let limit = |n: u32| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ratelimit.yaml");
    std::fs::write(&file, limit(1)).expect("write");
    let mut settings = grpc_settings(&dir);
    settings.policies = file.clone();
    settings.policies_poll = HumanDuration(50_000);
    let app = App::build(&settings)
        .await
        .expect("daemon builds from their file");
    let addr = app.grpc_addr().expect("gRPC on");
    let daemon = run_app(app, Arc::new(ManualClock::new(START_US)), dir);
    let mut client = RateLimitServiceClient::new(crate::grpc_client::tcp_channel(addr).await);
    assert_eq!(admitted(&mut client, "d", &[("k", "v")], 5).await, 1);

    let reloads = |result: &'static str| {
        let daemon = &daemon;
        async move {
            metric_value(
                &daemon.metrics().await,
                "sluice_policy_reloads_total",
                &[("result", result)],
            )
        }
    };
    let wait = |result: &'static str| async move {
        let what = format!("a {result} reload");
        crate::wait::eventually_within(&what, Duration::from_secs(5), || async {
            reloads(result).await >= 1.0
        })
        .await;
    };
    std::fs::write(&file, limit(3)).expect("write");
    wait("ok").await;
    assert_eq!(
        admitted(&mut client, "d", &[("k", "v")], 5).await,
        2,
        "3 per hour, 1 spent"
    );

    std::fs::write(&file, format!("{}    shadow_mode: maybe\n", limit(9))).expect("write");
    wait("invalid").await;
    assert_eq!(
        admitted(&mut client, "d", &[("k", "w")], 5).await,
        3,
        "the old limits serve"
    );
}

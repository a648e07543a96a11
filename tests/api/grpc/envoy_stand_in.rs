//! Converted envoyproxy/ratelimit stand-ins (`envoy_stand_in`): what they stand for is their
//! field, never their name. Renamed in the sluice file (as docs/envoy.md's migration invites)
//! they answer as before over gRPC, `/v1/check` and `/v1/explain`; a policy named like one
//! without the field, or the field on another shape, is refused with its file and line.

use std::path::Path;

use serde_json::{json, Value};
use sluice::config::parse_policies;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;

use crate::grpc_client::{ask, descriptor, request, spawn_grpc, with_override, GrpcApp, OK};
use crate::helpers::{json_of, metric_value, post};

/// One domain with each stand-in: `vip` unlimited, `free` exempt (its sibling limits every other
/// value), `50.0.0.5` blocked in shadow mode, and the domain's limit overrides.
const FILE: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: k\n    value: vip\n    rate_limit: {unlimited: true}\n  - key: k\n    value: free\n  - key: k\n    value: 50.0.0.5\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";

/// Envoy's `MINUTE`.
const MINUTE: i32 = 2;

/// `(code, current_limit as (requests_per_unit, unit), limit_remaining)` of each descriptor.
type Figures = (i32, Vec<(i32, Option<(u32, i32)>, u32)>);

fn figures(answer: &RateLimitResponse) -> Figures {
    let statuses = answer
        .statuses
        .iter()
        .map(|s| {
            let limit = s
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit));
            (s.code, limit, s.limit_remaining)
        })
        .collect();
    (answer.overall_code, statuses)
}

/// The converted file with every stand-in renamed `mine-...`, and the new names.
fn renamed() -> (String, Vec<String>) {
    let converted = sluice::config::envoy::convert(FILE).expect("converts");
    for kind in ["unlimited", "exempt", "shadow_blocked", "limit_override"] {
        let field = format!("envoy_stand_in: {kind}");
        assert!(converted.contains(&field), "{field} in {converted}");
    }
    let renamed = converted.replace("name: rls-", "name: mine-");
    let names = parse_policies(Path::new("t.yaml"), &renamed)
        .expect("the renamed file is valid")
        .iter()
        .map(|p| p.name().to_owned())
        .filter(|n| n.starts_with("mine-"))
        .collect();
    (renamed, names)
}

async fn answer(daemon: &GrpcApp, value: &str) -> Figures {
    let mut c = daemon.tcp().await;
    figures(&ask(&mut c, request("d", vec![descriptor(&[("k", value)])])).await)
}

/// What the stand-ins answer over gRPC, whatever they are named.
async fn assert_upstreams_answers(daemon: &GrpcApp, shadow_blocked: &str) {
    // Unlimited: OK, no current_limit, the largest remaining; exempt: remaining 0.
    for _ in 0..5 {
        assert_eq!(
            answer(daemon, "vip").await,
            (OK, vec![(OK, None, u32::MAX)])
        );
        assert_eq!(answer(daemon, "free").await, (OK, vec![(OK, None, 0)]));
    }
    // Their sibling limits the other values.
    assert_eq!(
        answer(daemon, "other").await,
        (OK, vec![(OK, Some((3, MINUTE)), 2)])
    );
    // Blocked in shadow mode: OK with a limit of 0, a shadow denial each time.
    for _ in 0..2 {
        assert_eq!(
            answer(daemon, "50.0.0.5").await,
            (OK, vec![(OK, Some((0, MINUTE)), 0)])
        );
    }
    let shadow_denied = metric_value(
        &daemon.app.metrics().await,
        "sluice_decisions_total",
        &[("policy", shadow_blocked), ("outcome", "shadow_denied")],
    );
    assert_eq!(shadow_denied, 2.0, "{shadow_blocked}");
    // A limit override takes the domain's override policy alone: 2 a minute, not the 3 of `k`.
    let mut c = daemon.tcp().await;
    let overridden = || {
        request(
            "d",
            vec![with_override(descriptor(&[("k", "o")]), 2, MINUTE)],
        )
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut c, overridden()).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, crate::grpc_client::OVER_LIMIT]);
}

#[tokio::test]
async fn converted_stand_ins_renamed_keep_their_meaning_over_grpc() {
    let converted = sluice::config::envoy::convert(FILE).expect("converts");
    let original = spawn_grpc(&converted).await;
    let name_of = |prefix: &str| {
        parse_policies(Path::new("t.yaml"), &converted)
            .expect("valid")
            .iter()
            .map(|p| p.name().to_owned())
            .find(|n| n.starts_with(prefix))
            .expect("the stand-in")
    };
    assert_upstreams_answers(&original, &name_of("rls-shadow-blocked-")).await;

    let (renamed, names) = renamed();
    assert_eq!(names.len(), 4, "{renamed}");
    let daemon = spawn_grpc(&renamed).await;
    let shadow_blocked = names
        .iter()
        .find(|n| n.starts_with("mine-shadow-blocked-"))
        .expect("renamed");
    assert_upstreams_answers(&daemon, shadow_blocked).await;
}

/// The check API and explain read the same policies: the renamed stand-ins answer as the
/// converted ones, names aside; `/v1/policies` shows their kinds.
#[tokio::test]
async fn converted_stand_ins_renamed_answer_the_check_api_and_explain_alike() {
    let converted = sluice::config::envoy::convert(FILE).expect("converts");
    let (renamed, _) = renamed();
    let ask_both = |daemon: GrpcApp| async move {
        let mut seen = Vec::new();
        for value in ["vip", "free", "50.0.0.5", "other"] {
            let body = json!({"descriptors": {"rls.domain": "d", "rls.entries": "k", "k": value}});
            let reply = daemon.app.check_tcp(&body).await;
            let mut checked = json_of(&reply);
            let admin = sluice::client::Target::Tcp(daemon.app.admin);
            let explained = post(&admin, "/v1/explain", body.to_string().into_bytes()).await;
            let mut explained = json_of(&explained);
            for answer in [&mut checked, &mut explained] {
                strip_names(answer);
            }
            seen.push((reply.status, checked, explained));
        }
        seen
    };
    let before = ask_both(spawn_grpc(&converted).await).await;
    let daemon = spawn_grpc(&renamed).await;
    // `/v1/policies` shows each stand-in's kind.
    let dumped = json_of(&daemon.app.admin_get("/v1/policies").await);
    let mut kinds: Vec<&str> = dumped["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .filter_map(|p| p["envoy_stand_in"].as_str())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["exempt", "limit_override", "shadow_blocked", "unlimited"],
        "{dumped}"
    );
    let after = ask_both(daemon).await;
    assert_eq!(before, after);
    assert!(
        before.iter().all(|(status, ..)| *status == 200),
        "{before:?}"
    );
}

/// Every string that names a policy, made the same whatever the stand-in's prefix.
fn strip_names(value: &mut Value) {
    match value {
        Value::String(text) => {
            for prefix in ["rls-", "mine-"] {
                if let Some(rest) = text.strip_prefix(prefix) {
                    *text = format!("stand-in-{rest}");
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_names),
        Value::Object(map) => map.values_mut().for_each(strip_names),
        _ => {}
    }
}

#[test]
fn a_name_reserved_for_stand_ins_is_refused_without_the_field() {
    let cases = [
        ("rls-override-x", "envoy_stand_in: limit_override"),
        ("rls-shadow-blocked-x", "envoy_stand_in: shadow_blocked"),
        ("rls-unlimited-x", "envoy_stand_in: unlimited"),
        ("rls-exempt-x", "envoy_stand_in: exempt"),
        ("rls-blocked-x", "deny: true"),
    ];
    for (name, written) in cases {
        let yaml = format!(
            "policies:\n  - name: ok\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n  - name: {name}\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n"
        );
        let error = parse_policies(Path::new("p.yaml"), &yaml)
            .expect_err(name)
            .to_string();
        let prefix = name.trim_end_matches('x');
        assert!(
            error.starts_with("p.yaml:7: ")
                && error.contains(&format!(
                    "names starting `{prefix}` are reserved for converted envoyproxy/ratelimit \
                     stand-ins"
                ))
                && error.contains(&format!(
                    "`sluice config convert` writes them with `{written}`"
                )),
            "{name}: {error}"
        );
    }
}

#[test]
fn the_field_is_refused_on_another_shape_than_the_converters() {
    let converted = sluice::config::envoy::convert(FILE).expect("converts");
    // A limit that says it is unlimited would answer without its limit over gRPC.
    let cases = [
        (
            "{name: a, domain: d, group: g, key: [k], algorithm: fixed_window, limit: 5, period: 1m, envoy_stand_in: unlimited}",
            "field `limit`",
        ),
        (
            "{name: a, domain: d, group: g, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1m, envoy_stand_in: exempt}",
            "field `shadow`",
        ),
        (
            "{name: a, domain: d, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1m, shadow: true, envoy_stand_in: shadow_blocked}",
            "field `group`",
        ),
        (
            "{name: a, domain: d, group: g, match: {k: v}, key: [rls.entries], algorithm: fixed_window, limit: 1000000000, period: 1s, envoy_stand_in: limit_override}",
            "field `match`",
        ),
        (
            "{name: a, domain: d, group: g, match: {rls.override: '1'}, key: [k], algorithm: fixed_window, limit: 1000000000, period: 1s, envoy_stand_in: limit_override}",
            "field `key`",
        ),
        (
            "{name: a, group: g, key: [k], deny: true, period: 1m, envoy_stand_in: blocked}",
            "a converted block list is a `deny: true` policy",
        ),
        (
            "{name: a, domain: d, group: g, key: [k], algorithm: token_bucket, limit: 1000000000, period: 1s, shadow: true, envoy_stand_in: unlimited}",
            "field `algorithm`",
        ),
    ];
    for (policy, reason) in cases {
        let yaml = format!("policies:\n  - {{name: ok, key: [ip], algorithm: fixed_window, limit: 5, period: 1m}}\n  - {policy}\n");
        let error = parse_policies(Path::new("p.yaml"), &yaml)
            .expect_err(policy)
            .to_string();
        assert!(
            error.starts_with("p.yaml:3") && error.contains(reason),
            "{policy}: {error}"
        );
    }
    // The converter's own shapes are accepted.
    parse_policies(Path::new("p.yaml"), &converted).expect("converted policies are valid");
}

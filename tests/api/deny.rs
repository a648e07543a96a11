//! Block lists (`deny: true`): a policy that denies whatever it applies to, by its kind, never by
//! its name, the same on every transport: `/v1/check`, a batch, `/v1/authz`, `/v1/explain` and
//! Envoy's gRPC `ShouldRateLimit` (where envoyproxy/ratelimit's `requests_per_unit: 0` converts to
//! one, renamed or not). The other policies the request selected are not spent; the wait told is
//! the policy's `period`, never "forever".

use axum::http::Method;
use serde_json::{json, Value};

use crate::grpc_client::{ask, descriptor, request, response_header, spawn_grpc, OK, OVER_LIMIT};
use crate::helpers::{header, json_of, post, spawn_app_with};

const POLICIES: &str = "
policies:
  - {name: blocklist, key: [ip], match: {ip: 203.0.113.7}, deny: true, period: 1m}
  - {name: api, key: [ip], algorithm: fixed_window, limit: 100, period: 1h}
";

fn at(ip: &str) -> Value {
    json!({"descriptors": {"ip": ip}})
}

#[tokio::test]
async fn a_deny_policy_denies_on_the_check_api_batches_authz_and_explain() {
    let app = spawn_app_with(POLICIES).await;
    for _ in 0..3 {
        let reply = app.check_tcp(&at("203.0.113.7")).await;
        assert_eq!(reply.status, 429, "{}", json_of(&reply));
        let body = json_of(&reply);
        assert_eq!(
            (&body["policy"], &body["allowed"], &body["remaining"]),
            (&json!("blocklist"), &json!(false), &json!(0)),
            "{body}"
        );
        assert_eq!(body["retry_after_sec"], json!(60), "{body}");
        assert_eq!(header(&reply, "retry-after"), "60");
    }
    // The other policy was not spent by the denied requests.
    let api = app
        .check_tcp(&json!({"policy": "api", "descriptors": {"ip": "203.0.113.7"}}))
        .await;
    assert_eq!(json_of(&api)["remaining"], json!(99), "{}", json_of(&api));
    assert_eq!(app.check_tcp(&at("198.51.100.1")).await.status, 200);
    // Over the socket too.
    assert_eq!(app.check(&app.uds, &at("203.0.113.7")).await.status, 429);

    let batch = app.batch(&[at("203.0.113.7"), at("198.51.100.2")]).await;
    let results = json_of(&batch);
    assert_eq!(results["results"][0]["allowed"], json!(false), "{results}");
    assert_eq!(
        results["results"][0]["policy"],
        json!("blocklist"),
        "{results}"
    );
    assert_eq!(results["results"][1]["allowed"], json!(true), "{results}");

    let headers = [
        ("x-original-uri", "/anything"),
        ("x-original-method", "GET"),
        ("x-sluice-descriptor-ip", "203.0.113.7"),
    ];
    let (status, retry, body) = crate::authz::send(&app, Method::GET, "/v1/authz", &headers).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry.as_deref(), Some("60"), "{body}");

    let admin = sluice::client::Target::Tcp(app.admin);
    let dumped = json_of(&app.admin_get("/v1/policies").await);
    assert_eq!(
        (
            &dumped["policies"][0]["deny"],
            &dumped["policies"][0]["period"]
        ),
        (&json!(true), &json!("1m")),
        "{dumped}"
    );
    assert!(dumped["policies"][0].get("limit").is_none(), "{dumped}");
    let explained = json_of(
        &post(
            &admin,
            "/v1/explain",
            at("203.0.113.7").to_string().into_bytes(),
        )
        .await,
    );
    assert_eq!(explained["outcome"], json!("denied"), "{explained}");
    assert_eq!(explained["deciding"], json!("blocklist"), "{explained}");
}

#[test]
fn a_deny_policy_has_no_quota_and_is_enforced_whole() {
    for (extra, field) in [
        ("algorithm: fixed_window", "algorithm"),
        ("limit: 5", "limit"),
        ("shadow: true", "shadow"),
        ("enforce_percent: 50", "enforce_percent"),
    ] {
        let yaml =
            format!("policies:\n  - {{name: b, key: [ip], deny: true, period: 1m, {extra}}}\n");
        let error = sluice::config::parse_policies(std::path::Path::new("p.yaml"), &yaml)
            .expect_err("refused")
            .to_string();
        assert!(error.contains(&format!("field `{field}`")), "{error}");
    }
    let error = sluice::config::parse_policies(
        std::path::Path::new("p.yaml"),
        "policies:\n  - {name: b, key: [ip], deny: true}\n",
    )
    .expect_err("refused")
    .to_string();
    assert!(error.contains("field `period`"), "{error}");
}

/// envoyproxy/ratelimit's `requests_per_unit: 0`, named by the operator (`name: my-blocklist`):
/// OVER_LIMIT with a Retry-After of at most its unit, the same as unnamed.
#[tokio::test]
async fn a_converted_block_denies_over_grpc_whatever_its_name() {
    for name in ["name: my-blocklist, ", ""] {
        let file = format!(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: \
             {{unit: second, requests_per_unit: 10}}\n  - key: remote_address\n    value: \
             50.0.0.5\n    rate_limit: {{{name}unit: minute, requests_per_unit: 0}}\n"
        );
        let daemon = spawn_grpc(&file).await;
        let mut c = daemon.tcp().await;
        for _ in 0..2 {
            let answer = ask(
                &mut c,
                request("edge", vec![descriptor(&[("remote_address", "50.0.0.5")])]),
            )
            .await;
            assert_eq!(answer.overall_code, OVER_LIMIT, "{name}");
            let retry: u64 = response_header(&answer, "retry-after")
                .or_else(|| response_header(&answer, "Retry-After"))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a Retry-After in {answer:?}"));
            assert!((1..=60).contains(&retry), "{name}: Retry-After {retry}");
        }
        let other = ask(
            &mut c,
            request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
        )
        .await;
        assert_eq!(other.overall_code, OK, "{name}");
    }
}

/// docs/envoy.md's migration: convert, then rename the policies in the sluice file. The block's
/// policy renamed still denies (it once was a shadow policy of limit 1,000,000,000 that denied
/// only because of its `rls-blocked-` name: renamed, the blocked address got OK).
#[tokio::test]
async fn a_converted_block_renamed_in_the_sluice_file_still_denies() {
    let file = "domain: edge\ndescriptors:\n  - key: remote_address\n    value: 50.0.0.5\n    \
                rate_limit: {unit: minute, requests_per_unit: 0}\n";
    let converted = sluice::config::envoy::convert(file).expect("converts");
    assert!(converted.contains("rls-blocked-"), "{converted}");
    let renamed = converted.replace("rls-blocked-", "edge-blocklist-");
    let daemon = spawn_grpc(&renamed).await;
    let mut c = daemon.tcp().await;
    let answer = ask(
        &mut c,
        request("edge", vec![descriptor(&[("remote_address", "50.0.0.5")])]),
    )
    .await;
    assert_eq!(answer.overall_code, OVER_LIMIT, "{renamed}");
    assert_eq!(answer.statuses[0].limit_remaining, 0, "{renamed}");
}

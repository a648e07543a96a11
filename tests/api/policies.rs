//! Several policies on one request (one denial spends nothing elsewhere) and shadow policies
//! (report, never block).

use serde_json::json;

use crate::helpers::{
    header, json_of, metric_value, remaining, spawn_app_with, RATE_LIMIT_HEADERS,
};

const TWO_POLICIES: &str = r#"
policies:
  - name: per_ip
    match: { route: "/api/*" }
    key: [ip]
    algorithm: fixed_window
    limit: 5
    period: 1m
  - name: per_user
    match: { route: "/api/*" }
    key: [user]
    algorithm: sliding_log
    limit: 3
    period: 1m
"#;

#[tokio::test]
async fn denial_by_one_policy_names_it_and_spends_nothing_from_the_other() {
    let app = spawn_app_with(TWO_POLICIES).await;
    let req = |user: &str| json!({"descriptors": {"route": "/api/orders", "ip": "10.0.0.1", "user": user}});
    let per_ip = json!({"policy": "per_ip", "descriptors": {"ip": "10.0.0.1"}});
    let per_user = |user: &str| json!({"policy": "per_user", "descriptors": {"user": user}});

    // Both allow; the tighter one (least remaining) is reported.
    for left in [2, 1, 0] {
        let reply = app.check_tcp(&req("u1")).await;
        assert_eq!(reply.status, 200);
        assert_eq!(json_of(&reply)["policy"], "per_user");
        assert_eq!(json_of(&reply)["remaining"], left);
    }
    assert_eq!(
        remaining(&app.dry_run(&per_ip).await),
        1,
        "per_ip spent 3 of 5"
    );

    // per_user denies the 4th: 429 naming per_user, and per_ip was not spent.
    let reply = app.check_tcp(&req("u1")).await;
    assert_eq!(reply.status, 429);
    let body = json_of(&reply);
    assert_eq!(body["policy"], "per_user");
    assert_eq!(body["error"], "rate_limit");
    assert_eq!(body["limit"], 3);
    assert_eq!(header(&reply, "ratelimit-policy"), "\"per_user\";q=3;w=60");
    assert_eq!(
        remaining(&app.dry_run(&per_ip).await),
        1,
        "the denied request spent nothing from per_ip"
    );

    // Another user from the same IP: per_ip runs out after 2 more, and its denial leaves the
    // user's counter alone.
    for _ in 0..2 {
        assert_eq!(app.check_tcp(&req("u2")).await.status, 200);
    }
    let reply = app.check_tcp(&req("u2")).await;
    assert_eq!(reply.status, 429);
    assert_eq!(json_of(&reply)["policy"], "per_ip");
    assert_eq!(header(&reply, "x-ratelimit-limit"), "5");
    let dry = app.dry_run(&per_user("u2")).await;
    assert_eq!(dry.status, 200, "u2 spent 2 of 3 on per_user");
    assert_eq!(remaining(&dry), 0);

    // When both deny, the longest wait decides: per_user's 60 s log beats the fixed window,
    // which ends at the next whole minute (less than 60 s away).
    let reply = app.check_tcp(&req("u1")).await;
    assert_eq!(reply.status, 429);
    assert_eq!(json_of(&reply)["policy"], "per_user");
    assert_eq!(json_of(&reply)["retry_after_ms"], 60_000);
}

const SHADOWS: &str = r#"
policies:
  - name: beta_shadow
    match: { route: "/beta" }
    key: [user]
    algorithm: fixed_window
    limit: 2
    period: 1m
    shadow: true
  - name: api_enforced
    match: { route: "/api" }
    key: [user]
    algorithm: sliding_log
    limit: 100
    period: 1m
  - name: api_shadow
    match: { route: "/api" }
    key: [user]
    algorithm: fixed_window
    limit: 1
    period: 1m
    shadow: true
"#;

fn decisions(metrics: &str, policy: &str, outcome: &str) -> f64 {
    metric_value(
        metrics,
        "sluice_decisions_total",
        &[("policy", policy), ("outcome", outcome)],
    )
}

#[tokio::test]
async fn shadow_policy_alone_reports_but_never_blocks() {
    let app = spawn_app_with(SHADOWS).await;
    let beta = json!({"descriptors": {"route": "/beta", "user": "u1"}});
    for i in 0..5 {
        for target in [&app.tcp, &app.uds] {
            let reply = app.check(target, &beta).await;
            assert_eq!(reply.status, 200, "check {i}: a shadow policy never blocks");
            let body = json_of(&reply);
            assert_eq!(body["allowed"], true);
            assert_eq!(body["mode"], "shadow");
            assert_eq!(body["policy"], "beta_shadow");
            assert!(body.get("error").is_none(), "{body}");
            for name in RATE_LIMIT_HEADERS {
                assert!(
                    reply.header(name).is_none(),
                    "shadow figures stay hidden: {name}"
                );
            }
        }
    }
    let metrics = app.metrics().await;
    assert_eq!(decisions(&metrics, "beta_shadow", "allowed"), 2.0);
    assert_eq!(decisions(&metrics, "beta_shadow", "shadow_denied"), 8.0);
    assert_eq!(decisions(&metrics, "beta_shadow", "denied"), 0.0);
}

#[tokio::test]
async fn shadow_would_deny_still_says_retry_after_ms_zero() {
    let app = spawn_app_with(SHADOWS).await;
    let beta = json!({"descriptors": {"route": "/beta", "user": "u9"}});
    for _ in 0..3 {
        let reply = app.check_tcp(&beta).await;
        let body = json_of(&reply);
        assert_eq!(body["allowed"], true);
        assert_eq!(
            body["retry_after_ms"], 0,
            "allowed answers carry no wait: {body}"
        );
    }
}

#[tokio::test]
async fn shadow_beside_an_enforced_policy_is_invisible_but_counted() {
    let app = spawn_app_with(SHADOWS).await;
    let api = json!({"descriptors": {"route": "/api", "user": "u1"}});
    for left in [99, 98, 97] {
        let reply = app.check_tcp(&api).await;
        assert_eq!(reply.status, 200);
        let body = json_of(&reply);
        assert_eq!(body["policy"], "api_enforced");
        assert_eq!(body["mode"], "enforced");
        assert_eq!(body["remaining"], left);
        assert_eq!(header(&reply, "x-ratelimit-limit"), "100");
        assert_eq!(header(&reply, "x-ratelimit-remaining"), left.to_string());
    }
    let metrics = app.metrics().await;
    assert_eq!(decisions(&metrics, "api_shadow", "allowed"), 1.0);
    assert_eq!(decisions(&metrics, "api_shadow", "shadow_denied"), 2.0);
    assert_eq!(decisions(&metrics, "api_enforced", "allowed"), 3.0);
}

//! The admin listener: probes, Prometheus metrics and the effective policy dump.

use serde_json::json;

use crate::helpers::{header, json_of, metric_value, spawn_app};

#[tokio::test]
async fn probes_answer() {
    let app = spawn_app().await;
    let live = app.admin_get("/livez").await;
    assert_eq!(live.status, 200);
    assert_eq!(live.body, "ok\n");
    let ready = app.admin_get("/readyz").await;
    assert_eq!(ready.status, 200);
    let body = json_of(&ready);
    assert_eq!(body["ready"], true);
    assert_eq!(body["store"], "memory");
    assert_eq!(body["policies"], 2);
    // The admin listener does not serve checks.
    let check = json!({"policy": "login", "descriptors": {"ip": "192.0.2.1"}});
    let reply = crate::helpers::post(
        &sluice::client::Target::Tcp(app.admin),
        "/v1/check",
        check.to_string().into_bytes(),
    )
    .await;
    assert_ne!(reply.status, 200);
    assert_eq!(app.admin_get("/nope").await.status, 404);
}

#[tokio::test]
async fn metrics_count_decisions_and_time_both_transports() {
    let app = spawn_app().await;
    let login = json!({"policy": "login", "descriptors": {"ip": "192.0.2.1"}});
    for _ in 0..6 {
        app.check(&app.tcp, &login).await;
    }
    for _ in 0..6 {
        app.check(&app.uds, &login).await;
    }
    app.check(&app.uds, &json!({"cost": 0})).await;

    let reply = app.admin_get("/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(header(&reply, "content-type").starts_with("text/plain"));
    let text = String::from_utf8(reply.body.to_vec()).expect("UTF-8");
    assert!(text.contains("sluice_decisions_total"), "{text}");
    assert!(
        text.contains("sluice_check_duration_seconds_bucket{transport=\"tcp\""),
        "{text}"
    );
    assert!(
        text.contains("sluice_check_duration_seconds_bucket{transport=\"uds\""),
        "{text}"
    );
    let decisions = |outcome| {
        metric_value(
            &text,
            "sluice_decisions_total",
            &[("policy", "login"), ("outcome", outcome)],
        )
    };
    assert_eq!(decisions("allowed"), 10.0);
    assert_eq!(decisions("denied"), 2.0);
    let count = |transport| {
        metric_value(
            &text,
            "sluice_check_duration_seconds_count",
            &[("transport", transport)],
        )
    };
    assert_eq!(count("tcp"), 6.0);
    assert_eq!(count("uds"), 7.0);
    let responses = |transport, code| {
        metric_value(
            &text,
            "sluice_http_responses_total",
            &[("transport", transport), ("code", code)],
        )
    };
    assert_eq!(responses("tcp", "200"), 6.0);
    assert_eq!(responses("uds", "200"), 4.0);
    assert_eq!(responses("uds", "429"), 2.0);
    assert_eq!(responses("uds", "400"), 1.0);
    assert_eq!(metric_value(&text, "sluice_policies_loaded", &[]), 2.0);
}

#[tokio::test]
async fn policy_dump_lists_every_policy_with_its_parameters() {
    let app = spawn_app().await;
    let reply = app.admin_get("/v1/policies").await;
    assert_eq!(reply.status, 200);
    let body = json_of(&reply);
    let policies = body["policies"].as_array().expect("policies").clone();
    assert_eq!(policies.len(), 2);
    let api = policies
        .iter()
        .find(|p| p["name"] == "public_api")
        .expect("public_api");
    assert_eq!(api["algorithm"], "token_bucket");
    assert_eq!(api["limit"], 1000);
    assert_eq!(api["burst"], 150);
    assert_eq!(api["period"], "1m");
    assert_eq!(api["key"], json!(["tenant", "api_key"]));
    assert_eq!(api["match"], json!({"api_key": "*"}));
    assert_eq!(api["failure_mode"], "open");
    assert_eq!(api["shadow"], false);
    assert_eq!(api["tiers"]["descriptor"], "tier");
    let enterprise = &api["tiers"]["levels"]["enterprise"];
    assert_eq!(enterprise["limit"], 10_000);
    assert_eq!(enterprise["burst"], 1500);
    assert_eq!(enterprise["algorithm"], "token_bucket");
    assert_eq!(
        (&api["reports"], &api["report_debt_periods"]),
        (&json!(true), &json!(1))
    );
    assert_eq!(enterprise["report_debt_periods"], 1);

    let login = policies
        .iter()
        .find(|p| p["name"] == "login")
        .expect("login");
    assert_eq!(login["algorithm"], "sliding_log");
    assert_eq!(login["limit"], 10);
    assert_eq!(login["period"], "5m");
    assert_eq!(login["key"], json!(["ip"]));
    assert_eq!(login["match"], json!({"path": "/login"}));
    assert_eq!(login["failure_mode"], "closed");
    assert!(login.get("burst").is_none(), "a sliding log has no burst");
    assert!(login.get("tiers").is_none());
    assert_eq!(login["reports"], false, "the shipped login refuses reports");
    assert!(
        login.get("report_debt_periods").is_none(),
        "a log owes no debt"
    );
}

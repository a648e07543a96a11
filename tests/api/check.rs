//! `POST /v1/check` against the shipped example policies: login (sliding log) and public_api
//! (token bucket with an enterprise tier), requests no policy matches, and dry runs. The
//! scenarios that need no manual clock run on every store too.

use serde_json::{json, Value};
use sluice::client::Reply;

use crate::helpers::{
    check_on, connect, header, json_of, metric_value, remaining, spawn_app, TestApp,
    RATE_LIMIT_HEADERS, SEC_US, SHIPPED_POLICIES,
};
use crate::stores::{on_stores, spawn_on, Backend, OnStore};

/// A daemon enforcing the shipped policies on `backend`.
async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, SHIPPED_POLICIES, prefix).await
}

fn login(ip: &str) -> Value {
    json!({"descriptors": {"path": "/login", "ip": ip}})
}

fn api(tenant: &str, api_key: &str) -> Value {
    json!({"descriptors": {"tenant": tenant, "api_key": api_key}})
}

/// Asserts a 429 with the `rate_limit` body, whose `retry_after_sec` equals `Retry-After` and is
/// `retry_after_ms` rounded up to seconds; returns `retry_after_ms`.
fn assert_denied(reply: &Reply, policy: &str) -> u64 {
    assert_eq!(
        reply.status,
        429,
        "body: {}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = json_of(reply);
    assert_eq!(body["allowed"], false);
    assert_eq!(body["error"], "rate_limit");
    assert_eq!(body["policy"], policy);
    assert_eq!(body["mode"], "enforced");
    let retry_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    let retry_sec = body["retry_after_sec"].as_u64().expect("retry_after_sec");
    assert!(retry_ms > 0, "a denial says when to retry");
    assert_eq!(
        retry_sec,
        retry_ms.div_ceil(1000),
        "retry_after_sec = ceil(ms / 1000)"
    );
    let header_sec: u64 = header(reply, "retry-after")
        .parse()
        .expect("integer Retry-After");
    assert_eq!(
        header_sec, retry_sec,
        "Retry-After header = retry_after_sec"
    );
    retry_ms
}

/// Asserts a 200 for `policy` with `remaining` left, and the matching headers.
fn assert_allowed(reply: &Reply, policy: &str, limit: u64, left: u64) {
    assert_eq!(
        reply.status,
        200,
        "body: {}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = json_of(reply);
    assert_eq!(body["allowed"], true);
    assert_eq!(body["policy"], policy);
    assert_eq!(body["limit"], limit);
    assert_eq!(body["remaining"], left, "remaining");
    assert_eq!(body["retry_after_ms"], 0);
    assert_eq!(body["mode"], "enforced");
    assert!(body.get("error").is_none(), "no error on 200: {body}");
    assert!(
        body.get("retry_after_sec").is_none(),
        "no retry_after_sec on 200"
    );
    assert!(
        reply.header("retry-after").is_none(),
        "no Retry-After on 200"
    );
    assert_eq!(header(reply, "x-ratelimit-limit"), limit.to_string());
    assert_eq!(header(reply, "x-ratelimit-remaining"), left.to_string());
}

#[tokio::test]
async fn login_allows_ten_per_five_minutes_then_429_with_consistent_retry() {
    let app = spawn_app().await;
    let mut conn = connect(&app.tcp).await;
    for i in 0..10 {
        let reply = check_on(&mut conn, &login("203.0.113.7")).await;
        assert_allowed(&reply, "login", 10, 9 - i);
        assert_eq!(header(&reply, "x-ratelimit-reset"), "300");
        assert_eq!(header(&reply, "ratelimit-policy"), "\"login\";q=10;w=300");
        assert_eq!(
            header(&reply, "ratelimit"),
            format!("\"login\";r={};t=300", 9 - i)
        );
        assert_eq!(header(&reply, "cache-control"), "no-store");
    }
    let reply = check_on(&mut conn, &login("203.0.113.7")).await;
    assert_eq!(assert_denied(&reply, "login"), 300_000);
    assert_eq!(json_of(&reply)["remaining"], 0);
    assert_eq!(json_of(&reply)["limit"], 10);
    assert_eq!(header(&reply, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&reply, "ratelimit"), "\"login\";r=0;t=300");

    // Naming the policy explicitly spends from the same counter.
    let explicit = json!({"policy": "login", "descriptors": {"ip": "203.0.113.7"}});
    assert_denied(&check_on(&mut conn, &explicit).await, "login");
    // Another client IP has its own quota.
    assert_allowed(
        &check_on(&mut conn, &login("203.0.113.8")).await,
        "login",
        10,
        9,
    );

    // Rounding: 299.5 s later the wait is 500 ms, which is 1 s in whole seconds.
    app.advance(299 * SEC_US + 500_000);
    let reply = check_on(&mut conn, &login("203.0.113.7")).await;
    assert_eq!(assert_denied(&reply, "login"), 500);
    assert_eq!(json_of(&reply)["retry_after_sec"], 1);
    // One microsecond before the window ends: still denied, and the wait rounds up to 1 ms.
    app.advance(500_000 - 1);
    assert_eq!(
        assert_denied(&check_on(&mut conn, &login("203.0.113.7")).await, "login"),
        1
    );
    app.advance(1);
    assert_allowed(
        &check_on(&mut conn, &login("203.0.113.7")).await,
        "login",
        10,
        9,
    );
}

#[tokio::test]
async fn login_is_exact_across_the_five_minute_boundary() {
    // 10 attempts at 4:59 and 10 more at 5:01: a fixed window would admit all 20; the sliding log
    // sees 10 in the last 5 minutes and denies the second 10.
    let app = spawn_app().await;
    let mut conn = connect(&app.tcp).await;
    app.advance(4 * 60 * SEC_US + 59 * SEC_US);
    for i in 0..10 {
        assert_allowed(
            &check_on(&mut conn, &login("198.51.100.1")).await,
            "login",
            10,
            9 - i,
        );
    }
    app.advance(2 * SEC_US);
    for _ in 0..10 {
        let reply = check_on(&mut conn, &login("198.51.100.1")).await;
        // The attempts from 4:59 leave the window at 9:59, 298 s from 5:01.
        assert_eq!(assert_denied(&reply, "login"), 298_000);
    }
    app.advance(298 * SEC_US);
    assert_allowed(
        &check_on(&mut conn, &login("198.51.100.1")).await,
        "login",
        10,
        9,
    );
}

#[tokio::test]
async fn public_api_bursts_150_then_refills_one_token_per_60ms() {
    let app = spawn_app().await;
    let mut conn = connect(&app.tcp).await;
    for i in 0..150 {
        let reply = check_on(&mut conn, &api("acme", "key-1")).await;
        assert_allowed(&reply, "public_api", 150, 149 - i);
    }
    let last_allowed = check_on(&mut conn, &api("acme", "key-1")).await;
    let retry_ms = assert_denied(&last_allowed, "public_api");
    assert_eq!(retry_ms, 60, "1000 per minute: one token every 60 ms");
    assert_eq!(json_of(&last_allowed)["retry_after_sec"], 1);
    assert_eq!(header(&last_allowed, "retry-after"), "1");
    // A bucket of 150 refilled at 1000/min is full again after 9 s.
    assert_eq!(
        header(&last_allowed, "ratelimit-policy"),
        "\"public_api\";q=150;w=9"
    );
    assert_eq!(header(&last_allowed, "x-ratelimit-reset"), "9");

    app.advance(59_999);
    assert_denied(
        &check_on(&mut conn, &api("acme", "key-1")).await,
        "public_api",
    );
    app.advance(1);
    assert_allowed(
        &check_on(&mut conn, &api("acme", "key-1")).await,
        "public_api",
        150,
        0,
    );
    assert_denied(
        &check_on(&mut conn, &api("acme", "key-1")).await,
        "public_api",
    );
    // Idle for 9 s: the whole burst is back.
    app.advance(9 * SEC_US);
    let reply = check_on(
        &mut conn,
        &json!({"descriptors": {"tenant": "acme", "api_key": "key-1"}, "cost": 150}),
    )
    .await;
    assert_allowed(&reply, "public_api", 150, 0);
}

#[tokio::test]
async fn enterprise_tier_gets_ten_times_the_burst() {
    let app = spawn_app().await;
    let check = json!({"descriptors": {"tenant": "bigco", "api_key": "k", "tier": "enterprise"}});
    for round in 0..15 {
        let reply = app.batch(&vec![check.clone(); 100]).await;
        assert_eq!(reply.status, 200);
        let results = json_of(&reply)["results"]
            .as_array()
            .expect("results")
            .clone();
        assert_eq!(results.len(), 100);
        for (i, result) in results.iter().enumerate() {
            assert_eq!(result["allowed"], true, "round {round} item {i}: {result}");
            assert_eq!(result["limit"], 1500);
            assert_eq!(result["remaining"], 1500 - 100 * round - i as u64 - 1);
        }
    }
    let reply = app.check_tcp(&check).await;
    // 10 000 per minute: one token every 6 ms.
    assert_eq!(assert_denied(&reply, "public_api"), 6);
    assert_eq!(header(&reply, "x-ratelimit-limit"), "1500");
    // The tier's burst, not the default's, bounds a single cost.
    let big = json!({"descriptors": {"tenant": "other", "api_key": "k", "tier": "enterprise"}, "cost": 1500});
    assert_allowed(&app.check_tcp(&big).await, "public_api", 1500, 0);
    // An unknown tier gets the default quota.
    let gold = json!({"descriptors": {"tenant": "t", "api_key": "k", "tier": "gold"}});
    assert_allowed(&app.check_tcp(&gold).await, "public_api", 150, 149);
}

on_stores! {
/// A token bucket refilling every 60 ms: the denials follow the spends within milliseconds.
async fn counters_are_per_tenant_and_api_key(app: &TestApp) via spawn, on [memory, redis, cluster] {
    let spend_all = json!({"descriptors": {"tenant": "a", "api_key": "shared"}, "cost": 150});
    assert_allowed(&app.check_tcp(&spend_all).await, "public_api", 150, 0);
    assert_denied(&app.check_tcp(&api("a", "shared")).await, "public_api");
    // Same API key, other tenant: its own bucket.
    assert_allowed(
        &app.check_tcp(&api("b", "shared")).await,
        "public_api",
        150,
        149,
    );
    // Same tenant, other key: its own bucket too.
    assert_allowed(
        &app.check_tcp(&api("a", "other")).await,
        "public_api",
        150,
        149,
    );

    // Values that would collide if the key were naively joined with `:` stay apart.
    let colon = json!({"descriptors": {"tenant": "x:y", "api_key": "z"}, "cost": 150});
    assert_allowed(&app.check_tcp(&colon).await, "public_api", 150, 0);
    assert_allowed(
        &app.check_tcp(&api("x", "y:z")).await,
        "public_api",
        150,
        149,
    );
    assert_denied(&app.check_tcp(&api("x:y", "z")).await, "public_api");
}
}

on_stores! {
async fn no_matching_policy_is_allowed_with_null_policy_and_no_limit_headers(app: &TestApp)
    via spawn, on [memory, redis, cluster]
{
    let unmatched = [
        json!({}),
        json!({"descriptors": {}}),
        json!({"descriptors": {"path": "/home", "ip": "203.0.113.7"}}),
        // login matches on path, but its key (ip) is missing: it does not apply.
        json!({"descriptors": {"path": "/login"}}),
        // public_api needs a tenant as well as an api_key.
        json!({"descriptors": {"api_key": "k1"}}),
    ];
    for body in unmatched {
        for target in [&app.tcp, &app.uds] {
            let reply = app.check(target, &body).await;
            assert_eq!(reply.status, 200, "{body}");
            let answer = json_of(&reply);
            assert_eq!(
                answer,
                json!({
                    "allowed": true, "policy": null, "limit": null, "remaining": null,
                    "reset_after_ms": 0, "retry_after_ms": 0, "mode": "enforced"
                }),
                "{body}"
            );
            for name in RATE_LIMIT_HEADERS {
                assert!(reply.header(name).is_none(), "{name} absent for {body}");
            }
        }
    }
}
}

/// Embedded only: its last step advances the manual clock past the window.
#[tokio::test]
async fn dry_run_never_consumes() {
    let app = spawn_app().await;
    let body = login("192.0.2.10");
    let mut dry = body.clone();
    dry["dry_run"] = json!(true);
    let mut conn = connect(&app.tcp).await;
    for _ in 0..50 {
        let reply = check_on(&mut conn, &dry).await;
        assert_allowed(&reply, "login", 10, 9);
    }
    let before = app.metrics().await;
    let dry_big =
        json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 150, "dry_run": true});
    for _ in 0..20 {
        assert_allowed(&check_on(&mut conn, &dry_big).await, "public_api", 150, 0);
    }
    // Dry runs are not decisions: the counters in /metrics did not move.
    assert_eq!(
        app.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with("sluice_decisions_total"))
            .collect::<Vec<_>>(),
        before
            .lines()
            .filter(|l| l.starts_with("sluice_decisions_total"))
            .collect::<Vec<_>>()
    );

    // The real checks still see the full quota.
    assert_allowed(&check_on(&mut conn, &body).await, "login", 10, 9);
    let real_big = json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 150});
    assert_allowed(&check_on(&mut conn, &real_big).await, "public_api", 150, 0);

    // A dry run of an exhausted key reports the denial and still spends nothing.
    for _ in 0..9 {
        check_on(&mut conn, &body).await;
    }
    for _ in 0..5 {
        let reply = check_on(&mut conn, &dry).await;
        assert_denied(&reply, "login");
    }
    let metrics = app.metrics().await;
    let labels = [("policy", "login"), ("outcome", "allowed")];
    assert_eq!(
        metric_value(&metrics, "sluice_decisions_total", &labels),
        10.0
    );
    let labels = [("policy", "login"), ("outcome", "denied")];
    assert_eq!(
        metric_value(&metrics, "sluice_decisions_total", &labels),
        0.0
    );
    app.advance(300 * SEC_US);
    assert_eq!(remaining(&check_on(&mut conn, &body).await), 9);
}

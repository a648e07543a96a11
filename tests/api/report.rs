//! `POST /v1/report` and `sluice report`: a cost known afterwards (an LLM's tokens) is spent on
//! every policy the request matches whatever its counters hold, never a 429; past the limit the
//! next check is denied exactly as long as the overspend requires (each algorithm), on the
//! embedded store and on a real Redis, up to the policy's debt bound (`report_debt_periods`,
//! default 1); bad reports are 400s and reports to a policy with `reports: false` 403s, which
//! spend nothing; a store that cannot take a report gives each policy's failure mode.

use serde_json::{json, Value};
use sluice::client::Target;
use sluice::config::HumanDuration;

use crate::helpers::{
    assert_error, json_of, metric_value, post, run_async, sluice_command, spawn_app_in,
    spawn_app_with, test_settings, TestApp, SEC_US,
};
use crate::redis_server::RedisServer;

/// 10 tokens per second, bursts of 10, up to 5 s of debt; a window and a log of 10 per second;
/// 5 per hour with the default debt bound (1 period); a login that refuses reports.
const POLICIES: &str = "
policies:
  - {name: llm, key: [user], match: {route: llm}, algorithm: token_bucket, limit: 10, period: 1s, burst: 10, report_debt_periods: 5}
  - {name: window, key: [user], match: {route: window}, algorithm: fixed_window, limit: 10, period: 1s}
  - {name: log, key: [user], match: {route: log}, algorithm: sliding_log, limit: 10, period: 1s, failure_mode: closed}
  - {name: hourly, key: [user], match: {route: hourly}, algorithm: token_bucket, limit: 5, period: 1h, burst: 5}
  - {name: login, key: [user], match: {route: login}, algorithm: sliding_log, limit: 10, period: 1m, failure_mode: closed, reports: false}
";

const HOUR_MS: u64 = 3_600_000;

/// The largest report (cost 1,000,000) on the 5-per-hour bucket: the next check waits one
/// period (its default debt bound), not the 22.8 years the whole cost would take to refill;
/// returns the answer's `retry_after_ms`.
async fn a_largest_report_owes_one_period(app: &TestApp) -> u64 {
    let (status, body) = report(app, &ask("hourly", "max", 1_000_000)).await;
    assert_eq!(
        (status, &body["within_limit"], &body["remaining"]),
        (200, &json!(false), &json!(0)),
        "{body}"
    );
    let retry = body["retry_after_ms"].as_u64().expect("a wait");
    assert!(
        (HOUR_MS - 1_000..=HOUR_MS).contains(&retry),
        "one period: {body}"
    );
    let reset = body["reset_after_ms"].as_u64().expect("a reset");
    assert!(reset <= HOUR_MS * 9 / 5, "4 tokens and one period: {body}");
    // A second one adds nothing: the bound holds whatever is reported.
    let (_, again) = report(app, &ask("hourly", "max", 1_000_000)).await;
    assert!(again["retry_after_ms"].as_u64() <= Some(HOUR_MS), "{again}");
    retry
}

/// A report to `login` (`reports: false`) is a 403 naming the policy, spends nothing and is
/// counted `disabled`.
async fn a_login_refuses_reports(app: &TestApp) {
    let reply = post(
        &app.tcp,
        "/v1/report",
        ask("login", "ann", 10).to_string().into_bytes(),
    )
    .await;
    assert_error(&reply, 403, "reports_refused");
    let reason = json_of(&reply)["reason"].as_str().unwrap_or("").to_owned();
    assert!(reason.contains("policy `login`"), "{reason}");
    let (status, seen) = check(
        app,
        &json!({"descriptors": {"route": "login", "user": "ann"}, "dry_run": true}),
    )
    .await;
    assert_eq!((status, &seen["remaining"]), (200, &json!(9)), "{seen}");
    let metrics = app.metrics().await;
    let count = metric_value(
        &metrics,
        "sluice_reports_total",
        &[("policy", "login"), ("outcome", "disabled")],
    );
    assert_eq!(count, 1.0);
}

#[tokio::test]
async fn reports_are_bounded_in_periods_and_refused_where_a_policy_says_so() {
    let app = spawn_app_with(POLICIES).await;
    assert_eq!(a_largest_report_owes_one_period(&app).await, HOUR_MS);
    app.advance(HOUR_MS * 1_000 - 1);
    assert_eq!(check(&app, &ask("hourly", "max", 1)).await.0, 429);
    app.advance(1);
    assert_eq!(check(&app, &ask("hourly", "max", 1)).await.0, 200);
    // The llm bucket's bound is 5 periods: 100 tokens owed wait 5 s, not 9.1 s.
    let (_, body) = report(&app, &ask("llm", "ann", 100)).await;
    assert_eq!(body["retry_after_ms"], 5_000, "{body}");
    a_login_refuses_reports(&app).await;
}

fn ask(route: &str, user: &str, cost: u64) -> Value {
    json!({"descriptors": {"route": route, "user": user}, "cost": cost})
}

async fn report(app: &TestApp, body: &Value) -> (u16, Value) {
    let reply = post(&app.tcp, "/v1/report", body.to_string().into_bytes()).await;
    (reply.status.as_u16(), json_of(&reply))
}

async fn check(app: &TestApp, body: &Value) -> (u16, Value) {
    let reply = app.check_tcp(body).await;
    (reply.status.as_u16(), json_of(&reply))
}

#[tokio::test]
async fn a_report_past_the_limit_denies_checks_until_the_overspend_is_paid() {
    let app = spawn_app_with(POLICIES).await;
    // Checked first with an estimate, the real cost reported after: 3 + 30 on a bucket of 10.
    assert_eq!(check(&app, &ask("llm", "ann", 3)).await.0, 200);
    let (status, body) = report(&app, &ask("llm", "ann", 30)).await;
    assert_eq!(status, 200, "never a 429: {body}");
    assert_eq!(
        body,
        json!({"within_limit": false, "policy": "llm", "limit": 10, "remaining": 0,
               "reset_after_ms": 3_300, "retry_after_ms": 2_400, "mode": "enforced"}),
        "23 tokens owed (2.3 s) and 1 to spend"
    );
    let (status, denied) = check(&app, &ask("llm", "ann", 1)).await;
    assert_eq!((status, &denied["retry_after_ms"]), (429, &json!(2_400)));
    app.advance(2_400_000 - 1);
    assert_eq!(check(&app, &ask("llm", "ann", 1)).await.0, 429);
    app.advance(1);
    assert_eq!(check(&app, &ask("llm", "ann", 1)).await.0, 200);
    // Another partition is untouched.
    assert_eq!(check(&app, &ask("llm", "bob", 10)).await.0, 200);

    // Within the limit a report answers what is left, as a check would.
    let (status, body) = report(&app, &ask("llm", "cat", 4)).await;
    assert_eq!(
        (status, &body["within_limit"], &body["remaining"]),
        (200, &json!(true), &json!(6))
    );
    assert_eq!(body["retry_after_ms"], 0);
    let (_, seen) = check(
        &app,
        &json!({"descriptors": {"route": "llm", "user": "cat"}, "dry_run": true}),
    )
    .await;
    assert_eq!(seen["remaining"], 5, "the report was spent");

    let metrics = app.metrics().await;
    let reports = |outcome| {
        metric_value(
            &metrics,
            "sluice_reports_total",
            &[("policy", "llm"), ("outcome", outcome)],
        )
    };
    assert_eq!((reports("over"), reports("within")), (1.0, 1.0));
}

#[tokio::test]
async fn windows_and_logs_deny_as_long_as_their_overspend_requires() {
    let app = spawn_app_with(POLICIES).await;
    app.advance(SEC_US - 1_700_000_000_000_000 % SEC_US + 200_000); // 200 ms into a window
    let (_, window) = report(&app, &ask("window", "ann", 25)).await;
    assert_eq!(
        (&window["within_limit"], &window["retry_after_ms"]),
        (&json!(false), &json!(800))
    );
    app.advance(799_999);
    assert_eq!(check(&app, &ask("window", "ann", 1)).await.0, 429);
    app.advance(1);
    let (status, next) = check(&app, &ask("window", "ann", 10)).await;
    assert_eq!(status, 200, "a fixed window carries nothing over: {next}");

    // A log: 4 units, then 20 reported 300 ms later: the 10 newest units are those 20's.
    assert_eq!(report(&app, &ask("log", "ann", 4)).await.1["remaining"], 6);
    app.advance(300_000);
    let (_, log) = report(&app, &ask("log", "ann", 20)).await;
    assert_eq!(
        (&log["remaining"], &log["retry_after_ms"]),
        (&json!(0), &json!(1_000))
    );
    app.advance(999_999);
    assert_eq!(check(&app, &ask("log", "ann", 1)).await.0, 429);
    app.advance(1);
    assert_eq!(check(&app, &ask("log", "ann", 10)).await.0, 200);
}

#[tokio::test]
async fn bad_reports_are_refused_and_spend_nothing() {
    let app = spawn_app_with(POLICIES).await;
    let bad = [
        (
            json!({"descriptors": {"route": "llm", "user": "ann"}, "cost": 5, "dry_run": true}),
            400,
            "bad_request",
        ),
        (
            json!({"policy": "nope", "descriptors": {"user": "ann"}}),
            400,
            "unknown_policy",
        ),
        (
            json!({"policy": "llm", "descriptors": {}}),
            400,
            "missing_descriptor",
        ),
        (
            json!({"descriptors": {"route": "llm", "user": "ann"}, "cost": 0}),
            400,
            "bad_request",
        ),
        (
            json!({"descriptors": {"route": "llm", "user": "ann"}, "cost": 1_000_001}),
            400,
            "bad_request",
        ),
        (
            json!({"descriptors": {"route": "llm", "user": "ann"}, "costs": 5}),
            400,
            "bad_request",
        ),
    ];
    for (body, status, code) in bad {
        let reply = post(&app.tcp, "/v1/report", body.to_string().into_bytes()).await;
        assert_error(&reply, status, code);
    }
    let reply = crate::helpers::get(&app.tcp, "/v1/report").await;
    assert_error(&reply, 405, "method_not_allowed");
    let (_, seen) = check(
        &app,
        &json!({"descriptors": {"route": "llm", "user": "ann"}, "dry_run": true}),
    )
    .await;
    assert_eq!(
        seen["remaining"], 9,
        "nothing was spent (a dry run of 1 would leave 9)"
    );
    // Matching no policy spends nothing and says so, like a check.
    let (status, body) = report(&app, &ask("elsewhere", "ann", 5)).await;
    assert_eq!(
        (status, &body["policy"], &body["within_limit"]),
        (200, &Value::Null, &json!(true))
    );
    // The Unix socket serves it too.
    let reply = post(
        &app.uds,
        "/v1/report",
        ask("llm", "uds", 2).to_string().into_bytes(),
    )
    .await;
    assert_eq!(json_of(&reply)["remaining"], 8);
}

#[tokio::test]
async fn sluice_report_spends_on_a_running_daemon() {
    let app = spawn_app_with(POLICIES).await;
    let cwd = app.dir.path().to_owned();
    let Target::Tcp(addr) = app.tcp else {
        unreachable!("tcp")
    };
    let http = addr.to_string();
    let args = |cost: &'static str| {
        sluice_command(
            &cwd,
            &[
                "report",
                "-d",
                "route=llm",
                "-d",
                "user=ann",
                "--cost",
                cost,
                "--http",
                &http,
            ],
        )
    };
    let out = run_async(args("4")).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout
            .starts_with("spent policy=llm limit=10 remaining=6 "),
        "{out:?}"
    );
    let out = run_async(args("40")).await;
    assert_eq!(
        out.code,
        Some(0),
        "spent past the limit is still done: {out:?}"
    );
    assert!(
        out.stdout
            .starts_with("spent_over_limit policy=llm limit=10 remaining=0 "),
        "{out:?}"
    );
    let mut json = args("1");
    json.arg("--json");
    let out = run_async(json).await;
    let answer: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(answer["within_limit"], false);
    let mut dry = args("1");
    dry.arg("--dry-run");
    let out = run_async(dry).await;
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stdout.contains("cannot be a dry run"), "{out:?}");
}

/// A daemon on `redis`, waited for (bounded) until its checks are enforced.
async fn on_redis(redis: &RedisServer, prefix: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(redis.url());
    settings.redis.key_prefix = prefix.into();
    settings.redis.timeout = HumanDuration(2_000_000);
    let app = spawn_app_in(dir, settings, POLICIES).await;
    app.wait_for_store().await;
    app
}

#[tokio::test]
async fn on_redis_a_report_is_spent_and_a_dead_store_gives_the_failure_modes() {
    let mut redis = RedisServer::start();
    let app = on_redis(&redis, "report").await;
    // A window of 10 per second: the report is spent in Redis, the next check denied (the
    // window's end is Redis' own clock, so only its bound is known).
    assert_eq!(report(&app, &ask("log", "ann", 4)).await.1["remaining"], 6);
    let (status, body) = report(&app, &ask("log", "ann", 25)).await;
    assert_eq!(
        (status, &body["within_limit"], &body["remaining"]),
        (200, &json!(false), &json!(0)),
        "{body}"
    );
    let members: u64 = redis::cmd("ZCARD")
        .arg("report:{log:ann}")
        .query(&mut redis.connection())
        .expect("ZCARD");
    assert_eq!(
        members, 1,
        "the log keeps its newest `limit` units: 10 of the 25 reported last, as one run (one \
         member per unit once: 10 members)"
    );
    let (status, denied) = check(&app, &ask("log", "ann", 1)).await;
    assert_eq!(status, 429, "{denied}");
    assert!(
        denied["retry_after_ms"]
            .as_u64()
            .is_some_and(|ms| (1..=1_000).contains(&ms)),
        "{denied}"
    );
    let (_, bucket) = report(&app, &ask("llm", "ann", 30)).await;
    assert_eq!(bucket["remaining"], 0);
    let retry = bucket["retry_after_ms"].as_u64().expect("a wait");
    assert!(
        (2_000..=2_100).contains(&retry),
        "20 tokens owed, then 1: {bucket}"
    );
    // The Lua twin holds the same debt bound: the key lives until the bucket is full again.
    a_largest_report_owes_one_period(&app).await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg("report:{hourly:max}")
        .query(&mut redis.connection())
        .expect("PTTL");
    assert!(
        (1..=(HOUR_MS * 9 / 5) as i64).contains(&ttl),
        "expires within 1.8 h (4 tokens and one period), got {ttl} ms"
    );
    a_login_refuses_reports(&app).await;

    redis.kill();
    let (status, body) = report(&app, &ask("log", "bob", 1)).await;
    assert_eq!(
        (status, &body["error"]),
        (503, &json!("limiter_unavailable")),
        "fail closed: {body}"
    );
    let (status, body) = report(&app, &ask("llm", "bob", 1)).await;
    assert_eq!(
        (status, &body["mode"]),
        (200, &json!("fail_open")),
        "lost, said so: {body}"
    );
    let metrics = app.metrics().await;
    let count = |policy, outcome| {
        metric_value(
            &metrics,
            "sluice_reports_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    };
    assert_eq!((count("log", "refused"), count("llm", "lost")), (1.0, 1.0));
}

//! The check API answers the same over TCP and over the Unix socket, and both listeners spend from
//! the same counters.

use serde_json::{json, Value};
use sluice::client::Reply;

use crate::helpers::{connect, json_of, remaining, spawn_app, TestApp, RATE_LIMIT_HEADERS, SEC_US};

/// One step of a scripted session: a check body, or a clock move.
enum Step {
    Check(Value),
    Batch(Vec<Value>),
    Advance(u64),
}

fn script() -> Vec<Step> {
    let login = json!({"descriptors": {"path": "/login", "ip": "203.0.113.7"}});
    let api = json!({"descriptors": {"tenant": "acme", "api_key": "k1"}, "cost": 149});
    let mut steps: Vec<Step> = (0..11).map(|_| Step::Check(login.clone())).collect();
    steps.extend([
        Step::Advance(299 * SEC_US + 500_000),
        Step::Check(login.clone()),
        Step::Advance(SEC_US),
        Step::Check(login.clone()),
        Step::Check(api.clone()),
        Step::Check(json!({"descriptors": {"tenant": "acme", "api_key": "k1"}})),
        Step::Check(json!({"descriptors": {"tenant": "acme", "api_key": "k1"}})),
        Step::Advance(30_000),
        Step::Check(json!({"descriptors": {"tenant": "acme", "api_key": "k1"}, "dry_run": true})),
        Step::Check(json!({"descriptors": {"path": "/home"}})),
        Step::Check(json!({"policy": "nope"})),
        Step::Check(json!({"cost": 0})),
        Step::Batch(vec![login.clone(), api, json!({})]),
    ]);
    steps
}

/// Runs the script against `app` over `use_uds ? socket : TCP`; returns every reply.
async fn play(app: &TestApp, use_uds: bool) -> Vec<Reply> {
    let target = if use_uds { &app.uds } else { &app.tcp };
    let mut conn = connect(target).await;
    let mut replies = Vec::new();
    for step in script() {
        match step {
            Step::Check(body) => replies.push(
                conn.post_json("/v1/check", &body)
                    .await
                    .expect("check exchange"),
            ),
            Step::Batch(checks) => replies.push(
                conn.post_json("/v1/check/batch", &json!({ "checks": checks }))
                    .await
                    .expect("batch exchange"),
            ),
            Step::Advance(us) => app.advance(us),
        }
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_script_gives_identical_answers_over_tcp_and_unix_socket() {
    // Two daemons with identical manual clocks, so the two sequences share no counters.
    let over_tcp = spawn_app().await;
    let over_uds = spawn_app().await;
    let tcp = play(&over_tcp, false).await;
    let uds = play(&over_uds, true).await;
    assert_eq!(tcp.len(), uds.len());

    let statuses: Vec<u16> = tcp.iter().map(|r| r.status.as_u16()).collect();
    // The script is meant to cover allowed, denied and refused answers.
    for expected in [200, 429, 400] {
        assert!(
            statuses.contains(&expected),
            "script covers {expected}: {statuses:?}"
        );
    }
    for (i, (t, u)) in tcp.iter().zip(&uds).enumerate() {
        assert_eq!(t.status, u.status, "step {i}: status");
        assert_eq!(
            t.body,
            u.body,
            "step {i}: body\n tcp: {}\n uds: {}",
            String::from_utf8_lossy(&t.body),
            String::from_utf8_lossy(&u.body)
        );
        for name in RATE_LIMIT_HEADERS
            .iter()
            .copied()
            .chain(["content-type", "cache-control"])
        {
            assert_eq!(t.header(name), u.header(name), "step {i}: header {name}");
        }
    }
    // And the rate-limit headers were really exercised, not absent on both sides.
    assert!(tcp.iter().any(|r| r.header("retry-after").is_some()));
    assert!(tcp.iter().any(|r| r.header("ratelimit").is_some()));
}

#[tokio::test]
async fn both_listeners_spend_from_the_same_counters() {
    let app = spawn_app().await;
    let body = json!({"policy": "login", "descriptors": {"ip": "192.0.2.44"}});
    for expected in [9, 8, 7] {
        let reply = app.check(&app.tcp, &body).await;
        assert_eq!(remaining(&reply), expected);
    }
    for expected in [6, 5] {
        let reply = app.check(&app.uds, &body).await;
        assert_eq!(reply.status, 200);
        assert_eq!(remaining(&reply), expected);
    }
    let reply = app.check(&app.tcp, &body).await;
    assert_eq!(json_of(&reply)["remaining"], 4);
}

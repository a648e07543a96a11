//! `POST /v1/check/batch`: answers in order, each check decided on its own; an invalid item or an
//! oversized batch fails the whole batch and spends nothing.

use serde_json::{json, Value};

use crate::helpers::{assert_error, header, json_of, post, remaining, spawn_app};

fn login(ip: &str) -> Value {
    json!({"policy": "login", "descriptors": {"ip": ip}})
}

#[tokio::test]
async fn results_come_back_in_order_with_independent_decisions() {
    let app = spawn_app().await;
    let reply = app
        .batch(&[
            login("192.0.2.1"),
            json!({"descriptors": {"path": "/login", "ip": "192.0.2.1"}}),
            json!({"descriptors": {"path": "/nothing"}}),
            json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 10}),
            json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 141}),
            login("192.0.2.2"),
        ])
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(header(&reply, "cache-control"), "no-store");
    let results = json_of(&reply)["results"]
        .as_array()
        .expect("results")
        .clone();
    assert_eq!(results.len(), 6);
    let summary: Vec<(Value, Value, Value)> = results
        .iter()
        .map(|r| {
            (
                r["allowed"].clone(),
                r["policy"].clone(),
                r["remaining"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (json!(true), json!("login"), json!(9)),
            (json!(true), json!("login"), json!(8)),
            (json!(true), json!(null), json!(null)),
            (json!(true), json!("public_api"), json!(140)),
            // 141 more than the 140 left: denied, and it does not stop the rest of the batch.
            (json!(false), json!("public_api"), json!(140)),
            (json!(true), json!("login"), json!(9)),
        ]
    );
    assert_eq!(results[4]["error"], "rate_limit");
    assert_eq!(results[4]["retry_after_sec"], 1);
    assert!(results[0].get("error").is_none());

    // Checks later in a batch see the spending of earlier ones; the state outlives the batch.
    let reply = app.batch(&vec![login("192.0.2.3"); 11]).await;
    assert_eq!(
        reply.status, 200,
        "a denial inside a batch is not a batch failure"
    );
    let results = json_of(&reply)["results"]
        .as_array()
        .expect("results")
        .clone();
    for (i, result) in results.iter().enumerate().take(10) {
        assert_eq!(result["allowed"], true, "item {i}");
        assert_eq!(result["remaining"], 9 - i as u64);
    }
    assert_eq!(results[10]["allowed"], false);
    assert_eq!(results[10]["retry_after_sec"], 300);
    assert_eq!(app.check_tcp(&login("192.0.2.3")).await.status, 429);

    // The same batch over the Unix socket.
    let body = json!({"checks": [login("192.0.2.4"), login("192.0.2.4")]});
    let reply = post(&app.uds, "/v1/check/batch", body.to_string().into_bytes()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(json_of(&reply)["results"][1]["remaining"], 8);

    // An empty batch is a valid, empty answer.
    let reply = app.batch(&[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(json_of(&reply), json!({"results": []}));
}

#[tokio::test]
async fn one_invalid_item_fails_the_batch_naming_it_and_spends_nothing() {
    let app = spawn_app().await;
    let ip = "192.0.2.50";
    assert_eq!(remaining(&app.check_tcp(&login(ip)).await), 9);
    let cases = [
        (
            json!({"descriptors": {"ip": ip}, "policy": "login", "cost": 0}),
            2,
            "bad_request",
        ),
        (json!({"policy": "no_such_policy"}), 2, "unknown_policy"),
        (
            json!({"policy": "login", "descriptors": {"path": "/login"}}),
            2,
            "missing_descriptor",
        ),
        (
            json!({"policy": "login", "descriptors": {"ip": ip}, "cost": 11}),
            2,
            "cost_exceeds_limit",
        ),
        (json!({"descriptors": {"bad name": "x"}}), 2, "bad_request"),
    ];
    for (bad, index, code) in cases {
        let mut checks = vec![login(ip), login(ip)];
        checks.insert(index, bad.clone());
        checks.push(json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 150}));
        let reply = app.batch(&checks).await;
        let reason = assert_error(&reply, 400, code);
        assert!(
            reason.starts_with(&format!("checks[{index}]")),
            "reason names the item: {reason} (for {bad})"
        );
        // Nothing was spent: neither the items before the bad one nor those after.
        assert_eq!(remaining(&app.dry_run(&login(ip)).await), 8, "after {bad}");
        let api = json!({"descriptors": {"tenant": "t", "api_key": "k"}, "cost": 150});
        assert_eq!(app.dry_run(&api).await.status, 200, "after {bad}");
    }

    // An item that is not even a check (unknown field, wrong type) fails the batch too.
    for bad in [
        json!({"policy": "login", "colour": "red"}),
        json!({"cost": "one"}),
        json!(7),
    ] {
        let reply = app.batch(&[login(ip), bad.clone()]).await;
        assert_error(&reply, 400, "bad_request");
        assert_eq!(remaining(&app.dry_run(&login(ip)).await), 8, "after {bad}");
    }
}

#[tokio::test]
async fn batch_larger_than_max_batch_is_refused_whole() {
    let app = spawn_app().await;
    // limits.max_batch defaults to 100: exactly 100 is fine...
    let api = json!({"descriptors": {"tenant": "t", "api_key": "k"}});
    let reply = app.batch(&vec![api.clone(); 100]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        json_of(&reply)["results"].as_array().map(Vec::len),
        Some(100)
    );
    // ...101 is not, and none of them is spent.
    let other = json!({"descriptors": {"tenant": "t", "api_key": "other"}});
    let reply = app.batch(&vec![other.clone(); 101]).await;
    let reason = assert_error(&reply, 400, "bad_request");
    assert!(reason.contains("100"), "reason gives the cap: {reason}");
    assert_eq!(remaining(&app.dry_run(&other).await), 149);

    // Not a batch at all.
    for body in [
        json!({}),
        json!({"checks": {}}),
        json!({"checks": [], "extra": 1}),
    ] {
        let reply = post(&app.tcp, "/v1/check/batch", body.to_string().into_bytes()).await;
        assert_error(&reply, 400, "bad_request");
    }
}

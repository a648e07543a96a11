//! Concurrency limits through `POST /v1/check` and `POST /v1/release` on every store: at most
//! `limit` permits held, the denial's wait is the earliest permit's expiry, a release gives the
//! slot back once (a second is a 200 that released nothing), a forged or altered permit is
//! refused with a reason, an unreleased permit returns by itself after its `permit_ttl` (on the
//! manual clock for the embedded store, on Redis' own clock for Redis: a 1 s TTL and a bounded
//! wait), and a request another policy denies holds no slot.

use serde_json::{json, Value};

use crate::helpers::{assert_error, header, json_of, metric_value, post, TestApp};
use crate::stores::{on_stores, spawn_on, Backend, OnStore, Store};

const POLICIES: &str = "
policies:
  - {name: gen, key: [tenant], match: {route: gen}, algorithm: concurrency, limit: 3, permit_ttl: 1s, failure_mode: closed}
  - {name: tokens, key: [tenant], match: {route: gen}, algorithm: fixed_window, limit: 1000, period: 1h}
";

async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, POLICIES, prefix).await
}

fn ask(tenant: &str) -> Value {
    json!({"descriptors": {"tenant": tenant, "route": "gen"}})
}

async fn release(app: &TestApp, permit: &str) -> (u16, Value) {
    let body = json!({ "permit": permit }).to_string().into_bytes();
    let reply = post(&app.tcp, "/v1/release", body).await;
    (reply.status.as_u16(), json_of(&reply))
}

/// Takes a permit for `tenant`: its token, the answer's `remaining`.
async fn acquire(app: &TestApp, tenant: &str) -> (String, u64) {
    let reply = app.check_tcp(&ask(tenant)).await;
    let body = json_of(&reply);
    assert_eq!(reply.status, 200, "{body}");
    let permit = body["permit"]
        .as_str()
        .expect("an allowed check holds a permit");
    (permit.to_owned(), body["remaining"].as_u64().unwrap_or(99))
}

on_stores! {
async fn permits_are_taken_denied_released_and_expire(app: &OnStore<TestApp>)
    via spawn, on [memory, redis, cluster]
{
    let memory = matches!(app.store, Store::Memory);
    let tenant = "acme";
    let mut held = Vec::new();
    for expected in [2, 1, 0] {
        let (permit, remaining) = acquire(app, tenant).await;
        assert_eq!(remaining, expected);
        held.push(permit);
        if memory {
            app.advance(100_000);
        }
    }
    let denied = app.check_tcp(&ask(tenant)).await;
    let body = json_of(&denied);
    assert_eq!(denied.status, 429, "{body}");
    assert_eq!(body["policy"], "gen", "{body}");
    assert!(body.get("permit").is_none(), "a denial holds nothing: {body}");
    let retry_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    if memory {
        // Taken at 0, 100 and 200 ms, asked at 300 ms: the first expires at 1 s.
        assert_eq!(retry_ms, 700, "{body}");
    } else {
        assert!((1..=1_000).contains(&retry_ms), "{body}");
    }
    assert_eq!(header(&denied, "retry-after"), "1");
    // An operator's read: every slot taken, nothing spent by reading.
    for _ in 0..2 {
        let read = app.admin_get("/v1/counters?policy=gen&d.tenant=acme").await;
        let body = json_of(&read);
        assert_eq!(read.status, 200, "{body}");
        assert_eq!(
            (body["algorithm"].as_str(), body["limit"].as_u64(), body["remaining"].as_u64(), body["allowed"].as_bool()),
            (Some("concurrency"), Some(3), Some(0), Some(false)),
            "{body}"
        );
    }

    // A release gives the slot back once.
    assert_eq!(release(app, &held[1]).await, (200, json!({"released": true, "policies": ["gen"]})));
    assert_eq!(release(app, &held[1]).await, (200, json!({"released": false, "policies": ["gen"]})));
    let (again, remaining) = acquire(app, tenant).await;
    assert_eq!(remaining, 0);
    assert_eq!(app.check_tcp(&ask(tenant)).await.status, 429);

    // Forged, altered or malformed: refused with a reason, nothing released.
    let (id, rest) = again.split_at(32);
    let flipped = if id.starts_with('0') { "1" } else { "0" };
    let forged = format!("{flipped}{}{rest}", &id[1..]);
    let (status, body) = release(app, &forged).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("forged_permit")), "{body}");
    let (status, body) = release(app, "not-a-permit").await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_permit")), "{body}");
    let reply = post(&app.tcp, "/v1/release", br#"{"permit": 7}"#.to_vec()).await;
    assert_error(&reply, 400, "bad_request");
    assert_eq!(app.check_tcp(&ask(tenant)).await.status, 429, "still full");

    // Nobody releases: every permit returns by itself after its permit_ttl.
    if memory {
        app.advance(1_000_000);
    } else {
        let all_back = || async {
            let probe = json!({"descriptors": {"tenant": tenant, "route": "gen"}, "dry_run": true});
            let reply = app.check_tcp(&probe).await;
            reply.status == 200 && json_of(&reply)["remaining"] == 2
        };
        crate::wait::eventually("the permits to expire on Redis' clock", all_back).await;
    }
    let (_, remaining) = acquire(app, tenant).await;
    assert_eq!(remaining, 2, "every expired permit is back");
    assert_eq!(release(app, &again).await.1["released"], false, "expired already");

    let metrics = app.metrics().await;
    let count = |event| metric_value(&metrics, "sluice_permits_total", &[("policy", "gen"), ("event", event)]);
    assert_eq!(count("acquired"), 5.0);
    assert_eq!(count("denied"), 3.0);
    assert_eq!(count("released"), 1.0);
    assert_eq!(count("released_none"), 2.0, "released twice, expired");
}
}

on_stores! {
async fn a_request_another_policy_denies_holds_no_slot(app: &OnStore<TestApp>)
    via spawn, on [memory, redis]
{
    // A cost above the concurrency limit is no error: a permit is one request in flight.
    let reply = app.check_tcp(&json!({"descriptors": {"tenant": "big", "route": "gen"}, "cost": 999})).await;
    assert_eq!(reply.status, 200, "{}", json_of(&reply));
    // The token budget is spent now: the next request is denied by it, and its permit goes back.
    let over = app.check_tcp(&json!({"descriptors": {"tenant": "big", "route": "gen"}, "cost": 5})).await;
    let body = json_of(&over);
    assert_eq!((over.status.as_u16(), body["policy"].as_str()), (429, Some("tokens")), "{body}");
    // Asked of the concurrency policy alone: one permit held (the first request's), the denied
    // one's given back, so one is left after this one.
    let probe = app
        .check_tcp(&json!({"policy": "gen", "descriptors": {"tenant": "big"}, "dry_run": true}))
        .await;
    let body = json_of(&probe);
    assert_eq!((probe.status.as_u16(), body["remaining"].as_u64()), (200, Some(1)), "{body}");
}
}

/// A request a concurrency policy applies to is refused on `/v1/authz`, which cannot release.
#[tokio::test]
async fn authz_refuses_a_concurrency_policy() {
    let app = crate::helpers::spawn_app_with(
        "policies:\n  - {name: gen, key: [method], algorithm: concurrency, limit: 3}\n",
    )
    .await;
    let headers = [("x-original-uri", "/x"), ("x-original-method", "GET")];
    let (status, _, body) =
        crate::authz::send(&app, axum::http::Method::GET, "/v1/authz", &headers).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("concurrency limit"), "{reason}");
}

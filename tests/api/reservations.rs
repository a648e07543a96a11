//! Reservations through `POST /v1/check` (`"reserve": true`) and `POST /v1/settle` on every
//! store: a reservation spends its estimate, a settle below it gives back exactly the unused
//! part into the same counter (a fixed window's and a token bucket's), a settle above it spends
//! the difference, a second settle is a 409 that changes nothing, a reservation never settled
//! keeps its estimate and is refused as expired once its `reservation_ttl` ends (on the manual
//! clock to the µs for the embedded store; on Redis' clock, the host's, for Redis), and a
//! forged, altered or another partition's or policy's token is refused with a reason. Then what
//! is refused before anything is spent: a policy without reservations, a dry run, a batch, a
//! report; and, on the embedded store, a refund never lands in a later window or in a counter
//! reset since.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::helpers::{assert_error, json_of, metric_value, post, TestApp};
use crate::stores::{on_stores, spawn_on, Backend, OnStore, Store};

const POLICIES: &str = "
policies:
  - {name: tokens, key: [tenant], match: {route: gen}, algorithm: fixed_window, limit: 100, period: 1h, reservations: true, reservation_ttl: 1s, failure_mode: closed}
  - {name: bucket, key: [tenant], match: {route: tb}, algorithm: token_bucket, limit: 1, period: 1h, burst: 100, reservations: true, reservation_ttl: 1s, failure_mode: closed}
  - {name: plain, key: [tenant], match: {route: plain}, algorithm: fixed_window, limit: 10, period: 1h}
  - {name: short, key: [tenant], match: {route: short}, algorithm: fixed_window, limit: 10, period: 2s, reservations: true, reservation_ttl: 5s}
  - {name: blocked, key: [tenant], match: {route: gen, tenant: evil}, deny: true, period: 1m}
  - {name: slots, key: [tenant], match: {route: llm}, algorithm: concurrency, limit: 1, failure_mode: closed}
  - {name: llm_tokens, key: [tenant], match: {route: llm}, algorithm: fixed_window, limit: 100, period: 1h, reservations: true, failure_mode: closed}
";

async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, POLICIES, prefix).await
}

fn ask(route: &str, tenant: &str, cost: u64) -> Value {
    json!({"descriptors": {"tenant": tenant, "route": route}, "cost": cost, "reserve": true})
}

/// Reserves `cost`: the token and the answer's `remaining` (the reservation must be allowed).
async fn reserve(app: &TestApp, route: &str, tenant: &str, cost: u64) -> (String, u64) {
    let reply = app.check_tcp(&ask(route, tenant, cost)).await;
    let body = json_of(&reply);
    assert_eq!(reply.status, 200, "{body}");
    let token = body["reservation"]
        .as_str()
        .unwrap_or_else(|| panic!("an allowed reservation answers one: {body}"));
    (
        token.to_owned(),
        body["remaining"].as_u64().unwrap_or(u64::MAX),
    )
}

pub(crate) async fn settle_on(
    target: &sluice::client::Target,
    token: &str,
    cost: u64,
) -> (u16, Value) {
    let body = json!({ "reservation": token, "cost": cost })
        .to_string()
        .into_bytes();
    let reply = post(target, "/v1/settle", body).await;
    (reply.status.as_u16(), json_of(&reply))
}

async fn settle(app: &TestApp, token: &str, cost: u64) -> (u16, Value) {
    settle_on(&app.tcp, token, cost).await
}

/// What is left of `tenant`'s counter under `route`, spending nothing: a dry run of 1 unit
/// answers what would be left after it (`llm_tokens_only`: that policy alone).
async fn left(app: &TestApp, route: &str, tenant: &str) -> u64 {
    let probe = match route {
        "llm_tokens_only" => {
            json!({"policy": "llm_tokens", "descriptors": {"tenant": tenant}, "dry_run": true})
        }
        _ => json!({"descriptors": {"tenant": tenant, "route": route}, "dry_run": true}),
    };
    let reply = app.check_tcp(&probe).await;
    units_left(&json_of(&reply))
}

/// What a dry run of 1 unit says is left before it.
pub(crate) fn units_left(body: &Value) -> u64 {
    let after = body["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("remaining: {body}"));
    if body["allowed"] == true {
        after + 1
    } else {
        0
    }
}

/// The reservation's end (µs on the store's clock) as its token carries it (the payload's first
/// line): what the test waits for, never what it asserts.
pub(crate) fn expires_us(token: &str) -> u64 {
    let payload = token.rsplit('.').next().expect("a token");
    let text = URL_SAFE_NO_PAD.decode(payload).expect("base64url");
    let text = String::from_utf8(text).expect("text");
    text.lines()
        .next()
        .and_then(|l| l.parse().ok())
        .expect("expires_us")
}

/// `token` with its payload replaced by `other`'s: the id and MAC of one reservation over
/// another's partitions.
pub(crate) fn spliced(token: &str, other: &str) -> String {
    let (head, _) = token.rsplit_once('.').expect("three fields");
    let (_, tail) = other.rsplit_once('.').expect("three fields");
    format!("{head}.{tail}")
}

on_stores! {
async fn reservations_refund_charge_settle_once_and_expire(app: &OnStore<TestApp>)
    via spawn, on [memory, redis, cluster]
{
    let memory = matches!(app.store, Store::Memory);
    crate::wait::within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    // A fixed window: 40 reserved, 25 used: 15 back, exactly.
    let (token, remaining) = reserve(app, "gen", "acme", 40).await;
    assert_eq!(remaining, 60);
    let (status, body) = settle(app, &token, 25).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"settled": true, "estimate": 40, "cost": 25,
               "policies": [{"policy": "tokens", "refunded": 15, "charged": 0, "applied": true}]})
    );
    assert_eq!(left(app, "gen", "acme").await, 75);
    // A second settle changes nothing, whatever its cost.
    for cost in [0, 25, 90] {
        let (status, body) = settle(app, &token, cost).await;
        assert_eq!((status, body["error"].as_str()), (409, Some("already_settled")), "{body}");
    }
    assert_eq!(left(app, "gen", "acme").await, 75);
    // Used more than reserved: the difference is spent.
    let (token, _) = reserve(app, "gen", "acme", 30).await;
    let (status, body) = settle(app, &token, 50).await;
    assert_eq!((status, &body["policies"][0]["charged"]), (200, &json!(20)), "{body}");
    assert_eq!(left(app, "gen", "acme").await, 25);
    // More than is left: denied, nothing taken, no reservation; on Redis the pod then denies
    // the same reservation itself (its local layer), as it does a check.
    let hits = |metrics: &str| metric_value(metrics, "sluice_local_layer_hits_total", &[("policy", "tokens")]);
    let before = hits(&app.metrics().await);
    for _ in 0..2 {
        let over = app.check_tcp(&ask("gen", "acme", 30)).await;
        let body = json_of(&over);
        assert_eq!(over.status, 429, "{body}");
        assert!(body.get("reservation").is_none(), "{body}");
    }
    let local = if memory { 0.0 } else { 1.0 };
    assert_eq!(hits(&app.metrics().await) - before, local, "the second denial is the pod's");
    assert_eq!(left(app, "gen", "acme").await, 25);

    // A token bucket (1 token an hour: no refill to speak of): 40 reserved, 10 used.
    let (token, remaining) = reserve(app, "tb", "acme", 40).await;
    assert_eq!(remaining, 60);
    let (status, body) = settle(app, &token, 10).await;
    assert_eq!((status, &body["policies"][0]["refunded"]), (200, &json!(30)), "{body}");
    assert_eq!(left(app, "tb", "acme").await, 90);

    // Forged, altered, another partition's or another policy's: refused, nothing changed.
    let (mine, _) = reserve(app, "gen", "mine", 10).await;
    let (theirs, _) = reserve(app, "gen", "theirs", 10).await;
    let (other_policy, _) = reserve(app, "tb", "mine", 10).await;
    let (id, rest) = mine.split_at(32);
    let flipped = if id.starts_with('0') { "1" } else { "0" };
    let forged = format!("{flipped}{}{rest}", &id[1..]);
    for (what, token) in [
        ("forged id", forged),
        ("another partition", spliced(&mine, &theirs)),
        ("another policy", spliced(&mine, &other_policy)),
    ] {
        let (status, body) = settle(app, &token, 0).await;
        assert_eq!((status, body["error"].as_str()), (400, Some("forged_reservation")), "{what}: {body}");
    }
    let (status, body) = settle(app, "not-a-reservation", 0).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_reservation")), "{body}");
    let reply = post(&app.tcp, "/v1/settle", br#"{"reservation": "x", "cost": -1}"#.to_vec()).await;
    assert_error(&reply, 400, "bad_request");
    assert_eq!(
        (left(app, "gen", "mine").await, left(app, "gen", "theirs").await, left(app, "tb", "mine").await),
        (90, 90, 90),
        "nothing given back"
    );

    // Never settled: it keeps its estimate; once its reservation_ttl ends a settle is refused.
    let (first, _) = reserve(app, "gen", "late", 10).await;
    let (second, _) = reserve(app, "gen", "late", 10).await;
    if memory {
        // Both made at the same instant: 1 µs before the end the first still settles.
        app.advance(999_999);
        assert_eq!(settle(app, &first, 0).await.0, 200);
        app.advance(1);
    } else {
        // Redis' clock is this host's: wait until the end has passed on it.
        let end = expires_us(&second);
        let past = || async move {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970");
            u64::try_from(now.as_micros()).unwrap_or(u64::MAX) > end + 20_000
        };
        crate::wait::eventually("the reservation's ttl to end", past).await;
        let (status, body) = settle(app, &first, 0).await;
        assert_eq!((status, body["error"].as_str()), (410, Some("reservation_expired")), "{body}");
    }
    let (status, body) = settle(app, &second, 0).await;
    assert_eq!((status, body["error"].as_str()), (410, Some("reservation_expired")), "{body}");
    let expected = if memory { 90 } else { 80 };
    assert_eq!(left(app, "gen", "late").await, expected, "an expired reservation keeps its estimate");

    let metrics = app.metrics().await;
    let event = |e| metric_value(&metrics, "sluice_reservations_total", &[("policy", "tokens"), ("event", e)]);
    let units = |k| metric_value(&metrics, "sluice_reservation_units_total", &[("policy", "tokens"), ("kind", k)]);
    let (settled, expired) = if memory { (3.0, 1.0) } else { (2.0, 2.0) };
    assert_eq!(
        (event("opened"), event("denied"), event("settled"), event("already_settled"), event("expired")),
        (6.0, 2.0, settled, 3.0, expired)
    );
    let refunded = if memory { 25.0 } else { 15.0 };
    assert_eq!((units("reserved"), units("refunded"), units("charged")), (110.0, refunded, 20.0));
}
}

on_stores! {
async fn what_cannot_reserve_is_refused_before_anything_is_spent(app: &OnStore<TestApp>)
    via spawn, on [memory, redis]
{
    let refused = app.check_tcp(&ask("plain", "acme", 3)).await;
    let reason = assert_error(&refused, 403, "reservations_off");
    assert!(reason.contains("`plain`"), "{reason}");
    // A block list denies a reservation as it denies a check.
    let blocked = app.check_tcp(&ask("gen", "evil", 1)).await;
    let body = json_of(&blocked);
    assert_eq!((blocked.status.as_u16(), body["policy"].as_str()), (429, Some("blocked")), "{body}");
    assert_eq!(left(app, "gen", "evil").await, 0, "blocked");
    let mut dry = ask("gen", "acme", 3);
    dry["dry_run"] = json!(true);
    assert_error(&app.check_tcp(&dry).await, 400, "bad_request");
    let batch = app.batch(&[ask("gen", "acme", 3)]).await;
    assert_error(&batch, 400, "bad_request");
    let report = post(&app.tcp, "/v1/report", ask("gen", "acme", 3).to_string().into_bytes()).await;
    assert_error(&report, 400, "bad_request");
    assert_eq!(left(app, "gen", "acme").await, 100);
    assert_eq!(left(app, "plain", "acme").await, 10);
}
}

/// On the embedded store's manual clock: a fixed window's refund never lands in the next window
/// (the units were counted in the one that ended).
#[tokio::test]
async fn a_refund_never_lands_in_a_later_window() {
    let app = spawn(Backend::Memory, "refund-window").await;
    // Start at a window boundary of the 2 s period.
    let now = sluice::clock::Clock::now_us(app.clock.as_ref());
    app.advance(2_000_000 - now % 2_000_000);
    let (token, remaining) = reserve(&app, "short", "acme", 8).await;
    assert_eq!(remaining, 2);
    app.advance(2_000_000);
    assert_eq!(left(&app, "short", "acme").await, 10, "a new window");
    let (status, body) = settle(&app, &token, 0).await;
    assert_eq!(
        (status, &body["policies"][0]["refunded"]),
        (200, &json!(0)),
        "{body}"
    );
    assert_eq!(
        left(&app, "short", "acme").await,
        10,
        "nothing lands in the new window"
    );
}

on_stores! {
/// A refund never lands in a counter reset since the reservation (its lease epoch changed),
/// even one spent again since; a reservation of the new counter gets its refund.
async fn a_refund_never_lands_in_a_counter_reset_since(app: &OnStore<TestApp>)
    via spawn, on [memory, redis, cluster]
{
    crate::wait::within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let (token, _) = reserve(app, "gen", "reset", 40).await;
    let path = "/v1/counters?policy=tokens&d.tenant=reset";
    let admin = sluice::client::Target::Tcp(app.admin);
    let reply = sluice::client::request(&admin, axum::http::Method::DELETE, path, None)
        .await
        .expect("DELETE /v1/counters");
    assert_eq!(reply.status, 200, "{}", json_of(&reply));
    let (spent, _) = reserve(app, "gen", "reset", 50).await;
    let (status, body) = settle(app, &token, 0).await;
    assert_eq!((status, &body["policies"][0]["refunded"]), (200, &json!(0)), "{body}");
    assert_eq!(left(app, "gen", "reset").await, 50, "nothing lands in the reset counter");
    let (status, body) = settle(app, &spent, 1).await;
    assert_eq!((status, &body["policies"][0]["refunded"]), (200, &json!(49)), "{body}");
    assert_eq!(left(app, "gen", "reset").await, 99);
}
}

on_stores! {
/// A concurrency policy beside a token budget: the request holds a permit and a reservation; a
/// request the permits deny reserves nothing.
async fn a_permit_and_a_reservation_together(app: &OnStore<TestApp>)
    via spawn, on [memory, redis, cluster]
{
    crate::wait::within_one_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let reply = app.check_tcp(&ask("llm", "acme", 40)).await;
    let body = json_of(&reply);
    assert_eq!(reply.status, 200, "{body}");
    let (permit, token) = (body["permit"].as_str(), body["reservation"].as_str());
    let (Some(permit), Some(token)) = (permit, token) else {
        panic!("a permit and a reservation: {body}");
    };
    let denied = app.check_tcp(&ask("llm", "acme", 40)).await;
    let body = json_of(&denied);
    assert_eq!((denied.status.as_u16(), body["policy"].as_str()), (429, Some("slots")), "{body}");
    assert!(body.get("reservation").is_none(), "{body}");
    assert_eq!(left(app, "llm_tokens_only", "acme").await, 60, "nothing reserved by the denial");
    let released = post(&app.tcp, "/v1/release", json!({ "permit": permit }).to_string().into_bytes()).await;
    assert_eq!(json_of(&released)["released"], true);
    let (status, body) = settle(app, token, 10).await;
    assert_eq!((status, &body["policies"][0]["refunded"]), (200, &json!(30)), "{body}");
    assert_eq!(left(app, "llm_tokens_only", "acme").await, 90);
}
}

//! `/v1/top` lists concurrency partitions with the slots held now: the partitions a pod took
//! permits in, each read from the store when asked (every pod's permits on Redis, expired ones
//! not counted), most held first; a release or an expiry shows at the next read. Partitions only
//! to a loopback client, as in the other lists.

use serde_json::{json, Value};

use crate::helpers::{json_of, post, TestApp};
use crate::stores::{on_stores, spawn_on, spawn_on_with, Backend, OnStore, Store};

const POLICIES: &str = "
policies:
  - {name: gen, key: [tenant], match: {route: gen}, algorithm: concurrency, limit: 3, permit_ttl: 2s, failure_mode: closed}
  - {name: tokens, key: [tenant], match: {route: gen}, algorithm: fixed_window, limit: 1000, period: 1h}
";

async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, POLICIES, prefix).await
}

async fn acquire(app: &TestApp, tenant: &str) -> String {
    let reply = app
        .check_tcp(&json!({"descriptors": {"tenant": tenant, "route": "gen"}}))
        .await;
    let body = json_of(&reply);
    assert_eq!(reply.status, 200, "{body}");
    body["permit"].as_str().expect("a permit").to_owned()
}

/// `(partition, held, limit, acquired)` of `gen`'s concurrency list, in order.
async fn held(app: &TestApp) -> Vec<(String, Option<u64>, u64, u64)> {
    let reply = app.admin_get("/v1/top?policy=gen").await;
    let body = json_of(&reply);
    assert_eq!(reply.status, 200, "{body}");
    let lists = body["concurrency"].as_array().expect("concurrency lists");
    assert_eq!(lists.len(), 1, "{body}");
    assert_eq!(lists[0]["policy"], "gen", "{body}");
    lists[0]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e: &Value| {
            (
                e["partition"].as_str().unwrap_or_default().to_owned(),
                e["held"].as_u64(),
                e["limit"].as_u64().unwrap_or(0),
                e["acquired"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

on_stores! {
async fn top_shows_the_slots_held_in_concurrency_partitions(app: &OnStore<TestApp>)
    via spawn, on [memory, redis, cluster]
{
    let first = acquire(app, "acme").await;
    acquire(app, "acme").await;
    acquire(app, "beta").await;
    assert_eq!(
        held(app).await,
        [("acme".into(), Some(2), 3, 2), ("beta".into(), Some(1), 3, 1)]
    );
    // A token-bucket policy asked for by name has no concurrency list; without a name, every
    // concurrency policy with a partition is listed.
    let other = json_of(&app.admin_get("/v1/top?policy=tokens").await);
    assert_eq!(other["concurrency"], json!([]), "{other}");
    let all = json_of(&app.admin_get("/v1/top").await);
    assert_eq!(all["concurrency"][0]["entries"][0]["held"], 2, "{all}");

    let released = post(&app.tcp, "/v1/release", json!({"permit": first}).to_string().into_bytes()).await;
    assert_eq!(released.status, 200);
    assert_eq!(held(app).await, [("acme".into(), Some(1), 3, 2), ("beta".into(), Some(1), 3, 1)]);

    if !matches!(app.store, Store::Memory) {
        // Another pod's permits in the same partition count: held is read from Redis.
        let other = spawn_on_with(app.store.clone(), POLICIES, &app.prefix, |_| {}).await;
        acquire(&other, "beta").await;
        acquire(&other, "beta").await;
        assert_eq!(
            held(app).await,
            [("beta".into(), Some(3), 3, 1), ("acme".into(), Some(1), 3, 2)]
        );
        // Nobody releases: every slot comes back at permit_ttl, on Redis' clock.
        crate::wait::eventually("the permits to expire", || async {
            held(app).await.iter().all(|(_, held, _, _)| *held == Some(0))
        })
        .await;
    } else {
        app.advance(2_000_000);
        assert_eq!(
            held(app).await,
            [("acme".into(), Some(0), 3, 2), ("beta".into(), Some(0), 3, 1)]
        );
    }
}
}

//! Policies of several windows through the real API, the same scenario on the embedded store, a
//! real Redis and a real Redis Cluster: a request needs room in every window, a denial by one
//! spends from none, the answer names the deciding window, the headers list every window, and
//! the counters keep their layout (one window: as before; several: one key per period, in one
//! Cluster slot).

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{header, json_of, remaining, spawn_app_in, test_settings, TestApp};
use crate::redis_server::RedisServer;
use crate::stores::{on_stores, spawn_on, Backend, OnStore, Store};

/// Sliding logs (rolling: real time during the test cannot cross a boundary), minutes and hours
/// (Redis reads its own clock). `short` is decided by its minute, `long` by its hour.
const POLICIES: &str = "
policies:
  - {name: short, key: [user], algorithm: sliding_log, failure_mode: closed, limits: [{limit: 2, period: 1m}, {limit: 3, period: 1h}]}
  - {name: long, key: [user], algorithm: sliding_log, failure_mode: closed, limits: [{limit: 4, period: 1m}, {limit: 3, period: 1h}]}
  - {name: single, key: [user], algorithm: sliding_log, limit: 5, period: 1h, failure_mode: closed}
";

fn body(policy: &str, user: &str, cost: u64) -> Value {
    json!({"policy": policy, "descriptors": {"user": user}, "cost": cost})
}

/// Every window's remaining units, from explain (spends nothing).
async fn windows(app: &TestApp, policy: &str, user: &str) -> Vec<u64> {
    let reply = crate::helpers::post(
        &sluice::client::Target::Tcp(app.admin),
        "/v1/explain",
        body(policy, user, 1).to_string().into_bytes(),
    )
    .await;
    let explained = json_of(&reply);
    let part = explained["policies"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["policy"] == policy))
        .unwrap_or_else(|| panic!("{policy} explained: {explained}"))
        .clone();
    part["windows"]
        .as_array()
        .unwrap_or_else(|| panic!("windows of {policy}: {part}"))
        .iter()
        .map(|w| {
            // Explain answers for a request of cost 1: add it back when it would pass.
            let left = w["remaining"].as_u64().expect("remaining");
            left + u64::from(w["allowed"] == true)
        })
        .collect()
}

/// The scenario every store must pass.
async fn scenario(app: &TestApp) {
    // `short`: the minute (2) runs out first. A denied request spends from neither window.
    for _ in 0..2 {
        assert_eq!(app.check_tcp(&body("short", "u", 1)).await.status, 200);
    }
    let denied = app.check_tcp(&body("short", "u", 1)).await;
    assert_eq!(denied.status, 429);
    let answer = json_of(&denied);
    assert_eq!(
        (answer["policy"].clone(), answer["window"].clone()),
        (json!("short"), json!(0))
    );
    assert_eq!(answer["limit"], 2);
    assert!(
        answer["retry_after_ms"].as_u64().expect("retry") <= 60_000,
        "{answer}"
    );
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        "\"short/1m\";q=2;w=60, \"short/1h\";q=3;w=3600"
    );
    assert_eq!(header(&denied, "ratelimit"), "\"short/1m\";r=0;t=60");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "2");
    assert_eq!(
        windows(app, "short", "u").await,
        [0, 1],
        "the hour spent 2 of 3, not 3"
    );

    // `long`: the hour (3) runs out while the minute (4) has room. A request of cost 2 that
    // only one window could take is denied and spends from neither.
    assert_eq!(remaining(&app.check_tcp(&body("long", "u", 2)).await), 1);
    let too_big = app.check_tcp(&body("long", "u", 2)).await;
    assert_eq!(too_big.status, 429);
    assert_eq!(json_of(&too_big)["window"], 1);
    assert_eq!(windows(app, "long", "u").await, [2, 1]);
    let last = app.check_tcp(&body("long", "u", 1)).await;
    assert_eq!(
        (last.status.as_u16(), json_of(&last)["window"].clone()),
        (200, json!(1))
    );
    assert_eq!(header(&last, "ratelimit"), "\"long/1h\";r=0;t=3600");
    let over = json_of(&app.check_tcp(&body("long", "u", 1)).await);
    assert_eq!(
        (over["allowed"].clone(), over["window"].clone()),
        (json!(false), json!(1))
    );
    assert!(
        over["retry_after_ms"].as_u64().expect("retry") > 3_000_000,
        "{over}"
    );
    assert_eq!(windows(app, "long", "u").await, [1, 0]);

    // Another partition is untouched; a policy of one window answers as it always did.
    assert_eq!(windows(app, "short", "v").await, [2, 3]);
    let single = app.check_tcp(&body("single", "u", 1)).await;
    assert_eq!(json_of(&single).get("window"), None);
    assert_eq!(header(&single, "ratelimit-policy"), "\"single\";q=5;w=3600");
    // A cost beyond the smallest window is a 400, whatever the larger ones allow.
    let refused = app.check_tcp(&body("short", "w", 3)).await;
    assert_eq!(refused.status, 400);
    assert_eq!(json_of(&refused)["error"], "cost_exceeds_limit");
}

fn keys(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).expect("KEYS");
    keys.sort();
    keys
}

async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, POLICIES, prefix).await
}

on_stores! {
/// The scenario, then what each store keeps: the policy dump (embedded), one key per period
/// (Redis), both windows of a partition in one slot (Cluster).
async fn several_windows(app: &OnStore<TestApp>) via spawn, on [memory, redis, cluster] {
    scenario(app).await;
    let p = &app.prefix;
    match &app.store {
        Store::Memory => {
            // The policy dump shows the windows as written.
            let dump = json_of(&app.admin_get("/v1/policies").await);
            let short = dump["policies"]
                .as_array()
                .and_then(|all| all.iter().find(|p| p["name"] == "short"))
                .expect("short")
                .clone();
            assert_eq!(
                short["limits"],
                json!([{"limit": 2, "period": "1m"}, {"limit": 3, "period": "1h"}])
            );
        }
        Store::Redis(redis) => {
            let mut conn = redis.connection();
            assert_eq!(
                keys(&mut conn, &format!("{p}:{{short:u}}*")),
                [format!("{p}:{{short:u}}:1h"), format!("{p}:{{short:u}}:1m")],
                "one counter per window, named by its period"
            );
            assert_eq!(
                keys(&mut conn, &format!("{p}:{{single:*")),
                [format!("{p}:{{single:u}}")],
                "one window: the layout of before"
            );
        }
        Store::Cluster(cluster) => {
            // Both windows of a partition live on one node (one slot): one atomic script call.
            let mut nodes = cluster.connections();
            let holders: Vec<Vec<String>> = nodes
                .iter_mut()
                .map(|conn| keys(conn, &format!("{p}:{{long:u}}*")))
                .filter(|found| !found.is_empty())
                .collect();
            assert_eq!(
                holders,
                [vec![
                    format!("{p}:{{long:u}}:1h"),
                    format!("{p}:{{long:u}}:1m")
                ]]
            );
        }
    }
}
}

/// Random costs on policies of two windows, asked of the embedded store and of Redis side by
/// side and held to the model: a request passes if and only if both windows have room for its
/// cost, and then spends from both; otherwise from neither, and the window that decided had no
/// room. Sliding logs of a minute and an hour, so the seconds the test takes expire nothing;
/// `minute` runs out in its minute first, `hour` in its hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_and_redis_agree_with_the_all_or_nothing_model() {
    const DIFF: &str = "
policies:
  - {name: single, key: [user], algorithm: sliding_log, limit: 5, period: 1h}
  - {name: minute, key: [user], algorithm: sliding_log, limits: [{limit: 7, period: 1m}, {limit: 11, period: 1h}]}
  - {name: hour, key: [user], algorithm: sliding_log, limits: [{limit: 11, period: 1m}, {limit: 7, period: 1h}]}
";
    let redis = RedisServer::start();
    let embedded = crate::helpers::spawn_app_with(DIFF).await;
    let shared = {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = test_settings(dir.path());
        settings.redis.url = Some(redis.url());
        settings.redis.timeout = HumanDuration(2_000_000);
        // Store against store: the local layer would answer repeated denials with the figures
        // of the first (a denial all the same, but `remaining` as it was then).
        settings.local_layer.enabled = false;
        let app = spawn_app_in(dir, settings, DIFF).await;
        app.wait_for_store().await;
        app
    };
    let mut denials_by = [0, 0];
    for seed in 1..=6u64 {
        let user = format!("user-{seed}");
        let (policy, limits) = if seed % 2 == 0 {
            ("minute", [7, 11])
        } else {
            ("hour", [11, 7])
        };
        let mut state = seed;
        let mut spent = [0u64; 2];
        for step in 0..24 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let cost = 1 + (state >> 33) % 4;
            let fits = |w: usize| spent[w] + cost <= limits[w];
            let model = fits(0) && fits(1);
            let request = json!({"policy": policy, "descriptors": {"user": user}, "cost": cost});
            let answers = [
                json_of(&embedded.check_tcp(&request).await),
                json_of(&shared.check_tcp(&request).await),
            ];
            for answer in &answers {
                assert_eq!(
                    answer["allowed"], model,
                    "seed {seed} step {step} cost {cost} spent {spent:?}: {answer}"
                );
            }
            let figures = |a: &Value| {
                (
                    a["window"].clone(),
                    a["remaining"].clone(),
                    a["limit"].clone(),
                )
            };
            assert_eq!(
                figures(&answers[0]),
                figures(&answers[1]),
                "seed {seed} step {step}"
            );
            if model {
                spent = [spent[0] + cost, spent[1] + cost];
            } else {
                let window = answers[0]["window"].as_u64().expect("a window decided") as usize;
                assert!(!fits(window), "window {window} had room: {}", answers[0]);
                denials_by[window] += 1;
            }
        }
    }
    println!("denials by window (minute, hour): {denials_by:?}");
    assert!(
        denials_by.iter().all(|&n| n > 0),
        "each window decided at least once"
    );
}

//! `/v1/counters` on the admin listener: a partition's counter seen without spending and reset,
//! on the embedded store and on Redis (single, Cluster, Sentinel); a reset on one daemon clears
//! the remembered denial of another daemon's local layer (through the reset channel), also after
//! Redis restarted under them.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use axum::http::Method;
use serde_json::{json, Value};
use sluice::client::{self, counters_path, Reply, Target};
use sluice::config::HumanDuration;
use sluice::limit::Descriptors;

use crate::helpers::{
    assert_error, json_of, metric_value, post, sluice_command, spawn_app_in, spawn_app_with,
    test_settings, ChildGuard, TestApp,
};
use crate::redis_server::{RedisCluster, RedisServer};
use crate::stores::{on_stores, spawn_on, Backend, OnStore};
use crate::wait::{eventually, wait_enforced, wait_for_store};

/// 3 per hour: a denial is remembered for up to an hour, far longer than any test runs.
const POLICIES: &str = "
policies:
  - {name: login, key: [ip], algorithm: sliding_log, limit: 3, period: 1h, failure_mode: closed}
  - {name: api, key: [tenant], algorithm: token_bucket, limit: 10, period: 1m, burst: 5, tiers: {descriptor: tier, levels: {gold: {limit: 100, burst: 50}}}}
";

fn ip(value: &str) -> Descriptors {
    [("ip".to_owned(), value.to_owned())].into_iter().collect()
}

async fn request(target: &Target, method: Method, path: &str, body: Option<Vec<u8>>) -> Reply {
    client::request(target, method.clone(), path, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {target}: {e}"))
}

/// `GET /v1/counters` for `login` and `ip`, which must answer 200.
async fn show(admin: &Target, address: &str) -> Value {
    let reply = request(
        admin,
        Method::GET,
        &counters_path("login", &ip(address), None),
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", json_of(&reply));
    json_of(&reply)
}

/// `DELETE /v1/counters` for `login` and `ip`, which must answer 200.
async fn reset(admin: &Target, address: &str) -> Value {
    let path = counters_path("login", &ip(address), None);
    let reply = request(admin, Method::DELETE, &path, None).await;
    assert_eq!(reply.status, 200, "{}", json_of(&reply));
    json_of(&reply)
}

async fn login(check: &Target, address: &str) -> Reply {
    let body = json!({"policy": "login", "descriptors": {"ip": address}});
    post(check, "/v1/check", body.to_string().into_bytes()).await
}

#[tokio::test]
async fn embedded_counters_are_seen_without_spending_and_reset() {
    let app = spawn_app_with(POLICIES).await;
    let admin = Target::Tcp(app.admin);
    for _ in 0..3 {
        let fresh = show(&admin, "192.0.2.1").await;
        assert_eq!(
            (
                &fresh["remaining"],
                &fresh["limit"],
                &fresh["reset_after_ms"]
            ),
            (&json!(3), &json!(3), &json!(0)),
            "never seen: a full quota, and looking spends nothing: {fresh}"
        );
    }
    let fresh = show(&admin, "192.0.2.1").await;
    assert_eq!(fresh["key"], "login:192.0.2.1");
    assert_eq!(fresh["store"], "memory");
    assert_eq!(fresh["period_ms"], 3_600_000);
    assert!(fresh["windows"].is_null(), "one counter: {fresh}");
    assert_eq!(
        (&fresh["allowed"], &fresh["retry_after_ms"]),
        (&json!(true), &json!(0))
    );

    for _ in 0..3 {
        assert_eq!(login(&app.tcp, "192.0.2.1").await.status, 200);
    }
    assert_eq!(login(&app.tcp, "192.0.2.1").await.status, 429);
    app.advance(60_000_000);
    let blocked = show(&admin, "192.0.2.1").await;
    assert_eq!(
        (&blocked["remaining"], &blocked["allowed"]),
        (&json!(0), &json!(false))
    );
    assert_eq!(blocked["retry_after_ms"], 3_540_000, "{blocked}");
    assert_eq!(blocked["reset_after_ms"], 3_540_000, "{blocked}");

    let report = reset(&admin, "192.0.2.1").await;
    assert_eq!(
        (&report["existed"], &report["fleet"], &report["keys"]),
        (&json!(true), &json!("alone"), &json!(["login:192.0.2.1"]))
    );
    let reply = login(&app.tcp, "192.0.2.1").await;
    assert_eq!(reply.status, 200, "the next request sees a full quota");
    assert_eq!(json_of(&reply)["remaining"], 2);
    let again = reset(&admin, "192.0.2.99").await;
    assert_eq!(again["existed"], false, "nothing to reset: {again}");
    let metrics = app.metrics().await;
    let resets = |policy| {
        metric_value(
            &metrics,
            "sluice_counter_resets_total",
            &[("policy", policy)],
        )
    };
    assert_eq!((resets("login"), resets("api")), (2.0, 0.0));

    // The tier and cost the check API would use.
    let gold: Descriptors = [("tenant", "acme"), ("tier", "gold")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let path = counters_path("api", &gold, Some(60));
    let reason = assert_error(
        &request(&admin, Method::GET, &path, None).await,
        400,
        "cost_exceeds_limit",
    );
    assert!(reason.contains("(50)"), "the gold burst: {reason}");
    let path = counters_path("api", &gold, Some(20));
    let tiered = json_of(&request(&admin, Method::GET, &path, None).await);
    assert_eq!(
        (&tiered["tier"], &tiered["limit"], &tiered["remaining"]),
        (&json!("gold"), &json!(50), &json!(50)),
        "{tiered}"
    );
    assert_eq!(
        (&tiered["cost"], &tiered["allowed"]),
        (&json!(20), &json!(true))
    );
}

async fn spawn(backend: Backend, prefix: &str) -> OnStore<TestApp> {
    spawn_on(backend, POLICIES, prefix).await
}

on_stores! {
async fn bad_counter_questions_are_refused_with_a_reason(app: &TestApp)
    via spawn, on [memory, redis, cluster]
{
    let admin = Target::Tcp(app.admin);
    let get = |path: &'static str| {
        let admin = admin.clone();
        async move { request(&admin, Method::GET, path, None).await }
    };
    let reason = assert_error(&get("/v1/counters").await, 400, "bad_request");
    assert!(reason.contains("policy"), "{reason}");
    assert_error(
        &get("/v1/counters?policy=nope&d.ip=1").await,
        400,
        "unknown_policy",
    );
    assert_error(
        &get("/v1/counters?policy=login").await,
        400,
        "missing_descriptor",
    );
    assert_error(
        &get("/v1/counters?policy=login&d.ip=1&cost=0").await,
        400,
        "bad_request",
    );
    assert_error(
        &get("/v1/counters?policy=login&d.ip=1&cost=4").await,
        400,
        "cost_exceeds_limit",
    );
    assert_error(
        &get("/v1/counters?policy=login&ip=1").await,
        400,
        "bad_request",
    );
    assert_error(
        &get("/v1/counters?policy=login&d.ip=1&d.ip=2").await,
        400,
        "bad_request",
    );
    assert_error(
        &get("/v1/counters?policy=login&d.bad%20name=1").await,
        400,
        "bad_request",
    );
    let long = format!("/v1/counters?policy=login&d.ip={}", "x".repeat(300));
    assert_error(
        &request(&admin, Method::GET, &long, None).await,
        400,
        "bad_request",
    );
    let body = json!({"policy": "login", "descriptors": {"ip": "1"}}).to_string();
    let reason = assert_error(
        &request(
            &admin,
            Method::DELETE,
            "/v1/counters?policy=login&d.ip=1",
            Some(body.into_bytes()),
        )
        .await,
        400,
        "bad_request",
    );
    assert!(reason.contains("query string"), "{reason}");
    assert_error(
        &request(
            &admin,
            Method::DELETE,
            "/v1/counters?policy=login&d.ip=1&cost=1",
            None,
        )
        .await,
        400,
        "bad_request",
    );
    assert_error(
        &request(
            &admin,
            Method::POST,
            "/v1/counters?policy=login&d.ip=1",
            None,
        )
        .await,
        405,
        "method_not_allowed",
    );
    // Nothing was reset by any of them.
    let metrics = app.metrics().await;
    let resets = metric_value(
        &metrics,
        "sluice_counter_resets_total",
        &[("policy", "login")],
    );
    assert_eq!(resets, 0.0);

    // Resets turned off: refused (seeing still works).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.listen.admin_resets = sluice::config::AdminResets::Off;
    let app = spawn_app_in(dir, settings, POLICIES).await;
    let admin = Target::Tcp(app.admin);
    let path = "/v1/counters?policy=login&d.ip=1";
    let reason = assert_error(
        &request(&admin, Method::DELETE, path, None).await,
        403,
        "forbidden",
    );
    assert!(reason.contains("listen.admin_resets"), "{reason}");
    assert_eq!(request(&admin, Method::GET, path, None).await.status, 200);
}
}

/// Where a daemon answers: its check API and its admin listener.
struct Pod {
    check: Target,
    admin: Target,
}

impl Pod {
    fn of(app: &TestApp) -> Self {
        Self {
            check: app.tcp.clone(),
            admin: Target::Tcp(app.admin),
        }
    }
}

/// Waits (bounded) until `count()` reaches `n`.
async fn wait_count(what: &str, n: usize, mut count: impl FnMut() -> usize) {
    eventually(&format!("{what}: fewer than {n}"), || {
        let enough = count() >= n;
        async move { enough }
    })
    .await;
}

/// The whole story on two daemons sharing Redis: `b` denies `address` from its local layer;
/// `a` resets the counter; `b` forgets and admits again. `exists` says whether Redis holds a key.
async fn reset_reaches_the_other_daemon(
    a: &Pod,
    b: &Pod,
    address: &str,
    exists: impl Fn(&str) -> bool + Copy,
) {
    let fresh = show(&a.admin, address).await;
    let key = fresh["key"].as_str().expect("key").to_owned();
    assert_eq!(key, format!("rl:{{login:{address}}}"));
    assert_eq!(
        (&fresh["remaining"], &fresh["store"]),
        (&json!(3), &json!("redis"))
    );
    assert!(!exists(&key), "looking wrote nothing");

    for _ in 0..3 {
        assert_eq!(login(&b.check, address).await.status, 200);
    }
    assert_eq!(login(&b.check, address).await.status, 429);
    let on_b = show(&b.admin, address).await;
    assert!(
        on_b["local_layer_retry_after_ms"].as_u64() > Some(3_000_000),
        "b remembers the denial: {on_b}"
    );
    let on_a = show(&a.admin, address).await;
    assert_eq!(on_a["allowed"], false, "{on_a}");
    assert!(on_a["local_layer_retry_after_ms"].is_null(), "{on_a}");
    assert!(exists(&key));

    let report = reset(&a.admin, address).await;
    assert_eq!(
        (&report["existed"], &report["fleet"]),
        (&json!(true), &json!("announced")),
        "{report}"
    );
    assert!(!exists(&key), "the key is gone");
    eventually(
        "b hears of the reset (it would deny for an hour)",
        || async move { show(&b.admin, address).await["local_layer_retry_after_ms"].is_null() },
    )
    .await;
    let reply = login(&b.check, address).await;
    assert_eq!(reply.status, 200, "{}", json_of(&reply));
    assert_eq!(json_of(&reply)["remaining"], 2);
}

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::redis_server::free_port()))
}

/// A `sluice serve` process on `redis_url`, its log in `<dir>/sluice-<index>.log`.
fn serve(dir: &Path, index: usize, redis_url: &str) -> (ChildGuard, Pod) {
    let (http, admin) = (free_addr(), free_addr());
    let settings = dir.join(format!("sluice-{index}.toml"));
    let text = format!(
        "policies = {policies:?}\n[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\nsocket = \"\"\n\
         [redis]\nurl = \"{redis_url}\"\ntimeout = \"2s\"\n[log]\nlevel = \"warn\"\nformat = \"json\"\n",
        policies = dir.join("policies.yaml").display().to_string(),
    );
    std::fs::write(&settings, text).expect("write settings");
    let log = std::fs::File::create(dir.join(format!("sluice-{index}.log"))).expect("log file");
    let child = sluice_command(dir, &["serve", "--config", &settings.display().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn sluice serve");
    let pod = Pod {
        check: Target::Tcp(http),
        admin: Target::Tcp(admin),
    };
    (ChildGuard(Some(child)), pod)
}

/// Subscribers of the reset channel (on this node).
pub(crate) fn numsub(conn: &mut redis::Connection) -> usize {
    let reply: (String, usize) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("rl:resets")
        .query(conn)
        .unwrap_or_default();
    reply.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_on_one_daemon_clears_another_daemons_local_layer_also_after_redis_restarts() {
    let mut redis = RedisServer::start();
    let port = redis.port;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write policies");
    let (_a_process, a) = serve(dir.path(), 0, &redis.url());
    let (_b_process, b) = serve(dir.path(), 1, &redis.url());
    let exists = |key: &str| -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query(&mut redis_conn(port))
            .expect("EXISTS")
    };
    let probe = json!({"policy": "login", "descriptors": {"ip": "probe"}});
    for pod in [&a, &b] {
        wait_for_store(&pod.admin).await;
    }
    wait_count("subscribers", 2, || numsub(&mut redis_conn(port))).await;
    reset_reaches_the_other_daemon(&a, &b, "203.0.113.7", exists).await;
    let log = std::fs::read_to_string(dir.path().join("sluice-0.log")).expect("a's log");
    let line: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "counter reset by an operator")
        .unwrap_or_else(|| panic!("the reset is logged: {log}"));
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["policy"], "login", "{line}");
    assert!(
        line["requested_by"]
            .as_str()
            .is_some_and(|peer| peer.starts_with("127.0.0.1:")),
        "who asked: {line}"
    );
    assert!(
        !line.to_string().contains("203.0.113.7"),
        "the raw partition is for debug: {line}"
    );

    // Redis restarts (empty): both daemons subscribe again by themselves.
    redis.restart();
    for pod in [&a, &b] {
        wait_enforced(&pod.check, &probe).await;
    }
    wait_count("subscribers after the restart", 2, || {
        numsub(&mut redis_conn(port))
    })
    .await;
    reset_reaches_the_other_daemon(&a, &b, "203.0.113.8", exists).await;
}

fn redis_conn(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect to test redis")
}

/// Two daemons in this process on the Redis `configure` sets up.
async fn two_daemons(
    configure: impl Fn(&mut sluice::config::Settings, usize),
) -> (TestApp, TestApp) {
    let spawn = |index| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = test_settings(dir.path());
        settings.redis.timeout = HumanDuration(2_000_000);
        configure(&mut settings, index);
        spawn_app_in(dir, settings, POLICIES)
    };
    let a = spawn(0).await;
    let b = spawn(1).await;
    for app in [&a, &b] {
        app.wait_for_store().await;
    }
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_resets_reach_daemons_subscribed_to_other_nodes() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    // Each daemon subscribes to its first seed node: different nodes, so the announcement must
    // cross the cluster bus for at least one of them.
    let (a, b) = two_daemons(|settings, index| {
        let mut seeds = urls.clone();
        seeds.rotate_left(index);
        settings.redis.cluster = seeds;
    })
    .await;
    let mut nodes = cluster.connections();
    wait_count("subscribers", 2, || nodes.iter_mut().map(numsub).sum()).await;
    let exists = |key: &str| {
        cluster.connections().iter_mut().any(|conn| {
            // A node that does not own the key's slot answers MOVED: not here.
            redis::cmd("EXISTS")
                .arg(key)
                .query::<bool>(conn)
                .unwrap_or(false)
        })
    };
    reset_reaches_the_other_daemon(&Pod::of(&a), &Pod::of(&b), "198.51.100.1", exists).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_resets_go_to_the_primary_the_sentinels_name() {
    let primary = RedisServer::start();
    let (_sentinel, port, _dir) = crate::redis::sentinel_of(&primary);
    let (a, b) = two_daemons(|settings, _| {
        settings.redis.sentinel.nodes = vec![format!("redis://127.0.0.1:{port}")];
        settings.redis.sentinel.master = "mymaster".into();
    })
    .await;
    wait_count("subscribers", 2, || numsub(&mut primary.connection())).await;
    let exists = |key: &str| {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<bool>(&mut primary.connection())
            .expect("EXISTS")
    };
    reset_reaches_the_other_daemon(&Pod::of(&a), &Pod::of(&b), "198.51.100.2", exists).await;
}

//! Redis failures through the real API, with real `redis-server` (and Sentinel) processes: every
//! check is answered, by the policy's failure mode while Redis cannot answer, and the daemon
//! recovers by itself. Detection and recovery times are printed (`--nocapture`) for the record;
//! the asserted bounds are loose, since CI machines are small and shared.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{json_of, metric_value, spawn_app_in, test_settings, TestApp};
use crate::redis_server::{spawn_sentinel, RedisServer};

const POLICIES: &str = "
policies:
  - {name: api, key: [api_key], algorithm: fixed_window, limit: 1000000, period: 1h, failure_mode: open}
  - {name: login, key: [ip], algorithm: sliding_log, limit: 1000, period: 1h, failure_mode: closed}
  - {name: shared, key: [user], algorithm: fixed_window, limit: 8, period: 1h, failure_mode: local}
";

/// The deadline of a check's Redis calls in these tests.
const DEADLINE: Duration = Duration::from_millis(50);
/// What a check may take beyond its deadline on a small, busy CI machine (debug build).
const SLACK: Duration = Duration::from_millis(400);
/// Longest wait for a state to be reached. Real Sentinels demote a restarted old primary only
/// after they see it again and it has resynced: once in a full parallel suite on two cores that
/// took over 20 s, so the bound is 40 s (a wait, not a figure: the test asserts no timing).
const WAIT: Duration = Duration::from_secs(40);
/// How long a returning old primary may take to become a replica in sync (see its use).
const RESYNC_WAIT: Duration = Duration::from_secs(60);

enum Redis<'a> {
    Url(String),
    Sentinel(&'a [u16]),
}

async fn spawn(redis: Redis<'_>) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    match redis {
        Redis::Url(url) => settings.redis.url = Some(url),
        Redis::Sentinel(ports) => {
            settings.redis.sentinel.nodes = ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect();
            settings.redis.sentinel.master = "mymaster".into();
        }
    }
    settings.redis.timeout = HumanDuration(DEADLINE.as_micros() as u64);
    settings.redis.connect_timeout = HumanDuration(300_000);
    settings.redis.breaker.failures = 3;
    settings.redis.breaker.probe_min = HumanDuration(20_000);
    settings.redis.breaker.probe_max = HumanDuration(100_000);
    settings.local.replicas = 2;
    settings.local.margin_percent = 0;
    spawn_app_in(dir, settings, POLICIES).await
}

fn api(key: &str) -> Value {
    json!({"policy": "api", "descriptors": {"api_key": key}})
}

/// Asks the `api` policy (fails open) until its answer has `mode`; returns how long that took.
async fn wait_for_mode(app: &TestApp, mode: &str) -> Duration {
    let started = Instant::now();
    loop {
        let reply = app.check_tcp(&api("probe")).await;
        if json_of(&reply)["mode"] == mode {
            return started.elapsed();
        }
        assert!(started.elapsed() < WAIT, "never reached mode {mode}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks sent continuously in the background, each answer recorded.
struct Load {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<Vec<(u16, Value, Duration)>>,
}

fn start_load(app: &Arc<TestApp>) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let (app, flag) = (Arc::clone(app), Arc::clone(&stop));
    let handle = tokio::spawn(async move {
        let mut answers = Vec::new();
        for i in 0..20_000 {
            if flag.load(Ordering::Relaxed) {
                break;
            }
            let started = Instant::now();
            let reply = app.check_tcp(&api(&format!("load-{}", i % 50))).await;
            answers.push((
                reply.status.as_u16(),
                json_of(&reply)["mode"].clone(),
                started.elapsed(),
            ));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        answers
    });
    Load { stop, handle }
}

impl Load {
    /// Stops the load and checks that every check got a proper answer.
    async fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let answers = self.handle.await.expect("load task");
        for (status, mode, took) in &answers {
            assert_eq!(*status, 200, "the api policy fails open: {mode}");
            assert!(mode == "enforced" || mode == "fail_open", "mode {mode}");
            assert!(*took < DEADLINE + SLACK, "answered after {took:?}");
        }
        answers.len()
    }
}

async fn metric(app: &TestApp, kind: &str) -> f64 {
    metric_value(
        &app.metrics().await,
        "sluice_redis_errors_total",
        &[("kind", kind)],
    )
}

/// The three failure modes while Redis cannot answer.
async fn assert_failure_modes(app: &TestApp, user: &str) {
    let open = app.check_tcp(&api("k")).await;
    assert_eq!(open.status, 200);
    assert_eq!(json_of(&open)["mode"], "fail_open");
    // Nothing was counted: no `remaining` to tell (it said 0).
    assert_eq!(
        json_of(&open)["remaining"],
        Value::Null,
        "{}",
        json_of(&open)
    );

    let closed = app
        .check_tcp(&json!({"policy": "login", "descriptors": {"ip": "192.0.2.1"}}))
        .await;
    assert_eq!(closed.status, 503);
    assert_eq!(json_of(&closed)["error"], "limiter_unavailable");
    assert_eq!(closed.header("retry-after"), Some("1"));
    assert_eq!(json_of(&closed)["remaining"], Value::Null);

    // 8 per hour shared by 2 replicas: this pod may let 4 through on its own.
    let local = json!({"policy": "shared", "descriptors": {"user": user}});
    for i in 0..4 {
        let reply = app.check_tcp(&local).await;
        assert_eq!(reply.status, 200, "local {i}: {}", json_of(&reply));
        assert_eq!(json_of(&reply)["mode"], "local");
        assert_eq!(json_of(&reply)["limit"], 4);
        // Counted in this pod's share.
        assert_eq!(json_of(&reply)["remaining"], 3 - i);
    }
    let over = app.check_tcp(&local).await;
    assert_eq!(over.status, 429);
    assert_eq!(json_of(&over)["mode"], "local");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_absent_at_start_then_started() {
    let mut server = RedisServer::stopped(RedisServer::free_port(), &[]);
    let app = spawn(Redis::Url(server.url())).await;
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "open");
    assert_eq!(
        app.admin_get("/readyz").await.status,
        200,
        "ready without Redis"
    );

    let started = Instant::now();
    assert_failure_modes(&app, "u-absent").await;
    let per_check = started.elapsed() / 7;
    println!("absent at start: a degraded check took {per_check:?} on average");
    assert!(
        per_check < DEADLINE,
        "the open circuit skips Redis: {per_check:?}"
    );

    server.restart();
    let recovered = wait_for_mode(&app, "enforced").await;
    println!("absent at start: Redis started, checks enforced after {recovered:?}");
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_shutdown_mid_traffic_then_restart_on_the_same_port() {
    let mut server = RedisServer::start();
    let app = Arc::new(spawn(Redis::Url(server.url())).await);
    wait_for_mode(&app, "enforced").await;
    let exhaust = json!({"policy": "shared", "descriptors": {"user": "z"}});
    for _ in 0..8 {
        assert_eq!(app.check_tcp(&exhaust).await.status, 200);
    }
    assert_eq!(app.check_tcp(&exhaust).await.status, 429);

    for how in ["kill -9", "SHUTDOWN"] {
        let load = start_load(&app);
        tokio::time::sleep(Duration::from_millis(100)).await;
        if how == "kill -9" {
            server.kill();
        } else {
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
                .arg("NOSAVE")
                .query(&mut server.connection());
            server.wait_exit();
        }
        let detected = wait_for_mode(&app, "fail_open").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.restart();
        let recovered = wait_for_mode(&app, "enforced").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answered = load.finish().await;
        println!("{how}: detected after {detected:?}, recovered {recovered:?} after restart; {answered} checks under load all answered");
    }
    // Counters lost with the data are fresh state, never negative.
    let fresh = json_of(&app.check_tcp(&exhaust).await);
    assert_eq!(fresh["mode"], "enforced");
    assert_eq!(fresh["remaining"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_is_answered_within_the_deadline_and_recovers_aligned() {
    let server = RedisServer::start();
    let app = Arc::new(spawn(Redis::Url(server.url())).await);
    wait_for_mode(&app, "enforced").await;

    server.signal("STOP");
    let mut slowest = Duration::ZERO;
    for i in 0..6 {
        let started = Instant::now();
        let reply = app.check_tcp(&api(&format!("hung-{i}"))).await;
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert_eq!(json_of(&reply)["mode"], "fail_open");
        assert!(took < DEADLINE + SLACK, "check {i} took {took:?}");
    }
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "open");
    let mut concurrent = tokio::task::JoinSet::new();
    for i in 0..20 {
        let app = Arc::clone(&app);
        concurrent.spawn(async move {
            let started = Instant::now();
            let reply = app.check_tcp(&api(&format!("c-{i}"))).await;
            (json_of(&reply)["mode"].clone(), started.elapsed())
        });
    }
    let mut open_slowest = Duration::ZERO;
    while let Some(answer) = concurrent.join_next().await {
        let (mode, took) = answer.expect("check");
        assert_eq!(mode, "fail_open");
        open_slowest = open_slowest.max(took);
    }
    println!("hung Redis: slowest check while detecting {slowest:?}; with the circuit open, slowest of 20 concurrent {open_slowest:?}");

    server.signal("CONT");
    let recovered = wait_for_mode(&app, "enforced").await;
    println!("hung Redis: resumed, checks enforced after {recovered:?}");
    // Replies stay aligned: a fresh counter counts down exactly.
    let fresh = json!({"policy": "shared", "descriptors": {"user": "after-hang"}});
    for expected in (0..8).rev() {
        let reply = json_of(&app.check_tcp(&fresh).await);
        assert_eq!(reply["mode"], "enforced");
        assert_eq!(reply["remaining"], expected, "{reply}");
    }
    assert!(metric(&app, "deadline").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demoted_primary_then_promoted_recovers_within_a_second() {
    let primary = RedisServer::start();
    let other = RedisServer::start();
    let app = spawn(Redis::Url(primary.url())).await;
    wait_for_mode(&app, "enforced").await;

    let mut admin = primary.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut admin)
        .expect("REPLICAOF");
    let detected = wait_for_mode(&app, "fail_open").await;
    assert!(metric(&app, "readonly").await >= 1.0, "READONLY counted");
    assert_failure_modes(&app, "u-demoted").await;

    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut admin)
        .expect("REPLICAOF NO ONE");
    let recovered = wait_for_mode(&app, "enforced").await;
    println!("demoted primary: detected after {detected:?}; promoted again, enforced after {recovered:?}");
    assert!(
        recovered < Duration::from_secs(1),
        "recovery took {recovered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_busy_and_auth_errors_are_counted_and_failure_modes_apply() {
    let server = RedisServer::start();
    let app = spawn(Redis::Url(server.url())).await;
    wait_for_mode(&app, "enforced").await;
    let mut admin = server.connection();

    // Out of memory with noeviction: writes are refused.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut admin)
        .expect("config");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut admin)
        .expect("config");
    wait_for_mode(&app, "fail_open").await;
    assert!(metric(&app, "oom").await >= 1.0, "OOM counted");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut admin)
        .expect("config");
    wait_for_mode(&app, "enforced").await;

    // A script that never ends: Redis answers BUSY to everyone else until it is killed.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg(20)
        .query(&mut admin)
        .expect("config");
    let mut blocker = server.connection();
    let busy = std::thread::spawn(move || {
        let _: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query(&mut blocker);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    wait_for_mode(&app, "fail_open").await;
    let mut killer = server.connection();
    let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("KILL").query(&mut killer);
    busy.join().expect("blocker thread");
    wait_for_mode(&app, "enforced").await;
    let busy_or_timeout = metric(&app, "busy").await + metric(&app, "deadline").await;
    assert!(
        busy_or_timeout >= 1.0,
        "BUSY (or the deadline it causes) counted"
    );

    // A server that wants a password: NOAUTH without one, WRONGPASS with a wrong one.
    let locked = RedisServer::start_with(&["--requirepass", "s3cret"]);
    for url in [
        locked.url(),
        format!("redis://:wrong@127.0.0.1:{}", locked.port),
    ] {
        let app = spawn(Redis::Url(url)).await;
        crate::wait::until("auth errors counted", WAIT, || async {
            if metric(&app, "auth").await >= 1.0 {
                return Ok(());
            }
            let metrics = app.metrics().await;
            let errors: Vec<String> = metrics
                .lines()
                .filter(|l| l.starts_with("sluice_redis_errors_total"))
                .map(str::to_owned)
                .collect();
            Err(errors)
        })
        .await;
        assert_failure_modes(&app, "u-auth").await;
    }
}

/// Sentinel: 1 primary, 1 replica, 3 Sentinels; `kill -9` the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_moves_checks_to_the_new_primary() {
    const DOWN_AFTER_MS: u64 = 1_000;
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    wait_for(
        || info(&replica, "replication").contains("master_link_status:up"),
        "replica in sync",
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let ports: Vec<u16> = (0..3).map(|_| RedisServer::free_port()).collect();
    let mut sentinels = Vec::new();
    for port in &ports {
        let conf = dir.path().join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel monitor mymaster 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds mymaster {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout mymaster 5000\nsentinel parallel-syncs mymaster 1\n",
                primary.port,
                dir = dir.path().display(),
            ),
        )
        .expect("sentinel conf");
        sentinels.push(crate::helpers::ChildGuard(Some(spawn_sentinel(&conf))));
    }
    let sentinel_query = |port: u16, args: &[&str]| -> Option<redis::Value> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(300))
            .ok()?;
        redis::cmd("SENTINEL").arg(args).query(&mut conn).ok()
    };
    let count = |value: Option<redis::Value>| match value {
        Some(redis::Value::Array(items)) => items.len(),
        _ => 0,
    };
    wait_for(
        || {
            ports.iter().all(|p| {
                count(sentinel_query(*p, &["SENTINELS", "mymaster"])) == 2
                    && count(sentinel_query(*p, &["REPLICAS", "mymaster"])) == 1
            })
        },
        "sentinels see each other and the replica",
    );

    let app = Arc::new(spawn(Redis::Sentinel(&ports)).await);
    wait_for_mode(&app, "enforced").await;
    let load = start_load(&app);
    tokio::time::sleep(Duration::from_millis(100)).await;

    primary.kill();
    let killed = Instant::now();
    wait_for_mode(&app, "fail_open").await;
    let detected = killed.elapsed();
    wait_for_mode(&app, "enforced").await;
    let moved = killed.elapsed();
    let answered = load.finish().await;
    println!("sentinel failover: detected after {detected:?}, checks on the new primary {moved:?} after kill -9 (down-after {DOWN_AFTER_MS} ms); {answered} checks under load all answered");
    assert!(
        moved < Duration::from_millis(DOWN_AFTER_MS) + Duration::from_secs(10),
        "{moved:?}"
    );
    assert!(
        info(&replica, "replication").contains("role:master"),
        "the replica was promoted"
    );

    // The old primary comes back (empty, still calling itself primary for a moment): no check
    // may be written to it.
    primary.restart();
    for i in 0..20 {
        let reply = json_of(&app.check_tcp(&api(&format!("after-{i}"))).await);
        assert_eq!(reply["mode"], "enforced");
    }
    let stats = info(&primary, "commandstats");
    assert!(
        !stats.contains("cmdstat_evalsha") && !stats.contains("cmdstat_eval:"),
        "{stats}"
    );

    // A planned failover with no traffic at all: the daemon hears the Sentinels' +switch-master
    // and reconnects before the next check, which is then enforced on its first try (without
    // the announcement it would first hit the demoted primary and fail open).
    // Sentinel turns the returning primary into a replica on its 10 s INFO period, then the
    // replica syncs in full. Under a whole parallel test run Sentinel sometimes did not do it
    // within 90 s (no sluice process is involved in this); if it has not within WAIT, the test
    // sends the REPLICAOF Sentinel would have sent, so that the planned failover below starts
    // from the state it needs.
    let in_sync = || info(&primary, "replication").contains("master_link_status:up");
    let by = Instant::now() + WAIT;
    let mut synced = in_sync();
    for _ in 0..400 {
        if synced || Instant::now() >= by {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        synced = in_sync();
    }
    if !synced {
        println!(
            "Sentinel had not reconfigured the returning primary within {WAIT:?}: REPLICAOF sent"
        );
        let mut conn = primary.try_connection().expect("the old primary answers");
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(replica.port)
            .query(&mut conn)
            .expect("REPLICAOF");
    }
    crate::wait::eventually_blocking(
        "the old primary is now a replica in sync",
        RESYNC_WAIT,
        in_sync,
    );
    // A Sentinel refuses the failover (`-NOGOODSLAVE`) until its INFO period has seen the old
    // primary as a replica in sync; on a busy host that can take a few periods, so ask again
    // (any Sentinel) until one accepts it. Once one has, the others answer `-INPROGRESS`.
    wait_for(
        || {
            ports
                .iter()
                .any(|p| sentinel_query(*p, &["FAILOVER", "mymaster"]).is_some())
        },
        "a Sentinel accepted the planned failover",
    );
    wait_for(
        || {
            info(&primary, "replication").contains("role:master")
                && info(&replica, "replication").contains("role:slave")
        },
        "the planned failover completed",
    );
    let announced = Instant::now();
    loop {
        let metrics = app.metrics().await;
        // Half-open: the prober reconnected after the announcement; no traffic has closed it.
        let switched = metric_value(&metrics, "sluice_redis_circuit_state", &[]) == 3.0
            || announced.elapsed() > Duration::from_secs(3);
        if switched {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = json_of(&app.check_tcp(&api("after-switch")).await);
    assert_eq!(first["mode"], "enforced", "{first}");
}

/// `INFO section`, or nothing while the server refuses connections (restarting, resyncing after
/// a Sentinel made it a replica): the callers wait for a state, bounded.
fn info(server: &RedisServer, section: &str) -> String {
    let Ok(mut conn) = server.try_connection() else {
        return String::new();
    };
    redis::cmd("INFO")
        .arg(section)
        .query(&mut conn)
        .unwrap_or_default()
}

fn wait_for(condition: impl FnMut() -> bool, what: &str) {
    crate::wait::eventually_blocking(what, WAIT, condition);
}

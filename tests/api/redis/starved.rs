//! A starved daemon is not a Redis outage: the daemon's runtime (one worker thread) is blocked
//! past a call's deadline while a real `redis-server` answers it, so the call's timer fires late
//! with the reply already in the socket. The check gets Redis's answer and the circuit stays
//! closed. A Redis that really stops answering (`SIGSTOP`) is still found within one deadline,
//! also when the daemon was starved while it went silent (one deadline after it runs again).
//!
//! The starvation is deterministic: a task that blocks the runtime's only worker (the test body
//! runs on its own thread), not load on the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::config::HumanDuration;

use crate::helpers::{json_of, metric_value, spawn_app_in, test_settings, TestApp};
use crate::redis_server::RedisServer;

const POLICIES: &str = "
policies:
  - {name: api, key: [api_key], algorithm: fixed_window, limit: 1000000, period: 1h, failure_mode: open}
";

/// The deadline of a check's Redis calls here: long enough that the test sees the call written
/// and blocks the runtime well before it passes, on a busy machine.
const DEADLINE: Duration = Duration::from_millis(400);
/// What a check may take beyond its deadline on a small, busy CI machine (debug build).
const SLACK: Duration = Duration::from_millis(400);
/// Longest wait for a state to be reached.
const WAIT: Duration = Duration::from_secs(20);

async fn spawn(server: &RedisServer) -> Arc<TestApp> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.redis.url = Some(server.url());
    settings.redis.timeout = HumanDuration(DEADLINE.as_micros() as u64);
    // redis-rs' own reply timeout (the larger of the two) stays a backstop past the starvation.
    settings.redis.connect_timeout = HumanDuration(2_000_000);
    settings.redis.breaker.failures = 3;
    settings.redis.breaker.probe_min = HumanDuration(20_000);
    settings.redis.breaker.probe_max = HumanDuration(100_000);
    Arc::new(spawn_app_in(dir, settings, POLICIES).await)
}

fn api(key: &str) -> Value {
    json!({"policy": "api", "descriptors": {"api_key": key}})
}

async fn metric(app: &TestApp, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(&app.metrics().await, name, labels)
}

/// Asks until the answer is enforced (Redis reached, circuit closed).
async fn wait_enforced(app: &TestApp) {
    let started = Instant::now();
    while json_of(&app.check_tcp(&api("probe")).await)["mode"] != "enforced" {
        assert!(started.elapsed() < WAIT, "never enforced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends a check in the background while Redis is stopped, and returns once its call has been
/// written to Redis (counted, then a moment for the connection's writer), with the instant by
/// which it was written.
async fn check_written(
    app: &Arc<TestApp>,
    key: &str,
) -> (tokio::task::JoinHandle<(Value, Duration)>, Instant) {
    let calls = metric(app, "sluice_redis_calls_total", &[]).await;
    let (app2, body) = (Arc::clone(app), api(key));
    let check = tokio::spawn(async move {
        let started = Instant::now();
        let reply = app2.check_tcp(&body).await;
        assert_eq!(reply.status, 200, "the api policy fails open");
        (json_of(&reply), started.elapsed())
    });
    let started = Instant::now();
    while metric(app, "sluice_redis_calls_total", &[]).await <= calls {
        assert!(
            started.elapsed() < DEADLINE / 2,
            "the call was not sent in time"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    (check, Instant::now())
}

/// Blocks the runtime's only worker until `until` (the daemon is not scheduled); returns once
/// the worker is blocked.
fn starve_until(until: Instant) -> tokio::task::JoinHandle<()> {
    let (blocked, is_blocked) = std::sync::mpsc::channel();
    let handle = tokio::spawn(async move {
        let _ = blocked.send(());
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    });
    is_blocked
        .recv_timeout(WAIT)
        .expect("the worker runs the blocking task");
    handle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_starved_daemon_gets_the_reply_waiting_in_its_socket_and_keeps_the_circuit_closed() {
    let server = RedisServer::start();
    let app = spawn(&server).await;
    wait_enforced(&app).await;

    for round in 0..3 {
        server.signal("STOP");
        let (check, written) = check_written(&app, &format!("starved-{round}")).await;
        // The daemon does not run from before Redis answers until half a deadline past the
        // call's deadline (its timer fires late; the reply waits in the socket meanwhile).
        let starved = starve_until(written + DEADLINE + DEADLINE / 2);
        server.signal("CONT");
        starved.await.expect("the blocking task");
        let (answer, took) = check.await.expect("check task");
        assert_eq!(
            answer["mode"], "enforced",
            "round {round}: a healthy Redis answered, after {took:?}: {answer}"
        );
        assert_eq!(answer["remaining"], 999_999, "{answer}");
    }
    let metrics = app.metrics().await;
    assert_eq!(
        metric_value(&metrics, "sluice_redis_circuit_state", &[]),
        0.0
    );
    for kind in ["deadline", "timeout"] {
        let errors = metric_value(&metrics, "sluice_redis_errors_total", &[("kind", kind)]);
        assert_eq!(errors, 0.0, "no {kind} error on a healthy Redis");
    }
    let excused = metric_value(&metrics, "sluice_redis_deadlines_excused_total", &[]);
    println!("starved daemon: {excused} missed deadlines excused");
    assert!(excused >= 1.0, "the late timers were noticed: {excused}");
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_silent_redis_is_found_within_one_deadline_starved_or_not() {
    let server = RedisServer::start();
    let app = spawn(&server).await;
    wait_enforced(&app).await;

    // Not starved: the first check past its deadline opens the circuit.
    server.signal("STOP");
    let started = Instant::now();
    let reply = json_of(&app.check_tcp(&api("hung")).await);
    let took = started.elapsed();
    assert_eq!(reply["mode"], "fail_open", "{reply}");
    assert!(
        took >= DEADLINE,
        "answered after {took:?}, before the deadline"
    );
    // One deadline; one more only if this busy machine fired its timer over a tenth late.
    assert!(took < 2 * DEADLINE + SLACK, "answered after {took:?}");
    println!("silent Redis: found after {took:?} (deadline {DEADLINE:?})");
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "open");
    assert!(metric(&app, "sluice_redis_errors_total", &[("kind", "deadline")]).await >= 1.0);
    server.signal("CONT");
    wait_enforced(&app).await;

    // Starved across the deadline while Redis is silent: the late timer is not taken for the
    // silence; the deadline the daemon then watches on time is, and opens the circuit.
    server.signal("STOP");
    let (check, written) = check_written(&app, "hung-starved").await;
    let resumed = written + DEADLINE + DEADLINE / 2;
    starve_until(resumed).await.expect("the blocking task");
    let (answer, _) = check.await.expect("check task");
    let after = resumed.elapsed();
    assert_eq!(answer["mode"], "fail_open", "{answer}");
    assert!(
        after < 2 * DEADLINE + SLACK,
        "found {after:?} after the daemon ran again"
    );
    println!(
        "silent Redis, daemon starved across the deadline: found {after:?} after it ran again"
    );
    assert_eq!(json_of(&app.admin_get("/readyz").await)["redis"], "open");
    let late = metric(
        &app,
        "sluice_redis_deadlines_excused_total",
        &[("reason", "timer_late")],
    )
    .await;
    assert!(late >= 1.0, "the late timer was excused: {late}");
    server.signal("CONT");
    wait_enforced(&app).await;
}

//! Waiting for something the daemon does in the background, bounded: [`eventually`] polls a
//! condition a bounded number of times within a bounded time ([`eventually_blocking`] off the
//! async runtime), and [`wait_for_store`] waits until
//! a daemon's store takes calls (the Redis connection is made in the background, after start),
//! [`wait_enforced`] until a check is decided by it; [`within_one_window`] keeps a real-time
//! scenario clear of a fixed window's end.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::Method;
use serde_json::Value;
use sluice::client::{self, Target};

use crate::helpers::{ChildGuard, TestApp};

/// Longest a test waits for a background event (a connection, a reload, a subscription).
pub const WAIT: Duration = Duration::from_secs(20);

/// Pause between two looks.
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// Polls `attempt` every [`POLL_EVERY`] until it gives `Ok`, at most `within` and at most
/// `within / POLL_EVERY + 1` times; panics naming `what` and the last `Err` otherwise.
pub async fn until<T, E, F, Fut>(what: &str, within: Duration, mut attempt: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let tries = within.as_millis() / POLL_EVERY.as_millis() + 1;
    let mut last = None;
    for _ in 0..tries {
        match attempt().await {
            Ok(value) => return value,
            Err(not_yet) => last = Some(not_yet),
        }
        if started.elapsed() >= within {
            break;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    panic!("{what}: not within {within:?} (last seen: {last:?})");
}

/// Polls `done` (bounded by [`WAIT`]) until it holds.
pub async fn eventually<F, Fut>(what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, WAIT, done).await;
}

/// [`eventually`] with its own bound (where the bound is what the test is about).
pub async fn eventually_within<F, Fut>(what: &str, within: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until(what, within, || {
        let look = done();
        async move { look.await.then_some(()).ok_or("no") }
    })
    .await;
}

/// [`until`] for code off the async runtime (or before one): the same bounds, sleeping the
/// thread between looks.
pub fn until_blocking<T, E: Debug>(
    what: &str,
    within: Duration,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> T {
    let started = Instant::now();
    let tries = within.as_millis() / POLL_EVERY.as_millis() + 1;
    let mut last = None;
    for _ in 0..tries {
        match attempt() {
            Ok(value) => return value,
            Err(not_yet) => last = Some(not_yet),
        }
        if started.elapsed() >= within {
            break;
        }
        std::thread::sleep(POLL_EVERY);
    }
    panic!("{what}: not within {within:?} (last seen: {last:?})");
}

/// [`eventually_within`] off the async runtime.
pub fn eventually_blocking(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    until_blocking(what, within, || done().then_some(()).ok_or("no"));
}

/// The store health `/readyz` on `admin` reports now: `None` for the embedded store (which is
/// always there), the Redis circuit state otherwise; `Err` while the daemon does not answer.
async fn store_health(admin: &Target) -> Result<Option<String>, String> {
    let reply = client::request(admin, Method::GET, "/readyz", None)
        .await
        .map_err(|e| e.to_string())?;
    let body = reply.json();
    match body.get("redis") {
        None => Ok(None),
        Some(state) => Ok(Some(state.as_str().unwrap_or_default().to_owned())),
    }
}

/// Waits (bounded by [`WAIT`]) until the daemon whose admin listener is `admin` answers and its
/// store takes calls: the embedded store at once, Redis once the background connection is made
/// (the circuit is no longer `open`). Also for daemons that are still starting.
pub async fn wait_for_store(admin: &Target) {
    until("the daemon reaches its store", WAIT, || async move {
        match store_health(admin).await? {
            None => Ok(()),
            Some(state) if state != "open" => Ok(()),
            Some(state) => Err(format!("redis {state}")),
        }
    })
    .await;
}

/// Waits (bounded by [`WAIT`]) until a dry run of `probe` on the check API `check` is decided by
/// the store (`mode: enforced`): a real round trip, for a daemon whose Redis went away and came
/// back (its circuit still says `healthy` until a call fails).
pub async fn wait_enforced(check: &Target, probe: &Value) {
    let mut probe = probe.clone();
    probe["dry_run"] = Value::Bool(true);
    let body = probe.to_string().into_bytes();
    until("checks are decided by the store", WAIT, || {
        let body = body.clone();
        async move {
            let reply = client::request(check, Method::POST, "/v1/check", Some(body))
                .await
                .map_err(|e| e.to_string())?;
            let answer = reply.json();
            match answer["mode"] == "enforced" {
                true => Ok(()),
                false => Err(answer.to_string()),
            }
        }
    })
    .await;
}

/// Waits (bounded by `within`) until `GET path` on `admin` answers 200, failing at once if
/// `child` exits first; `log` says what the process wrote, for the failure message.
pub async fn wait_answering(
    admin: &Target,
    path: &str,
    child: &mut ChildGuard,
    within: Duration,
    log: impl Fn() -> String,
) {
    let what = format!("{admin} answers {path}");
    until(&what, within, || {
        let exited = child.0.as_mut().map(|c| c.try_wait().expect("try_wait"));
        assert!(
            exited.is_some_and(|status| status.is_none()),
            "the process exited; log:\n{}",
            log()
        );
        async {
            match client::request(admin, Method::GET, path, None).await {
                Ok(reply) if reply.status == 200 => Ok(()),
                Ok(reply) => Err(format!("status {}; log:\n{}", reply.status, log())),
                Err(error) => Err(format!("{error}; log:\n{}", log())),
            }
        }
    })
    .await;
}

impl TestApp {
    /// [`wait_for_store`] for this daemon.
    pub async fn wait_for_store(&self) {
        wait_for_store(&Target::Tcp(self.admin)).await;
    }
}

/// Waits, when the fixed window of `period` running now ends within `needed`, until it has
/// ended (and a second more): a scenario that spends a window's limit in real time (on Redis,
/// whose clock is this host's) and asserts its exact bound then runs inside one window, instead
/// of failing when it happens to cross a boundary (a second window's limit is rightly admitted
/// there). sluice aligns a window to multiples of its period since the Unix epoch. Waits at most
/// `needed` and a second.
pub async fn within_one_window(period: Duration, needed: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    let into = Duration::from_micros(
        u64::try_from(since_epoch.as_micros() % period.as_micros().max(1)).unwrap_or(0),
    );
    let left = period.saturating_sub(into);
    if left < needed {
        eprintln!(
            "waiting {:.1} s for the next {} s window",
            left.as_secs_f64() + 1.0,
            period.as_secs()
        );
        tokio::time::sleep(left + Duration::from_secs(1)).await;
    }
}

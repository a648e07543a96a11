//! The one background task that (re)connects: at start, and whenever the circuit opens. It builds
//! a fresh connection (for Sentinel: asks for the primary again), proves it with a write probe,
//! loads the scripts and publishes it; then the circuit goes half-open. Between attempts it waits
//! a jittered, doubling delay, so a fleet of sidecars does not hammer a recovering Redis in step.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::access::Access;
use super::conn::{self, Conn, Timeouts};
use super::error::ErrorKind;
use super::health::{Circuit, Health};
use super::permissions::{self, AclWatch};
use crate::config::RedisTarget;

/// How the prober paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First delay after a failed attempt.
    pub min: Duration,
    /// Longest delay between attempts.
    pub max: Duration,
}

/// A pause uniform in `[delay/2, delay]`, drawn from `attempt` and a per-process `jitter` key.
pub fn jittered(delay: Duration, attempt: u64, jitter: &RandomState) -> Duration {
    let spread = jitter.hash_one(attempt) % 1_000;
    delay / 2 + delay / 2 * u32::try_from(spread).unwrap_or(0) / 1_000
}

/// Everything the prober needs.
pub struct Prober {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Credentials and TLS.
    pub access: Access,
    /// Connect and reply timeouts.
    pub timeouts: Timeouts,
    /// The key the write probe sets (in the daemon's prefix, with an expiry).
    pub probe_key: String,
    /// The commands the permission probe asks about (`permissions::probe_commands`).
    pub acl_commands: Vec<(&'static str, Vec<String>)>,
    /// Where the permission probe's finding goes (gauges, warn lines).
    pub acl: Arc<AclWatch>,
    /// Script sources to load into a new connection.
    pub scripts: Vec<Arc<str>>,
    /// The Cluster node script, when node calls are wanted (see `slot_map`).
    pub node_script: Option<Arc<str>>,
    /// Shared health.
    pub health: Arc<Health>,
    /// Where new connections are published.
    pub publish: watch::Sender<Option<Conn>>,
    /// Pacing.
    pub backoff: Backoff,
    /// Error counter (by kind).
    pub errors: IntCounterVec,
    /// Ends the prober when the store is dropped (see `RedisStore`'s `alive`).
    pub alive: CancellationToken,
}

impl Prober {
    /// Runs until the store is dropped.
    pub async fn run(self) {
        let alive = self.alive.clone();
        let mut delay = Duration::ZERO;
        let jitter = RandomState::new();
        let mut attempt: u64 = 0;
        let mut last_warning: Option<std::time::Instant> = None;
        loop {
            // Wait until the circuit is open (registering interest before looking, so an opening
            // in between is not missed).
            let opened = self.health.opened.notified();
            if self.health.circuit() != Circuit::Open {
                tokio::select! {
                    _ = opened => {}
                    () = alive.cancelled() => return,
                }
                delay = Duration::ZERO;
                continue;
            }
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(jittered(delay, attempt, &jitter)) => {}
                    () = alive.cancelled() => return,
                }
            }
            attempt += 1;
            let budget = self.timeouts.connect * 2;
            match tokio::time::timeout(budget, self.connect_and_probe()).await {
                Ok(Ok(conn)) => {
                    last_warning = None;
                    tracing::info!(redis = %conn::describe(&self.target), "Redis reachable; connection rebuilt");
                    let _ = self.publish.send(Some(conn));
                    self.health.half_open();
                    delay = Duration::ZERO;
                }
                Ok(Err(error)) => {
                    let kind = ErrorKind::of(&error).as_str();
                    self.errors.with_label_values(&[kind]).inc();
                    self.warn_now_and_then(&mut last_warning, kind, &error.to_string());
                    delay = (delay * 2).clamp(self.backoff.min, self.backoff.max);
                }
                Err(_) => {
                    self.errors
                        .with_label_values(&[ErrorKind::Timeout.as_str()])
                        .inc();
                    self.warn_now_and_then(&mut last_warning, "timeout", "no answer");
                    delay = (delay * 2).clamp(self.backoff.min, self.backoff.max);
                }
            }
        }
    }

    /// A failed attempt is logged at warn level when the outage starts and every 30 s after;
    /// every attempt at debug level.
    fn warn_now_and_then(&self, last: &mut Option<std::time::Instant>, kind: &str, error: &str) {
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
            *last = Some(std::time::Instant::now());
            tracing::warn!(redis = %conn::describe(&self.target), kind, error, "Redis unreachable; checks use their failure modes");
        } else {
            tracing::debug!(kind, error, "Redis probe failed");
        }
    }

    async fn connect_and_probe(&self) -> redis::RedisResult<Conn> {
        let mut conn = conn::connect(&self.target, &self.access, self.timeouts).await?;
        // The write probe first: it proves the connection authenticated (Redis closes an
        // unauthenticated connection that sends a command of many arguments, as the permission
        // probe is). A write probe the ACL refused is named by the permission probe all the same.
        let written = conn.probe(&self.probe_key).await;
        if written.is_ok() || written.as_ref().is_err_and(|e| e.code() == Some("NOPERM")) {
            let found = permissions::probe(&mut conn, &self.probe_key, &self.acl_commands).await;
            self.acl.probed(found);
        }
        written?;
        for source in &self.scripts {
            conn.load_script(source).await?;
        }
        Ok(match &self.node_script {
            Some(source) => conn.enable_node_calls(source).await,
            None => conn,
        })
    }
}

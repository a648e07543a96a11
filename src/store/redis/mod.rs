//! The Redis store: counters shared by every pod, changed only by the Lua scripts in `lua/`, which
//! read Redis `TIME` so that all pods share one clock. Calls are coalesced into pipelines by the
//! [`batcher`]; a single primary, a Sentinel-watched primary or a Cluster ([`conn`]) holds them,
//! one hash tag per counter ([`keys`]). [`health`] keeps a circuit breaker so that an unreachable
//! Redis costs microseconds per check, and the [`prober`] reconnects.
//!
//! A group of several policies (per-IP and per-account on login) is one atomic call of the group
//! script, recording every allowed key or none, whenever its keys can be in one script: always on
//! a single primary, and in a Cluster when they share a hash slot. Keys in different Cluster slots
//! are decided in two steps: every key evaluated without recording, then, if no enforced policy
//! denied, each allowed key recorded by its own (atomic, re-deciding) call; a race can then deny
//! in the second step after another key was spent. A single-policy check is one script call.

pub mod batcher;
pub mod conn;
pub mod health;
pub mod keys;
pub mod prober;
pub mod scripts;
pub mod sentinel_watch;

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::watch;

use self::batcher::{BatchConfig, BatchMetrics, Batcher};
use self::conn::{RedisTarget, Timeouts};
use self::health::{Circuit, Health};
use self::prober::{Backoff, Prober};
use self::scripts::{parse_reply, Scripts};
use super::{RateStore, StoreCheck, StoreError, StoreFuture};
use crate::limit::Decision;

/// Everything the Redis store is configured with.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Default deadline of one check (all its Redis calls, queueing included).
    pub timeout: Duration,
    /// Connection attempt and reply backstop timeouts.
    pub timeouts: Timeouts,
    /// Pipelining limits.
    pub batch: BatchConfig,
    /// Consecutive failures that open the circuit.
    pub breaker_failures: u32,
    /// Pacing of reconnection attempts.
    pub backoff: Backoff,
}

/// Metrics the Redis store keeps.
#[derive(Clone)]
pub struct RedisMetrics {
    /// Pipelining and errors.
    pub batch: BatchMetrics,
    /// `sluice_redis_circuit_state`.
    pub circuit: IntGauge,
    /// `sluice_redis_up`.
    pub up: IntGauge,
}

/// Counters in Redis.
pub struct RedisStore {
    cluster: bool,
    batcher: Batcher,
    connection: watch::Receiver<Option<conn::Conn>>,
    scripts: Scripts,
    prefix: String,
    timeout: Duration,
    health: Arc<Health>,
    errors: prometheus::IntCounterVec,
}

impl RedisStore {
    /// Starts connecting in the background and returns at once. Until connected the circuit is
    /// open: checks skip Redis and their failure modes apply. Needs a Tokio runtime.
    pub fn start(options: RedisOptions, metrics: RedisMetrics) -> Result<Self, String> {
        conn::validate(&options.target)?;
        if options.key_prefix.contains(['{', '}']) {
            return Err("redis.key_prefix must not contain `{` or `}`".into());
        }
        tracing::info!(redis = %conn::describe(&options.target), "using the Redis store");
        for kind in [
            "timeout",
            "deadline",
            "connection",
            "noscript",
            "readonly",
            "loading",
            "busy",
            "oom",
            "auth",
        ] {
            metrics.batch.errors.with_label_values(&[kind]);
        }
        let health = Arc::new(Health::new(
            Circuit::Open,
            options.breaker_failures,
            metrics.circuit,
            metrics.up,
        ));
        let scripts = Scripts::default();
        let cluster = matches!(options.target, RedisTarget::Cluster(_));
        let (publish, connection) = watch::channel(None);
        if let RedisTarget::Sentinel(sentinel) = &options.target {
            tokio::spawn(sentinel_watch::watch(sentinel.clone(), Arc::clone(&health)));
        }
        let prober = Prober {
            target: options.target,
            timeouts: options.timeouts,
            probe_key: format!("{}:{{sluice:probe}}", options.key_prefix),
            scripts: scripts.sources(),
            health: Arc::clone(&health),
            publish,
            backoff: options.backoff,
            errors: metrics.batch.errors.clone(),
        };
        tokio::spawn(prober.run());
        Ok(Self {
            cluster,
            errors: metrics.batch.errors.clone(),
            batcher: Batcher::spawn(connection.clone(), options.batch, metrics.batch),
            connection,
            scripts,
            prefix: options.key_prefix,
            timeout: options.timeout,
            health,
        })
    }

    /// `HGET <prefix>:<name> <field>` on the current connection (for small shared tables such as
    /// tenant tiers); fails fast while the circuit is open.
    pub async fn hash_get(&self, name: &str, field: &str) -> Result<Option<String>, StoreError> {
        if !self.health.allows_calls() {
            return Err(StoreError::CircuitOpen);
        }
        let current = self.connection.borrow().clone();
        let Some(mut conn) = current else {
            return Err(StoreError::failed("connection", "not connected to Redis"));
        };
        let key = format!("{}:{name}", self.prefix);
        conn.hash_get(&key, field)
            .await
            .map_err(|e| StoreError::failed(batcher::error_kind(&e), e.to_string()))
    }

    async fn check_group(
        &self,
        checks: &[StoreCheck],
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        if checks.len() == 1 {
            return self.run(checks.iter().map(|c| (c, !dry_run))).await;
        }
        let keyed: Vec<(String, &StoreCheck)> = checks
            .iter()
            .map(|c| (keys::redis_key(&self.prefix, &c.key), c))
            .collect();
        let one_slot = keyed
            .windows(2)
            .all(|w| keys::slot(&w[0].0) == keys::slot(&w[1].0));
        if !self.cluster || one_slot {
            let call = self.scripts.group_call(&keyed, !dry_run, None);
            let value = self
                .batcher
                .submit(call)
                .await?
                .await
                .map_err(|_| StoreError::failed("internal", "Redis call dropped"))??;
            return scripts::parse_group_reply(&value, keyed.len())
                .map_err(|detail| StoreError::failed("protocol", detail));
        }
        // Different Cluster slots: evaluate all, then record the allowed ones one by one.
        let mut decisions = self.run(checks.iter().map(|c| (c, false))).await?;
        let group_allowed = checks
            .iter()
            .zip(&decisions)
            .all(|(check, decision)| decision.allowed || !check.enforce);
        if dry_run || !group_allowed {
            return Ok(decisions);
        }
        let allowed: Vec<usize> = (0..checks.len())
            .filter(|&i| decisions[i].allowed)
            .collect();
        let recorded = self
            .run(allowed.iter().map(|&i| (&checks[i], true)))
            .await?;
        for (i, decision) in allowed.into_iter().zip(recorded) {
            decisions[i] = decision;
        }
        Ok(decisions)
    }

    /// Submits every call first (so they share pipelines), then collects the replies.
    async fn run<'a>(
        &self,
        calls: impl Iterator<Item = (&'a StoreCheck, bool)>,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut pending = Vec::new();
        for (check, commit) in calls {
            let key = keys::redis_key(&self.prefix, &check.key);
            let call = self
                .scripts
                .call(&check.algorithm, key, check.cost, commit, None);
            pending.push(self.batcher.submit(call).await?);
        }
        let mut decisions = Vec::with_capacity(pending.len());
        for reply in pending {
            let value = reply
                .await
                .map_err(|_| StoreError::failed("internal", "Redis call dropped"))??;
            let decision =
                parse_reply(&value).map_err(|detail| StoreError::failed("protocol", detail))?;
            decisions.push(decision);
        }
        Ok(decisions)
    }
}

impl RateStore for RedisStore {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        dry_run: bool,
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        Box::pin(async move {
            if !self.health.allows_calls() {
                return Err(StoreError::CircuitOpen);
            }
            let deadline = deadline.unwrap_or(self.timeout);
            let result = tokio::time::timeout(deadline, self.check_group(checks, dry_run))
                .await
                .unwrap_or(Err(StoreError::Timeout));
            match &result {
                Ok(_) => self.health.on_success(),
                Err(error) => {
                    if *error == StoreError::Timeout {
                        self.errors.with_label_values(&["deadline"]).inc();
                    }
                    self.health.on_failure(error.kind());
                }
            }
            result
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn health(&self) -> Option<&'static str> {
        Some(self.health.circuit().as_str())
    }
}

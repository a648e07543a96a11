//! The Redis store: counters shared by every pod, changed only by the Lua scripts in `lua/`, which
//! read Redis `TIME` so that all pods share one clock. Calls are coalesced into pipelines by the
//! [`batcher`]; a Cluster is supported with one hash tag per counter ([`keys`]).
//!
//! A group of several policies is decided in two steps: every key is evaluated without recording
//! (one pipeline), then, if no enforced policy denied, the allowed keys are recorded. The second
//! step re-decides atomically per key, so a race can still deny there after another key of the
//! group was spent; a single-policy check (the common case) is one atomic script call.

pub mod batcher;
pub mod conn;
pub mod keys;
pub mod scripts;

use std::time::Duration;

use self::batcher::{BatchConfig, BatchMetrics, Batcher};
use self::conn::{RedisTarget, Timeouts};
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
    /// Deadline of one check (all its Redis calls).
    pub timeout: Duration,
    /// Connection attempt and reply backstop timeouts.
    pub timeouts: Timeouts,
    /// Pipelining limits.
    pub batch: BatchConfig,
}

/// Counters in Redis.
pub struct RedisStore {
    batcher: Batcher,
    scripts: Scripts,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    /// Starts connecting in the background and returns at once; until connected, checks fail
    /// fast with [`StoreError::Unavailable`] and the failure modes apply. Needs a Tokio runtime.
    pub fn start(options: RedisOptions, metrics: BatchMetrics) -> Result<Self, String> {
        conn::validate(&options.target)?;
        if options.key_prefix.contains(['{', '}']) {
            return Err("redis.key_prefix must not contain `{` or `}`".into());
        }
        tracing::info!(redis = %conn::describe(&options.target), "using the Redis store");
        let scripts = Scripts::default();
        let connection = conn::spawn_connector(options.target, options.timeouts, scripts.sources());
        Ok(Self {
            batcher: Batcher::spawn(connection, options.batch, metrics),
            scripts,
            prefix: options.key_prefix,
            timeout: options.timeout,
        })
    }

    async fn check_group(
        &self,
        checks: Vec<StoreCheck>,
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let single = checks.len() == 1;
        let mut decisions = self
            .run(checks.iter().map(|c| (c, single && !dry_run)))
            .await?;
        if single || dry_run {
            return Ok(decisions);
        }
        let group_allowed = checks
            .iter()
            .zip(&decisions)
            .all(|(check, decision)| decision.allowed || !check.enforce);
        if !group_allowed {
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
                .map_err(|_| StoreError::Unavailable("Redis call dropped".into()))??;
            decisions.push(parse_reply(&value).map_err(StoreError::Unavailable)?);
        }
        Ok(decisions)
    }
}

impl RateStore for RedisStore {
    fn check(&self, checks: Vec<StoreCheck>, dry_run: bool) -> StoreFuture<'_> {
        Box::pin(async move {
            tokio::time::timeout(self.timeout, self.check_group(checks, dry_run))
                .await
                .unwrap_or(Err(StoreError::Timeout))
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

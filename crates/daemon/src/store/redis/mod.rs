//! The Redis store: counters shared by every pod, changed only by the Lua scripts in `lua/`, which
//! read Redis `TIME` so that all pods share one clock. The [`batcher`] turns concurrent checks into
//! one call of the batch script per batch; a single primary, a Sentinel-watched primary or a
//! Cluster ([`conn`]) holds them, one hash tag per counter ([`keys`]). [`health`] keeps a circuit
//! breaker so that an unreachable Redis costs microseconds per check, and the [`prober`]
//! reconnects.
//!
//! A check of several policies (per-IP and per-account on login) is one check of the batch
//! script, recording every allowed key or none, whenever its keys can be in one script: always on
//! a single primary, and in a Cluster when they share a hash slot. Keys in different Cluster slots
//! are decided in two steps: every key evaluated without recording, then, if no enforced policy
//! denied, each allowed key recorded by its own (atomic, re-deciding) check; a race can then deny
//! in the second step after another key was spent.
//!
//! An operator's reset deletes the counter's key and announces it on the [`resets`] channel, so
//! that every pod's local layer forgets its remembered denial.

pub mod access;
pub mod batcher;
pub mod conn;
pub mod error;
pub mod health;
pub mod keys;
pub mod metrics;
pub mod permissions;
mod permits;
pub mod prober;
mod reservations;
pub mod resets;
pub mod scripts;
pub mod sentinel_watch;
pub mod slot_map;

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use self::access::Access;
use self::batcher::{BatchConfig, Batcher, Origin};
use self::conn::Timeouts;
use self::error::ErrorKind;
use self::health::{Circuit, Health};
pub use self::metrics::RedisMetrics;
use self::prober::{Backoff, Prober};
use self::resets::{Follower, ResetEvent};
use self::scripts::{Commit, Item, Scripts};
use super::{
    Acquired, Fleet, LeaseFuture, RateStore, Released, ResetFuture, ResetOutcome, Spend,
    StoreCheck, StoreError, StoreFuture,
};
use crate::config::RedisTarget;
use crate::limit::{Algorithm, Decision, Grant, Key, NEVER};

/// Everything the Redis store is configured with.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Credentials and TLS.
    pub access: Access,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Default deadline of one check's Redis round trip (from the write of its batch).
    pub timeout: Duration,
    /// Connection attempt and reply backstop timeouts.
    pub timeouts: Timeouts,
    /// Pipelining limits.
    pub batch: BatchConfig,
    /// Consecutive failures that open the circuit.
    pub breaker_failures: u32,
    /// Pacing of reconnection attempts.
    pub backoff: Backoff,
    /// In a Cluster of Redis >= 7.0: one call per node rather than one per hash slot.
    pub node_calls: bool,
    /// Spans for batch calls (off unless `[tracing]` is set).
    pub tracing: crate::telemetry::Tracing,
}

/// Counters in Redis.
pub struct RedisStore {
    cluster: bool,
    batcher: Batcher,
    connection: watch::Receiver<Option<conn::Conn>>,
    prefix: String,
    timeout: Duration,
    health: Arc<Health>,
    /// The lease script (takes and give-backs go out on their own, not through the batcher).
    lease: scripts::Script,
    /// The concurrency script (`lua/concurrency.lua`), called on its own like the lease's.
    concurrency: scripts::Script,
    /// The reservation script (`lua/reservation.lua`): settle marks, called on its own.
    reservation: scripts::Script,
    /// How to follow the reset channel (started by [`RedisStore::follow_resets`]).
    resets: Follower,
    /// The lifetime of every background task of the store (the prober, the dispatcher, the
    /// Sentinel watch, the reset follower): each holds a clone and ends when it is cancelled,
    /// which `_stop_tasks` does when the store is dropped.
    alive: CancellationToken,
    _stop_tasks: DropGuard,
}

/// Longest a check waits inside sluice (queued behind other batches) beyond its Redis deadline
/// before it gives up. It is a backstop, not a Redis failure: the circuit is not touched.
const QUEUE_BACKSTOP: Duration = Duration::from_secs(1);

impl RedisStore {
    /// Starts connecting in the background and returns at once. Until connected the circuit is
    /// open: checks skip Redis and their failure modes apply. Needs a Tokio runtime.
    pub fn start(options: RedisOptions, registry: &Registry) -> Result<Self, String> {
        conn::validate(&options.target, &options.access)?;
        if options.key_prefix.contains(['{', '}']) {
            return Err("redis.key_prefix must not contain `{` or `}`".into());
        }
        tracing::info!(redis = %conn::describe(&options.target), tls = %options.access.tls, "using the Redis store");
        if options.access.tls.insecure {
            tracing::warn!(
                "redis.tls.insecure is on: Redis' certificate is NOT verified, anyone on the path \
                 can read and change the counters; for self-signed test setups only"
            );
        }
        let metrics = RedisMetrics::register(registry)
            .map_err(|error| format!("registering the Redis metrics: {error}"))?;
        let health = Arc::new(Health::new(
            Circuit::Open,
            options.breaker_failures,
            metrics.circuit,
            metrics.up,
        ));
        let scripts = Scripts::default();
        let cluster = matches!(options.target, RedisTarget::Cluster(_));
        let resets = Follower {
            target: options.target.clone(),
            access: options.access.clone(),
            timeouts: options.timeouts,
            channel: resets::channel(&options.key_prefix),
        };
        let alive = CancellationToken::new();
        let (publish, connection) = watch::channel(None);
        if let RedisTarget::Sentinel(sentinel) = &options.target {
            tokio::spawn(sentinel_watch::watch(
                sentinel.clone(),
                options.access.clone(),
                Arc::clone(&health),
                alive.clone(),
            ));
        }
        let node_script = (matches!(options.target, RedisTarget::Cluster(_)) && options.node_calls)
            .then(|| Arc::clone(&scripts.node_batch().source));
        let probe_key = format!("{}:{{sluice:probe}}", options.key_prefix);
        let acl_commands = permissions::probe_commands(
            &options.target,
            &probe_key,
            &format!("{}:tenant-tiers", options.key_prefix),
            &resets::channel(&options.key_prefix),
        );
        let prober = Prober {
            target: options.target,
            access: options.access,
            timeouts: options.timeouts,
            probe_key,
            acl_commands,
            acl: Arc::clone(&metrics.batch.acl),
            scripts: scripts.sources(),
            node_script,
            health: Arc::clone(&health),
            publish,
            backoff: options.backoff,
            errors: metrics.batch.errors.clone(),
            alive: alive.clone(),
        };
        tokio::spawn(prober.run());
        let batcher = Batcher::spawn(
            connection.clone(),
            scripts.clone(),
            options.batch,
            metrics.batch,
            Arc::clone(&health),
            options.tracing,
            alive.clone(),
        );
        Ok(Self {
            cluster,
            batcher,
            connection,
            prefix: options.key_prefix,
            timeout: options.timeout,
            lease: scripts.lease().clone(),
            concurrency: scripts.concurrency().clone(),
            reservation: scripts.reservation().clone(),
            health,
            resets,
            _stop_tasks: alive.clone().drop_guard(),
            alive,
        })
    }

    /// Subscribes to the reset channel in the background (until the store is dropped) and hands
    /// every announced reset to `on_reset`, e.g. to drop the key from the local layer.
    pub fn follow_resets(&self, on_reset: impl Fn(ResetEvent) + Send + Sync + 'static) {
        tokio::spawn(self.resets.clone().run(on_reset, self.alive.clone()));
    }

    /// The current connection, for a one-off command; fails fast while the circuit is open.
    fn current(&self) -> Result<conn::Conn, StoreError> {
        if !self.health.allows_calls() {
            return Err(StoreError::CircuitOpen);
        }
        let current = self.connection.borrow().clone();
        current.ok_or_else(|| StoreError::failed(ErrorKind::NotConnected, "not connected to Redis"))
    }

    /// `HGET <prefix>:<name> <field>` on the current connection (for small shared tables such as
    /// tenant tiers); fails fast while the circuit is open.
    pub async fn hash_get(&self, name: &str, field: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.current()?;
        let key = format!("{}:{name}", self.prefix);
        conn.hash_get(&key, field).await.map_err(|e| failed(&e))
    }

    /// Deletes the counter's key (on its primary, through the check path's connection but not
    /// its batcher) and announces the reset; the announcement failing does not undo the reset.
    async fn reset_key(&self, key: &Key) -> Result<ResetOutcome, StoreError> {
        let mut conn = self.current()?;
        // The counter and its lease epoch together (one slot): a lease taken from the old
        // counter gives nothing back to whatever counter holds the key next.
        let counter = keys::redis_key(&self.prefix, key);
        let epoch = keys::lease_epoch_key(&counter);
        let existed = conn
            .delete(&[counter.as_str(), epoch.as_str()])
            .await
            .map_err(|e| failed(&e))?;
        let fleet = match conn
            .publish(&self.resets.channel, &resets::encode(key))
            .await
        {
            Ok(receivers) => Fleet::Announced { receivers },
            Err(error) => {
                tracing::warn!(channel = %self.resets.channel, %error, "counter reset but not announced: other pods' local layers keep their denial until its retry instant");
                Fleet::NotAnnounced
            }
        };
        Ok(ResetOutcome { existed, fleet })
    }

    /// One call of the lease script on `check`'s counter (`EVALSHA`, `NOSCRIPT` -> `EVAL`
    /// once), within `deadline`: `mode` and the three arguments as `lua/lease.lua` takes them.
    async fn lease_call(
        &self,
        check: &StoreCheck,
        mode: &str,
        [units, extra, epoch]: [u64; 3],
        deadline: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let (algorithm, limit, period, capacity) = match check.algorithm {
            Algorithm::TokenBucket(b) => ("tb", b.limit(), b.period_us(), b.capacity()),
            Algorithm::FixedWindow(w) => ("fw", w.limit(), w.period_us(), 0),
            Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
                return Err(StoreError::failed(
                    ErrorKind::Other,
                    "a sliding log or a concurrency limit is never leased",
                ))
            }
        };
        let mut conn = self.current()?;
        let key = keys::redis_key(&self.prefix, &check.key);
        let epoch_key = keys::lease_epoch_key(&key);
        let command = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script)
                .arg(2)
                .arg(&key)
                .arg(&epoch_key)
                .arg(mode)
                .arg(algorithm)
                .arg(limit)
                .arg(period)
                .arg(capacity)
                .arg(units)
                .arg(extra)
                .arg(epoch);
            cmd
        };
        eval_figures(&mut conn, &self.lease, command, deadline, "lease").await
    }

    /// Where `checks` were planned (see [`batcher::Origin`]).
    fn origin<'c>(checks: impl IntoIterator<Item = &'c StoreCheck>) -> Origin {
        Origin {
            policies: checks
                .into_iter()
                .map(|check| (Arc::clone(check.key.policy_name()), check.generation))
                .collect(),
        }
    }

    fn item(&self, check: &StoreCheck) -> Item {
        Item {
            key: keys::redis_key(&self.prefix, &check.key),
            algorithm: check.algorithm,
            cost: check.cost,
            enforce: check.enforce,
        }
    }

    async fn check_group(
        &self,
        checks: &[StoreCheck],
        spend: Spend,
        deadline: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let items: Vec<Item> = checks.iter().map(|c| self.item(c)).collect();
        let one_slot = !self.cluster
            || items
                .windows(2)
                .all(|w| keys::slot(&w[0].key) == keys::slot(&w[1].key));
        if one_slot {
            let reply = self
                .batcher
                .submit(items, Self::origin(checks), spend, deadline)
                .await?;
            return answer(reply, deadline).await;
        }
        // Different Cluster slots: evaluate all, then record the allowed ones one by one. Every
        // call is queued before any is awaited, so that they share batches.
        let mut decisions = self.each(checks.iter(), Spend::DryRun, deadline).await?;
        let group_allowed = checks
            .iter()
            .zip(&decisions)
            .all(|(check, decision)| decision.allowed || !check.enforce);
        if spend == Spend::DryRun || !group_allowed {
            return Ok(decisions);
        }
        let allowed: Vec<usize> = (0..checks.len())
            .filter(|&i| decisions[i].allowed)
            .collect();
        let recorded = self
            .each(allowed.iter().map(|&i| &checks[i]), Spend::Record, deadline)
            .await
            .map_err(|error| match error {
                StoreError::BadKey { item, detail } => StoreError::BadKey {
                    item: allowed.get(item).copied().unwrap_or(item),
                    detail,
                },
                other => other,
            })?;
        for (i, decision) in allowed.into_iter().zip(recorded) {
            decisions[i] = decision;
        }
        Ok(decisions)
    }

    /// Spends every check regardless (a report): one call when the keys can share a script,
    /// else one per key (they need not be all or nothing: nothing is refused).
    async fn spend_group(
        &self,
        checks: &[StoreCheck],
        deadline: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let items: Vec<Item> = checks.iter().map(|c| self.item(c)).collect();
        let one_slot = !self.cluster
            || items
                .windows(2)
                .all(|w| keys::slot(&w[0].key) == keys::slot(&w[1].key));
        if one_slot {
            let reply = self
                .batcher
                .submit(items, Self::origin(checks), Commit::Report, deadline)
                .await?;
            return answer(reply, deadline).await;
        }
        self.each(checks.iter(), Commit::Report, deadline).await
    }

    /// Each check as its own, all queued before any answer is awaited.
    async fn each<'c>(
        &self,
        checks: impl Iterator<Item = &'c StoreCheck>,
        commit: impl Into<Commit> + Copy,
        deadline: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut pending = Vec::new();
        for check in checks {
            let (item, origin) = (self.item(check), Self::origin([check]));
            pending.push(
                self.batcher
                    .submit(vec![item], origin, commit, deadline)
                    .await?,
            );
        }
        let mut decisions = Vec::with_capacity(pending.len());
        for (index, reply) in pending.into_iter().enumerate() {
            // Each job is one item: a bad key is the item's own, number `index` here.
            let decided = answer(reply, deadline).await.map_err(|error| match error {
                StoreError::BadKey { detail, .. } => StoreError::BadKey {
                    item: index,
                    detail,
                },
                other => other,
            })?;
            decisions.extend(decided);
        }
        Ok(decisions)
    }
}

/// A concurrency limit's permits are taken by [`RateStore::acquire`] (its own script), never
/// in a batch: the check path keeps them apart, this is the store's own guard.
fn has_permits(checks: &[StoreCheck]) -> bool {
    checks
        .iter()
        .any(|c| matches!(c.algorithm, Algorithm::Concurrency(_)))
}

/// [`has_permits`]: an error, for a path that would record them.
fn refuse_permits(checks: &[StoreCheck]) -> Result<(), StoreError> {
    match checks
        .iter()
        .position(|c| matches!(c.algorithm, Algorithm::Concurrency(_)))
    {
        Some(_) => Err(StoreError::failed(
            ErrorKind::Other,
            "a concurrency limit is checked by acquiring a permit, not in a batch",
        )),
        None => Ok(()),
    }
}

fn failed(error: &redis::RedisError) -> StoreError {
    StoreError::failed(ErrorKind::of(error), error.to_string())
}

/// One call of `script` outside the batcher within `deadline` (`EVALSHA`, then `EVAL` once on
/// `NOSCRIPT`), its reply's integers; `command(verb, body)` is the call with its keys and
/// arguments, `what` names the script in an error.
async fn eval_figures(
    conn: &mut conn::Conn,
    script: &scripts::Script,
    command: impl Fn(&str, &str) -> redis::Cmd,
    deadline: Duration,
    what: &str,
) -> Result<Vec<i64>, StoreError> {
    let call = async {
        match conn.eval(&command("EVALSHA", &script.sha)).await {
            Err(error) if ErrorKind::of(&error) == ErrorKind::Noscript => {
                conn.eval(&command("EVAL", &script.source)).await
            }
            other => other,
        }
    };
    let reply = tokio::time::timeout(deadline, call)
        .await
        .map_err(|_| StoreError::Timeout)?
        .map_err(|e| failed(&e))?;
    redis::from_redis_value::<Vec<i64>>(reply)
        .map_err(|e| StoreError::failed(ErrorKind::Other, format!("{what} reply: {e}")))
}

/// Waits for a submitted check's decisions. The dispatcher answers every job (the call's own
/// deadline counts from its write to Redis); the backstop only guards against a stalled daemon.
async fn answer(
    reply: tokio::sync::oneshot::Receiver<batcher::Reply>,
    deadline: Duration,
) -> Result<Vec<Decision>, StoreError> {
    match tokio::time::timeout(deadline + QUEUE_BACKSTOP, reply).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(_)) => Err(StoreError::failed(ErrorKind::Other, "Redis call dropped")),
        Err(_) => Err(StoreError::failed(
            ErrorKind::Overloaded,
            "waited too long in sluice's own queue",
        )),
    }
}

impl RateStore for RedisStore {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: Spend,
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        Box::pin(async move {
            if !self.health.allows_calls() {
                return Err(StoreError::CircuitOpen);
            }
            let deadline = deadline.unwrap_or(self.timeout);
            if has_permits(checks) {
                // A read (`/v1/counters`, `/v1/explain`, a probe) peeks at the permits; the
                // check path takes them with `acquire`, never here.
                return match spend {
                    Spend::DryRun => self.peek_with_permits(checks, deadline).await,
                    Spend::Record => refuse_permits(checks).map(|()| Vec::new()),
                };
            }
            // The batcher reports each call's outcome to the breaker (a bad key, or a check
            // that waited too long inside sluice, says nothing about Redis).
            self.check_group(checks, spend, deadline).await
        })
    }

    fn spend<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        Box::pin(async move {
            if !self.health.allows_calls() {
                return Err(StoreError::CircuitOpen);
            }
            refuse_permits(checks)?;
            self.spend_group(checks, deadline.unwrap_or(self.timeout))
                .await
        })
    }

    fn take<'a>(
        &'a self,
        check: &'a StoreCheck,
        fraction: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Option<Grant>> {
        Box::pin(async move {
            if !check.algorithm.leasable() {
                return Ok(None);
            }
            let deadline = deadline.unwrap_or(self.timeout);
            let figures = self
                .lease_call(check, "take", [check.cost, fraction, 0], deadline)
                .await?;
            let &[units, limit, remaining, reset, retry, window, hold, at, epoch] =
                figures.as_slice()
            else {
                return Err(StoreError::failed(
                    ErrorKind::Other,
                    format!("lease reply of {} figures, not 9", figures.len()),
                ));
            };
            let whole = |n: i64| u64::try_from(n).unwrap_or(0);
            let units = whole(units);
            Ok(Some(Grant {
                units,
                decision: Decision {
                    allowed: units > 0 || retry == 0,
                    limit: whole(limit),
                    remaining: whole(remaining),
                    reset_after_us: whole(reset),
                    retry_after_us: u64::try_from(retry).unwrap_or(NEVER),
                },
                window: whole(window),
                hold_us: whole(hold),
                at_us: whole(at),
                epoch: whole(epoch),
            }))
        })
    }

    fn give_back<'a>(
        &'a self,
        check: &'a StoreCheck,
        unused: u64,
        grant: Grant,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, u64> {
        Box::pin(async move {
            let unused = unused.min(grant.units);
            if !check.algorithm.leasable() || unused == 0 {
                return Ok(0);
            }
            let extra = match check.algorithm {
                Algorithm::TokenBucket(_) => grant.at_us.saturating_add(grant.hold_us),
                _ => grant.window,
            };
            let deadline = deadline.unwrap_or(self.timeout);
            let figures = self
                .lease_call(check, "back", [unused, extra, grant.epoch], deadline)
                .await?;
            Ok(figures
                .first()
                .map_or(0, |&n| u64::try_from(n).unwrap_or(0)))
        })
    }

    fn settle_mark<'a>(
        &'a self,
        key: &'a Key,
        id: u128,
        expires_us: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, crate::store::SettleMark> {
        Box::pin(self.mark_settled(key, id, expires_us, deadline.unwrap_or(self.timeout)))
    }

    fn acquire<'a>(
        &'a self,
        check: &'a StoreCheck,
        permit: u128,
        spend: Spend,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Acquired> {
        let deadline = deadline.unwrap_or(self.timeout);
        Box::pin(self.acquire_permit(check, permit, spend, deadline))
    }

    fn release<'a>(
        &'a self,
        key: &'a Key,
        permit: u128,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Released> {
        Box::pin(self.release_permit(key, permit, deadline.unwrap_or(self.timeout)))
    }

    fn reset<'a>(&'a self, key: &'a Key) -> ResetFuture<'a> {
        Box::pin(self.reset_key(key))
    }

    fn stored_key(&self, key: &Key) -> String {
        keys::redis_key(&self.prefix, key)
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn health(&self) -> Option<Circuit> {
        Some(self.health.circuit())
    }
}

#[cfg(test)]
mod tests;

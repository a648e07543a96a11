//! The Redis store's permits (concurrency limits): one call of `lua/concurrency.lua` per acquire
//! or release, outside the batcher (as quota leases are), on the partition's own key, so a
//! Cluster routes it to the key's slot like every other check. The sorted set's scores are
//! expiries on Redis' clock, so every pod counts the same permits.

use std::time::Duration;

use super::{eval_figures, keys, ErrorKind, RedisStore};
use crate::limit::{Algorithm, Concurrency, Decision, Key, NEVER};
use crate::store::{Acquired, Released, Spend, StoreCheck, StoreError};

/// A permit id as the script stores it: 32 hex digits.
pub(crate) fn member(permit: u128) -> String {
    format!("{permit:032x}")
}

impl RedisStore {
    /// Takes (or, in a dry run, peeks at) a permit on `check`'s partition.
    pub(super) async fn acquire_permit(
        &self,
        check: &StoreCheck,
        permit: u128,
        spend: Spend,
        deadline: Duration,
    ) -> Result<Acquired, StoreError> {
        let Algorithm::Concurrency(limit) = check.algorithm else {
            return Err(StoreError::failed(
                ErrorKind::Other,
                "only a concurrency limit takes permits",
            ));
        };
        let mode = match spend {
            Spend::Record => "acquire",
            Spend::DryRun => "peek",
        };
        let args = [limit.limit(), limit.ttl_us()];
        let figures = self
            .permit_call(&check.key, mode, args, permit, deadline)
            .await?;
        let &[allowed, limit, remaining, reset, retry, expired] = figures.as_slice() else {
            return Err(StoreError::failed(
                ErrorKind::Other,
                format!("permit reply of {} figures, not 6", figures.len()),
            ));
        };
        let whole = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(Acquired {
            decision: Decision {
                allowed: allowed == 1,
                limit: whole(limit),
                remaining: whole(remaining),
                reset_after_us: whole(reset),
                retry_after_us: u64::try_from(retry).unwrap_or(NEVER),
            },
            expired: whole(expired),
        })
    }

    /// A dry run of `checks` of which some are concurrency limits: those peeked at one call
    /// each, the others as one group; the decisions in order.
    pub(super) async fn peek_with_permits(
        &self,
        checks: &[StoreCheck],
        deadline: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let held = |c: &StoreCheck| matches!(c.algorithm, Algorithm::Concurrency(_));
        let others: Vec<StoreCheck> = checks.iter().filter(|c| !held(c)).cloned().collect();
        let mut decided = if others.is_empty() {
            Vec::new()
        } else {
            self.check_group(&others, Spend::DryRun, deadline).await?
        }
        .into_iter();
        let mut out = Vec::with_capacity(checks.len());
        for check in checks {
            let decision = if held(check) {
                let one = self
                    .acquire_permit(check, 0, Spend::DryRun, deadline)
                    .await?
                    .decision;
                if check.cost == 0 {
                    Concurrency::as_read(one)
                } else {
                    one
                }
            } else {
                decided.next().ok_or_else(|| {
                    StoreError::failed(ErrorKind::Protocol, "fewer decisions than checks")
                })?
            };
            out.push(decision);
        }
        Ok(out)
    }

    /// Gives a permit of `key`'s partition back.
    pub(super) async fn release_permit(
        &self,
        key: &Key,
        permit: u128,
        deadline: Duration,
    ) -> Result<Released, StoreError> {
        let figures = self
            .permit_call(key, "release", [0, 0], permit, deadline)
            .await?;
        let &[released, expired] = figures.as_slice() else {
            return Err(StoreError::failed(
                ErrorKind::Other,
                format!("release reply of {} figures, not 2", figures.len()),
            ));
        };
        Ok(Released {
            released: released == 1,
            expired: u64::try_from(expired).unwrap_or(0),
        })
    }

    /// One call of the concurrency script (`EVALSHA`, `NOSCRIPT` -> `EVAL` once) within
    /// `deadline`, its reply's integers.
    async fn permit_call(
        &self,
        key: &Key,
        mode: &str,
        [limit, ttl_us]: [u64; 2],
        permit: u128,
        deadline: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.current()?;
        let key = keys::redis_key(&self.prefix, key);
        let member = member(permit);
        let command = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script)
                .arg(1)
                .arg(&key)
                .arg(mode)
                .arg(limit)
                .arg(ttl_us)
                .arg(&member)
                .arg(0);
            cmd
        };
        eval_figures(&mut conn, &self.concurrency, command, deadline, "permit").await
    }
}

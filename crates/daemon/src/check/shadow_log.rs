//! The shadow policies' "would block" log line: at info level, at most once per partition per
//! minute (a storm must not flood the log), naming the policy and a fingerprint of the partition
//! (a keyed hash, random per process, so a short value such as an IP cannot be recovered by trying
//! them all); the raw partition only at debug level. The same fingerprint, and the same once per
//! partition per minute, for the warn line of a counter whose key the store says is not sluice's
//! (a foreign or oversized value under the key prefix).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use moka::sync::Cache;

use super::verdict::PolicyDecision;
use crate::limit::Key;

/// How long a partition's "would block" line is not repeated.
const QUIET: Duration = Duration::from_secs(60);

/// Remembers which partitions were logged recently.
pub struct ShadowLog {
    logged: Cache<Key, ()>,
    bad_keys: Cache<Key, ()>,
    secret: RandomState,
}

impl ShadowLog {
    /// An empty log memory (bounded to 10,000 partitions).
    pub fn new() -> Self {
        let quiet = || {
            Cache::builder()
                .max_capacity(10_000)
                .time_to_live(QUIET)
                .build()
        };
        Self {
            logged: quiet(),
            bad_keys: quiet(),
            secret: RandomState::new(),
        }
    }

    /// Logs at warn that `key`'s counter holds something that is not sluice's (the check got its
    /// failure mode), unless that partition was logged within a minute.
    pub fn bad_key(&self, policy: &str, key: &Key, detail: &str) {
        if self.bad_keys.contains_key(key) {
            return;
        }
        self.bad_keys.insert(key.clone(), ());
        tracing::warn!(
            policy,
            partition = self.fingerprint(key),
            store = detail,
            "the counter's key holds a value that is not sluice's (another type, a foreign or \
             oversized value): this check gets its failure mode until the key is removed"
        );
    }

    /// The partition's fingerprint in this process's log lines (shadow blocks, counter resets).
    pub fn fingerprint(&self, key: &Key) -> String {
        format!("{:016x}", self.fingerprint_id(key))
    }

    /// The fingerprint as a number (the top lists' identity; printed the same way).
    pub fn fingerprint_id(&self, key: &Key) -> u64 {
        self.secret.hash_one(key)
    }

    /// Logs that `part` would have blocked, unless its partition was logged within a minute.
    pub fn would_block(&self, part: &PolicyDecision) {
        if self.logged.contains_key(&part.key) {
            return;
        }
        self.logged.insert(part.key.clone(), ());
        tracing::info!(
            policy = part.policy.name(),
            partition = self.fingerprint(&part.key),
            retry_after_ms = part.decision.retry_after_us.div_ceil(1_000),
            "would block (shadow)"
        );
        tracing::debug!(
            policy = part.policy.name(),
            partition = part.key.partition(),
            "would block (shadow): raw partition"
        );
    }
}

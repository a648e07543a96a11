//! The shadow policies' "would block" log line: at info level, at most once per partition per
//! minute (a storm must not flood the log; every would-block is counted in
//! `sluice_decisions_total{outcome="shadow_denied"}` and listed in `/v1/top`), naming the policy
//! and a fingerprint of the partition; the raw partition only at debug level, under the log
//! target `sluice::check::shadow_log`. The same fingerprint, and the same once per partition per
//! minute, for the warn line of a counter whose key the store says is not sluice's (a foreign or
//! oversized value under the key prefix).
//!
//! The fingerprint is the first 8 bytes of HMAC-SHA1(secret, policy `\0` partition), in hex: a
//! keyed hash, so a short value such as an IP cannot be recovered by trying them all, and with
//! the operator's secret (`shadow.fingerprint_key`) the same on every pod, so a fleet's lines join
//! (and `printf '%s\0%s' login 203.0.113.7 | openssl dgst -sha1 -hmac "$SECRET"` gives one
//! partition's in its first 16 hex digits).
//! Without a secret the key is random per process. Every window of a partition has the one
//! fingerprint.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use moka::sync::Cache;
use sha1_smol::Sha1;

use super::verdict::PolicyDecision;
use crate::limit::Key;

/// How long a partition's "would block" line is not repeated.
const QUIET: Duration = Duration::from_secs(60);

/// Remembers which partitions were logged recently.
pub struct ShadowLog {
    logged: Cache<Key, ()>,
    bad_keys: Cache<Key, ()>,
    secret: Hmac,
}

/// HMAC-SHA1 (RFC 2104) with its two padded keys already hashed: a fingerprint costs two
/// SHA-1 blocks (denials and would-blocks only; the allow path never computes one).
pub(super) struct Hmac {
    inner: Sha1,
    outer: Sha1,
}

impl Hmac {
    /// SHA-1's block size.
    const BLOCK: usize = 64;

    pub(super) fn new(key: &[u8]) -> Self {
        let mut block = [0u8; Self::BLOCK];
        if key.len() > Self::BLOCK {
            block[..20].copy_from_slice(&Sha1::from(key).digest().bytes());
        } else {
            block[..key.len()].copy_from_slice(key);
        }
        let padded = |pad: u8| Sha1::from(block.map(|b| b ^ pad));
        Self {
            inner: padded(0x36),
            outer: padded(0x5c),
        }
    }

    /// A key no other process has (when the operator set none).
    fn random() -> Self {
        let state = RandomState::new();
        let mut key = [0u8; 32];
        for (i, chunk) in key.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&state.hash_one(i).to_le_bytes());
        }
        Self::new(&key)
    }

    /// The first 8 bytes of the MAC of `parts`, concatenated.
    pub(super) fn mac64(&self, parts: &[&[u8]]) -> u64 {
        let mut inner = self.inner.clone();
        for part in parts {
            inner.update(part);
        }
        let mut outer = self.outer.clone();
        outer.update(&inner.digest().bytes());
        let mac = outer.digest().bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&mac[..8]);
        u64::from_be_bytes(first)
    }
}

impl ShadowLog {
    /// An empty log memory (bounded to 10,000 partitions), fingerprints keyed by `secret` (the
    /// same on every pod given it) or, with `None`, by a random key of this process.
    pub fn new(secret: Option<&[u8]>) -> Self {
        let quiet = || {
            Cache::builder()
                .max_capacity(10_000)
                .time_to_live(QUIET)
                .build()
        };
        Self {
            logged: quiet(),
            bad_keys: quiet(),
            secret: secret.map_or_else(Hmac::random, Hmac::new),
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

    /// The fingerprint as a number (the top lists' identity; printed the same way): of the
    /// partition, whichever window `key` names.
    pub fn fingerprint_id(&self, key: &Key) -> u64 {
        self.secret
            .mac64(&[key.policy().as_bytes(), b"\0", key.partition().as_bytes()])
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn fingerprints_are_hmac_sha1_and_shared_by_a_secret() {
        // RFC 2202 test case 2: HMAC-SHA1("Jefe", "what do ya want for nothing?").
        let jefe = Hmac::new(b"Jefe");
        assert_eq!(
            jefe.mac64(&[b"what do ya want ", b"for nothing?"]),
            0xeffcdf6ae5eb2fa2
        );
        // RFC 2202 test case 6: a key longer than a block is hashed first.
        assert_eq!(
            Hmac::new(&[0xaa; 80])
                .mac64(&[b"Test Using Larger Than Block-Size Key - Hash Key First"]),
            0xaa4ae5e15272d00e
        );
        let key = Key::new(Arc::from("login"), ["203.0.113.7"]);
        let secret = b"0123456789abcdef-fleet";
        let (a, b) = (ShadowLog::new(Some(secret)), ShadowLog::new(Some(secret)));
        assert_eq!(a.fingerprint(&key), b.fingerprint(&key));
        assert_eq!(
            a.fingerprint(&key),
            a.fingerprint(&key.for_window(60_000_000))
        );
        assert_ne!(a.fingerprint(&key), ShadowLog::new(None).fingerprint(&key));
        assert_ne!(
            ShadowLog::new(None).fingerprint(&key),
            ShadowLog::new(None).fingerprint(&key)
        );
    }
}

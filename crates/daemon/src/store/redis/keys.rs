//! Redis key layout: `<prefix>:{<policy>:<partition>}`, and `<prefix>:{<policy>:<partition>}:<period>`
//! for each window of a policy of several (e.g. `rl:{api:acme}:1h`).
//!
//! The whole partition identity sits inside one hash tag, so every key of one check of one
//! partition maps to one Cluster slot (a policy's windows too: their periods follow the tag),
//! and different partitions spread over the slots. The partition is already escaped by [`Key`]
//! (`%`, `:`, `{`, `}`, `#` and control bytes), so a value can neither collide with another nor
//! move the tag; the first `}` ends the tag, so what follows it (nothing, or a window's period
//! in its one canonical spelling) tells the windows apart. Partitions longer than
//! [`MAX_PARTITION_BYTES`] are replaced by `#` and their SHA-1, bounding memory per key; `#`
//! cannot start an escaped value.

use crate::limit::{period_name, Key};

/// Longest partition stored as is; longer ones are hashed.
pub const MAX_PARTITION_BYTES: usize = 128;

/// The lease epoch key of the counter stored at `counter` (`lua/lease.lua`): the same hash tag,
/// so the same Cluster slot.
pub fn lease_epoch_key(counter: &str) -> String {
    format!("{counter}:lease-epoch")
}

/// The settle mark of reservation `id` made on the counter stored at `counter`
/// (`lua/reservation.lua`): the same hash tag, so the same Cluster slot.
pub fn reservation_key(counter: &str, id: u128) -> String {
    format!("{counter}:rsv:{id:032x}")
}

/// The Redis key of a counter.
pub fn redis_key(prefix: &str, key: &Key) -> String {
    let partition = key.partition();
    let policy = key.policy();
    match (partition.len() > MAX_PARTITION_BYTES, key.period_us()) {
        (false, None) => format!("{prefix}:{{{policy}:{partition}}}"),
        (false, Some(period)) => {
            format!("{prefix}:{{{policy}:{partition}}}:{}", period_name(period))
        }
        (true, period_us) => {
            let digest = sha1_smol::Sha1::from(partition.as_bytes())
                .digest()
                .to_string();
            match period_us {
                None => format!("{prefix}:{{{policy}:#{digest}}}"),
                Some(period) => {
                    format!("{prefix}:{{{policy}:#{digest}}}:{}", period_name(period))
                }
            }
        }
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the
/// first `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = key
        .find('{')
        .and_then(|open| {
            let close = key[open + 1..].find('}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    crc16(hashed) % 16_384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn key(values: &[&str]) -> String {
        redis_key("rl", &Key::new(Arc::from("api"), values.iter().copied()))
    }

    #[test]
    fn layout_keeps_one_hash_tag() {
        assert_eq!(key(&["acme", "k1"]), "rl:{api:acme:k1}");
        let hostile = key(&["}{", "a:b{c}"]);
        assert_eq!(hostile.matches('{').count(), 1, "{hostile}");
        assert_eq!(hostile.matches('}').count(), 1, "{hostile}");
        assert!(hostile.ends_with('}'));
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Reference values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(
            slot("{}x"),
            crc16(b"{}x") % 16_384,
            "an empty tag hashes the whole key"
        );
    }

    #[test]
    fn windows_follow_the_tag_and_share_its_slot() {
        let plain = Key::new(Arc::from("api"), ["acme", "k1"]);
        let second = redis_key("rl", &plain.for_window(1_000_000));
        let hour = redis_key("rl", &plain.for_window(5_400_000_000));
        assert_eq!(
            redis_key("rl", &plain),
            "rl:{api:acme:k1}",
            "one window: as before"
        );
        assert_eq!(second, "rl:{api:acme:k1}:1s");
        assert_eq!(hour, "rl:{api:acme:k1}:1h30m");
        assert_eq!(slot(&second), slot(&hour));
        assert_eq!(slot(&second), slot("rl:{api:acme:k1}"));
        // A hostile value cannot end the tag early and fake a window.
        let fake = Key::new(Arc::from("api"), ["acme", "k1}:1s"]);
        assert_ne!(redis_key("rl", &fake), second);
        let long = Key::new(Arc::from("api"), ["x".repeat(200).as_str()]);
        let (a, b) = (long.for_window(1_000_000), long.for_window(2_000_000));
        assert_ne!(redis_key("rl", &a), redis_key("rl", &b));
        assert_eq!(slot(&redis_key("rl", &a)), slot(&redis_key("rl", &long)));
    }

    #[test]
    fn long_partitions_are_hashed_and_stay_distinct() {
        let a = "x".repeat(200);
        let b = format!("{}y", "x".repeat(199));
        assert_ne!(key(&[&a]), key(&[&b]));
        assert!(key(&[&a]).len() < 64);
        assert_ne!(key(&[&a]), key(&["#"]), "a raw `#` is escaped");
    }
}

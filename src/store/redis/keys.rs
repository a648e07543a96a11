//! Redis key layout: `<prefix>:{<policy>:<partition>}`.
//!
//! The whole counter identity sits inside one hash tag, so every key a script touches (just the
//! one) maps to one Cluster slot, and different partitions spread over the slots. The partition
//! is already escaped by [`Key`] (`%`, `:`, `{`, `}`, `#` and control bytes), so a value can neither
//! collide with another nor move the tag. Partitions longer than [`MAX_PARTITION_BYTES`] are
//! replaced by `#` and their SHA-1, bounding memory per key; `#` cannot start an escaped value.

use crate::limit::Key;

/// Longest partition stored as is; longer ones are hashed.
pub const MAX_PARTITION_BYTES: usize = 128;

/// The Redis key of a counter.
pub fn redis_key(prefix: &str, key: &Key) -> String {
    let partition = key.partition();
    if partition.len() > MAX_PARTITION_BYTES {
        let digest = sha1_smol::Sha1::from(partition.as_bytes())
            .digest()
            .to_string();
        format!("{prefix}:{{{}:#{digest}}}", key.policy())
    } else {
        format!("{prefix}:{{{}:{partition}}}", key.policy())
    }
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
    fn long_partitions_are_hashed_and_stay_distinct() {
        let a = "x".repeat(200);
        let b = format!("{}y", "x".repeat(199));
        assert_ne!(key(&[&a]), key(&[&b]));
        assert!(key(&[&a]).len() < 64);
        assert_ne!(key(&[&a]), key(&["#"]), "a raw `#` is escaped");
    }
}

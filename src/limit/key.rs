//! Storage keys: which counter a request spends from, built injectively from descriptor values.

use std::fmt;
use std::sync::Arc;

/// Identifies one counter: a policy and the partition (e.g. one tenant's API key) within it.
///
/// The partition is the policy's key descriptor values, each percent-escaped and joined with `:`.
/// Escaping `%`, `:`, `{`, `}`, `#` and control bytes makes the encoding injective (two different
/// value lists never give the same partition), keeps Redis hash tags (`{...}`) under the store's
/// control, and leaves a leading `#` free to mark hashed partitions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    policy: Arc<str>,
    partition: String,
}

impl Key {
    /// Builds the key of `policy` for the given key descriptor values, in the policy's order.
    pub fn new<'a>(policy: Arc<str>, values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut partition = String::new();
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                partition.push(':');
            }
            escape_into(value, &mut partition);
        }
        Self { policy, partition }
    }

    /// The key of `policy` whose partition is `partition` as [`Key::partition`] gives it
    /// (already escaped): how a key named in a message from another process is rebuilt.
    pub fn from_partition(policy: Arc<str>, partition: String) -> Self {
        Self { policy, partition }
    }

    /// The policy this counter belongs to.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The escaped partition within the policy.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// A stable number in 0..100 for this key, the same in every process and release: rollouts
    /// by percentage pick the same partitions everywhere.
    pub fn bucket_of_100(&self) -> u8 {
        (self.stable_hash() % 100) as u8
    }

    /// FNV-1a over policy and partition: stable across processes, unlike `std`'s hasher.
    fn stable_hash(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.policy.bytes().chain([0]).chain(self.partition.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.policy, self.partition)
    }
}

fn escape_into(value: &str, out: &mut String) {
    for ch in value.chars() {
        match ch {
            '%' | ':' | '{' | '}' | '#' => push_escaped(ch as u8, out),
            c if c.is_ascii_control() => push_escaped(c as u8, out),
            c => out.push(c),
        }
    }
}

fn push_escaped(byte: u8, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(byte >> 4)] as char);
    out.push(HEX[usize::from(byte & 0x0f)] as char);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(values: &[&str]) -> Key {
        Key::new(Arc::from("p"), values.iter().copied())
    }

    #[test]
    fn separators_inside_values_cannot_collide() {
        assert_ne!(key(&["a:b", "c"]), key(&["a", "b:c"]));
        assert_ne!(key(&["a%3Ab"]), key(&["a:b"]));
        assert_eq!(key(&["a:b", "c"]).partition(), "a%3Ab:c");
    }

    #[test]
    fn braces_are_escaped_so_hash_tags_stay_fixed() {
        let k = key(&["{x}", "\n"]);
        assert!(!k.partition().contains('{') && !k.partition().contains('}'));
        assert_eq!(k.partition(), "%7Bx%7D:%0A");
    }

    #[test]
    fn policy_is_part_of_identity() {
        let a = Key::new(Arc::from("a"), ["x"]);
        let b = Key::new(Arc::from("b"), ["x"]);
        assert_ne!(a, b);
        assert_eq!(a.to_string(), "a:x");
    }
}

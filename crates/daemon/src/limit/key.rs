//! Storage keys: which counter a request spends from, built injectively from descriptor values.

use std::fmt;
use std::sync::Arc;

use super::Micros;

/// Identifies one counter: a policy and the partition (e.g. one tenant's API key) within it.
///
/// The partition is the policy's key descriptor values, each percent-escaped and joined with `:`.
/// Escaping `%`, `:`, `{`, `}`, `#` and control bytes makes the encoding injective (two different
/// value lists never give the same partition), keeps Redis hash tags (`{...}`) under the store's
/// control, and leaves a leading `#` free to mark hashed partitions.
///
/// A policy of several windows has one counter per window: the same partition with the window's
/// period. A policy of one window has no period in its key, so its counters are the same as
/// before windows existed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    policy: Arc<str>,
    partition: String,
    /// The period of its window, for a policy of several windows.
    period_us: Option<Micros>,
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
        Self {
            policy,
            partition,
            period_us: None,
        }
    }

    /// The counter of the window of `period_us` in the same partition (policies of several
    /// windows only).
    pub fn for_window(&self, period_us: Micros) -> Self {
        Self {
            period_us: Some(period_us),
            ..self.clone()
        }
    }

    /// The key of `policy` whose partition is `partition` as [`Key::partition`] gives it
    /// (already escaped): how a key named in a message from another process is rebuilt.
    pub fn from_partition(policy: Arc<str>, partition: String) -> Self {
        Self {
            policy,
            partition,
            period_us: None,
        }
    }

    /// The partition's own key, without a window: what a policy's local limit counts in.
    pub fn without_window(&self) -> Self {
        Self {
            period_us: None,
            ..self.clone()
        }
    }

    /// The policy this counter belongs to.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The policy's name as shared by every key of it (a cheap clone).
    pub fn policy_name(&self) -> &Arc<str> {
        &self.policy
    }

    /// The escaped partition within the policy.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// The period of this counter's window, for a policy of several windows; `None` for a
    /// policy of one.
    pub fn period_us(&self) -> Option<Micros> {
        self.period_us
    }

    /// A stable number in 0..100 for this key, the same in every process and release: rollouts
    /// by percentage pick the same partitions everywhere. The window is left out, so that every
    /// window of a partition is in or out of a rollout together.
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
        write!(f, "{}:{}", self.policy, self.partition)?;
        match self.period_us {
            Some(period_us) => write!(f, "@{period_us}us"),
            None => Ok(()),
        }
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

    #[test]
    fn windows_are_apart_but_share_the_rollout_bucket() {
        let plain = key(&["x"]);
        let second = plain.for_window(1_000_000);
        let hour = plain.for_window(3_600_000_000);
        assert_ne!(plain, second);
        assert_ne!(second, hour);
        assert_eq!(hour.partition(), plain.partition());
        assert_eq!(hour.period_us(), Some(3_600_000_000));
        assert_eq!(second.to_string(), "p:x@1000000us");
        assert_eq!(plain.bucket_of_100(), hour.bucket_of_100());
    }
}

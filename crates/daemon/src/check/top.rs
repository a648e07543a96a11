//! "Who is limited": per policy, the partitions denied most, and apart from them the partitions a
//! shadow policy (or a partition outside a rollout) would have blocked most, each kept by a
//! fixed-memory heavy-hitters sketch ([`super::top_sketch`]) of the same bounds and served on the
//! admin listener (`GET /v1/top`, `sluice top`). Only denials and would-blocks touch them (the
//! allow path never does): one read lock on the policies' map and the policy's own mutex,
//! O(capacity) work. At most [`MAX_POLICIES`] policies have lists; a reload keeps the lists of
//! policies still present (same name) and drops the others'. Counted since the daemon started (or
//! the policy appeared), in this pod only.
//!
//! Entries name the partition by the same keyed fingerprint as the log lines (the same on every
//! pod given `shadow.fingerprint_key`, else random per process), worked out when a partition
//! enters a list (an HMAC costs more than the rest of a denial); within a list a partition is
//! known by a cheaper hash keyed at random per process. The partition itself (escaped
//! key descriptor values, as `/v1/counters` shows it) is kept too, at most 128 bytes, and shown
//! only to loopback clients (see `transport::top`).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::top_sketch::SpaceSaving;
use super::verdict::PolicyDecision;
use super::CheckService;
use crate::limit::{Key, PolicySet};

/// Partitions tracked per policy.
pub const TOP_CAPACITY: usize = 64;
/// Policies with a list; a policy beyond (in file order) has none (its denials are not listed).
pub const MAX_POLICIES: usize = 512;

/// The lists of every policy: denials and shadow would-blocks, apart.
pub struct TopDenied {
    denied: Lists,
    would_block: Lists,
    /// Keys the partitions' identities within the lists.
    ids: RandomState,
}

/// Which of a policy's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// Denials (enforced, local, local limit).
    Denied,
    /// Would-blocks of a shadow policy or of a partition outside a rollout (nothing blocked).
    WouldBlock,
}

/// One list per policy.
struct Lists {
    lists: RwLock<HashMap<Arc<str>, Mutex<SpaceSaving>>>,
}

/// One policy's list as served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopList {
    /// The policy.
    pub policy: String,
    /// Denials of the policy noted (every partition's); in a would-block list, would-blocks.
    pub denials: u64,
    /// Partitions the list can hold; with more denied partitions, counts carry an error bound.
    pub capacity: usize,
    /// The most denied partitions, most first.
    pub entries: Vec<TopEntry>,
}

/// One partition of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopEntry {
    /// The partition's fingerprint, as in the log lines.
    pub fingerprint: String,
    /// The partition (escaped key descriptor values, joined by `:`), for loopback clients only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Whether `partition` was cut at 128 bytes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partition_truncated: bool,
    /// Denials (would-blocks) counted: at most `error` more than the true number.
    pub denials: u64,
    /// The overestimate bound: the true number is in `denials - error ..= denials`.
    pub error: u64,
    /// The last denial, in milliseconds since the Unix epoch.
    pub last_denied_unix_ms: u64,
}

impl TopDenied {
    /// Lists for `policies` (the first [`MAX_POLICIES`]).
    pub fn new(policies: &PolicySet) -> Self {
        let top = Self {
            denied: Lists::new(),
            would_block: Lists::new(),
            ids: RandomState::new(),
        };
        top.replace_policies(policies);
        top
    }

    fn of(&self, tally: Tally) -> &Lists {
        match tally {
            Tally::Denied => &self.denied,
            Tally::WouldBlock => &self.would_block,
        }
    }

    /// Keeps the lists of policies still in `policies`, drops the others', adds empty ones.
    pub fn replace_policies(&self, policies: &PolicySet) {
        self.denied.replace_policies(policies);
        self.would_block.replace_policies(policies);
    }

    /// Counts a denial or would-block of `key`'s partition under `policy`; `fingerprint` is
    /// asked for when the partition enters the list.
    pub fn note(&self, tally: Tally, policy: &str, key: &Key, fingerprint: impl FnOnce() -> u64) {
        let id = self.ids.hash_one(key.partition());
        self.of(tally).note(policy, id, key, fingerprint);
    }

    /// The `limit` partitions of `policy` noted most in `tally` (`None`: it has no list),
    /// partitions shown only with `raw`.
    pub fn list(&self, tally: Tally, policy: &str, limit: usize, raw: bool) -> Option<TopList> {
        self.of(tally).list(policy, limit, raw)
    }

    /// Every listed policy with at least one entry in `tally`, in name order.
    pub fn noted_policies(&self, tally: Tally) -> Vec<String> {
        self.of(tally).noted_policies()
    }

    /// Partitions tracked over every list of both kinds (at most
    /// `2 * MAX_POLICIES * TOP_CAPACITY`).
    pub fn tracked(&self) -> usize {
        self.denied.tracked() + self.would_block.tracked()
    }
}

impl Lists {
    fn new() -> Self {
        Self {
            lists: RwLock::new(HashMap::new()),
        }
    }

    fn replace_policies(&self, policies: &PolicySet) {
        let mut lists = self.lists.write().unwrap_or_else(|p| p.into_inner());
        let names: Vec<&str> = policies
            .iter()
            .map(|p| p.name())
            .take(MAX_POLICIES)
            .collect();
        lists.retain(|name, _| names.contains(&&**name));
        for name in names {
            if !lists.contains_key(name) {
                lists.insert(Arc::from(name), Mutex::new(SpaceSaving::new(TOP_CAPACITY)));
            }
        }
    }

    fn note(&self, policy: &str, id: u64, key: &Key, fingerprint: impl FnOnce() -> u64) {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let Some(list) = lists.get(policy) else {
            return;
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut list = list.lock().unwrap_or_else(|p| p.into_inner());
        list.note(id, || (fingerprint(), key.partition().to_owned()), now_ms);
    }

    fn list(&self, policy: &str, limit: usize, raw: bool) -> Option<TopList> {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let list = lists.get(policy)?.lock().unwrap_or_else(|p| p.into_inner());
        Some(TopList {
            policy: policy.to_owned(),
            denials: list.total(),
            capacity: list.capacity(),
            entries: list
                .top(limit)
                .into_iter()
                .map(|e| TopEntry {
                    fingerprint: format!("{:016x}", e.fingerprint),
                    partition: raw.then_some(e.label),
                    partition_truncated: raw && e.truncated,
                    denials: e.count,
                    error: e.error,
                    last_denied_unix_ms: e.last_ms,
                })
                .collect(),
        })
    }

    fn noted_policies(&self) -> Vec<String> {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = lists
            .iter()
            .filter(|(_, list)| list.lock().map_or(true, |l| !l.is_empty()))
            .map(|(name, _)| name.to_string())
            .collect();
        names.sort();
        names
    }

    fn tracked(&self) -> usize {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        lists
            .values()
            .map(|l| l.lock().map_or(0, |l| l.len()))
            .sum()
    }
}

impl CheckService {
    /// Counts a denial or would-block in the policy's top list of `tally` (the partition, every
    /// window as one).
    pub(super) fn note_top(&self, tally: Tally, part: &PolicyDecision) {
        let fingerprint = || self.shadow_log.fingerprint_id(&part.key);
        // A policy of one window (most) needs no copy of its key.
        if part.key.period_us().is_none() {
            self.top
                .note(tally, part.policy.name(), &part.key, fingerprint);
        } else {
            let key = part.key.without_window();
            self.top.note(tally, part.policy.name(), &key, fingerprint);
        }
    }

    /// The `limit` partitions of `policy` noted most in `tally` in this pod (`None`: no such
    /// list); the partitions themselves only with `raw` (else fingerprints only).
    pub fn top_list(&self, tally: Tally, policy: &str, limit: usize, raw: bool) -> Option<TopList> {
        self.top.list(tally, policy, limit, raw)
    }

    /// Policies with at least one entry listed in `tally`, in name order.
    pub fn top_policies(&self, tally: Tally) -> Vec<String> {
        self.top.noted_policies(tally)
    }

    /// Partitions tracked by every policy's top list (bounded whatever the traffic).
    pub fn top_tracked(&self) -> usize {
        self.top.tracked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_policies;

    fn set(yaml: &str) -> PolicySet {
        parse_policies(std::path::Path::new("t.yaml"), yaml).expect("valid")
    }

    const TWO: &str = "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}\n  - {name: b, key: [ip], algorithm: fixed_window, limit: 1, period: 1h}\n";

    #[test]
    fn partitions_only_when_raw_and_lists_follow_reloads() {
        let top = TopDenied::new(&set(TWO));
        let key = Key::new(Arc::from("a"), ["203.0.113.7"]);
        top.note(Tally::Denied, "a", &key, || 7);
        top.note(Tally::Denied, "b", &key, || 8);
        top.note(Tally::WouldBlock, "b", &key, || 9);
        assert_eq!(top.noted_policies(Tally::WouldBlock), ["b"]);
        let would = top.list(Tally::WouldBlock, "b", 10, false).expect("b list");
        assert_eq!(
            (would.denials, &*would.entries[0].fingerprint),
            (1, "0000000000000009")
        );
        assert_eq!(
            top.list(Tally::WouldBlock, "a", 10, false)
                .map(|l| l.denials),
            Some(0)
        );
        let hidden = top.list(Tally::Denied, "a", 10, false).expect("a list");
        assert_eq!(hidden.entries[0].partition, None);
        assert_eq!(hidden.entries[0].fingerprint, "0000000000000007");
        let shown = top.list(Tally::Denied, "a", 10, true).expect("a list");
        assert_eq!(shown.entries[0].partition.as_deref(), Some("203.0.113.7"));
        // b removed, a kept with its denial, c new and empty.
        top.replace_policies(&set(&TWO.replace("name: b", "name: c")));
        assert!(top.list(Tally::Denied, "b", 10, true).is_none());
        assert!(top.list(Tally::WouldBlock, "b", 10, true).is_none());
        assert_eq!(
            top.list(Tally::Denied, "a", 10, true).map(|l| l.denials),
            Some(1)
        );
        assert_eq!(top.noted_policies(Tally::Denied), ["a"]);
        assert!(top.noted_policies(Tally::WouldBlock).is_empty());
        assert_eq!(top.tracked(), 1);
    }
}

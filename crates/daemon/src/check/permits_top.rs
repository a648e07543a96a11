//! Concurrency partitions in `/v1/top`: per concurrency policy, the partitions this pod took
//! permits in most recently (at most [`TOP_CAPACITY`] per policy, the least recent dropped for a
//! new one), each with the slots held **now**, read from the store when `/v1/top` is asked (one
//! dry-run read of all of them, on the store's clock: every pod's permits, expired ones not
//! counted). A per-policy gauge of permits held is not kept: held permits live in the store (on
//! Redis, one sorted set per partition shared by every pod, dropping expired members only when
//! a call touches them), so a pod's own tally drifts (permits released through another pod,
//! partitions whose permits all expired); `sluice_permits_total` counts this pod's events and
//! this list reads the truth for the partitions that matter.
//!
//! Noted on each permit acquired (a request that already costs its own store call): one read
//! lock on the policies' map and the policy's own mutex, O(capacity) work when a partition is new.
//!
//! [`TOP_CAPACITY`]: super::TOP_CAPACITY

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::top::{MAX_POLICIES, TOP_CAPACITY};
use super::top_sketch::cut;
use super::CheckService;
use crate::limit::{Algorithm, PolicySet};
use crate::store::{Spend, StoreCheck, StoreError};

/// Partitions permits were taken in, per concurrency policy.
#[derive(Default)]
pub struct HeldPartitions {
    lists: RwLock<HashMap<Arc<str>, Mutex<Recent>>>,
}

/// One policy's partitions, by fingerprint.
#[derive(Default)]
struct Recent {
    entries: HashMap<u64, Seen>,
    /// Acquisitions noted so far: orders the entries by recency.
    noted: u64,
}

/// A partition as listed, before its slots are read.
struct Listed {
    id: u64,
    read: StoreCheck,
    acquired: u64,
    last_ms: u64,
}

struct Seen {
    /// The read of the partition's slots: its key and quota (tier included), cost 0.
    read: StoreCheck,
    acquired: u64,
    last_ms: u64,
    /// `Recent::noted` at its last acquisition.
    last: u64,
}

/// One concurrency policy's partitions as served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldList {
    /// The policy.
    pub policy: String,
    /// Partitions the list can hold; the least recently acquired is dropped for a new one.
    pub capacity: usize,
    /// The partitions, most slots held first, then most acquired in this pod.
    pub entries: Vec<HeldEntry>,
}

/// One partition's slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldEntry {
    /// The partition's fingerprint, as in the log lines and the other top lists.
    pub fingerprint: String,
    /// The partition, for loopback clients only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Whether `partition` was cut at 128 bytes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partition_truncated: bool,
    /// Permits held now, by every pod (read from the store; `null` when it could not answer).
    pub held: Option<u64>,
    /// The partition's limit (its tier's, if any).
    pub limit: u64,
    /// Permits this pod acquired in the partition since it was listed.
    pub acquired: u64,
    /// This pod's last acquisition, in milliseconds since the Unix epoch.
    pub last_acquired_unix_ms: u64,
}

impl HeldPartitions {
    /// Keeps the lists of concurrency policies still in `policies` (the first [`MAX_POLICIES`])
    /// and not redefined since (their reads would be of the old quota); drops the others.
    pub fn replace_policies(&self, policies: &PolicySet, changed: impl Fn(&str) -> bool) {
        let mut lists = self.lists.write().unwrap_or_else(|p| p.into_inner());
        let names: Vec<&str> = policies
            .iter()
            .filter(|p| {
                matches!(
                    p.parts().quota.windows().first(),
                    Some(Algorithm::Concurrency(_))
                )
            })
            .map(|p| p.name())
            .take(MAX_POLICIES)
            .collect();
        lists.retain(|name, _| names.contains(&&**name) && !changed(name));
        for name in names {
            lists.entry(Arc::from(name)).or_default();
        }
    }

    /// Notes a permit acquired under `check` (partition fingerprint `id`).
    pub fn note(&self, id: u64, check: &StoreCheck) {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let Some(list) = lists.get(check.key.policy()) else {
            return;
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut list = list.lock().unwrap_or_else(|p| p.into_inner());
        list.noted += 1;
        let last = list.noted;
        if let Some(seen) = list.entries.get_mut(&id) {
            seen.acquired += 1;
            seen.last_ms = now_ms;
            seen.last = last;
            return;
        }
        if list.entries.len() >= TOP_CAPACITY {
            let oldest = list
                .entries
                .iter()
                .min_by_key(|(_, seen)| seen.last)
                .map(|(&id, _)| id);
            if let Some(oldest) = oldest {
                list.entries.remove(&oldest);
            }
        }
        let read = StoreCheck {
            cost: 0,
            ..check.clone()
        };
        list.entries.insert(
            id,
            Seen {
                read,
                acquired: 1,
                last_ms: now_ms,
                last,
            },
        );
    }

    /// `policy`'s partitions (`None`: not a listed concurrency policy), unread.
    fn snapshot(&self, policy: &str) -> Option<Vec<Listed>> {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let list = lists.get(policy)?.lock().unwrap_or_else(|p| p.into_inner());
        Some(
            list.entries
                .iter()
                .map(|(&id, seen)| Listed {
                    id,
                    read: seen.read.clone(),
                    acquired: seen.acquired,
                    last_ms: seen.last_ms,
                })
                .collect(),
        )
    }

    /// Listed concurrency policies with at least one partition, in name order.
    fn noted_policies(&self) -> Vec<String> {
        let lists = self.lists.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = lists
            .iter()
            .filter(|(_, list)| list.lock().map_or(true, |l| !l.entries.is_empty()))
            .map(|(name, _)| name.to_string())
            .collect();
        names.sort();
        names
    }
}

impl CheckService {
    /// The concurrency partitions of `policy` (or of every concurrency policy with one), each
    /// with its slots held now read from the store in one dry run, most held first (then most acquired here), `limit`
    /// per policy; partitions shown only with `raw`. A store that cannot answer leaves `held`
    /// null.
    pub async fn held_lists(&self, policy: Option<&str>, limit: usize, raw: bool) -> Vec<HeldList> {
        let names = match policy {
            Some(name) => vec![name.to_owned()],
            None => self.permits.held.noted_policies(),
        };
        let snapshots: Vec<(String, Vec<Listed>)> = names
            .into_iter()
            .filter_map(|name| {
                let snapshot = self.permits.held.snapshot(&name)?;
                Some((name, snapshot))
            })
            .collect();
        let reads: Vec<StoreCheck> = snapshots
            .iter()
            .flat_map(|(_, entries)| entries.iter().map(|e| e.read.clone()))
            .collect();
        let decisions = if reads.is_empty() {
            Ok(Vec::new())
        } else {
            self.store.check(&reads, Spend::DryRun, None).await
        };
        let decisions = match decisions {
            Ok(decisions) if decisions.len() == reads.len() => Some(decisions),
            Ok(_) => None,
            Err(error) => {
                let error: StoreError = error;
                tracing::debug!(%error, "/v1/top: the store could not read the permits held");
                None
            }
        };
        let mut at = 0;
        snapshots
            .into_iter()
            .map(|(name, entries)| {
                let mut listed: Vec<HeldEntry> = entries
                    .into_iter()
                    .map(
                        |Listed {
                             id,
                             read,
                             acquired,
                             last_ms,
                         }| {
                            let decision = decisions.as_ref().map(|d| d[at]);
                            at += 1;
                            let limit =
                                decision.map_or_else(|| read.algorithm.limit(), |d| d.limit);
                            let (partition, truncated) = if raw {
                                let (shown, cut) = cut(read.key.partition().to_owned());
                                (Some(shown), cut)
                            } else {
                                (None, false)
                            };
                            HeldEntry {
                                fingerprint: format!("{id:016x}"),
                                partition,
                                partition_truncated: truncated,
                                held: decision.map(|d| d.limit.saturating_sub(d.remaining)),
                                limit,
                                acquired,
                                last_acquired_unix_ms: last_ms,
                            }
                        },
                    )
                    .collect();
                listed.sort_by(|a, b| {
                    (b.held, b.acquired, b.last_acquired_unix_ms)
                        .cmp(&(a.held, a.acquired, a.last_acquired_unix_ms))
                        .then_with(|| a.fingerprint.cmp(&b.fingerprint))
                });
                listed.truncate(limit);
                HeldList {
                    policy: name,
                    capacity: TOP_CAPACITY,
                    entries: listed,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_policies;
    use crate::limit::Key;

    const SET: &str = "policies:\n  - {name: gen, key: [t], algorithm: concurrency, limit: 2}\n  - {name: other, key: [t], algorithm: fixed_window, limit: 1, period: 1h}\n";

    fn check(set: &PolicySet, n: u64) -> StoreCheck {
        let policy = set.get("gen").expect("gen");
        StoreCheck {
            key: Key::new(Arc::from("gen"), [n.to_string().as_str()]),
            algorithm: policy.parts().quota.windows()[0],
            cost: 1,
            enforce: true,
            generation: 0,
        }
    }

    #[test]
    fn a_list_keeps_the_most_recently_acquired_partitions_of_concurrency_policies() {
        let set = parse_policies(std::path::Path::new("t.yaml"), SET).expect("valid");
        let held = HeldPartitions::default();
        held.replace_policies(&set, |_| false);
        assert!(held.snapshot("other").is_none(), "not a concurrency policy");
        for n in 0..TOP_CAPACITY as u64 {
            held.note(n, &check(&set, n));
        }
        held.note(0, &check(&set, 0)); // 0 acquired again: 1 is now the least recent
        held.note(1_000, &check(&set, 1_000));
        let listed = held.snapshot("gen").expect("a list");
        assert_eq!(listed.len(), TOP_CAPACITY);
        let ids: Vec<u64> = listed.iter().map(|l| l.id).collect();
        assert!(!ids.contains(&1) && ids.contains(&0) && ids.contains(&1_000));
        let zero = listed.iter().find(|l| l.id == 0).expect("0 listed");
        assert_eq!((zero.acquired, zero.read.cost), (2, 0), "read at cost 0");
        assert_eq!(held.noted_policies(), ["gen"]);
        // A reload that changes the policy starts its list afresh; one without it drops it.
        held.replace_policies(&set, |name| name == "gen");
        assert_eq!(held.snapshot("gen").map(|l| l.len()), Some(0));
        let without = parse_policies(std::path::Path::new("t.yaml"), "policies:\n  - {name: other, key: [t], algorithm: fixed_window, limit: 1, period: 1h}\n").expect("valid");
        held.replace_policies(&without, |_| false);
        assert!(held.snapshot("gen").is_none());
    }
}

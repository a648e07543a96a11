//! The heavy-hitters sketch behind "who is limited": Space-Saving (Metwally, Agrawal, El Abbadi,
//! 2005) with a fixed number of counters. Pure: ids and times are passed in.
//!
//! With `capacity` counters over a stream of `total` denials it guarantees, for every partition:
//! a partition denied more than `total / capacity` times is always listed; a listed partition's
//! `count` overestimates its true denials by at most its `error` (`count - error <= true <=
//! count`), and `error <= total / capacity`. Memory is `capacity` entries, each with a label of
//! at most [`MAX_LABEL`] bytes, whatever the traffic.

/// Longest label (the partition as shown) an entry keeps, in bytes; longer ones are cut at a
/// character boundary and flagged.
pub const MAX_LABEL: usize = 128;

/// One tracked partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The partition's identity (a keyed hash of its counter key).
    pub id: u64,
    /// The partition as shown, at most [`MAX_LABEL`] bytes.
    pub label: String,
    /// Whether `label` was cut.
    pub truncated: bool,
    /// Denials counted (an overestimate by at most `error`).
    pub count: u64,
    /// How much of `count` may belong to partitions this entry replaced.
    pub error: u64,
    /// When it was last denied (ms since the Unix epoch).
    pub last_ms: u64,
}

/// A fixed-capacity Space-Saving summary.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    entries: Vec<Entry>,
    total: u64,
}

impl SpaceSaving {
    /// An empty summary of `capacity` counters (at least 1); nothing is allocated until used.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: Vec::new(),
            total: 0,
        }
    }

    /// Counters kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Denials noted so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Partitions tracked now (at most the capacity).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was noted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counts one denial of partition `id` at `now_ms`; `label` is asked for only when the
    /// partition takes a counter. O(capacity): a scan of ids, no allocation for a tracked one.
    pub fn note(&mut self, id: u64, label: impl FnOnce() -> String, now_ms: u64) {
        self.total = self.total.saturating_add(1);
        if let Some(entry) = self.entries.iter_mut().find(|e| e.id == id) {
            entry.count = entry.count.saturating_add(1);
            entry.last_ms = entry.last_ms.max(now_ms);
            return;
        }
        let (label, truncated) = cut(label());
        if self.entries.len() < self.capacity {
            self.entries.push(Entry {
                id,
                label,
                truncated,
                count: 1,
                error: 0,
                last_ms: now_ms,
            });
            return;
        }
        // Full: the least counted entry gives its counter to the newcomer, whose count then
        // includes (at most) the replaced one's.
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            *min = Entry {
                id,
                label,
                truncated,
                count: min.count.saturating_add(1),
                error: min.count,
                last_ms: now_ms,
            };
        }
    }

    /// The `limit` most denied entries, most first (ties: the most recent first).
    pub fn top(&self, limit: usize) -> Vec<Entry> {
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_ms.cmp(&a.last_ms)));
        sorted.into_iter().take(limit).cloned().collect()
    }
}

/// `label` within [`MAX_LABEL`] bytes, and whether it was cut.
pub(super) fn cut(mut label: String) -> (String, bool) {
    if label.len() <= MAX_LABEL {
        return (label, false);
    }
    let mut end = MAX_LABEL;
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    label.truncate(end);
    label.shrink_to_fit();
    (label, true)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Space-Saving's guarantees on skewed random streams.
        #[test]
        fn heavy_hitters_are_listed_and_counts_are_bounded(
            capacity in 1usize..20,
            stream in prop::collection::vec(
                prop_oneof![3 => 0u64..4, 2 => 0u64..40, 1 => 0u64..2_000], 0..3_000),
        ) {
            let mut sketch = SpaceSaving::new(capacity);
            let mut exact: HashMap<u64, u64> = HashMap::new();
            for (t, &id) in stream.iter().enumerate() {
                sketch.note(id, || format!("p{id}"), t as u64);
                *exact.entry(id).or_default() += 1;
            }
            let total = stream.len() as u64;
            prop_assert_eq!(sketch.total(), total);
            prop_assert!(sketch.len() <= capacity);
            let listed = sketch.top(capacity);
            let sum: u64 = listed.iter().map(|e| e.count).sum();
            prop_assert_eq!(sum, total, "counts add up to the stream");
            for entry in &listed {
                let truth = exact[&entry.id];
                prop_assert!(entry.count - entry.error <= truth && truth <= entry.count, "{:?} true {}", entry, truth);
                prop_assert!(entry.error <= total / capacity as u64, "{:?}", entry);
                prop_assert_eq!(&entry.label, &format!("p{}", entry.id));
            }
            for (id, &count) in &exact {
                if count > total / capacity as u64 {
                    prop_assert!(listed.iter().any(|e| e.id == *id), "{} denied {} of {} missing", id, count, total);
                }
            }
        }
    }

    #[test]
    fn many_distinct_partitions_stay_at_capacity() {
        let mut sketch = SpaceSaving::new(8);
        for id in 0..100_000u64 {
            sketch.note(id, || "x".repeat(1_000), id);
        }
        assert_eq!(sketch.len(), 8);
        assert!(sketch
            .top(100)
            .iter()
            .all(|e| e.label.len() == MAX_LABEL && e.truncated));
    }

    #[test]
    fn labels_are_cut_at_a_character_boundary() {
        let (label, cut_) = cut("é".repeat(100));
        assert!(cut_ && label.len() <= MAX_LABEL && label.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_most_denied_come_first_with_their_last_denial() {
        let mut sketch = SpaceSaving::new(4);
        for (t, id) in [1, 2, 2, 3, 2, 1].into_iter().enumerate() {
            sketch.note(id, || id.to_string(), 100 + t as u64);
        }
        let top: Vec<(u64, u64, u64)> = sketch
            .top(2)
            .iter()
            .map(|e| (e.id, e.count, e.last_ms))
            .collect();
        assert_eq!(top, [(2, 3, 104), (1, 2, 105)]);
    }
}

//! Cluster node calls: which primary serves each hash slot, as this daemon last read it with
//! `CLUSTER SLOTS`, so that a batch's checks go out as one call per node (the node script, flagged
//! `allow-cross-slot-keys`: Redis >= 7.0) instead of one per slot.
//!
//! The map only groups checks; redis-rs still routes each call (by its first slot) and follows
//! `MOVED`/`ASK` itself. A call grouped by a stale map (a resharding moved a slot) is refused by
//! the node before anything is written (the script checks that every key is local first), its
//! checks are resent one call per slot, and the map is read again in the background. Without a
//! map (not read yet, being re-read, or a server that refused the node script) calls go one per
//! slot, as on Redis 6.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use redis::Value;

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16_384;
/// A slot no primary serves (the map is then unusable for it: one call per slot).
const UNSERVED: u16 = u16::MAX;

/// The primary serving each slot, as a small node number.
pub struct SlotMap {
    owners: Box<[u16]>,
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ...], replicas...], ...]`.
    /// Nodes are told apart by id (by `host:port` when a server gives none).
    pub fn from_cluster_slots(reply: &Value) -> Result<Self, String> {
        let Value::Array(ranges) = reply else {
            return Err("CLUSTER SLOTS reply is not an array".into());
        };
        let mut owners = vec![UNSERVED; SLOTS].into_boxed_slice();
        let mut nodes: Vec<Vec<u8>> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err("CLUSTER SLOTS entry is not an array".into());
            };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (slot(fields.first()), slot(fields.get(1)), fields.get(2))
            else {
                return Err("CLUSTER SLOTS entry without a slot range and a primary".into());
            };
            if start > end {
                return Err(format!("CLUSTER SLOTS range {start}-{end} is reversed"));
            }
            let identity = match primary.get(2) {
                Some(Value::BulkString(id)) if !id.is_empty() => id.clone(),
                _ => format!("{:?}:{:?}", primary.first(), primary.get(1)).into_bytes(),
            };
            let node = match nodes.iter().position(|known| *known == identity) {
                Some(index) => index,
                None => {
                    nodes.push(identity);
                    nodes.len() - 1
                }
            };
            let node = u16::try_from(node).map_err(|_| "more nodes than slots".to_owned())?;
            owners[usize::from(start)..=usize::from(end)].fill(node);
        }
        Ok(Self { owners })
    }

    /// The node serving `slot`, if the map knows one.
    pub fn node_of(&self, slot: u16) -> Option<u16> {
        self.owners
            .get(usize::from(slot))
            .copied()
            .filter(|&node| node != UNSERVED)
    }
}

/// A slot number from a reply field (`0..16384`).
fn slot(field: Option<&Value>) -> Option<u16> {
    match field {
        Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|&s| usize::from(s) < SLOTS),
        _ => None,
    }
}

/// The slot map of one Cluster connection whose nodes took the node script.
#[derive(Default)]
pub struct NodeCalls {
    map: RwLock<Option<Arc<SlotMap>>>,
    refreshing: AtomicBool,
}

impl NodeCalls {
    /// The map to group by, if one is known.
    pub fn map(&self) -> Option<Arc<SlotMap>> {
        self.map.read().map_or(None, |map| map.clone())
    }

    /// Replaces the map (`None`: one call per slot until the next one is read).
    pub fn set(&self, map: Option<SlotMap>) {
        if let Ok(mut current) = self.map.write() {
            *current = map.map(Arc::new);
        }
    }

    /// Claims the one refresh in progress: `true` if the caller should read the map again.
    pub fn start_refresh(&self) -> bool {
        !self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// Ends a refresh started with [`Self::start_refresh`].
    pub fn end_refresh(&self) {
        self.refreshing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
        ])
    }

    fn range(start: i64, end: i64, primary: Value) -> Value {
        Value::Array(vec![Value::Int(start), Value::Int(end), primary])
    }

    #[test]
    fn reads_ranges_and_tells_nodes_apart_by_id() {
        let reply = Value::Array(vec![
            range(0, 5460, node("a", 1)),
            range(5461, 10922, node("b", 2)),
            range(10923, 16000, node("c", 3)),
            range(16001, 16383, node("a", 1)),
        ]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        assert_eq!(map.node_of(0), map.node_of(16383));
        assert_ne!(map.node_of(0), map.node_of(5461));
        assert_ne!(map.node_of(5461), map.node_of(10923));
        assert_eq!(map.node_of(10922), map.node_of(5461));
    }

    #[test]
    fn unserved_slots_and_bad_replies() {
        let map =
            SlotMap::from_cluster_slots(&Value::Array(vec![range(0, 10, node("a", 1))])).unwrap();
        assert!(map.node_of(10).is_some() && map.node_of(11).is_none());
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(5, 4, node("a", 1))]),
            Value::Array(vec![range(0, 16384, node("a", 1))]),
        ] {
            assert!(SlotMap::from_cluster_slots(&bad).is_err());
        }
    }
}

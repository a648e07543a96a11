//! Cluster grouping: a Cluster call's declared keys must share a hash slot, while a node call
//! (Redis >= 7.0, the flagged node script) may cover every slot of one node. A batch is grouped
//! by node (when the slot map is known) and slot, arrival order kept within a slot; a node that
//! refuses a node call (the slot map is stale) gets its checks back one call per slot while the
//! map is read again.

use std::sync::Arc;

use super::call::Via;
use super::{Dispatch, Job};
use crate::store::redis::conn::Conn;
use crate::store::redis::keys;

impl Dispatch {
    /// Sends `jobs` to a Cluster: one call per node or per slot, all in flight together.
    pub(super) async fn cluster_batch(&self, conn: Conn, jobs: Vec<Job>) {
        // A job's items share a slot already; each job's slot is hashed once.
        let map = conn.node_calls().and_then(|calls| calls.map());
        let mut placed: Vec<(Option<u16>, u16, Job)> = jobs
            .into_iter()
            .map(|job| {
                let slot = job.items.first().map_or(0, |item| keys::slot(&item.key));
                (map.as_ref().and_then(|map| map.node_of(slot)), slot, job)
            })
            .collect();
        placed.sort_by_key(|(node, slot, _)| (*node, *slot));
        let mut calls = Vec::new();
        let mut placed = placed.into_iter().peekable();
        while let Some((node, slot, first)) = placed.next() {
            let mut group = vec![(slot, first)];
            while let Some((_, other, job)) = placed.next_if(|(other_node, other_slot, _)| {
                *other_node == node && (node.is_some() || *other_slot == slot)
            }) {
                group.push((other, job));
            }
            calls.push(self.cluster_call(conn.clone(), group));
        }
        futures_util::future::join_all(calls).await;
    }

    /// One call for `group` (sorted by slot: one slot, or several of one node). A node that
    /// refuses a node call (a key it does not serve: the slot map is stale) ran nothing of it;
    /// its checks are resent one call per slot and the map is read again.
    async fn cluster_call(&self, conn: Conn, group: Vec<(u16, Job)>) {
        let first = group.first().map_or(0, |(slot, _)| *slot);
        let (slots, jobs): (Vec<u16>, Vec<Job>) = group.into_iter().unzip();
        let via = if slots.iter().all(|slot| *slot == first) {
            Via::Keys
        } else {
            Via::Node(first)
        };
        let Err(refused) = self.call(conn.clone(), jobs, via).await else {
            return;
        };
        self.refresh_slot_map(&conn);
        let mut calls = Vec::new();
        let mut rest = slots.into_iter().zip(refused).peekable();
        while let Some((slot, job)) = rest.next() {
            let mut jobs = vec![job];
            while let Some((_, job)) = rest.next_if(|(other, _)| *other == slot) {
                jobs.push(job);
            }
            calls.push(self.call(conn.clone(), jobs, Via::Keys));
        }
        futures_util::future::join_all(calls).await;
    }

    /// Forgets the slot map (one call per slot meanwhile) and reads it again in the background,
    /// once at a time.
    fn refresh_slot_map(&self, conn: &Conn) {
        let Some(calls) = conn.node_calls() else {
            return;
        };
        if !calls.start_refresh() {
            return;
        }
        calls.set(None);
        let (mut conn, calls) = (conn.clone(), Arc::clone(calls));
        tokio::spawn(async move {
            conn.refresh_slot_map().await;
            calls.end_refresh();
        });
    }
}

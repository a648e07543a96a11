//! The defects the simulator knows of and steps around until their fixes land: each names the
//! kind of operation that meets it and the stores it shows on. The invariants never change; an
//! operation of a listed kind is not carried out (nor counted), and its replay in [`super::replays`]
//! shows the defect until the entry goes.

use super::model::Model;
use super::ops::{Alg, Item, Op, Pick};
use super::Store;

/// The kind of an operation, as the known defects name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A check, a batch or a report.
    Request,
    /// A reload that keeps a sliding log's or fixed window's algorithm and lowers its limit
    /// over the existing state (a token bucket's lowered burst or rate is an ordinary reload:
    /// Redis answers it as the model does).
    LowerOverState,
    /// Any other reload.
    Reload,
    /// A batch, or checks sent at once, holding a check of every policy and another check of
    /// the same partition.
    GroupWithOthers,
    /// Time passing, a restart, a pause.
    Store,
    /// An operation of the leased lane (its checks, Envoys, resets and reloads).
    Lane,
}

/// A known defect: on `stores`, the simulator skips operations of `kind` rather than fail on
/// them (the invariants stay as they are). Remove an entry once its fix is merged; [`super::replays`]
/// then expects its replay to pass.
pub struct KnownDefect {
    /// Where it is tracked: `"36.1"` is issue 36's item 1; `"sim.N"` a defect the simulator
    /// found beyond the list (see [`super::replays`]).
    pub item: &'static str,
    /// The operations that meet it.
    pub kind: Kind,
    /// Where.
    pub stores: &'static [Store],
}

/// The defects the simulator steps around until their fixes land.
pub const KNOWN_DEFECTS: &[KnownDefect] = &[
    // On a Cluster, a check of policies in several slots, in a batch or at the same time as
    // another check of the partition, can be denied by one policy after the others have spent
    // (`replays::sim_4_*`): a group is all or nothing.
    KnownDefect {
        item: "sim.4",
        kind: Kind::GroupWithOthers,
        stores: &[Store::Redis7Cluster],
    },
];

/// Whether `kind` is a known defect on `store`.
pub fn known(store: Store, kind: Kind) -> Option<&'static str> {
    KNOWN_DEFECTS
        .iter()
        .find(|d| d.kind == kind && d.stores.contains(&store))
        .map(|d| d.item)
}

/// The kind of `op` given the policies in force.
pub fn kind(op: &Op, model: &Model) -> Kind {
    match op {
        Op::Batch { items, .. } if group_and_more(items) => Kind::GroupWithOthers,
        Op::Concurrent { calls }
            if group_and_more(&calls.iter().map(|c| c.1).collect::<Vec<_>>()) =>
        {
            Kind::GroupWithOthers
        }
        Op::Check { .. } | Op::Batch { .. } | Op::Concurrent { .. } | Op::Report { .. } => {
            Kind::Request
        }
        Op::Reload { policy, change } => {
            let (was, next) = (model.specs[*policy], change.apply(&model.specs[*policy]));
            let lower = next.algorithm().limit() < was.algorithm().limit();
            if next.alg == was.alg && next.alg != Alg::TokenBucket && lower {
                Kind::LowerOverState
            } else {
                Kind::Reload
            }
        }
        Op::Advance { .. }
        | Op::Restart { .. }
        | Op::Pause { .. }
        | Op::Reshard { .. }
        | Op::AclRevoke { .. } => Kind::Store,
        Op::Leased { .. }
        | Op::Rlqs { .. }
        | Op::RlqsSteady { .. }
        | Op::RlqsReport { .. }
        | Op::RlqsEnd { .. }
        | Op::Sleep { .. }
        | Op::Reset { .. }
        | Op::LaneReload { .. } => Kind::Lane,
    }
}

/// Whether `items` hold a check of every policy and another check of the same partition.
fn group_and_more(items: &[Item]) -> bool {
    items.iter().enumerate().any(|(at, group)| {
        group.pick == Pick::All
            && items
                .iter()
                .enumerate()
                .any(|(other, item)| other != at && item.part == group.part)
    })
}

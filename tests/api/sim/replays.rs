//! Shrunk sequences the simulator found, replayed as they were printed. A replay of a known
//! defect ([`super::KNOWN_DEFECTS`]) must still fail while the defect is listed, and pass once
//! its entry is removed (the fix merged).

#[allow(unused_imports)]
use super::ops::{Alg::*, Change::*, Item, Op::*, Pick::*, Spec};
use super::{replay, Store};

/// Asserts the replay passes, or, while `item` is a known defect on `store`, that it still fails.
fn known_defect(item: &str, store: Store, specs: Vec<Spec>, ops: Vec<super::ops::Op>) {
    let listed = super::KNOWN_DEFECTS
        .iter()
        .any(|d| d.item == item && d.stores.contains(&store));
    let result = replay(store, specs, ops);
    match listed {
        true => assert!(
            result.is_err(),
            "{item} no longer shows on {store:?}: remove it from KNOWN_DEFECTS"
        ),
        false => assert!(result.is_ok(), "{item} on {store:?}: {result:?}"),
    }
}

/// Asserts the replay passes.
#[allow(dead_code)]
fn passes(store: Store, specs: Vec<Spec>, ops: Vec<super::ops::Op>) {
    let result = replay(store, specs, ops);
    assert!(result.is_ok(), "{store:?}: {result:?}");
}

/// sim.1: sliding log -> token bucket -> sliding log, no check under the token bucket: the
/// second change must start afresh (limit 1: allowed), the daemon reads the log of before.
#[test]
fn sim_1_an_algorithm_changed_back_starts_afresh_on_the_embedded_store() {
    known_defect(
        "sim.1",
        Store::Embedded,
        vec![
            Spec {
                alg: SlidingLog,
                limit: 1,
                burst: 1,
                period_s: 10,
            },
            Spec {
                alg: TokenBucket,
                limit: 1,
                burst: 1,
                period_s: 10,
            },
        ],
        vec![
            Check {
                via: 0,
                item: Item {
                    pick: One(0),
                    part: 1,
                    cost: 1,
                    dry_run: false,
                },
            },
            Reload {
                policy: 0,
                change: Algorithm(TokenBucket),
            },
            Reload {
                policy: 0,
                change: Algorithm(SlidingLog),
            },
            Check {
                via: 0,
                item: Item {
                    pick: One(0),
                    part: 1,
                    cost: 1,
                    dry_run: false,
                },
            },
        ],
    );
}

//! Shrunk sequences the simulator found, replayed as they were printed. A replay of a known
//! defect ([`super::KNOWN_DEFECTS`]) must still fail while the defect is listed, and pass once
//! its entry is removed (the fix merged).

#[allow(unused_imports)]
use super::lane::{LaneAlg, LaneSpec};
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

/// A policy of the replays.
fn spec(alg: super::ops::Alg, limit: u64, burst: u64, period_s: u64) -> Spec {
    Spec {
        alg,
        limit,
        burst,
        period_s,
    }
}

/// A check through the first daemon, spending (not a dry run).
fn check(pick: super::ops::Pick, part: u8, cost: u64) -> super::ops::Op {
    Check {
        via: 0,
        item: Item {
            pick,
            part,
            cost,
            dry_run: false,
        },
    }
}

/// Asserts the replay passes, with the leased lane's policy `lane`.
fn passes_lane(store: Store, specs: Vec<Spec>, lane: LaneSpec, ops: Vec<super::ops::Op>) {
    let result = super::replay_lane(store, specs, lane, ops);
    assert!(result.is_ok(), "{store:?}: {result:?}");
}

/// Asserts the replay passes.
fn passes(store: Store, specs: Vec<Spec>, ops: Vec<super::ops::Op>) {
    let result = replay(store, specs, ops);
    assert!(result.is_ok(), "{store:?}: {result:?}");
}

/// sim.1: sliding log -> token bucket -> sliding log, no check under the token bucket: the
/// daemon reads the log of before (limit 1: denied). The model once started it afresh; the
/// rule is now written that way (docs/policies.md): a state of the algorithm in force counts as
/// it is, another algorithm's reads as fresh. Stricter than afresh, never looser.
#[test]
fn sim_1_an_algorithm_changed_back_reads_its_state_as_it_is_on_the_embedded_store() {
    passes(
        Store::Embedded,
        vec![spec(SlidingLog, 1, 1, 10), spec(TokenBucket, 1, 1, 10)],
        vec![
            check(One(0), 1, 1),
            Reload {
                policy: 0,
                change: Algorithm(TokenBucket),
            },
            Reload {
                policy: 0,
                change: Algorithm(SlidingLog),
            },
            check(One(0), 1, 1),
        ],
    );
}

/// 36.1: a fixed window at its limit of 2, the limit lowered to 1, a report: the new limit
/// applies to the state as it is (over the limit, remaining 0), the daemon answers `fail_open`.
#[test]
fn item_1_a_lowered_limit_over_state_is_enforced_on_redis_cluster() {
    passes(
        Store::Redis7Cluster,
        vec![spec(FixedWindow, 2, 1, 3600), spec(SlidingLog, 2, 1, 3600)],
        vec![
            check(All, 1, 2),
            Reload {
                policy: 0,
                change: Limit(1),
            },
            Report {
                via: 0,
                pick: One(0),
                part: 1,
                cost: 1,
            },
        ],
    );
}

/// sim.2: a sliding log of 6 with 5 spent; a check of 2 is denied (remaining 1) and remembered;
/// a check of 1 spends the last unit; a check of 2 was answered from the local layer with
/// `remaining` 1 where none is left. An allowance now forgets the remembered denial (the pod
/// just spent there), so the last check asks Redis: `remaining` 0.
#[test]
fn sim_2_a_remembered_denial_answers_todays_remaining_on_redis() {
    passes(
        Store::Redis7,
        vec![spec(SlidingLog, 6, 1, 3600), spec(FixedWindow, 4, 1, 3600)],
        vec![
            Batch {
                via: 0,
                items: vec![Item {
                    pick: One(0),
                    part: 0,
                    cost: 5,
                    dry_run: false,
                }],
            },
            check(One(0), 0, 2),
            check(One(0), 0, 1),
            check(All, 0, 2),
        ],
    );
}

/// sim.4: on a Cluster, a batch of a check of both policies (two slots) and a check of `p0`
/// (burst 1): the group is denied (it ran after the `p0` check took the only token), and yet it
/// spent a unit of `p1`: a group spends from all of its policies or from none.
#[test]
fn sim_4_a_denied_group_in_a_batch_spends_nothing_on_redis_cluster() {
    known_defect(
        "sim.4",
        Store::Redis7Cluster,
        vec![spec(TokenBucket, 4, 1, 3600), spec(TokenBucket, 1, 5, 3600)],
        vec![
            Batch {
                via: 0,
                items: vec![
                    Item {
                        pick: All,
                        part: 0,
                        cost: 1,
                        dry_run: false,
                    },
                    Item {
                        pick: One(0),
                        part: 0,
                        cost: 1,
                        dry_run: false,
                    },
                ],
            },
            check(One(1), 0, 1),
        ],
    );
}

/// sim.1 on Redis: a token bucket spent by a report, changed to a sliding log and back with no
/// write in between: the bucket of before the first change denies (limit 1), as it is.
#[test]
fn sim_1_an_algorithm_changed_back_reads_its_state_as_it_is_on_redis() {
    passes(
        Store::Redis7,
        vec![spec(TokenBucket, 1, 1, 3600), spec(TokenBucket, 1, 1, 3600)],
        vec![
            Report {
                via: 0,
                pick: One(0),
                part: 0,
                cost: 1,
            },
            Reload {
                policy: 0,
                change: Algorithm(SlidingLog),
            },
            Reload {
                policy: 0,
                change: Algorithm(TokenBucket),
            },
            check(One(0), 0, 1),
        ],
    );
}

/// sim.3, as shrunk on Redis7Cluster: a fixed window's period changed from 1 h to 2 h (both
/// windows started at the same instant in that run) must start the window afresh, as the
/// scripts do (they store the window's number under its period): the embedded store kept the
/// count when the two windows started together. A reload that changes the period is a window
/// boundary on every store (docs/policies.md).
#[test]
fn sim_3_a_changed_fixed_window_period_is_a_window_boundary_on_every_store() {
    for store in [Store::Embedded, Store::Redis7, Store::Redis7Cluster] {
        passes(
            store,
            vec![spec(FixedWindow, 2, 1, 3600), spec(TokenBucket, 1, 1, 3600)],
            vec![
                check(All, 2, 1),
                Reload {
                    policy: 0,
                    change: Period(7200),
                },
                check(One(0), 2, 1),
                check(One(0), 2, 1),
                check(One(0), 2, 1),
            ],
        );
    }
}

/// Found when the report debt bound met the simulator (its model had no bound): two reports
/// leave a 1/2h bucket one period in debt (the default `report_debt_periods`), and a burst raised
/// to 2 then admits one check from the state as it is, on every store alike.
#[test]
fn a_bounded_report_debt_then_a_raised_burst_admits_from_the_state_as_it_is() {
    for store in [Store::Embedded, Store::Redis7] {
        passes(
            store,
            vec![spec(TokenBucket, 1, 1, 7200), spec(SlidingLog, 8, 1, 3600)],
            vec![
                Report {
                    via: 0,
                    pick: One(0),
                    part: 0,
                    cost: 2,
                },
                Report {
                    via: 0,
                    pick: One(0),
                    part: 0,
                    cost: 1,
                },
                Reload {
                    policy: 0,
                    change: Burst(2),
                },
                check(One(0), 0, 1),
                check(One(0), 0, 1),
            ],
        );
    }
}

/// The leased lane, as the simulator printed it when an assignment 3 tokens over its lease was
/// tried (a revert check: 3 admitted in the window): an Envoy's first 4 requests on a fixed
/// window of 2 per 2 s (the first denied and reported at once, the rest on the burst share,
/// when the window has time left to back one), then `lease: true` checks of the same
/// partition: never more than 2 in the window.
#[test]
fn lane_1_an_envoys_burst_share_and_leased_checks_keep_to_the_window() {
    passes_lane(
        Store::Embedded,
        vec![spec(TokenBucket, 1, 1, 10), spec(TokenBucket, 1, 1, 10)],
        LaneSpec {
            alg: LaneAlg::FixedWindow,
            limit: 2,
            burst: 1,
            period_s: 2,
        },
        vec![
            Rlqs {
                session: 0,
                part: 0,
                n: 4,
            },
            Leased {
                via: 0,
                part: 0,
                n: 4,
            },
        ],
    );
}

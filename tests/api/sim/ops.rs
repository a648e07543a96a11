//! What the simulator does to a daemon: the operations of a sequence, the policies they reload,
//! and their generators (proptest strategies, which also shrink them). Every type prints with
//! `{:?}` as the Rust expression that builds it, so a shrunk sequence pastes into a replay.

use super::lane::{LaneAlg, LaneSpec, LANE_PERIODS};
use proptest::prelude::*;
use sluice::limit::{Algorithm, Calendar, CalendarUnit, FixedWindow, SlidingLog, TokenBucket};

/// The partitions (values of the `user` descriptor) a sequence uses.
pub const PARTS: u8 = 3;

/// How many policies a sequence's file holds (`p0`, `p1`), every one keyed by `user`.
pub const POLICIES: usize = 2;

/// An algorithm a policy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    /// `token_bucket`.
    TokenBucket,
    /// `sliding_log`.
    SlidingLog,
    /// `fixed_window`.
    FixedWindow,
    /// `fixed_window` with `calendar: true`: local days in Europe/Berlin (its `period` is always
    /// `1d`; a reload of the period leaves it so).
    CalendarDay,
}

/// One policy as written in the file: the figures a reload changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Its algorithm.
    pub alg: Alg,
    /// `limit`.
    pub limit: u64,
    /// `burst` (token bucket only; ignored otherwise).
    pub burst: u64,
    /// `period`, in seconds.
    pub period_s: u64,
}

impl Spec {
    /// The algorithm the daemon builds from this policy (the model's math).
    pub fn algorithm(&self) -> Algorithm {
        let period_us = self.period_s * 1_000_000;
        match self.alg {
            // The policies leave `report_debt_periods` at its default: a report's debt is
            // bounded to one period, as the daemon bounds it.
            Alg::TokenBucket => TokenBucket::new(self.limit, period_us, self.burst)
                .expect("valid token bucket")
                .with_report_debt(1)
                .into(),
            Alg::SlidingLog => SlidingLog::new(self.limit, period_us)
                .expect("valid sliding log")
                .into(),
            Alg::FixedWindow => FixedWindow::new(self.limit, period_us)
                .expect("valid fixed window")
                .into(),
            Alg::CalendarDay => {
                let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin").expect("a zone");
                FixedWindow::calendar(self.limit, berlin)
                    .expect("valid calendar window")
                    .into()
            }
        }
    }

    /// Its line in the policy file; policies alternate failure modes `open` and `closed`, so a
    /// failure mode of either kind shows.
    pub fn yaml(&self, index: usize) -> String {
        let (alg, burst) = match self.alg {
            Alg::TokenBucket => ("token_bucket", format!(", burst: {}", self.burst)),
            Alg::SlidingLog => ("sliding_log", String::new()),
            Alg::FixedWindow => ("fixed_window", String::new()),
            Alg::CalendarDay => (
                "fixed_window",
                ", calendar: true, time_zone: Europe/Berlin".to_owned(),
            ),
        };
        let period = match self.alg {
            Alg::CalendarDay => "1d".to_owned(),
            _ => format!("{}s", self.period_s),
        };
        let mode = if index.is_multiple_of(2) {
            "open"
        } else {
            "closed"
        };
        format!(
            "  - {{name: p{index}, key: [user], algorithm: {alg}, limit: {}, period: {period}{burst}, failure_mode: {mode}}}\n",
            self.limit
        )
    }
}

/// Which policies a request names: one (`policy` in the body) or every one that applies (no
/// `policy`: both, all or nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// `"policy": "p<n>"`.
    One(usize),
    /// No `policy`: every policy applies.
    All,
}

/// One check of a batch (or a single check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// Which policies.
    pub pick: Pick,
    /// Which partition (`user` = `u<part>`).
    pub part: u8,
    /// `cost`.
    pub cost: u64,
    /// `dry_run`.
    pub dry_run: bool,
}

/// What a reload changes in one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new `limit` (up or down; a token bucket's burst follows when it would fall below 1).
    Limit(u64),
    /// A new `burst` (token bucket; a no-op edit for the others).
    Burst(u64),
    /// A new `period`, in seconds.
    Period(u64),
    /// Another algorithm.
    Algorithm(Alg),
}

/// One step of a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `POST /v1/check` on daemon `via` (modulo the daemons running).
    Check {
        /// Which daemon.
        via: usize,
        /// The check.
        item: Item,
    },
    /// `POST /v1/check/batch`.
    Batch {
        /// Which daemon.
        via: usize,
        /// The checks, in order.
        items: Vec<Item>,
    },
    /// Checks sent at once, each on its own connection to daemon `via` (two callers or more
    /// racing for one partition, or one per daemon).
    Concurrent {
        /// Each caller's daemon and check.
        calls: Vec<(usize, Item)>,
    },
    /// `POST /v1/report`.
    Report {
        /// Which daemon.
        via: usize,
        /// Which policies.
        pick: Pick,
        /// Which partition.
        part: u8,
        /// The cost spent.
        cost: u64,
    },
    /// The policy file rewritten with one policy changed, and every daemon reloaded.
    Reload {
        /// Which policy.
        policy: usize,
        /// What changes.
        change: Change,
    },
    /// The manual clock moves (the embedded store only: Redis reads `TIME`).
    Advance {
        /// Microseconds.
        us: u64,
    },
    /// The Redis server restarts: `SHUTDOWN SAVE` and back (`persist`), or `kill -9` and back
    /// with no data.
    Restart {
        /// Whether the data survives.
        persist: bool,
    },
    /// The Redis server is stopped (SIGSTOP) for `ms` while a check waits on it, then continued:
    /// slow, but within the daemon's budget.
    Pause {
        /// How long.
        ms: u64,
        /// The check in flight.
        item: Item,
    },
    /// The daemons' ACL user (a single server's: the line docs/redis.md gives) loses the
    /// command [`ACL_COMMANDS`]`[command]` (modulo their number) while daemon 0 checks `item`,
    /// then gets it back.
    AclRevoke {
        /// Which command the user loses.
        command: usize,
        /// The check sent meanwhile.
        item: Item,
    },
    /// `n` `lease: true` checks of the leased lane's partition `part`, at once, through lane
    /// daemon `via` (modulo their number).
    Leased {
        /// Which lane daemon.
        via: usize,
        /// Which partition.
        part: u8,
        /// How many checks.
        n: u64,
    },
    /// `n` requests of partition `part` at simulated Envoy `session` (modulo [`SESSIONS`]), on
    /// its RLQS bucket (its first request reported at once).
    Rlqs {
        /// Which Envoy.
        session: usize,
        /// Which partition.
        part: u8,
        /// How many requests.
        n: u64,
    },
    /// Steady demand at Envoy `session`: `reports` rounds of `n` requests of partition `part`
    /// then a report a second later (the cadence a steady client's assignment is renewed at).
    RlqsSteady {
        /// Which Envoy.
        session: usize,
        /// Which partition.
        part: u8,
        /// Requests per round.
        n: u64,
        /// Rounds.
        reports: u64,
    },
    /// Envoy `session`'s report of every bucket (its timer fired).
    RlqsReport {
        /// Which Envoy.
        session: usize,
    },
    /// Envoy `session`'s stream ends; its buckets keep their assignments until they expire.
    RlqsEnd {
        /// Which Envoy.
        session: usize,
    },
    /// Real time passes (the leased lane's clock is the system's); every Envoy whose 5 s
    /// report interval passed reports.
    Sleep {
        /// Milliseconds.
        ms: u64,
    },
    /// An operator resets the leased lane's counter of `part` (admin `DELETE /v1/counters`).
    Reset {
        /// Which partition.
        part: u8,
    },
    /// The policy file rewritten with the leased lane's policy changed, every daemon reloaded.
    LaneReload {
        /// What changes.
        change: Change,
    },
    /// A Cluster moves the hash slot of a key on node `node` (modulo the nodes; none held: no
    /// move) to the next node, key by key, while `item` is checked (through the first daemon)
    /// when the slot is MIGRATING with its first key moved.
    Reshard {
        /// Which node gives a slot.
        node: usize,
        /// The check sent during the move.
        item: Item,
    },
}

/// Simulated Envoys (RLQS sessions) a sequence runs.
pub const SESSIONS: usize = 3;

/// The leased lane's policy: a token bucket or a fixed window, limit 2 to 40, burst 1 to 40,
/// a period of [`LANE_PERIODS`] (large enough for Envoy's assignments to hold a few tokens).
pub fn lane() -> impl Strategy<Value = LaneSpec> {
    (
        prop_oneof![Just(LaneAlg::TokenBucket), Just(LaneAlg::FixedWindow)],
        2u64..=40,
        1u64..=40,
        prop::sample::select(&LANE_PERIODS[..]),
    )
        .prop_map(|(alg, limit, burst, period_s)| LaneSpec {
            alg,
            limit,
            burst,
            period_s,
        })
}

/// Which kinds of operation a store runs, and the periods its policies use.
#[derive(Clone, Copy, Debug)]
pub struct Menu {
    /// Periods a policy may take, in seconds.
    pub periods: &'static [u64],
    /// Whether time passes by the manual clock.
    pub advance: bool,
    /// Whether the server can be restarted and paused.
    pub restart: bool,
    /// Whether to reshard (a Cluster).
    pub reshard: bool,
    /// Whether to take a command from the daemons' ACL user (a single server).
    pub acl: bool,
}

/// The commands the documented ACL line grants that a check or a report may run (the others:
/// loading scripts, the tenant table, resets).
pub const ACL_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "time",
    "get",
    "getrange",
    "set",
    "pexpire",
    "del",
    "zadd",
    "zcount",
    "zrange",
    "zremrangebyscore",
    "zremrangebyrank",
];

impl Op {
    /// The operation's name, for the tally a run prints.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Check { .. } => "check",
            Op::Batch { .. } => "batch",
            Op::Concurrent { .. } => "concurrent",
            Op::Report { .. } => "report",
            Op::Reload { .. } => "reload",
            Op::Advance { .. } => "advance",
            Op::Restart { persist: true } => "restart_persist",
            Op::Restart { persist: false } => "restart_empty",
            Op::Pause { .. } => "pause",
            Op::Reshard { .. } => "reshard",
            Op::AclRevoke { .. } => "acl_revoke",
            Op::Leased { .. } => "leased",
            Op::Rlqs { .. } => "rlqs",
            Op::RlqsSteady { .. } => "rlqs_steady",
            Op::RlqsReport { .. } => "rlqs_report",
            Op::RlqsEnd { .. } => "rlqs_end",
            Op::Sleep { .. } => "sleep",
            Op::Reset { .. } => "reset",
            Op::LaneReload { .. } => "lane_reload",
        }
    }
}

impl Change {
    /// Applies the change to `spec`, keeping it a valid policy.
    pub fn apply(self, spec: &Spec) -> Spec {
        let mut next = *spec;
        match self {
            Change::Limit(limit) => next.limit = limit,
            Change::Burst(burst) => next.burst = burst,
            Change::Period(period_s) => next.period_s = period_s,
            Change::Algorithm(alg) => next.alg = alg,
        }
        next
    }
}

fn alg() -> impl Strategy<Value = Alg> {
    prop_oneof![
        Just(Alg::TokenBucket),
        Just(Alg::SlidingLog),
        Just(Alg::FixedWindow),
        Just(Alg::CalendarDay)
    ]
}

/// A policy: limit 1 to 8, burst 1 to 10, a period of the menu.
pub fn spec(menu: Menu) -> impl Strategy<Value = Spec> {
    (
        alg(),
        1u64..=8,
        1u64..=10,
        prop::sample::select(menu.periods),
    )
        .prop_map(|(alg, limit, burst, period_s)| Spec {
            alg,
            limit,
            burst,
            period_s,
        })
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        3 => (0..POLICIES).prop_map(Pick::One),
        1 => Just(Pick::All),
    ]
}

/// A check: costs mostly 1, sometimes up to 11 (past some limits: a 400).
fn item() -> impl Strategy<Value = Item> {
    let cost = prop_oneof![4 => Just(1u64), 2 => 1u64..=4, 1 => 1u64..=11];
    (pick(), 0..PARTS, cost, prop::bool::weighted(0.15)).prop_map(|(pick, part, cost, dry_run)| {
        Item {
            pick,
            part,
            cost,
            dry_run,
        }
    })
}

fn change(menu: Menu) -> impl Strategy<Value = Change> {
    prop_oneof![
        (1u64..=8).prop_map(Change::Limit),
        (1u64..=10).prop_map(Change::Burst),
        prop::sample::select(menu.periods).prop_map(Change::Period),
        alg().prop_map(Change::Algorithm),
    ]
}

/// One operation of the menu, checks most often.
pub fn op(menu: Menu) -> BoxedStrategy<Op> {
    let via = 0usize..4;
    let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (
            10,
            (via.clone(), item())
                .prop_map(|(via, item)| Op::Check { via, item })
                .boxed(),
        ),
        (
            2,
            (via.clone(), prop::collection::vec(item(), 1..6))
                .prop_map(|(via, items)| Op::Batch { via, items })
                .boxed(),
        ),
        (
            2,
            prop::collection::vec((via.clone(), item()), 2..=4)
                .prop_map(|calls| Op::Concurrent { calls })
                .boxed(),
        ),
        (
            2,
            (via, pick(), 0..PARTS, 1u64..=12)
                .prop_map(|(via, pick, part, cost)| Op::Report {
                    via,
                    pick,
                    part,
                    cost,
                })
                .boxed(),
        ),
        (
            3,
            (0..POLICIES, change(menu))
                .prop_map(|(policy, change)| Op::Reload { policy, change })
                .boxed(),
        ),
    ];
    // The leased lane, on every store.
    ops.push((
        4,
        (0usize..2, 0..PARTS, 1u64..=12)
            .prop_map(|(via, part, n)| Op::Leased { via, part, n })
            .boxed(),
    ));
    ops.push((
        5,
        (0..SESSIONS, 0..PARTS, 0u64..=12)
            .prop_map(|(session, part, n)| Op::Rlqs { session, part, n })
            .boxed(),
    ));
    ops.push((
        2,
        (0..SESSIONS)
            .prop_map(|session| Op::RlqsReport { session })
            .boxed(),
    ));
    ops.push((
        1,
        (0..SESSIONS, 0..PARTS, 1u64..=6, 2u64..=3)
            .prop_map(|(session, part, n, reports)| Op::RlqsSteady {
                session,
                part,
                n,
                reports,
            })
            .boxed(),
    ));
    ops.push((
        1,
        (0..SESSIONS)
            .prop_map(|session| Op::RlqsEnd { session })
            .boxed(),
    ));
    ops.push((
        2,
        prop_oneof![4 => 50u64..=1_500, 1 => Just(5_000)]
            .prop_map(|ms| Op::Sleep { ms })
            .boxed(),
    ));
    ops.push((1, (0..PARTS).prop_map(|part| Op::Reset { part }).boxed()));
    ops.push((
        1,
        change(menu)
            .prop_map(|change| Op::LaneReload { change })
            .boxed(),
    ));
    if menu.advance {
        let us = prop_oneof![
            (1u64..=5_000_000),
            (1u64..=3_600).prop_map(|s| s * 1_000_000),
        ];
        ops.push((2, us.prop_map(|us| Op::Advance { us }).boxed()));
    }
    if menu.restart {
        ops.push((
            1,
            any::<bool>()
                .prop_map(|persist| Op::Restart { persist })
                .boxed(),
        ));
        ops.push((
            1,
            (50u64..=300, item())
                .prop_map(|(ms, item)| Op::Pause { ms, item })
                .boxed(),
        ));
    }
    if menu.acl {
        ops.push((
            1,
            (0..ACL_COMMANDS.len(), item())
                .prop_map(|(command, item)| Op::AclRevoke { command, item })
                .boxed(),
        ));
    }
    if menu.reshard {
        ops.push((
            1,
            (0usize..3, item())
                .prop_map(|(node, item)| Op::Reshard { node, item })
                .boxed(),
        ));
    }
    prop::strategy::Union::new_weighted(ops).boxed()
}

//! What the lease simulator ([`super::lease_changes`]) does to a fleet: the operations of a
//! sequence and their seeded generator (SplitMix64: the same sequence from a seed on every
//! machine). Every type prints with `{:?}` as a failure's report shows it.

use super::lease_fleet::DEADLINE_MS;
use super::lease_ledger::{Alg, Spec};

/// The policies: `solo` (route `solo`) and the group `g1`, `g2` (route `grp`).
pub const NAMES: [&str; 3] = ["solo", "g1", "g2"];
/// Daemons in a sequence.
pub const DAEMONS: usize = 3;

/// SplitMix64: small, seeded, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn index(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

/// Which requests a burst sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `solo` alone.
    Solo,
    /// `g1` and `g2`, all or nothing.
    Group,
}

impl Route {
    pub fn policies(self) -> &'static [usize] {
        match self {
            Route::Solo => &[0],
            Route::Group => &[1, 2],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Route::Solo => "solo",
            Route::Group => "grp",
        }
    }
}

/// What a reload changes in one policy.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    Limit(u64),
    Burst(u64),
    Period(u64),
    SwitchAlgorithm,
    ToggleLease,
}

/// One step of a sequence.
#[derive(Clone, Debug)]
pub enum Op {
    /// `clients` clients on each daemon of `via`, `checks` checks of `cost` each.
    Burst {
        route: Route,
        via: Vec<usize>,
        clients: usize,
        checks: usize,
        cost: u64,
    },
    /// A reload, then checks of the policy's route at once: a drain (through every daemon
    /// until refused) when `drain`, else a short burst.
    Reload {
        policy: usize,
        change: Change,
        drain: bool,
    },
    /// A daemon stopped (SIGKILL, or SIGTERM when `graceful`) and started again.
    Stop { daemon: usize, graceful: bool },
    /// A reset through daemon `via`, then checks at once as after a reload.
    Reset {
        policy: usize,
        via: usize,
        drain: bool,
    },
    /// Redis stopped for `ms` while a burst of `route` runs on every daemon.
    Pause { ms: u64, route: Route },
    /// Redis killed and started without its data; a burst of `route` while it is down.
    DataLoss { route: Route },
}

fn spec(rng: &mut Rng) -> Spec {
    Spec {
        alg: if rng.percent(50) {
            Alg::TokenBucket
        } else {
            Alg::FixedWindow
        },
        limit: rng.range(60, 480),
        burst: rng.range(100, 480),
        period_s: [3600, 7200][rng.index(2)],
        lease: !rng.percent(15),
    }
}

fn route(rng: &mut Rng) -> Route {
    if rng.percent(50) {
        Route::Solo
    } else {
        Route::Group
    }
}

fn burst(rng: &mut Rng, checks: (u64, u64)) -> Op {
    let mut via: Vec<usize> = (0..DAEMONS).filter(|_| rng.percent(60)).collect();
    if via.is_empty() {
        via.push(rng.index(DAEMONS));
    }
    Op::Burst {
        route: route(rng),
        via,
        clients: rng.range(1, 3) as usize,
        checks: rng.range(checks.0, checks.1) as usize,
        cost: if rng.percent(80) { 1 } else { 2 },
    }
}

/// A sequence: the policies it starts with and its operations (a burst first).
pub fn sequence(seed: u64, single: bool) -> (Vec<Spec>, Vec<Op>) {
    let mut rng = Rng(seed);
    let specs = (0..NAMES.len()).map(|_| spec(&mut rng)).collect();
    let mut ops = vec![burst(&mut rng, (20, 40))];
    for _ in 0..rng.range(5, 11) {
        let faults = if single { 2 } else { 0 };
        let op = match rng.range(0, 9 + faults) {
            0..=3 => burst(&mut rng, (10, 40)),
            4..=6 => {
                let change = match rng.range(0, 5) {
                    0 | 1 => Change::Limit(rng.range(20, 180)),
                    2 => Change::Burst(rng.range(20, 180)),
                    3 => Change::Period([3600, 7200][rng.index(2)]),
                    4 => Change::SwitchAlgorithm,
                    _ => Change::ToggleLease,
                };
                Op::Reload {
                    policy: rng.index(NAMES.len()),
                    change,
                    drain: rng.percent(50),
                }
            }
            7 => Op::Stop {
                daemon: rng.index(DAEMONS),
                graceful: rng.percent(50),
            },
            8 | 9 => Op::Reset {
                policy: rng.index(NAMES.len()),
                via: rng.index(DAEMONS),
                drain: rng.percent(50),
            },
            10 => Op::Pause {
                ms: if rng.percent(50) {
                    rng.range(50, DEADLINE_MS - 100)
                } else {
                    rng.range(DEADLINE_MS * 2, DEADLINE_MS * 4)
                },
                route: route(&mut rng),
            },
            _ => Op::DataLoss {
                route: route(&mut rng),
            },
        };
        ops.push(op);
    }
    (specs, ops)
}

impl Change {
    pub fn apply(self, spec: &Spec) -> Spec {
        let mut next = *spec;
        match self {
            Change::Limit(percent) => next.limit = scaled(spec.limit, percent),
            Change::Burst(percent) => next.burst = scaled(spec.burst, percent),
            Change::Period(period_s) => next.period_s = period_s,
            Change::SwitchAlgorithm => {
                next.alg = match spec.alg {
                    Alg::TokenBucket => Alg::FixedWindow,
                    Alg::FixedWindow => Alg::TokenBucket,
                }
            }
            Change::ToggleLease => next.lease = !spec.lease,
        }
        next
    }
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Burst { .. } => "burst",
            Op::Reload { .. } => "reload",
            Op::Stop {
                graceful: false, ..
            } => "sigkill",
            Op::Stop { graceful: true, .. } => "sigterm",
            Op::Reset { .. } => "reset",
            Op::Pause { ms, .. } if *ms < DEADLINE_MS => "pause_within",
            Op::Pause { .. } => "pause_beyond",
            Op::DataLoss { .. } => "data_loss",
        }
    }

    /// The route to make busy just before this operation, if it is a change or a fault.
    pub fn primes(&self) -> Option<Route> {
        match self {
            Op::Burst { .. } => None,
            Op::Reload { policy, .. } | Op::Reset { policy, .. } => Some(route_of(*policy)),
            Op::Stop { daemon, .. } => Some(if daemon % 2 == 0 {
                Route::Solo
            } else {
                Route::Group
            }),
            Op::Pause { route, .. } | Op::DataLoss { route } => Some(*route),
        }
    }
}

pub fn route_of(policy: usize) -> Route {
    if policy == 0 {
        Route::Solo
    } else {
        Route::Group
    }
}

/// `value` scaled by `percent`, within what the policies use.
fn scaled(value: u64, percent: u64) -> u64 {
    (value * percent / 100).clamp(10, 1000)
}

//! The leased lane of the simulator (issue 47): policy `q`, `lease: true`, a token bucket or a
//! fixed window of a short period (so that buckets refill and windows turn within a sequence,
//! on Redis' clock too), matched by the descriptor `lane: q` and replacing `p0` and `p1` there.
//! Its admissions come from `lease: true` checks and from simulated Envoys' RLQS buckets
//! ([`super::envoy`]), which decide locally, so no answer can be modelled exactly: the lane is
//! held to a bound instead, by [`Ledger`], on the store's clock (the system clock: Redis `TIME`,
//! and the embedded lane daemon's own).
//!
//! The bound, partition by partition, account by account. An account opens with the sequence
//! and again at each break: a counter reset, Redis restarted without its data, a reload of `q`.
//! What was taken from the old counter may still be admitted after a break (an Envoy keeps its
//! tokens until its assignment ends; a pod keeps its lease until it hears of a data loss): an
//! account allows, on top of its own bound, the admissions by holders of the old counter's units
//! (Envoy buckets started before the break; `lease: true` checks within [`LOSS_GRACE_US`] of a
//! data loss), at most what the old account could still admit at the break ([`Account::carry`]).
//! Every other admission is the new account's.
//!
//! - **Fixed window**: in each window of the store's clock, at most the limit (plus the carry).
//! - **Token bucket** (`T = period / limit`): in every interval `[a, b]` between two admissions,
//!   at most `burst + (b - a) / T` (plus the carry): the bucket's definition, which a lease must
//!   keep at the real instants its units are admitted. [`SLACK_US`] covers the spread of one
//!   request's instant.

use std::fmt;

use super::ops::Change;

/// The lane's partitions are the sequence's ([`super::ops::PARTS`]).
pub use super::ops::PARTS;

/// How long after a data loss a pod may still admit on a lease of the lost counter (it drops
/// its leases when it resubscribes to the reset channel; its backoff reaches 5 s).
pub const LOSS_GRACE_US: u64 = 6_000_000;

/// Spread of an admission's instant (a request's round trip; Envoy's instant is exact).
const SLACK_US: u64 = 50_000;

/// The lane's algorithm (printed with its type, as a replay names it beside [`super::ops::Alg`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LaneAlg {
    /// `token_bucket`.
    TokenBucket,
    /// `fixed_window`.
    FixedWindow,
}

impl fmt::Debug for LaneAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaneAlg::TokenBucket => f.write_str("LaneAlg::TokenBucket"),
            LaneAlg::FixedWindow => f.write_str("LaneAlg::FixedWindow"),
        }
    }
}

/// Policy `q` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneSpec {
    /// Its algorithm.
    pub alg: LaneAlg,
    /// `limit`.
    pub limit: u64,
    /// `burst` (token bucket).
    pub burst: u64,
    /// `period`, in seconds.
    pub period_s: u64,
}

impl LaneSpec {
    /// Its line in the policy file.
    pub fn yaml(&self) -> String {
        let (alg, burst) = match self.alg {
            LaneAlg::TokenBucket => ("token_bucket", format!(", burst: {}", self.burst)),
            LaneAlg::FixedWindow => ("fixed_window", String::new()),
        };
        format!(
            "  - {{name: q, match: {{lane: q}}, key: [user], algorithm: {alg}, limit: {}, period: {}s{burst}, lease: true, replaces: [p0, p1], failure_mode: closed}}\n",
            self.limit, self.period_s
        )
    }

    /// What a reload of the lane does to it (a period keeps to the lane's short ones).
    pub fn apply(self, change: Change) -> Self {
        let mut next = self;
        match change {
            // The generated 1 to 8 (10) scaled to the lane's 5 to 40 (50).
            Change::Limit(limit) => next.limit = limit * 5,
            Change::Burst(burst) => next.burst = burst * 5,
            Change::Period(period_s) => next.period_s = LANE_PERIODS[period_s as usize % 3],
            Change::Algorithm(alg) => {
                next.alg = match alg {
                    super::ops::Alg::TokenBucket | super::ops::Alg::SlidingLog => {
                        LaneAlg::TokenBucket
                    }
                    _ => LaneAlg::FixedWindow,
                }
            }
        }
        next
    }

    fn period_us(&self) -> u64 {
        self.period_s * 1_000_000
    }
}

/// The lane's periods, in seconds.
pub const LANE_PERIODS: [u64; 3] = [1, 2, 5];

/// Who admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A `lease: true` check through daemon `n`.
    Lease(usize),
    /// RLQS session `n`'s Envoy.
    Envoy(usize),
}

/// One admission: when (µs, the store's clock), how many, by whom, and whether on units of the
/// account before (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub at_us: u64,
    pub n: u64,
    /// Printed with a breach.
    #[allow(dead_code)]
    pub by: Holder,
    pub old: bool,
}

/// One account of a partition.
#[derive(Clone, Debug)]
pub struct Account {
    spec: LaneSpec,
    opened_us: u64,
    opened_by: &'static str,
    /// What the account before could still admit at the break.
    carry: u64,
    admissions: Vec<Admission>,
}

impl Account {
    fn open(spec: LaneSpec, opened_us: u64, opened_by: &'static str, carry: u64) -> Self {
        Self {
            spec,
            opened_us,
            opened_by,
            carry,
            admissions: Vec::new(),
        }
    }

    /// What holders of this account's units may still have in hand at `at_us`, the counter
    /// then showing `remaining` (the next account's carry): a fixed window's units taken in the
    /// window and not admitted; a token bucket's units taken and not yet refilled (admitted or
    /// not).
    fn held(&self, at_us: u64, remaining: u64) -> u64 {
        let s = &self.spec;
        match s.alg {
            LaneAlg::FixedWindow => {
                let window = at_us / s.period_us();
                let this: u64 = self
                    .admissions
                    .iter()
                    .filter(|a| a.at_us / s.period_us() == window)
                    .map(|a| a.n)
                    .sum();
                s.limit.saturating_sub(remaining).saturating_sub(this)
            }
            LaneAlg::TokenBucket => s.burst.saturating_sub(remaining),
        }
    }

    /// The first breach of the bound, if any.
    fn breach(&self) -> Option<String> {
        let s = &self.spec;
        let mut admissions = self.admissions.clone();
        admissions.sort_by_key(|a| a.at_us);
        let carried = |of: &[Admission]| -> u64 {
            let old: u64 = of.iter().filter(|a| a.old).map(|a| a.n).sum();
            old.min(self.carry)
        };
        match s.alg {
            LaneAlg::FixedWindow => {
                let mut at = 0;
                while at < admissions.len() {
                    let window = admissions[at].at_us / s.period_us();
                    let end = admissions[at..]
                        .iter()
                        .position(|a| a.at_us / s.period_us() != window)
                        .map_or(admissions.len(), |p| at + p);
                    let of = &admissions[at..end];
                    let admitted: u64 = of.iter().map(|a| a.n).sum();
                    let most = s.limit + carried(of);
                    if admitted > most {
                        return Some(format!(
                            "fixed window {s:?}: {admitted} admitted in window {window}, at most \
                             {most} ({} carried): {of:?}",
                            carried(of)
                        ));
                    }
                    at = end;
                }
            }
            LaneAlg::TokenBucket => {
                let t = s.period_us() as f64 / s.limit as f64;
                for i in 0..admissions.len() {
                    let mut admitted = 0;
                    for j in i..admissions.len() {
                        admitted += admissions[j].n;
                        let span = admissions[j].at_us - admissions[i].at_us + SLACK_US;
                        let of = &admissions[i..=j];
                        let most = s.burst + (span as f64 / t) as u64 + carried(of);
                        if admitted > most {
                            return Some(format!(
                                "token bucket {s:?}: {admitted} admitted in {} µs, at most \
                                 {most} ({} carried): {of:?}",
                                span - SLACK_US,
                                carried(of)
                            ));
                        }
                    }
                }
            }
        }
        None
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let admitted: u64 = self.admissions.iter().map(|a| a.n).sum();
        write!(
            f,
            "account opened by {} at {} µs ({:?}, carry {}): {admitted} admitted",
            self.opened_by, self.opened_us, self.spec, self.carry
        )
    }
}

/// Every partition's accounts, and the breaks so far.
pub struct Ledger {
    accounts: Vec<Vec<Account>>,
    /// Breaks so far per partition (an Envoy bucket started at an older count holds old units).
    pub breaks: Vec<u64>,
    /// The last data loss, if any (µs): `lease: true` admissions within the grace are old.
    lost_at: Option<u64>,
    /// Admissions, by kind of holder, for the tally.
    pub admitted: (u64, u64),
}

impl Ledger {
    /// A ledger of a sequence starting at `now_us` with `spec` in force.
    pub fn new(spec: LaneSpec, now_us: u64) -> Self {
        Self {
            accounts: (0..PARTS)
                .map(|_| vec![Account::open(spec, now_us, "the sequence", 0)])
                .collect(),
            breaks: vec![0; PARTS as usize],
            lost_at: None,
            admitted: (0, 0),
        }
    }

    /// A break of partition `part` at `now_us` (`spec` in force from then on), its counter
    /// showing `remaining` just before (`None`: gone, the burst or limit is carried).
    pub fn break_part(
        &mut self,
        part: u8,
        spec: LaneSpec,
        now_us: u64,
        by: &'static str,
        remaining: Option<u64>,
    ) {
        let accounts = &mut self.accounts[part as usize];
        let carry = accounts
            .last()
            .map_or(0, |a| a.held(now_us, remaining.unwrap_or(0)));
        accounts.push(Account::open(spec, now_us, by, carry));
        self.breaks[part as usize] += 1;
    }

    /// A break of every partition, their counters showing `remaining` just before.
    pub fn break_all(
        &mut self,
        spec: LaneSpec,
        now_us: u64,
        by: &'static str,
        remaining: &[Option<u64>],
    ) {
        for part in 0..PARTS {
            self.break_part(part, spec, now_us, by, remaining[part as usize]);
        }
        if by == "a data loss" {
            self.lost_at = Some(now_us);
        }
    }

    /// Records `n` admitted on `part` at `at_us` by `by`; `since` is the break count an Envoy
    /// bucket started at. Then checks the partition's account.
    pub fn admit(
        &mut self,
        part: u8,
        at_us: u64,
        n: u64,
        by: Holder,
        since: Option<u64>,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let breaks = self.breaks[part as usize];
        let old = match by {
            Holder::Envoy(_) => since.is_some_and(|since| since < breaks),
            Holder::Lease(_) => self
                .lost_at
                .is_some_and(|lost| at_us < lost + LOSS_GRACE_US),
        };
        match by {
            Holder::Lease(_) => self.admitted.0 += n,
            Holder::Envoy(_) => self.admitted.1 += n,
        }
        let account = self.accounts[part as usize]
            .last_mut()
            .expect("an account is open");
        account.admissions.push(Admission { at_us, n, by, old });
        match account.breach() {
            Some(why) => Err(format!(
                "over-admission on the leased lane, partition u{part}, {account}: {why}"
            )),
            None => Ok(()),
        }
    }
}

/// The bound can fail: what a bucket or a window admits past its bound is named, and a carry
/// covers only what the old counter's holders admit.
#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_000_000_000_000;

    fn spec(alg: LaneAlg) -> LaneSpec {
        // A token bucket of 8 per 4 s (a unit every 0.5 s), burst 4; a window of 3 per 5 s.
        match alg {
            LaneAlg::TokenBucket => LaneSpec {
                alg,
                limit: 8,
                burst: 4,
                period_s: 4,
            },
            LaneAlg::FixedWindow => LaneSpec {
                alg,
                limit: 3,
                burst: 1,
                period_s: 5,
            },
        }
    }

    #[test]
    fn a_token_bucket_admits_its_burst_at_once_then_its_rate() {
        let mut ledger = Ledger::new(spec(LaneAlg::TokenBucket), T0);
        ledger.admit(0, T0, 4, Holder::Lease(0), None).unwrap();
        ledger
            .admit(0, T0 + 1_000_000, 2, Holder::Envoy(1), Some(0))
            .unwrap();
        let over = ledger.admit(0, T0 + 1_010_000, 1, Holder::Lease(1), None);
        assert!(over.is_err(), "7 in 1 s on burst 4 at 2 a second");
    }

    #[test]
    fn a_window_carries_only_what_the_old_holders_admit() {
        let fw = spec(LaneAlg::FixedWindow);
        // Window [T0, T0 + 5 s): an Envoy took 2 (the counter shows 1 left), admitted none.
        let at = (T0 / 5_000_000) * 5_000_000;
        let mut ledger = Ledger::new(fw, at);
        ledger.break_part(0, fw, at + 1_000, "a reset", Some(1));
        ledger
            .admit(0, at + 2_000, 3, Holder::Lease(0), None)
            .unwrap();
        // The Envoy's 2 may still be admitted: the fresh 3 plus them.
        let mut envoy = clone(&ledger);
        envoy
            .admit(0, at + 3_000, 2, Holder::Envoy(0), Some(0))
            .unwrap();
        // But 2 more by a holder of the new counter are 5 on a limit of 3 (the give-back of
        // the Envoy's units landing on the new counter).
        let over = ledger.admit(0, at + 3_000, 2, Holder::Lease(1), None);
        assert!(over.is_err(), "{over:?}");
    }

    fn clone(ledger: &Ledger) -> Ledger {
        Ledger {
            accounts: ledger.accounts.clone(),
            breaks: ledger.breaks.clone(),
            lost_at: ledger.lost_at,
            admitted: ledger.admitted,
        }
    }
}

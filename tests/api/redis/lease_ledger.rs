//! The bound a leased policy's fleet is held to through changes ([`super::lease_changes`]): what
//! the fleet admitted, by account, against the most the policy in force allows.
//!
//! An account is a stretch of a partition's counter with nothing forgotten: it opens with the
//! sequence, and again when the counter legitimately starts afresh (another algorithm, a fixed
//! window's new period, a counter reset, Redis restarted without its data). A lease of the old
//! counter must not be admitted from in the next account: a reload retires it at once, a reset
//! drops it on the announcement (the runner gives that [`super::lease_changes`]' `ANNOUNCED`),
//! a data loss on each pod's resubscription (the runner waits until no lease is held). So every
//! admission belongs to one account, and one from a lease that outlived its counter counts in
//! the new account, where it shows as over-admission.
//!
//! - **Fixed window**: within one window, at most the limit in force; a limit changed in the
//!   window applies to the count as it is, so the account's cap becomes `max(admitted so far,
//!   new limit)` (the counter, which includes what leases hold, only grows while below the new
//!   limit, and admissions never pass the counter). An account that spans `n` windows (a
//!   window edge in the sequence) is held to `n` times the highest limit it saw.
//! - **Token bucket** (GCRA, `T = period / limit`, burst tolerance `tau = burst * T`): each
//!   unit admitted moved the bucket's TAT by the `T` in force when it was counted (a take
//!   counts a lease's units at once; a give-back moves the TAT back by exactly what the lease
//!   did not admit), and the TAT is never more than `tau` past the store's `now`, nor (as
//!   `max(TAT, now)`) before the account's start. So `sum(admitted * T) <= elapsed + max tau`
//!   over the account, `elapsed` on Redis' clock. Reloads that keep the algorithm start a new
//!   segment (its own `T`) of the same account: a new rate applies to the state as it is.

/// An algorithm a leased policy uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    /// `token_bucket`.
    TokenBucket,
    /// `fixed_window`.
    FixedWindow,
}

/// A leased policy as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Its algorithm.
    pub alg: Alg,
    /// `limit`.
    pub limit: u64,
    /// `burst` (token bucket only).
    pub burst: u64,
    /// `period`, in seconds.
    pub period_s: u64,
    /// `lease`.
    pub lease: bool,
}

impl Spec {
    fn period_us(&self) -> u64 {
        self.period_s * 1_000_000
    }

    /// A token bucket's emission interval, µs per unit.
    fn interval_us(&self) -> f64 {
        self.period_us() as f64 / self.limit as f64
    }

    /// Its line in the policy file.
    pub fn yaml(&self, name: &str, route: &str) -> String {
        let (alg, burst) = match self.alg {
            Alg::TokenBucket => ("token_bucket", format!(", burst: {}", self.burst)),
            Alg::FixedWindow => ("fixed_window", String::new()),
        };
        format!(
            "  - {{name: {name}, match: {{route: {route}}}, key: [user], algorithm: {alg}, limit: {}, period: {}s{burst}, lease: {}, failure_mode: closed}}\n",
            self.limit, self.period_s, self.lease
        )
    }
}

/// Slack for the token bucket's rounding (µs, far below one unit's interval).
const ROUNDING_US: f64 = 1_000.0;

#[derive(Clone, Debug)]
enum Bound {
    /// A fixed window's period, its cap within one window, the highest limit it saw.
    Window {
        period_us: u64,
        cap: u64,
        highest: u64,
    },
    /// A token bucket's segments: (units admitted, `T`, `tau`), one per reload.
    Bucket { segments: Vec<(u64, f64, f64)> },
}

/// One account (see the module documentation).
#[derive(Clone, Debug)]
pub struct Account {
    opened_by: &'static str,
    start_us: u64,
    admitted: u64,
    bound: Bound,
}

/// A closed account's figures.
#[derive(Clone, Debug)]
pub struct Closed {
    /// What opened it.
    pub opened_by: &'static str,
    /// How much of the bound that used (1.0: all of it; above: over-admission).
    pub used: f64,
    /// The figures, for a report.
    pub text: String,
}

impl Account {
    fn open(spec: &Spec, start_us: u64, opened_by: &'static str) -> Self {
        let bound = match spec.alg {
            Alg::FixedWindow => Bound::Window {
                period_us: spec.period_us(),
                cap: spec.limit,
                highest: spec.limit,
            },
            Alg::TokenBucket => Bound::Bucket {
                segments: vec![(
                    0,
                    spec.interval_us(),
                    spec.burst as f64 * spec.interval_us(),
                )],
            },
        };
        Self {
            opened_by,
            start_us,
            admitted: 0,
            bound,
        }
    }

    fn close(&self, end_us: u64) -> Closed {
        let (used, text) = match &self.bound {
            Bound::Window {
                period_us,
                cap,
                highest,
            } => {
                let windows = end_us / period_us - self.start_us / period_us + 1;
                let allowed = if windows == 1 {
                    *cap
                } else {
                    windows * highest
                };
                (
                    self.admitted as f64 / allowed as f64,
                    format!(
                        "fixed window: {} admitted of at most {allowed} ({windows} window(s))",
                        self.admitted
                    ),
                )
            }
            Bound::Bucket { segments } => {
                let spent: f64 = segments.iter().map(|(n, t, _)| *n as f64 * t).sum();
                let tau = segments.iter().map(|s| s.2).fold(0.0, f64::max);
                let elapsed = end_us.saturating_sub(self.start_us) as f64;
                let allowed = elapsed + tau + ROUNDING_US;
                (
                    spent / allowed,
                    format!(
                        "token bucket: {} admitted in segments {:?} (units, T µs, tau µs): \
                         sum(admitted*T) {:.0} µs of at most {:.0} µs ({:.0} elapsed + {tau:.0} \
                         tau)",
                        self.admitted,
                        segments
                            .iter()
                            .map(|(n, t, tau)| (*n, t.round(), tau.round()))
                            .collect::<Vec<_>>(),
                        spent,
                        allowed,
                        elapsed
                    ),
                )
            }
        };
        Closed {
            opened_by: self.opened_by,
            used,
            text,
        }
    }
}

/// One policy's accounts over a sequence.
#[derive(Clone, Debug)]
pub struct Ledger {
    /// The policy in force.
    pub spec: Spec,
    open: Account,
    closed: Vec<Closed>,
}

impl Ledger {
    /// A fresh partition under `spec` from the store's time `start_us`.
    pub fn new(spec: Spec, start_us: u64) -> Self {
        Self {
            spec,
            open: Account::open(&spec, start_us, "start"),
            closed: Vec::new(),
        }
    }

    /// The fleet admitted `units` more.
    pub fn admit(&mut self, units: u64) {
        self.open.admitted += units;
        if let Bound::Bucket { segments } = &mut self.open.bound {
            if let Some(last) = segments.last_mut() {
                last.0 += units;
            }
        }
    }

    /// A reload put `next` in force between the store's times `before_us` and `after_us`.
    pub fn reload(&mut self, next: Spec, before_us: u64, after_us: u64) {
        let was = self.spec;
        self.spec = next;
        let afresh =
            was.alg != next.alg || (next.alg == Alg::FixedWindow && was.period_s != next.period_s);
        if afresh {
            let opened_by = if was.alg != next.alg {
                "algorithm"
            } else {
                "period"
            };
            self.fresh(before_us, after_us, opened_by);
            return;
        }
        match &mut self.open.bound {
            Bound::Window { cap, highest, .. } => {
                if next.limit != was.limit {
                    *cap = self.open.admitted.max(next.limit);
                    *highest = (*highest).max(next.limit);
                }
            }
            Bound::Bucket { segments } => {
                let t = next.interval_us();
                segments.push((0, t, next.burst as f64 * t));
            }
        }
    }

    /// The counter starts afresh (`why`: a reset, a data loss, a new algorithm or window
    /// period) between the store's times `before_us` and `after_us`: the open account closes
    /// at the later, the next opens at the earlier (both conservative).
    pub fn fresh(&mut self, before_us: u64, after_us: u64, why: &'static str) {
        let next = Account::open(&self.spec, before_us, why);
        let old = std::mem::replace(&mut self.open, next);
        self.closed.push(old.close(after_us));
    }

    /// Closes the open account at the store's time `end_us`; every account's figures.
    pub fn finish(mut self, end_us: u64) -> Vec<Closed> {
        self.closed.push(self.open.close(end_us));
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000_000;

    fn window(limit: u64) -> Spec {
        Spec {
            alg: Alg::FixedWindow,
            limit,
            burst: 1,
            period_s: 3600,
            lease: true,
        }
    }

    #[test]
    fn a_lowered_window_limit_caps_at_what_was_admitted_or_the_new_limit() {
        let mut ledger = Ledger::new(window(100), 10 * H);
        ledger.admit(40);
        ledger.reload(window(50), 10 * H + 1, 10 * H + 2);
        ledger.admit(10);
        let closed = ledger.clone().finish(10 * H + 3);
        assert_eq!(closed[0].used, 1.0, "{}", closed[0].text);
        ledger.admit(1);
        assert!(ledger.finish(10 * H + 3)[0].used > 1.0, "51 of 50");
    }

    #[test]
    fn a_window_edge_in_the_account_allows_a_window_more() {
        let mut ledger = Ledger::new(window(100), 11 * H - 5);
        ledger.admit(150);
        assert!(ledger.finish(11 * H + 5)[0].used <= 1.0);
    }

    #[test]
    fn a_bucket_is_held_to_burst_plus_refill_with_the_rate_of_each_segment() {
        let bucket = |limit, burst| Spec {
            alg: Alg::TokenBucket,
            limit,
            burst,
            period_s: 3600,
            lease: true,
        };
        // 100 spent at T = 36 s is 3600 s of TAT; at 10 an hour (T = 360 s, tau = 36000 s) a
        // burst of 100 leaves 90 more.
        let mut ledger = Ledger::new(bucket(100, 100), 10 * H);
        ledger.admit(100);
        ledger.reload(bucket(10, 100), 10 * H + 1, 10 * H + 2);
        ledger.admit(90);
        let closed = ledger.clone().finish(10 * H + 2);
        assert!(closed[0].used <= 1.0, "{}", closed[0].text);
        ledger.admit(1);
        assert!(ledger.finish(10 * H + 2)[0].used > 1.0);
    }
}

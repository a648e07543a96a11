//! The units one RLQS bucket holds (its grants, taken from the store) and what is known of the
//! assignment they back at Envoy: what was sent and until when, the most Envoy's bucket may
//! hold, and the units used (reported admissions) or expired, as [`super::sizing`] counts them.

use std::time::{Duration, Instant};

use super::sizing::{self, Backing, Held, Terms, DELIVERY_MARGIN_US};
use super::ShareGuard;
use crate::limit::Grant;
use crate::store::StoreCheck;

const MARGIN: Duration = Duration::from_micros(DELIVERY_MARGIN_US);

/// The units a bucket holds and the assignment they back.
pub(super) struct Pool {
    pub(super) check: StoreCheck,
    /// The origin of the µs the math counts in.
    pub(super) base: Instant,
    pub(super) grants: Vec<(Grant, Held)>,
    /// Units used (admissions reported, counted from the earliest to expire) or expired.
    pub(super) used: u64,
    /// The terms last sent, and when Envoy stops admitting on them at the latest.
    pub(super) sent: Option<(Terms, Instant)>,
    /// The most tokens and refill a second of the last two assignments sent (Envoy's bucket
    /// holds at most these between two reports); none sent yet: no bound.
    pub(super) bound: (u64, u64),
    /// The last report taken in.
    pub(super) noted: Option<Instant>,
    /// The most tokens Envoy's bucket may hold: at the last report (`level`), or as the last
    /// assignment sent left it; and how much of an admission on the replaced bucket counts
    /// against it (a smaller replacement starts at its share of the old level).
    pub(super) level: u64,
    pub(super) scale: (u64, u64),
    pub(super) share: ShareGuard,
}

impl Pool {
    /// An empty pool for `check`, its µs counted from a margin before `now`.
    pub(super) fn open(check: StoreCheck, now: Instant, share: ShareGuard) -> Self {
        Self {
            check,
            base: now.checked_sub(MARGIN).unwrap_or(now),
            grants: Vec::new(),
            used: 0,
            sent: None,
            bound: (u64::MAX, u64::MAX),
            noted: None,
            level: 0,
            scale: (1, 1),
            share,
        }
    }

    /// Records the assignment of `terms` sent at `sent`: the bounds of Envoy's bucket until the
    /// next report.
    pub(super) fn record(&mut self, terms: Terms, sent: Instant) {
        let last = self
            .sent
            .map_or((0, 0), |(last, _)| (last.tokens, last.per_s));
        // What Envoy's bucket holds once this lands: a running one's level (a replacement: in
        // proportion, Envoy 1.40 starts it at the old one's remaining fraction), else full.
        let old = self
            .sent
            .filter(|_| self.running(sent))
            .map(|(last, _)| last.tokens);
        (self.level, self.scale) = match old {
            Some(m_old) if m_old == terms.tokens => (self.level, (1, 1)),
            Some(m_old) => {
                let scaled = u128::from(self.level) * u128::from(terms.tokens);
                let scaled =
                    u64::try_from(scaled.div_ceil(u128::from(m_old.max(1)))).unwrap_or(u64::MAX);
                let scale = if terms.tokens < m_old {
                    (terms.tokens, m_old)
                } else {
                    (1, 1)
                };
                (
                    scaled.max(self.level).min(terms.tokens.max(self.level)),
                    scale,
                )
            }
            None => (terms.tokens, (1, 1)),
        };
        self.bound = (terms.tokens.max(last.0), terms.per_s.max(last.1));
        self.sent = Some((terms, sent + MARGIN + Duration::from_secs(terms.ttl_s)));
    }

    pub(super) fn us(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    pub(super) fn held(&self) -> Vec<Held> {
        self.grants.iter().map(|(_, held)| *held).collect()
    }

    pub(super) fn expired(&self, at: Instant) -> u64 {
        sizing::expired(&self.check.algorithm, &self.held(), self.us(at))
    }

    /// Takes in `allowed` requests reported at `now`; drops grants wholly expired.
    pub(super) fn note(&mut self, allowed: u64, now: Instant) {
        let cost = self.check.cost.max(1);
        let admitted = allowed.saturating_mul(cost);
        let at = self.us(now);
        let last = self.noted.replace(now).map_or(0, |last| self.us(last));
        if let Some((terms, _)) = self.sent {
            // Refilled since the last report (and the margin), less what it admitted.
            let span = at.saturating_sub(last).saturating_add(DELIVERY_MARGIN_US);
            let spent =
                u128::from(allowed) * u128::from(self.scale.0) / u128::from(self.scale.1.max(1));
            self.level = self
                .level
                .saturating_add(sizing::refill(self.bound.1, span))
                .min(terms.tokens)
                .saturating_sub(u64::try_from(spent).unwrap_or(u64::MAX));
            self.scale = (1, 1);
        }
        self.used = sizing::used_after(
            &self.check.algorithm,
            &self.held(),
            self.used,
            (last, at),
            admitted,
            (
                self.bound.0.saturating_mul(cost),
                self.bound.1.saturating_mul(cost),
                self.sent.map_or(u64::MAX, |(_, end)| self.us(end + MARGIN)),
            ),
        );
        let algorithm = self.check.algorithm;
        let used = &mut self.used;
        self.grants.retain(|(_, held)| {
            let gone = sizing::expired(&algorithm, std::slice::from_ref(held), at) >= held.units;
            if gone {
                *used = used.saturating_sub(held.units);
            }
            !gone
        });
    }

    pub(super) fn backing<'a>(&'a self, held: &'a [Held]) -> Backing<'a> {
        Backing {
            algorithm: &self.check.algorithm,
            held,
            used: self.used,
            cost: self.check.cost,
        }
    }

    /// Whether Envoy may still admit on the last assignment sent.
    pub(super) fn running(&self, now: Instant) -> bool {
        self.sent.is_some_and(|(_, end)| now < end + MARGIN)
    }
}

//! The memory budget a listener's connections share: every buffer a connection holds
//! (read and write buffers, request bodies, answers waiting for the client's window, a header
//! block being joined, its streams and calls in progress) is counted against it.
//!
//! Each connection reserves its base when it is accepted ([`connection_base`]): everything a
//! client can make it hold within the protocol's and the server's bounds before the server can
//! say no (its connection window, a read, its write buffer, a header block, a full table of
//! streams with a call each): a connection the budget cannot reserve that for is refused. Past
//! its base, a connection draws from what the others leave: while the listener
//! is over its budget, new streams of connections over their base are refused
//! (`REFUSED_STREAM`) and the body bytes they hold are not given back as window until their
//! call takes them. A well-behaved client stays within its base and is served throughout.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a connection's buffers may hold besides request bodies and streams: a read and a
/// partial frame, the write buffer to the point where reading stops and one read's answers, a
/// header block being joined, the HPACK table.
const BUFFERS: usize = 160 * 1024;

/// What a connection with `connection_window` and `streams` concurrent streams reserves when it
/// is accepted, each stream costing `per_stream` (its state and a call in progress).
pub fn connection_base(connection_window: u32, streams: u32, per_stream: usize) -> usize {
    BUFFERS + connection_window as usize + streams as usize * per_stream
}

/// Refusals are told (the budget's `warn`) at most once per this interval (they are counted
/// always).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Why a budget refused something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A new connection: closed at once.
    Connection,
    /// A new stream: `REFUSED_STREAM`.
    Stream,
    /// A connection sent too many frames that carry no progress, or caused too many resets:
    /// `GOAWAY(ENHANCE_YOUR_CALM)`.
    Calm,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit)
            .field("base", &self.base)
            .field("used", &self.used())
            .finish_non_exhaustive()
    }
}

impl Refusal {
    /// Every kind, for metric labels.
    pub const ALL: [Refusal; 3] = [Self::Connection, Self::Stream, Self::Calm];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Stream => "stream",
            Self::Calm => "enhance_your_calm",
        }
    }
}

/// What a budget calls, at most once a minute for each kind, when it refuses: the owner's log
/// line (what was refused, the budget's use and limit).
pub type Warn = fn(Refusal, &Budget);

/// The budget every connection of one or more listeners draws from.
pub struct Budget {
    warn: Warn,
    limit: usize,
    /// What each connection reserves.
    base: usize,
    used: AtomicUsize,
    refused: [AtomicU64; 3],
    started: Instant,
    /// Milliseconds from `started` to the last warning of each kind (0: none yet).
    warned_ms: [AtomicU64; 3],
}

impl Budget {
    /// A budget of `limit` bytes, `base` reserved by each connection; `warn` tells of refusals.
    pub fn new(limit: usize, base: usize, warn: Warn) -> Arc<Self> {
        Arc::new(Self {
            warn,
            limit,
            base,
            used: AtomicUsize::new(0),
            refused: Default::default(),
            started: Instant::now(),
            warned_ms: Default::default(),
        })
    }

    /// The budget, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What the connections hold now, in bytes.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Refusals of `kind` so far.
    pub fn refusals(&self, kind: Refusal) -> u64 {
        self.refused[kind as usize].load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }

    /// Reserves a new connection's base, or refuses it (counted) when the budget has no room.
    pub fn admit(self: &Arc<Self>) -> Option<Charge> {
        let mut used = self.used();
        loop {
            if used + self.base > self.limit {
                self.refuse(Refusal::Connection);
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used + self.base,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Charge {
                        budget: Arc::clone(self),
                        charged: self.base,
                    })
                }
                Err(now) => used = now,
            }
        }
    }

    /// Counts a refusal, and tells of it (`warn`) at most once a minute for each kind.
    pub(crate) fn refuse(&self, kind: Refusal) {
        self.refused[kind as usize].fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let warned = &self.warned_ms[kind as usize];
        let last = warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
        if !due
            || warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        (self.warn)(kind, self);
    }
}

/// One connection's share of the budget: its base, or what it holds when that is more.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    charged: usize,
}

impl Charge {
    /// The connection holds `held` bytes now.
    pub(crate) fn set(&mut self, held: usize) {
        let charged = held.max(self.budget.base);
        if charged > self.charged {
            self.budget
                .used
                .fetch_add(charged - self.charged, Ordering::Relaxed);
        } else if charged < self.charged {
            self.budget
                .used
                .fetch_sub(self.charged - charged, Ordering::Relaxed);
        }
        self.charged = charged;
    }

    /// Whether a connection holding `held` may take on more (a new stream): always within its
    /// base; beyond it, only while the listeners are within their budget.
    pub(crate) fn room(&self, held: usize) -> bool {
        held <= self.budget.base || !self.budget.over()
    }

    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.charged, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_past_the_budget_are_refused_and_charges_return_on_drop() {
        const BASE: usize = 1000;
        let budget = Budget::new(3 * BASE, BASE, |_, _| {});
        let mut a = budget.admit().unwrap();
        let b = budget.admit().unwrap();
        let c = budget.admit().unwrap();
        assert!(budget.admit().is_none());
        assert_eq!(budget.refusals(Refusal::Connection), 1);
        a.set(10);
        assert_eq!(budget.used(), 3 * BASE, "a base is charged at least");
        a.set(BASE + 100);
        assert!(!a.room(BASE + 100), "over its base on a full budget");
        assert!(b.room(BASE), "within its base");
        drop((a, b, c));
        assert_eq!(budget.used(), 0);
    }
}

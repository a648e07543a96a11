//! Where counters live: the [`RateStore`] trait, the embedded [`MemoryStore`] (default) and the
//! [`RedisStore`](redis::RedisStore) shared by every pod. The check path only ever sees the trait.

mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use memory::{MemoryMetrics, MemoryStore};
pub use redis::error::ErrorKind;
pub use redis::health::Circuit;

use crate::limit::{Algorithm, Decision, Grant, Key};

/// One counter to check: which key, under which algorithm and quota, for what cost.
#[derive(Debug, Clone)]
pub struct StoreCheck {
    /// The counter.
    pub key: Key,
    /// The algorithm and the quota that applies to this request (tier included).
    pub algorithm: Algorithm,
    /// Units to spend.
    pub cost: u64,
    /// False for shadow policies: their denials do not block the group.
    pub enforce: bool,
    /// The generation its policy's definition last changed in, in the set the check was planned
    /// under ([`PolicySet::revision`](crate::limit::PolicySet::revision)). The embedded store
    /// keeps, with each counter, the newest generation that wrote it, and a check of an older
    /// generation never restarts or overwrites it (see [`MemoryStore`]).
    pub generation: u64,
}

/// Whether a check records what it allows: one name and one polarity from the check layer down to
/// the scripts. Requests say `dry_run` on the wire; [`Spend::from_dry_run`] is where that turns
/// into this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Record the allowed checks (if every enforced one allows).
    Record,
    /// Decide only: nothing is spent (a probe, a read).
    DryRun,
}

impl Spend {
    /// The spend a request's `dry_run` flag asks for.
    pub fn from_dry_run(dry_run: bool) -> Self {
        if dry_run {
            Self::DryRun
        } else {
            Self::Record
        }
    }
}

/// The store could not decide; the policy's failure mode applies. A denial is never an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer before the check's deadline.
    #[error("store timed out")]
    Timeout,
    /// The circuit breaker is open: the store was not asked.
    #[error("store skipped: circuit open")]
    CircuitOpen,
    /// The key of the check's counter number `item` (0-based, in the order given) is not
    /// sluice's: another type, a value no algorithm writes, or beyond any sluice value's size.
    /// That check alone failed; the store itself is fine.
    #[error("store failed (bad_key) on counter {item}: {detail}")]
    BadKey {
        /// Which counter of the check.
        item: usize,
        /// What the store said (for logs; never names the key).
        detail: String,
    },
    /// The store answered with an error or is unreachable.
    #[error("store failed ({}): {detail}", kind.as_str())]
    Failed {
        /// What kind of failure (a bounded label).
        kind: ErrorKind,
        /// What happened (for logs; may not be shown to clients).
        detail: String,
    },
}

impl StoreError {
    /// The kind of failure; `None` when the store was not asked (circuit open).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Timeout => Some(ErrorKind::Deadline),
            Self::CircuitOpen => None,
            Self::BadKey { .. } => Some(ErrorKind::BadKey),
            Self::Failed { kind, .. } => Some(*kind),
        }
    }

    /// A failure of kind `kind`.
    pub fn failed(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self::Failed {
            kind,
            detail: detail.into(),
        }
    }
}

/// What [`RateStore::check`] returns: one decision per check, in order.
pub type StoreFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Decision>, StoreError>> + Send + 'a>>;

/// What a lease call returns ([`RateStore::take`], [`RateStore::give_back`]).
pub type LeaseFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What [`RateStore::acquire`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// Whether the permit was taken (or, in a dry run, would be), with the partition's figures.
    pub decision: Decision,
    /// Permits of the partition found expired (never released) and dropped by this call.
    pub expired: u64,
}

/// What [`RateStore::release`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Whether the permit was held (its slot is back); false for one released already, expired
    /// or never taken.
    pub released: bool,
    /// Permits of the partition found expired (never released) and dropped by this call.
    pub expired: u64,
}

/// What [`RateStore::settle_mark`] found: whether this settle is the reservation's first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleMark {
    /// The first settle of a reservation still open: it is marked settled now.
    First,
    /// Settled before (until its time to live ends, the mark says so).
    AlreadySettled,
    /// Its time to live has ended on the store's clock: it settled at its estimate.
    Expired,
}

/// What a reset did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetOutcome {
    /// Whether the store held state for the counter (false for a key never seen or expired).
    pub existed: bool,
    /// How the other pods' local layers learn of the reset.
    pub fleet: Fleet,
}

/// How the other pods' local layers (remembered denials) learn of a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fleet {
    /// The counters are this process's own: there is no other pod to tell.
    Alone,
    /// Announced on the store's reset channel; `receivers` subscribers got it from the node
    /// that took it (in a Cluster the others get it over the cluster bus, uncounted).
    Announced {
        /// Subscribers the node delivered it to.
        receivers: u64,
    },
    /// The counter was reset but the announcement failed: other pods keep a remembered denial
    /// until its retry instant.
    NotAnnounced,
}

impl Fleet {
    /// A stable name for answers and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Announced { .. } => "announced",
            Self::NotAnnounced => "not_announced",
        }
    }
}

/// What [`RateStore::reset`] returns.
pub type ResetFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ResetOutcome, StoreError>> + Send + 'a>>;

/// A place where counters live, shared by every transport.
pub trait RateStore: Send + Sync + 'static {
    /// Decides every check as one group. With [`Spend::Record`], the allowed checks are recorded
    /// if and only if every enforced check is allowed: a request denied by one policy spends
    /// nothing from the others. `deadline` overrides the store's own (remote stores only).
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: Spend,
        deadline: Option<Duration>,
    ) -> StoreFuture<'a>;

    /// Spends every check's cost whatever its decision (a report: the cost was known only
    /// after the request, e.g. an LLM's tokens), each check on its own (nothing to be all or
    /// nothing about: nothing is refused). Each decision is what is left after the spend: within
    /// the limit an ordinary admission's; past it (see [`Algorithm::spend`]) a denial of 1 unit
    /// saying how long the next check waits. `deadline` as for [`RateStore::check`].
    fn spend<'a>(&'a self, checks: &'a [StoreCheck], deadline: Option<Duration>)
        -> StoreFuture<'a>;

    /// Takes a lease on `check`'s counter: at most `check.cost` units and at most `1 / fraction`
    /// of what it has left, spent there in one atomic step before the caller admits any (see
    /// [`Algorithm::take`]). `None` when the store or the algorithm does not lease (a sliding
    /// log). `deadline` as for [`RateStore::check`].
    fn take<'a>(
        &'a self,
        check: &'a StoreCheck,
        fraction: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Option<Grant>> {
        let _ = (check, fraction, deadline);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Gives back what is left of `grant` (taken on `check`'s counter), of which `unused`
    /// units were not admitted: the store measures what the lease still held on its own clock
    /// (see [`Algorithm::give_back`]); the units it took back. Nothing lands on a counter that
    /// is no longer the one taken from (reset, recreated, its data lost: `grant.epoch`).
    fn give_back<'a>(
        &'a self,
        check: &'a StoreCheck,
        unused: u64,
        grant: Grant,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, u64> {
        let _ = (check, unused, grant, deadline);
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Takes permit `permit` on `check`'s partition (a concurrency limit, see
    /// [`Concurrency`](crate::limit::Concurrency)) if fewer than its limit are held, expired
    /// ones dropped first, in one atomic step on the store's clock; with [`Spend::DryRun`]
    /// decides only. A store that keeps no permits fails.
    fn acquire<'a>(
        &'a self,
        check: &'a StoreCheck,
        permit: u128,
        spend: Spend,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Acquired> {
        let _ = (check, permit, spend, deadline);
        Box::pin(std::future::ready(Err(StoreError::failed(
            ErrorKind::Other,
            "this store keeps no permits",
        ))))
    }

    /// Gives permit `permit` of `key`'s partition back (idempotent: a second release finds
    /// nothing).
    fn release<'a>(
        &'a self,
        key: &'a Key,
        permit: u128,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Released> {
        let _ = (key, permit, deadline);
        Box::pin(std::future::ready(Err(StoreError::failed(
            ErrorKind::Other,
            "this store keeps no permits",
        ))))
    }

    /// Marks reservation `id` of `key`'s partition settled, in one atomic step on the store's
    /// clock, unless it was settled before or its time to live ended (`expires_us`, on the
    /// store's clock): the store, not a pod, knows whether a reservation was settled, so any
    /// pod may settle any pod's reservation, once. A store that keeps no marks fails.
    fn settle_mark<'a>(
        &'a self,
        key: &'a Key,
        id: u128,
        expires_us: u64,
        deadline: Option<Duration>,
    ) -> LeaseFuture<'a, SettleMark> {
        let _ = (key, id, expires_us, deadline);
        Box::pin(std::future::ready(Err(StoreError::failed(
            ErrorKind::Other,
            "this store keeps no reservations",
        ))))
    }

    /// Forgets `key`'s state, so that the next request sees a full quota, and tells the other
    /// pods sharing the store (an operator's reset, never part of a check).
    fn reset<'a>(&'a self, key: &'a Key) -> ResetFuture<'a>;

    /// The counter's name as the store holds it (shown to operators).
    fn stored_key(&self, key: &Key) -> String {
        key.to_string()
    }

    /// A short name for logs and the readiness body (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// The remote store's circuit (`healthy`, `degraded`, `open`, `half_open`); `None` for a
    /// store that cannot fail.
    fn health(&self) -> Option<Circuit> {
        None
    }
}

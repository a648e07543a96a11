//! The embedded store: counters in process memory, sharded so that checks on different keys do
//! not contend, bounded in keys and in bytes, exact under concurrency.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};

use super::{
    Acquired, Fleet, LeaseFuture, RateStore, Released, ResetFuture, ResetOutcome, Spend,
    StoreCheck, StoreFuture,
};
use crate::clock::Clock;
use crate::limit::{Decision, Grant, Key, Micros, State};

/// What one key costs besides its own heap parts: the map entry, its control byte and the
/// table's spare capacity. A hashbrown table doubles when 7/8 full, so right after it grows it
/// is 7/16 full: each entry then carries 16/7 of its size, the worst case, which the budget
/// assumes (the budget is an upper bound on what the keys hold, not an average).
const ENTRY_OVERHEAD: usize = (size_of::<(Key, Slot)>() + 1) * 16 / 7 + 8;

/// How many entries are looked at to pick an eviction victim when a shard is full.
const EVICTION_SAMPLE: usize = 8;
/// A full shard purges expired keys at most this often; between purges it evicts by sampling.
const PURGE_INTERVAL_US: Micros = 1_000_000;

struct Slot {
    state: State,
    /// From this instant the state equals a fresh one, so the slot can be dropped.
    idle_at: Micros,
    /// The newest policy generation that wrote the state ([`StoreCheck::generation`]).
    generation: u64,
    /// The counter's lease epoch: fresh whenever the state is (created, restarted when idle,
    /// reset, evicted and made again) and, on a token bucket, at every take of units; a
    /// give-back lands only on the epoch it was taken in.
    epoch: u64,
}

impl Slot {
    /// Whether `check` was planned under an older policy set than one that already wrote
    /// here: it must neither restart nor overwrite this state (a reload's new algorithm or
    /// quota owns the partition from its first write on).
    fn supersedes(&self, check: &StoreCheck) -> bool {
        self.generation > check.generation
    }
}

#[derive(Default)]
struct Shard {
    slots: HashMap<Key, Slot>,
    last_purge: Micros,
    /// Estimated bytes held by `slots` ([`slot_bytes`] summed).
    bytes: usize,
}

/// Estimated bytes one key holds: the entry, its partition string and a sliding log's entries
/// (allocator rounding included), so that the budget tracks what the process really uses.
fn slot_bytes(key: &Key, slot: &Slot) -> usize {
    let heap = |bytes: usize| {
        if bytes == 0 {
            0
        } else {
            bytes.next_multiple_of(16) + 16
        }
    };
    let state = match &slot.state {
        State::Log(log) => heap(log.entries.capacity() * size_of::<(Micros, u64)>()),
        State::Permits(permits) => heap(permits.permits.capacity() * size_of::<(Micros, u128)>()),
        State::Bucket(_) | State::Window(_) => 0,
    };
    ENTRY_OVERHEAD + heap(key.partition().len()) + state
}

impl Shard {
    /// Drops every slot idle at `now`, keeping `bytes` in step.
    fn drop_idle(&mut self, now: Micros) {
        let mut freed = 0;
        self.slots.retain(|key, slot| {
            let keep = slot.idle_at > now;
            if !keep {
                freed += slot_bytes(key, slot);
            }
            keep
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }
}

/// Metrics the memory store keeps up to date.
#[derive(Clone)]
pub struct MemoryMetrics {
    /// Keys held.
    pub keys: IntGauge,
    /// Keys evicted because the store was full.
    pub evictions: IntCounter,
}

/// Counters in memory: one process's view only (use Redis to share limits across pods).
///
/// Each counter remembers the newest policy generation that wrote it. A check planned under an
/// older set (before a reload) that reaches a counter after a check of the newer set is answered
/// [`Algorithm::superseded`](crate::limit::Algorithm::superseded) (denied, nothing spent, retry
/// at once, under the set in force), in a group as an enforced denial: it never restarts the
/// partition under the old algorithm nor spends under the old quota.
///
/// Keys live in `2^n` shards, each behind its own mutex, held only for the few microseconds of
/// the arithmetic (never across an await). A multi-policy check locks its shards in index order,
/// so groups are atomic without deadlock. Idle keys are dropped by [`MemoryStore::sweep`]; when a
/// shard reaches its share of `max_keys`, the soonest-to-expire of a sample is evicted (its
/// counter restarts, which is counted in `sluice_memory_store_evictions_total`).
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    shard_capacity: usize,
    /// Each shard's share of the byte budget.
    shard_bytes: usize,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    metrics: Option<MemoryMetrics>,
    /// The last lease epoch handed to a counter.
    epochs: AtomicU64,
    /// Settled reservations, until their time to live ends.
    marks: reservations::Marks,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys.
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>, metrics: Option<MemoryMetrics>) -> Self {
        let max_keys = max_keys.max(1);
        let shard_count = (max_keys / 1024).clamp(1, 64).next_power_of_two();
        Self {
            shards: (0..shard_count).map(|_| Mutex::default()).collect(),
            shard_capacity: max_keys.div_ceil(shard_count),
            shard_bytes: usize::MAX,
            hasher: RandomState::new(),
            clock,
            metrics,
            epochs: AtomicU64::new(0),
            marks: reservations::Marks::new(max_keys),
        }
    }

    /// A lease epoch no counter of this store has had.
    fn next_epoch(&self) -> u64 {
        self.epochs.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Also bounds the estimated bytes held to about `max_bytes` (a sliding log's key holds its
    /// entries, so a key count alone does not bound memory): past it, keys are evicted as when
    /// the key cap is reached.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.shard_bytes = (max_bytes / self.shards.len()).max(1);
        self
    }

    /// Estimated bytes held by the keys (what `memory.max_bytes` bounds).
    pub fn bytes(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).bytes).sum()
    }

    fn shard_of(&self, key: &Key) -> usize {
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding the lock cannot leave a shard half-updated (updates are single
        // assignments), so a poisoned lock is safe to keep using.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The synchronous core of [`RateStore::check`].
    pub fn check_now(&self, checks: &[StoreCheck], spend: Spend) -> Vec<Decision> {
        let now = self.clock.now_us();
        let shard_of: Vec<usize> = checks.iter().map(|c| self.shard_of(&c.key)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = order.iter().map(|&i| self.lock(i)).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        let decisions: Vec<Decision> = checks
            .iter()
            .zip(&shard_of)
            .map(|(check, &shard)| {
                let fresh;
                let state = match guards[guard_of(shard)].slots.get(&check.key) {
                    Some(slot) if slot.supersedes(check) => return check.algorithm.superseded(),
                    Some(slot) if slot.idle_at > now => &slot.state,
                    _ => {
                        fresh = check.algorithm.new_state();
                        &fresh
                    }
                };
                check.algorithm.decide(state, now, check.cost)
            })
            .collect();

        let group_allowed = checks
            .iter()
            .zip(&decisions)
            .all(|(check, decision)| decision.allowed || !check.enforce);
        if spend == Spend::Record && group_allowed {
            for ((check, decision), &shard) in checks.iter().zip(&decisions).zip(&shard_of) {
                if decision.allowed {
                    self.admit(&mut guards[guard_of(shard)], check, now);
                }
            }
        }
        decisions
    }

    /// The synchronous core of [`RateStore::spend`]: every check's cost spent whatever its
    /// decision (see [`crate::limit::Algorithm::spend`]), each answer what is left after it.
    pub fn spend_now(&self, checks: &[StoreCheck]) -> Vec<Decision> {
        let now = self.clock.now_us();
        let shard_of: Vec<usize> = checks.iter().map(|c| self.shard_of(&c.key)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = order.iter().map(|&i| self.lock(i)).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        checks
            .iter()
            .zip(&shard_of)
            .map(|(check, &shard)| {
                let shard = &mut guards[guard_of(shard)];
                if shard
                    .slots
                    .get(&check.key)
                    .is_some_and(|slot| slot.supersedes(check))
                {
                    return check.algorithm.superseded();
                }
                let spent = self.record(shard, check, now, true);
                spent
                    .unwrap_or_else(|| check.algorithm.decide(&check.algorithm.new_state(), now, 0))
            })
            .collect()
    }

    fn admit(&self, shard: &mut Shard, check: &StoreCheck, now: Micros) {
        self.update(shard, check, now, |alg, state| {
            alg.admit(state, now, check.cost)
        });
    }

    /// Admits `check` (its decision allowed it) or, with `spend`, spends it whatever the
    /// decision; returns the spend's answer (an admission's is not needed).
    fn record(
        &self,
        shard: &mut Shard,
        check: &StoreCheck,
        now: Micros,
        spend: bool,
    ) -> Option<Decision> {
        self.update(shard, check, now, |alg, state| {
            if spend {
                Some(alg.spend(state, now, check.cost))
            } else {
                alg.admit(state, now, check.cost);
                None
            }
        })
    }

    /// Changes `check`'s counter with `change` (creating it, or starting it afresh when idle),
    /// keeping the key and byte budgets.
    fn update<R>(
        &self,
        shard: &mut Shard,
        check: &StoreCheck,
        now: Micros,
        change: impl FnOnce(&crate::limit::Algorithm, &mut State) -> R,
    ) -> R {
        // A key already held (the common case) is found with one lookup and not cloned.
        let (outcome, before, after) = if let Some(slot) = shard.slots.get_mut(&check.key) {
            let before = slot_bytes(&check.key, slot);
            if slot.idle_at <= now {
                slot.state = check.algorithm.new_state();
                slot.epoch = self.next_epoch();
            }
            // Callers have refused a superseded check: this only ever moves forward.
            slot.generation = slot.generation.max(check.generation);
            let outcome = change(&check.algorithm, &mut slot.state);
            slot.idle_at = check.algorithm.idle_at(&slot.state);
            (outcome, before, slot_bytes(&check.key, slot))
        } else {
            if shard.slots.len() >= self.shard_capacity {
                self.evict_one(shard, now, None);
            }
            let slot = shard
                .slots
                .entry(check.key.clone())
                .or_insert_with(|| Slot {
                    state: check.algorithm.new_state(),
                    idle_at: now,
                    generation: check.generation,
                    epoch: self.next_epoch(),
                });
            let outcome = change(&check.algorithm, &mut slot.state);
            slot.idle_at = check.algorithm.idle_at(&slot.state);
            (outcome, 0, slot_bytes(&check.key, slot))
        };
        shard.bytes = (shard.bytes + after).saturating_sub(before);
        // Over the byte budget: evict others (never the key just admitted) until under it.
        let mut tries = shard.slots.len();
        while shard.bytes > self.shard_bytes && shard.slots.len() > 1 && tries > 0 {
            tries -= 1;
            self.evict_one(shard, now, Some(&check.key));
        }
        outcome
    }

    /// The synchronous core of [`RateStore::take`]: a lease of at most `check.cost` units (see
    /// [`Algorithm::take`](crate::limit::Algorithm::take)); a check of an older policy set than
    /// the counter's gets nothing (its [`superseded`](crate::limit::Algorithm::superseded)
    /// answer).
    pub fn take_now(&self, check: &StoreCheck, fraction: u64) -> Option<Grant> {
        if !check.algorithm.leasable() {
            return None;
        }
        let now = self.clock.now_us();
        let mut shard = self.lock(self.shard_of(&check.key));
        if shard
            .slots
            .get(&check.key)
            .is_some_and(|slot| slot.supersedes(check))
        {
            return Some(Grant {
                units: 0,
                decision: check.algorithm.superseded(),
                window: 0,
                hold_us: 0,
                at_us: now,
                epoch: 0,
            });
        }
        let grant = self.update(&mut shard, check, now, |alg, state| {
            alg.take(state, now, check.cost, fraction)
        });
        // A token bucket's units taken now sit after every earlier holder's: a give-back of an
        // earlier grant would move the TAT back beneath them (they would then be counted
        // sooner than their `hold` says, and admitted twice). Each take with units makes the
        // counter's epoch afresh, so only the latest take's give-back lands. A reservation's
        // take (fraction 0) keeps it: its units are spent when taken, as a check's are.
        let renew = matches!(check.algorithm, crate::limit::Algorithm::TokenBucket(_))
            && fraction != 0
            && grant.is_some_and(|g| g.units > 0);
        let fresh = renew.then(|| self.next_epoch());
        // The key just written is never evicted by its own update.
        let epoch = match shard.slots.get_mut(&check.key) {
            Some(slot) => {
                if let Some(fresh) = fresh {
                    slot.epoch = fresh;
                }
                slot.epoch
            }
            None => 0,
        };
        grant.map(|grant| Grant { epoch, ..grant })
    }

    /// The synchronous core of [`RateStore::give_back`]: the units taken back; none unless the
    /// counter is still the one `grant` was taken from (its epoch).
    pub fn give_back_now(&self, check: &StoreCheck, unused: u64, grant: &Grant) -> u64 {
        let now = self.clock.now_us();
        let mut shard = self.lock(self.shard_of(&check.key));
        match shard.slots.get_mut(&check.key) {
            Some(slot) if slot.idle_at > now && slot.epoch == grant.epoch => {
                let back = check
                    .algorithm
                    .give_back(&mut slot.state, now, unused, grant);
                slot.idle_at = check.algorithm.idle_at(&slot.state);
                back
            }
            _ => 0,
        }
    }

    /// Makes room: purges idle keys (at most once a second), else evicts the soonest-to-expire
    /// of a sample (sparing `keep`).
    fn evict_one(&self, shard: &mut Shard, now: Micros, keep: Option<&Key>) {
        if now.saturating_sub(shard.last_purge) >= PURGE_INTERVAL_US {
            shard.last_purge = now;
            shard.drop_idle(now);
            if shard.bytes <= self.shard_bytes && shard.slots.len() < self.shard_capacity {
                return;
            }
        }
        let victim = shard
            .slots
            .iter()
            .filter(|(key, _)| Some(*key) != keep)
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, slot)| slot.idle_at)
            .map(|(key, _)| key.clone());
        if let Some(key) = victim {
            if let Some(slot) = shard.slots.remove(&key) {
                shard.bytes = shard.bytes.saturating_sub(slot_bytes(&key, &slot));
            }
            if let Some(metrics) = &self.metrics {
                metrics.evictions.inc();
            }
        }
    }

    /// Drops every idle key; returns how many keys remain. Run periodically.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        let mut remaining = 0;
        for index in 0..self.shards.len() {
            let mut shard = self.lock(index);
            shard.drop_idle(now);
            remaining += shard.slots.len();
        }
        if let Some(metrics) = &self.metrics {
            metrics
                .keys
                .set(i64::try_from(remaining).unwrap_or(i64::MAX));
        }
        remaining
    }

    /// Drops `key`'s state; whether it held a live (not idle) one.
    pub fn reset_now(&self, key: &Key) -> bool {
        let now = self.clock.now_us();
        let mut shard = self.lock(self.shard_of(key));
        match shard.slots.remove(key) {
            Some(slot) => {
                shard.bytes = shard.bytes.saturating_sub(slot_bytes(key, &slot));
                slot.idle_at > now
            }
            None => false,
        }
    }

    /// Keys currently held (idle ones included until the next sweep).
    pub fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock(i).slots.len())
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RateStore for MemoryStore {
    fn check<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        spend: Spend,
        _deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        let decisions = self.check_now(checks, spend);
        Box::pin(std::future::ready(Ok(decisions)))
    }

    fn spend<'a>(
        &'a self,
        checks: &'a [StoreCheck],
        _deadline: Option<Duration>,
    ) -> StoreFuture<'a> {
        let decisions = self.spend_now(checks);
        Box::pin(std::future::ready(Ok(decisions)))
    }

    fn take<'a>(
        &'a self,
        check: &'a StoreCheck,
        fraction: u64,
        _deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Option<Grant>> {
        Box::pin(std::future::ready(Ok(self.take_now(check, fraction))))
    }

    fn give_back<'a>(
        &'a self,
        check: &'a StoreCheck,
        unused: u64,
        grant: Grant,
        _deadline: Option<Duration>,
    ) -> LeaseFuture<'a, u64> {
        Box::pin(std::future::ready(Ok(
            self.give_back_now(check, unused, &grant)
        )))
    }

    fn settle_mark<'a>(
        &'a self,
        _key: &'a Key,
        id: u128,
        expires_us: u64,
        _deadline: Option<Duration>,
    ) -> LeaseFuture<'a, super::SettleMark> {
        let now = self.clock.now_us();
        Box::pin(std::future::ready(self.marks.settle(id, expires_us, now)))
    }

    fn acquire<'a>(
        &'a self,
        check: &'a StoreCheck,
        permit: u128,
        spend: Spend,
        _deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Acquired> {
        Box::pin(std::future::ready(Ok(
            self.acquire_now(check, permit, spend)
        )))
    }

    fn release<'a>(
        &'a self,
        key: &'a Key,
        permit: u128,
        _deadline: Option<Duration>,
    ) -> LeaseFuture<'a, Released> {
        Box::pin(std::future::ready(Ok(self.release_now(key, permit))))
    }

    fn reset<'a>(&'a self, key: &'a Key) -> ResetFuture<'a> {
        let existed = self.reset_now(key);
        Box::pin(std::future::ready(Ok(ResetOutcome {
            existed,
            fleet: Fleet::Alone,
        })))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

mod permits;
mod reservations;
#[cfg(test)]
mod tests;

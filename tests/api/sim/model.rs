//! The reference model: what each answer must be. Its bookkeeping is its own and deliberately
//! plain (a map from policy and partition to a state, the policies in force as written); only
//! the per-algorithm arithmetic is `sluice::limit`'s pure functions (property-tested elsewhere,
//! and the Lua twin differential-tested against them).
//!
//! The transition rules it holds the daemon to (docs/policies.md, "Changing a policy"): a reload
//! that keeps a policy's algorithm applies the new limit, burst and period to each partition's
//! state as it is; one that changes the algorithm starts every partition of the policy afresh
//! (another algorithm's state reads as fresh), except that a state of the algorithm in force
//! that a partition still holds (changed away and back, no check in between) counts as it is.
//! "As it is" is what the store holds: a state written under a policy lives until that policy's
//! `idle_at` for it (a Redis TTL, the embedded store's expiry) and is fresh from then on, so a
//! longer period never brings back units that had left the old window when the counter expired.
//! A request of several policies passes only if every one allows and then spends from all; a
//! report spends from every one whatever its counter holds.

use std::collections::BTreeMap;

use sluice::limit::{Decision, Micros, State};

use super::lane::LaneSpec;
use super::ops::{Item, Pick, Spec, POLICIES};

/// What a check, a batch item or a report must answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A 400 `cost_exceeds_limit` (nothing spent).
    TooCostly,
    /// An enforced answer: allowed (a check) or within the limit (a report), with `remaining`
    /// one of these (several when policies tie for deciding).
    Answer {
        /// `allowed` / `within_limit`.
        allowed: bool,
        /// The acceptable `remaining` values.
        remaining: Vec<u64>,
    },
}

/// The denials a local layer may remember of one partition (docs/policies.md, "The local
/// layer"): each as the cost denied and the `remaining` the store answered then. A superset: the
/// model cannot always tell whether the layer or the store answered (checks at once), and keeps
/// both possibilities. The layer only denies what the store would deny, so whichever answered,
/// a check's outcome is the store's; only a denial's `remaining` may be one of these.
type Remembered = Vec<(u64, u64)>;

/// The policies in force and every partition's state.
#[derive(Clone, Debug)]
pub struct Model {
    /// The policies in force, by index (`p<index>`).
    pub specs: Vec<Spec>,
    /// The leased lane's policy `q` (held to a bound by [`super::lane::Ledger`], not modelled).
    pub lane: LaneSpec,
    /// State per (policy, partition), with the instant it expires; absent is fresh.
    states: BTreeMap<(usize, u8), (State, Micros)>,
    /// Writes per (policy, partition) so far.
    writes: BTreeMap<(usize, u8), u64>,
    /// With Redis, each daemon's local layer: the denials it may remember per (daemon, policy,
    /// partition) (cleared by a reload).
    remembered: Option<BTreeMap<(usize, usize, u8), Remembered>>,
    daemons: usize,
}

impl Model {
    /// A model of a fresh store enforcing `specs` for `daemons` daemons, with a local layer
    /// each (`local_layer`: Redis) or not (the embedded store).
    pub fn new(specs: Vec<Spec>, lane: LaneSpec, daemons: usize, local_layer: bool) -> Self {
        assert_eq!(specs.len(), POLICIES);
        Self {
            specs,
            lane,
            states: BTreeMap::new(),
            writes: BTreeMap::new(),
            remembered: local_layer.then(BTreeMap::new),
            daemons,
        }
    }

    /// The `remaining` values daemon `via`'s local layer may answer `item` with (a denial, nothing
    /// asked of the store): those of the denials it may remember of the item's policies for costs
    /// up to `item.cost`. Empty when the store surely answers.
    fn local_answer(&self, via: usize, item: &Item) -> Vec<u64> {
        let Some(remembered) = &self.remembered else {
            return Vec::new();
        };
        Self::policies(item.pick)
            .into_iter()
            .filter_map(|p| remembered.get(&(via % self.daemons, p, item.part)))
            .flatten()
            .filter(|(cost, _)| *cost <= item.cost)
            .map(|(_, remaining)| *remaining)
            .collect()
    }

    /// What the store's answer `decisions` to a check of `cost` on daemon `via` leaves in its
    /// local layer: a denial is remembered; an allowance forgets the partition's denials, when
    /// the store surely answered (`sure`: no remembered denial applied and the check was alone).
    fn remember(
        &mut self,
        via: usize,
        part: u8,
        cost: u64,
        decisions: &[(usize, Decision)],
        sure: bool,
    ) {
        let daemons = self.daemons;
        let Some(remembered) = &mut self.remembered else {
            return;
        };
        for (p, decision) in decisions {
            let at = (via % daemons, *p, part);
            if !decision.allowed {
                remembered
                    .entry(at)
                    .or_default()
                    .push((cost, decision.remaining));
            } else if sure {
                remembered.remove(&at);
            }
        }
    }

    /// The policy file text of the policies in force.
    pub fn yaml(&self) -> String {
        let mut yaml = String::from("policies:\n");
        for (index, spec) in self.specs.iter().enumerate() {
            yaml.push_str(&spec.yaml(index));
        }
        yaml.push_str(&self.lane.yaml());
        yaml
    }

    /// A reload that puts `spec` in force for policy `policy`: state kept under the same
    /// algorithm, dropped (afresh) under another.
    pub fn reload(&mut self, policy: usize, spec: Spec) {
        let before = self.yaml();
        // Another algorithm's state stays where it is and reads as fresh (its variant differs);
        // changed back before a check of the other one replaced it, it counts again.
        self.specs[policy] = spec;
        // A file whose text did not change is not reloaded (the local layers keep their memory).
        let edited = self.yaml() != before;
        if let Some(remembered) = self.remembered.as_mut().filter(|_| edited) {
            remembered.clear();
        }
    }

    /// The store lost every counter (a restart without persistence).
    pub fn forget(&mut self) {
        self.states.clear();
    }

    fn policies(pick: Pick) -> Vec<usize> {
        match pick {
            Pick::One(policy) => vec![policy],
            Pick::All => (0..POLICIES).collect(),
        }
    }

    fn state(&self, policy: usize, part: u8, now: Micros) -> State {
        match self.states.get(&(policy, part)) {
            Some((state, expires)) if *expires > now => state.clone(),
            _ => self.specs[policy].algorithm().new_state(),
        }
    }

    /// Stores a written state, expiring when the policy in force says it is idle.
    fn write(&mut self, policy: usize, part: u8, state: State) {
        let expires = self.specs[policy].algorithm().idle_at(&state);
        self.states.insert((policy, part), (state, expires));
        *self.writes.entry((policy, part)).or_default() += 1;
    }

    /// A check on daemon `via` at `now`: all or nothing across the policies it names.
    /// `alone`: no other check ran at the same time (a batch's or concurrent callers' run at
    /// once, so their local layer answers and memory changes may interleave in any way).
    pub fn check(&mut self, via: usize, item: &Item, now: Micros, alone: bool) -> Expect {
        let policies = Self::policies(item.pick);
        if policies
            .iter()
            .any(|&p| item.cost > self.specs[p].algorithm().limit())
        {
            return Expect::TooCostly;
        }
        let decisions: Vec<(usize, Decision)> = policies
            .iter()
            .map(|&p| {
                let state = self.state(p, item.part, now);
                let decision = self.specs[p].algorithm().decide(&state, now, item.cost);
                (p, decision)
            })
            .collect();
        let allowed = decisions.iter().all(|(_, d)| d.allowed);
        let local = self.local_answer(via, item);
        self.remember(
            via,
            item.part,
            item.cost,
            &decisions,
            alone && local.is_empty(),
        );
        if allowed && !item.dry_run {
            for &p in &policies {
                let mut state = self.state(p, item.part, now);
                self.specs[p].algorithm().admit(&mut state, now, item.cost);
                self.write(p, item.part, state);
            }
        }
        let mut remaining = deciding(&decisions);
        if !allowed {
            remaining.extend(local);
            remaining.sort_unstable();
            remaining.dedup();
        }
        Expect::Answer { allowed, remaining }
    }

    /// A batch on daemon `via` run in `order`: one 400 (nothing spent) if any check costs more
    /// than its limit, else each check's answer at its place in the batch.
    pub fn batch(
        &mut self,
        via: usize,
        items: &[Item],
        order: &[usize],
        now: Micros,
    ) -> Vec<Expect> {
        let before = self.clone();
        let mut expected = vec![Expect::TooCostly; items.len()];
        for &at in order {
            expected[at] = self.check(via, &items[at], now, items.len() == 1);
        }
        if expected.contains(&Expect::TooCostly) {
            *self = before;
            return vec![Expect::TooCostly];
        }
        expected
    }

    /// A report on daemon `via` at `now`: every policy it names spends `cost`.
    pub fn report(&mut self, via: usize, pick: Pick, part: u8, cost: u64, now: Micros) -> Expect {
        let decisions: Vec<(usize, Decision)> = Self::policies(pick)
            .into_iter()
            .map(|p| {
                let mut state = self.state(p, part, now);
                let decision = self.specs[p].algorithm().spend(&mut state, now, cost);
                self.write(p, part, state);
                (p, decision)
            })
            .collect();
        self.remember(via, part, 1, &decisions, true);
        Expect::Answer {
            allowed: decisions.iter().all(|(_, d)| d.allowed),
            remaining: deciding(&decisions),
        }
    }
}

/// The `remaining` of the deciding policy: on a denial the denying one with the longest wait,
/// otherwise the one with the least remaining (every value tied for deciding is acceptable).
fn deciding(decisions: &[(usize, Decision)]) -> Vec<u64> {
    let denied: Vec<&Decision> = decisions
        .iter()
        .map(|(_, d)| d)
        .filter(|d| !d.allowed)
        .collect();
    let mut remaining: Vec<u64> = if denied.is_empty() {
        let least = decisions.iter().map(|(_, d)| d.remaining).min();
        least.into_iter().collect()
    } else {
        let longest = denied.iter().map(|d| d.retry_after_us).max();
        denied
            .iter()
            .filter(|d| Some(d.retry_after_us) == longest)
            .map(|d| d.remaining)
            .collect()
    };
    remaining.sort_unstable();
    remaining.dedup();
    remaining
}

/// Every order of `n` indices, the given order first.
pub fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in orders(n - 1) {
        for at in (0..n).rev() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

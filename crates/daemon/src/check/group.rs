//! Several questions checked as one all-or-nothing group, each with its own answer: Envoy's
//! `ShouldRateLimit` sends one descriptor per limit and wants a status for each, and sluice spends
//! from every one of them or from none (envoyproxy/ratelimit spends the others even when one is
//! over its limit).
//!
//! The figures are what is really left: the passing items of a denied group report their
//! remaining before the cost (nothing was spent), and when the local layer answered with the
//! denials only, the other items' figures are read from the store without spending. A probe
//! (Envoy's `hits_addend: 0`) reports what is left, spends nothing and never denies. A converted
//! `requests_per_unit: 0` (a `deny: true` block list) denies its group without the store spending;
//! in shadow mode, or asked by a probe, it has a fixed answer (a limit of 0) and no counter.
//! A policy that applies to one descriptor drops the policies it `replaces` from every other
//! (an overridden descriptor takes no part), before anything is planned. A descriptor with a
//! limit override that selects its domain's [`StandIn::Override`] is checked against that
//! policy alone, counted per descriptor (upstream uses no other limit for it).

use std::sync::Arc;

use super::plan::{self, Part, Plan};
use super::request::{CheckError, CheckRequest, Spend};
use super::verdict::{self, Mode, Outcome, PolicyDecision, Verdict};
use super::CheckService;
use crate::limit::{Algorithm, Applicable, Decision, Key, StandIn, NEVER};
use crate::store::StoreCheck;

/// One question of a group.
#[derive(Debug, Clone)]
pub struct GroupItem {
    /// The question. With [`Spend::DryRun`] it is a probe: checked with its cost, nothing spent, and it
    /// reports what is left (as if its cost were 0) without ever denying the group.
    pub request: CheckRequest,
    /// A quota to use instead of the selected policies' own (Envoy's descriptor `limit`); it
    /// counts in its own partition per window length, so that it never reads another quota's
    /// state, and overrides of one unit share a count.
    pub quota_override: Option<Algorithm>,
}

/// The answer to a group: the overall verdict and one per item, in order.
#[derive(Debug, Clone)]
pub struct GroupVerdict {
    /// Over every policy of every spending item: denied if any enforced one denied.
    pub overall: Verdict,
    /// Each item's own policies. An item may be allowed while the group is denied (then nothing
    /// was spent from it, and its remaining is what is left).
    pub items: Vec<Verdict>,
}

impl CheckService {
    /// Checks every item as one store group: every item is validated and planned first (a bad
    /// one fails the whole group, nothing spent), then the allowed policies of the spending
    /// items are spent only if no enforced policy of any of them denies; probes are read after.
    pub async fn check_group(&self, items: &[GroupItem]) -> Result<GroupVerdict, CheckError> {
        let policies = self.policies();
        // Selected up front only when some policy replaces another (no allocation otherwise).
        let mut selected: Vec<Vec<Applicable>> = Vec::new();
        if policies.replaces_any() {
            for item in items {
                selected.push(plan::select(&policies, &self.limits, &item.request)?);
            }
            // An overridden descriptor neither replaces nor is replaced (upstream: its limit
            // has no name).
            let open: Vec<usize> = (0..items.len())
                .filter(|at| items[*at].quota_override.is_none())
                .collect();
            let mut lists: Vec<_> = open
                .iter()
                .map(|at| std::mem::take(&mut selected[*at]))
                .collect();
            policies.drop_replaced(&mut lists);
            for (at, list) in open.into_iter().zip(lists) {
                selected[at] = list;
            }
        }
        let mut selected = selected.into_iter();
        // The spending items' plan, the probes' and the parts with a fixed answer (in `fixed`,
        // each naming its part there); every part knows its item.
        let (mut spend, mut probe, mut fixed) = (Plan::default(), Plan::default(), Plan::default());
        let mut answers: Vec<PolicyDecision> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let mut applicable = match selected.next() {
                Some(applicable) => applicable,
                None => plan::select(&policies, &self.limits, &item.request)?,
            };
            if item.quota_override.is_some() {
                let standing_in = |a: &Applicable| a.policy.stand_in();
                if let Some(at) = applicable
                    .iter()
                    .position(|a| standing_in(a) == Some(StandIn::Override))
                {
                    applicable = vec![applicable.swap_remove(at)];
                }
            }
            let dry_run = item.request.spend == Spend::DryRun;
            let plan = if dry_run { &mut probe } else { &mut spend };
            let planned = plan::plan_selected(
                self.tiers.as_ref(),
                &item.request,
                applicable,
                &policies,
                false,
            );
            for (mut part, mut check) in planned.await? {
                if matches!(check.algorithm, Algorithm::Concurrency(_)) {
                    return Err(concurrency_refused(part.policy.name()));
                }
                part.item = index;
                if let Some(quota) = item.quota_override {
                    // The override replaces the whole quota: one window, no local limit.
                    if part.window_index.is_some_and(|window| window > 0) {
                        continue;
                    }
                    override_quota(&mut part, &mut check, quota, &item.request)?;
                } else if let Some(answer) = fixed_answer(&part, &check, dry_run, fixed.parts.len())
                {
                    answers.push(answer);
                    fixed.push(part, check);
                    continue;
                }
                plan.push(part, check);
            }
        }
        let mut per_item: Vec<Vec<PolicyDecision>> = vec![Vec::new(); items.len()];
        let overall = if spend.is_empty() {
            None
        } else {
            Some(self.spend(spend, &mut per_item).await)
        };
        if !probe.is_empty() {
            let read = self.ask_store(Spend::DryRun, &mut probe).await;
            let read = read.evaluated.into_iter().map(|mut decision| {
                as_probe(&mut decision);
                decision
            });
            place(&probe, read, None, &mut per_item);
        }
        if !answers.is_empty() {
            let spent: Vec<PolicyDecision> = answers
                .iter()
                .filter(|answer| {
                    let item = fixed.parts.get(answer.part).map(|part| part.item);
                    item.and_then(|item| items.get(item))
                        .is_some_and(|item| item.request.spend == Spend::Record)
                })
                .cloned()
                .collect();
            self.record(&verdict::decide(spent));
            place(&fixed, answers, None, &mut per_item);
        }
        let overall = overall.unwrap_or_else(|| verdict::decide(per_item.concat()));
        let items = per_item
            .into_iter()
            .map(|parts| {
                if parts.is_empty() {
                    Verdict::unlimited()
                } else {
                    verdict::decide(parts)
                }
            })
            .collect();
        Ok(GroupVerdict { overall, items })
    }

    /// Spends the group (or nothing), placing each decision with its item; returns the verdict.
    async fn spend(&self, mut plan: Plan, per_item: &mut [Vec<PolicyDecision>]) -> Verdict {
        // What a denied group gives back (the checks move into the verdict).
        let costs: Vec<u64> = plan.checks.iter().map(|check| check.cost).collect();
        if plan.parts.iter().any(|p| p.policy.is_deny()) {
            // A block list selected (`deny: true`, a converted `requests_per_unit: 0`): denied
            // without spending, the others' figures read (see `deny`).
            let read = self.ask_store(Spend::DryRun, &mut plan).await;
            let overall = verdict::decide(read.evaluated);
            self.record(&overall);
            place(
                &plan,
                overall.evaluated.iter().cloned(),
                Some(&costs),
                per_item,
            );
            return overall;
        }
        let overall = self.run(Spend::Record, &mut plan).await;
        let mut placed: Vec<Option<PolicyDecision>> = vec![None; plan.parts.len()];
        for decision in &overall.evaluated {
            if let Some(slot) = placed.get_mut(decision.part) {
                *slot = Some(decision.clone());
            }
        }
        // A local layer or local limit answered with the denials only (the store was not asked,
        // the checks are still in the plan): read the others' figures without spending.
        let missing: Vec<usize> = (0..placed.len())
            .filter(|at| placed[*at].is_none())
            .collect();
        if !missing.is_empty() {
            let mut unasked = plan.subset(&missing);
            let read = self.ask_store(Spend::DryRun, &mut unasked).await;
            for decision in read.evaluated {
                if let Some(&at) = missing.get(decision.part) {
                    placed[at] = Some(PolicyDecision {
                        part: at,
                        ..decision
                    });
                }
            }
        }
        let unspent = overall.outcome == Outcome::Denied;
        let give_back = unspent.then_some(costs.as_slice());
        place(&plan, placed.into_iter().flatten(), give_back, per_item);
        overall
    }
}

/// The answer of a converted `requests_per_unit: 0` that the store has no part in, as upstream
/// gives it: in shadow mode, OK with a limit of 0 (a shadow denial, logged and counted as one);
/// asked by a probe, OK with a limit of 0 (a probe never denies). `at` is the part's index.
fn fixed_answer(part: &Part, check: &StoreCheck, probe: bool, at: usize) -> Option<PolicyDecision> {
    let (allowed, mode) = match part.policy.stand_in() {
        Some(StandIn::ShadowBlocked) => (false, Mode::Shadow),
        // A block list (`deny: true`, what `requests_per_unit: 0` converts to), by its kind.
        _ if probe && part.policy.is_deny() => (true, Mode::Enforced),
        _ => return None,
    };
    Some(PolicyDecision {
        policy: Arc::clone(&part.policy),
        key: check.key.clone(),
        decision: Decision {
            allowed,
            limit: 0,
            remaining: 0,
            reset_after_us: 0,
            retry_after_us: if allowed { 0 } else { NEVER },
        },
        mode,
        advertised_us: check.algorithm.advertised_us(),
        window_index: part.window_index,
        part: at,
    })
}

/// Gives each decision of `plan` to its part's item. A denied group spent nothing: with the
/// parts' costs in `give_back`, an allowed decision's remaining is after its cost, so the cost
/// is given back.
fn place(
    plan: &Plan,
    decisions: impl IntoIterator<Item = PolicyDecision>,
    give_back: Option<&[u64]>,
    per_item: &mut [Vec<PolicyDecision>],
) {
    for mut decision in decisions {
        let item = plan.parts.get(decision.part).map(|part| part.item);
        let Some(decisions) = item.and_then(|item| per_item.get_mut(item)) else {
            continue;
        };
        let cost = give_back.and_then(|costs| costs.get(decision.part));
        if let Some(cost) = cost.filter(|_| decision.decision.allowed) {
            let left = decision.decision.remaining.saturating_add(*cost);
            decision.decision.remaining = left.min(decision.decision.limit);
        }
        decisions.push(decision);
    }
}

/// A probe's figures: it was checked with a cost of 1 and spent nothing, so what is left is one
/// more than an allowed decision reports, and 0 when denied; it never denies.
fn as_probe(part: &mut PolicyDecision) {
    if part.decision.allowed {
        let left = part.decision.remaining.saturating_add(1);
        part.decision.remaining = left.min(part.decision.limit);
    } else if part.mode != Mode::FailClosed {
        part.decision.allowed = true;
        part.decision.remaining = 0;
        part.decision.retry_after_us = 0;
    }
}

/// Replaces a planned check's quota, refusing where the policy forbids overrides or the cost can
/// never fit the new quota. A domain's override policy counts per descriptor: every descriptor
/// of `request` (its entries and pseudo-descriptors, names and values) is in the partition.
fn override_quota(
    part: &mut Part,
    check: &mut StoreCheck,
    quota: Algorithm,
    request: &CheckRequest,
) -> Result<(), CheckError> {
    let name = part.policy.name();
    if !part.policy.parts().limit_override {
        return Err(CheckError::Invalid(format!(
            "policy `{name}` does not accept a limit override"
        )));
    }
    if check.cost > quota.limit() {
        return Err(CheckError::CostExceedsLimit {
            policy: name.to_owned(),
            cost: check.cost,
            limit: quota.limit(),
        });
    }
    // The window's length, not the limit: overrides of one unit share a count, as upstream's
    // (a limit raised within a window keeps what was spent; the algorithm is always the same).
    let marker = format!("override={}us", quota.period_us());
    check.key = if part.policy.stand_in() == Some(StandIn::Override) {
        let entries = request
            .descriptors
            .iter()
            .flat_map(|(descriptor, value)| [descriptor.as_str(), value.as_str()]);
        Key::new(Arc::from(name), entries.chain([marker.as_str()]))
    } else {
        let partition = check.key.partition();
        // The partition is already escaped; escaping it again as one value keeps keys
        // injective.
        Key::new(Arc::from(name), [partition, marker.as_str()])
    };
    check.algorithm = quota;
    part.tier = None;
    part.window_index = None;
    part.local = None;
    Ok(())
}

/// A group (Envoy's `ShouldRateLimit`) that applies a concurrency policy: the protocol has no
/// release, so a permit would be held for its whole `permit_ttl`; refused, nothing spent.
pub(super) fn concurrency_refused(policy: &str) -> CheckError {
    CheckError::Invalid(format!(
        "policy `{policy}` is a concurrency limit: its permits are given back with POST \
         /v1/release, which this protocol cannot send; check it with POST /v1/check"
    ))
}

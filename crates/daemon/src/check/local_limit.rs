//! The policies' local limits: a token bucket per policy and partition in this pod, checked
//! before the store, so that one partition's storm is cut here and never reaches Redis.
//!
//! It only ever denies earlier: a request it admits still needs the store's admission, and a
//! request it denies never reaches the store (nothing is spent there). The buckets of one
//! request's policies are one all-or-nothing group, spent when every one admits. A token spent
//! here is not given back when the store then denies: the bucket caps what this pod sends to
//! the store for a partition, denied or not.

use std::sync::Arc;

use super::plan::Plan;
use super::verdict::{self, Mode, PolicyDecision, Verdict};
use super::CheckService;
use crate::store::{Spend, StoreCheck};

impl CheckService {
    /// A denial when a local limit of an enforced policy has no room for the request; `None`
    /// (after spending from every bucket, with [`Spend::Record`]) when all have room. Takes the
    /// local checks out of `plan`'s parts.
    pub(super) fn local_limit(&self, plan: &mut Plan, spend: Spend) -> Option<Verdict> {
        let buckets = self.local_limits.as_ref()?;
        let (owners, checks): (Vec<usize>, Vec<StoreCheck>) = plan
            .parts
            .iter_mut()
            .enumerate()
            .filter_map(|(index, part)| Some((index, part.local.take()?)))
            .unzip();
        if checks.is_empty() {
            return None;
        }
        let decisions = buckets.check_now(&checks, spend);
        if decisions.iter().all(|d| d.allowed) {
            return None;
        }
        let denied = owners
            .into_iter()
            .zip(checks)
            .zip(decisions)
            .filter(|(_, decision)| !decision.allowed)
            .map(|((owner, check), decision)| PolicyDecision {
                policy: Arc::clone(&plan.parts[owner].policy),
                advertised_us: check.algorithm.advertised_us(),
                key: check.key,
                decision,
                mode: Mode::LocalLimit,
                window_index: None,
                part: owner,
            })
            .collect();
        Some(verdict::decide(denied))
    }
}

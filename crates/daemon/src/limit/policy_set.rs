//! The policy set in force: unique names, file order, and which policies apply to a request.
//!
//! Precedence: every matching policy applies (each is its own limit and all must pass), except
//! that among matching policies of the same `group` only the most specific one applies (more and
//! stricter conditions win: per condition exact > path template > glob > `*`, globs ranked by
//! their literal characters (`/v1/orders/*/items` > `/v1/orders/*` > `/v1/*`), summed over the
//! conditions; a tie goes to the one earlier in the file). A group lets a specific route replace
//! a broad default instead of stacking on it.
//!
//! Replacement (envoyproxy/ratelimit's `replaces`): a policy that applies drops the policies it
//! names from the same question, or from every descriptor of one Envoy request. Every applying
//! policy's list counts, a replaced one's included (as upstream collects them all first), and
//! what is dropped is the winner of its group: the next best does not step in.

use std::sync::Arc;

use super::matcher::Captures;
use super::{Descriptors, Policy, Subject};

/// An ordered set of policies with unique names.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<Arc<Policy>>,
    /// Whether any policy replaces another (else [`PolicySet::drop_replaced`] has nothing to do).
    replacing: bool,
    /// Which set in force this is: each reload's set is one more than the set it replaced (see
    /// [`PolicySet::generation`]).
    generation: u64,
    /// Per policy (same order): the generation its definition last changed in (see
    /// [`PolicySet::revision`]).
    revisions: Vec<u64>,
}

/// A policy that applies, with the template parameters its conditions captured.
#[derive(Debug, Clone)]
pub struct Applicable {
    /// The policy.
    pub policy: Arc<Policy>,
    /// Captured path parameters.
    pub captures: Captures,
}

impl PolicySet {
    /// Builds a set; fails with the first duplicated name.
    pub fn new(policies: Vec<Policy>) -> Result<Self, String> {
        for (i, policy) in policies.iter().enumerate() {
            if policies[..i].iter().any(|p| p.name() == policy.name()) {
                return Err(policy.name().to_owned());
            }
        }
        let replacing = policies.iter().any(|p| !p.replaces().is_empty());
        let policies_len = policies.len();
        Ok(Self {
            policies: policies.into_iter().map(Arc::new).collect(),
            replacing,
            generation: 0,
            revisions: vec![0; policies_len],
        })
    }

    /// The set's generation: 0 as built, then numbered by the service that puts it in force,
    /// one more than the set it replaces. Every check planned under this set carries it
    /// (`StoreCheck::generation`), so a store can tell a plan made before a reload from one made
    /// after it, and never let the older plan restart or overwrite what the newer one wrote.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// This set as generation `generation` (see [`PolicySet::generation`]), following
    /// `previous` (the set it replaces): a policy defined as it was there keeps its revision,
    /// every other one gets `generation`.
    pub fn with_generation(mut self, generation: u64, previous: &PolicySet) -> Self {
        self.generation = generation;
        self.revisions = self
            .policies
            .iter()
            .map(|policy| {
                previous
                    .policies
                    .iter()
                    .zip(&previous.revisions)
                    .find(|(old, _)| old.name() == policy.name())
                    // Every field is in the Debug form (a field kept in a map may print in
                    // another order: then the policy reads as changed, which only costs its
                    // checks in flight a retry).
                    .filter(|(old, _)| format!("{old:?}") == format!("{policy:?}"))
                    .map_or(generation, |(_, &revision)| revision)
            })
            .collect();
        self
    }

    /// The generation policy `name`'s definition last changed in (0 as built, or for a name not
    /// in the set). Every check of the policy carries it (`StoreCheck::generation`), so a store
    /// can tell a plan made before a reload that changed the policy from one made after it, and
    /// never let the older plan restart or overwrite what the newer one wrote; a reload that
    /// leaves the policy as it was leaves its checks in flight alone.
    pub fn revision(&self, name: &str) -> u64 {
        self.policies
            .iter()
            .zip(&self.revisions)
            .find(|(policy, _)| policy.name() == name)
            .map_or(0, |(_, &revision)| revision)
    }

    /// The policy with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// Every policy that applies to a request that did not name one, in file order, with group
    /// precedence applied.
    pub fn matching(&self, descriptors: &Descriptors) -> Vec<Applicable> {
        let subject = Subject::new(descriptors);
        let matched: Vec<Applicable> = self
            .policies
            .iter()
            .filter_map(|policy| {
                let captures = policy.matches_in(&subject)?;
                Some(Applicable {
                    policy: Arc::clone(policy),
                    captures,
                })
            })
            .collect();
        matched
            .iter()
            .enumerate()
            .filter(|(i, candidate)| {
                let Some(group) = &candidate.policy.parts().group else {
                    return true;
                };
                // Beaten by a more specific member of its group, or an equal one earlier.
                !matched.iter().enumerate().any(|(j, other)| {
                    other.policy.parts().group.as_ref() == Some(group)
                        && (other.policy.specificity() > candidate.policy.specificity()
                            || (other.policy.specificity() == candidate.policy.specificity()
                                && j < *i))
                })
            })
            .map(|(_, applicable)| applicable.clone())
            .collect()
    }

    /// Whether any policy replaces another.
    pub fn replaces_any(&self) -> bool {
        self.replacing
    }

    /// Drops from each list (the policies applying to one question each) every policy that a
    /// policy of any list replaces.
    pub fn drop_replaced(&self, lists: &mut [Vec<Applicable>]) {
        if !self.replacing {
            return;
        }
        // Collected before anything is dropped: a replaced policy's own list counts too.
        let replaced: Vec<String> = lists
            .iter()
            .flatten()
            .flat_map(|a| a.policy.replaces().iter().cloned())
            .collect();
        if replaced.is_empty() {
            return;
        }
        for list in lists.iter_mut() {
            list.retain(|a| !replaced.iter().any(|name| name == a.policy.name()));
        }
    }

    /// All policies, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.iter()
    }

    /// How many policies there are.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::policy::tests::parts;
    use crate::limit::Pattern;

    fn policy(name: &str, group: Option<&str>, path: &str) -> Policy {
        let mut p = parts(name);
        p.group = group.map(str::to_owned);
        p.conditions = vec![("path".into(), Pattern::parse(path).expect("valid"))];
        Policy::new(p).expect("valid")
    }

    fn names(set: &PolicySet, path: &str) -> Vec<String> {
        let request: Descriptors = [("path", path), ("ip", "1.1.1.1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        set.matching(&request)
            .into_iter()
            .map(|a| a.policy.name().to_owned())
            .collect()
    }

    #[test]
    fn ungrouped_policies_stack_and_the_most_specific_of_a_group_wins() {
        let set = PolicySet::new(vec![
            policy("all", None, "*"),
            policy("default", Some("api"), "/v1/*"),
            policy("search", Some("api"), "/v1/search"),
            policy("orders", Some("api"), "/v1/orders/{id}"),
            policy("items", Some("api"), "/v1/orders/*/items"),
            policy("order_any", Some("api"), "/v1/orders/*"),
        ])
        .expect("unique");
        assert_eq!(names(&set, "/v1/orders/7/items"), ["all", "items"]);
        assert_eq!(names(&set, "/v1/orders/7/notes"), ["all", "order_any"]);
        assert_eq!(names(&set, "/V1/Orders/7/Items/"), ["all", "items"]);
        assert_eq!(names(&set, "/v1/search"), ["all", "search"]);
        assert_eq!(names(&set, "/v1/orders/9"), ["all", "orders"]);
        assert_eq!(names(&set, "/v1/other"), ["all", "default"]);
        assert_eq!(names(&set, "/v2"), ["all"]);
    }

    #[test]
    fn ties_go_to_the_earlier_policy() {
        let set = PolicySet::new(vec![
            policy("first", Some("g"), "/x"),
            policy("second", Some("g"), "/x"),
        ])
        .expect("unique");
        assert_eq!(names(&set, "/x"), ["first"]);
    }

    #[test]
    fn a_replacing_policy_drops_the_named_ones_across_questions_but_not_their_next_best() {
        let mut vip = parts("vip");
        vip.conditions = vec![("user".into(), Pattern::parse("vip").expect("valid"))];
        vip.key = vec!["user".into()];
        vip.replaces = vec!["reads".into()];
        let mut reads = parts("reads");
        reads.group = Some("g".into());
        reads.conditions = vec![("route".into(), Pattern::parse("read").expect("valid"))];
        reads.key = vec!["route".into()];
        let mut any = parts("any_route");
        any.group = Some("g".into());
        any.conditions = vec![("route".into(), Pattern::parse("*").expect("valid"))];
        any.key = vec!["route".into()];
        let set = PolicySet::new(
            [vip, reads, any]
                .into_iter()
                .map(|p| Policy::new(p).expect("valid"))
                .collect(),
        )
        .expect("unique");
        let ask = |pairs: &[(&str, &str)]| -> Descriptors {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let names = |lists: &[Vec<Applicable>]| -> Vec<Vec<String>> {
            lists
                .iter()
                .map(|l| l.iter().map(|a| a.policy.name().to_owned()).collect())
                .collect()
        };
        // One question: vip applies, so reads does not (and any_route, beaten in its group by
        // reads, does not step in).
        let mut one = [set.matching(&ask(&[("user", "vip"), ("route", "read")]))];
        set.drop_replaced(&mut one);
        assert_eq!(names(&one), [vec!["vip".to_owned()]]);
        // Two questions (an Envoy request's descriptors): the same, across them.
        let mut two = [
            set.matching(&ask(&[("route", "read")])),
            set.matching(&ask(&[("user", "vip")])),
        ];
        set.drop_replaced(&mut two);
        assert_eq!(names(&two), [vec![], vec!["vip".to_owned()]]);
        // Without vip, reads applies.
        let mut alone = [set.matching(&ask(&[("route", "read")]))];
        set.drop_replaced(&mut alone);
        assert_eq!(names(&alone), [vec!["reads".to_owned()]]);
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let a = policy("a", None, "*");
        assert_eq!(PolicySet::new(vec![a.clone(), a]).unwrap_err(), "a");
    }
}

//! Policies: which requests a limit applies to, which counter they spend from, what quota (tier
//! included) and what cost.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::borrow::Cow;

use super::matcher::{Captures, Pattern};
use super::subject::{path_as_matched, path_pattern_problem};
use super::{Key, Micros, PathCase, Quota, StandIn, Subject, PATH_DESCRIPTOR};

/// A request's attributes (tenant, api_key, ip, method, path, operation, ...), by name.
pub type Descriptors = BTreeMap<String, String>;

/// Longest descriptor name accepted, on every transport and in every policy file.
pub const MAX_DESCRIPTOR_NAME: usize = 64;

/// What a policy does when its store cannot answer (Redis down or too slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Allow the request, mark the answer `fail_open` and count it.
    Open,
    /// Deny with 503: better to refuse a login than to let a brute force through.
    Closed,
    /// Enforce a per-pod share of the limit in memory until the store is back.
    Local,
}

impl FailureMode {
    /// The name used in files, answers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        }
    }
}

/// Per-tier quotas: the tier comes from the tenant override table or a descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// The descriptor that names the tier when no override does.
    pub descriptor: String,
    /// The quota (windows and local limit) for each named tier; unnamed tiers use the policy's
    /// own.
    pub levels: BTreeMap<String, Quota>,
}

/// Costs per descriptor value, e.g. GraphQL operation name -> complexity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostTable {
    /// The descriptor looked up (e.g. `operation`).
    pub descriptor: String,
    /// Cost per value; values not listed cost what the request says.
    pub costs: BTreeMap<String, u64>,
}

/// The parts of a [`Policy`], checked by [`Policy::new`].
#[derive(Debug, Clone)]
pub struct PolicyParts {
    /// Unique name: `[a-z0-9_-]`, at most 64 bytes (it is a metric label).
    pub name: String,
    /// Free text for operators.
    pub description: String,
    /// Conditions on descriptors; all must hold for the policy to apply.
    pub conditions: Vec<(String, Pattern)>,
    /// How the `path` descriptor's letters compare, in conditions and in the key.
    pub path_case: PathCase,
    /// Among matching policies of one group only the most specific applies.
    pub group: Option<String>,
    /// The descriptors whose values make the partition key, in order (e.g. tenant, api_key);
    /// path template parameters count as descriptors.
    pub key: Vec<String>,
    /// The windows (algorithm and limits) and local limit for requests without a listed tier.
    pub quota: Quota,
    /// Optional per-tier quotas.
    pub tiers: Option<Tiers>,
    /// Optional costs per descriptor value.
    pub cost: Option<CostTable>,
    /// What to do when the store cannot answer.
    pub failure_mode: FailureMode,
    /// Evaluate and report "would block", never block.
    pub shadow: bool,
    /// Percent of partitions enforced (the rest behave as shadow): a gradual rollout. The choice
    /// is a stable hash of the partition, so a client is either in or out.
    pub enforce_percent: u8,
    /// Deadline of this policy's store calls, overriding the store's default.
    pub timeout_us: Option<Micros>,
    /// Whether a caller may replace the quota for one request (Envoy's descriptor `limit`).
    pub limit_override: bool,
    /// Whether `POST /v1/report` may spend on this policy; `false`: a report it applies to is
    /// refused whole (a login's attempts are counted by checks, never reported after the fact).
    pub reports: bool,
    /// The policies (by name) this one replaces: where it applies to a request (or to any
    /// descriptor of an Envoy request), they do not (envoyproxy/ratelimit's `replaces`).
    pub replaces: Vec<String>,
    /// A block list: every request the policy applies to is denied, without a counter (its
    /// quota is a placeholder whose period is the wait a denied client is told).
    pub deny: bool,
    /// Quota leases: with a shared store, each pod takes blocks of units and admits from them
    /// without a round trip (token bucket and fixed window only; see `check::lease`).
    pub lease: bool,
    /// Reservations (`reservations: true`): their time to live in µs; `None`: a check of this
    /// policy cannot reserve (see `check::reservations`).
    pub reservation_ttl_us: Option<Micros>,
    /// A converted envoyproxy/ratelimit rule sluice's limits cannot say: its kind, which the
    /// check's group and the gRPC answer read (never the policy's name).
    pub stand_in: Option<StandIn>,
}

/// Why a [`PolicyParts`] is not a valid policy; names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct PolicyError {
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// The longest policy name accepted.
pub const MAX_POLICY_NAME: usize = 64;

/// A validated rate-limit policy.
#[derive(Debug, Clone)]
pub struct Policy {
    name: Arc<str>,
    specificity: (u32, usize),
    /// The conditions as compared: a `path` pattern lowercased unless `path_case: exact`.
    matchers: Vec<(String, Pattern)>,
    parts: PolicyParts,
}

/// Every problem with a policy's name, key, rollout and conditions (the fields besides its
/// quota), so that a policy file's check can list them all at once.
pub fn field_problems(
    name: &str,
    key: &[String],
    enforce_percent: u8,
    conditions: &[(String, Pattern)],
) -> Vec<PolicyError> {
    let mut problems = Vec::new();
    let mut err = |field, reason: String| problems.push(PolicyError { field, reason });
    if name.is_empty() || name.len() > MAX_POLICY_NAME {
        err("name", format!("must be 1 to {MAX_POLICY_NAME} bytes"));
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        err("name", "may contain only a-z, 0-9, `_` and `-`".into());
    }
    if key.is_empty() {
        err("key", "must name at least one descriptor".into());
    }
    for (i, name) in key.iter().enumerate() {
        if key[..i].contains(name) {
            err("key", format!("descriptor `{name}` is listed twice"));
        }
    }
    if enforce_percent > 100 {
        err("enforce_percent", "must be 0 to 100".into());
    }
    for (descriptor, pattern) in conditions {
        if descriptor == PATH_DESCRIPTOR {
            if let Some(reason) = path_pattern_problem(&pattern.to_string()) {
                err("match", reason);
            }
        }
    }
    problems
}

impl Policy {
    /// Validates `parts` into a policy; the error is the first of [`field_problems`].
    pub fn new(parts: PolicyParts) -> Result<Self, PolicyError> {
        let problems = field_problems(
            &parts.name,
            &parts.key,
            parts.enforce_percent,
            &parts.conditions,
        );
        if let Some(first) = problems.into_iter().next() {
            return Err(first);
        }
        let matchers = parts
            .conditions
            .iter()
            .map(|(name, pattern)| match parts.path_case {
                PathCase::Insensitive if name == PATH_DESCRIPTOR => {
                    (name.clone(), pattern.lowercased())
                }
                _ => (name.clone(), pattern.clone()),
            })
            .collect();
        let specificity = parts
            .conditions
            .iter()
            .map(|(_, pattern)| pattern.specificity())
            .fold((0, 0), |(rank, len), (r, l)| (rank + u32::from(r), len + l));
        Ok(Self {
            name: Arc::from(parts.name.as_str()),
            specificity,
            matchers,
            parts,
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything the policy was built from.
    pub fn parts(&self) -> &PolicyParts {
        &self.parts
    }

    /// Whether the conditions hold; if so, the template parameters captured.
    pub fn conditions_hold(&self, descriptors: &Descriptors) -> Option<Captures> {
        self.conditions_hold_in(&Subject::new(descriptors))
    }

    /// [`Self::conditions_hold`] for a request whose path forms are already worked out.
    pub fn conditions_hold_in(&self, subject: &Subject<'_>) -> Option<Captures> {
        let mut captures = Vec::new();
        self.matchers
            .iter()
            .all(|(name, pattern)| {
                subject
                    .value(name, self.parts.path_case)
                    .is_some_and(|(compared, kept)| {
                        pattern.matches_kept(compared, kept, &mut captures)
                    })
            })
            .then_some(captures)
    }

    /// The first condition that does not hold, as written, and whether its descriptor was sent.
    pub fn unmet_condition(&self, descriptors: &Descriptors) -> Option<(&str, &Pattern, bool)> {
        let subject = Subject::new(descriptors);
        self.matchers.iter().zip(&self.parts.conditions).find_map(
            |((name, pattern), (_, written))| match subject.value(name, self.parts.path_case) {
                None => Some((name.as_str(), written, false)),
                Some((compared, kept))
                    if !pattern.matches_kept(compared, kept, &mut Vec::new()) =>
                {
                    Some((name.as_str(), written, true))
                }
                Some(_) => None,
            },
        )
    }

    /// Whether the policy applies to a request that did not name a policy: every condition
    /// holds and every key descriptor is present. Returns the captured template parameters.
    pub fn matches(&self, descriptors: &Descriptors) -> Option<Captures> {
        self.matches_in(&Subject::new(descriptors))
    }

    /// [`Self::matches`] for a request whose path forms are already worked out.
    pub fn matches_in(&self, subject: &Subject<'_>) -> Option<Captures> {
        let captures = self.conditions_hold_in(subject)?;
        self.missing_key_descriptor(subject.descriptors(), &captures)
            .is_none()
            .then_some(captures)
    }

    /// The first key descriptor neither the request nor the captures provide.
    pub fn missing_key_descriptor(
        &self,
        descriptors: &Descriptors,
        captures: &Captures,
    ) -> Option<&str> {
        self.parts
            .key
            .iter()
            .find(|name| lookup(descriptors, captures, name).is_none())
            .map(String::as_str)
    }

    /// How specific the conditions are (for precedence within a group).
    pub fn specificity(&self) -> (u32, usize) {
        self.specificity
    }

    /// The listed tier this request is in, if any, and the quota that applies (the tier's, else
    /// the policy's own). `tier_override` (the tenant table's answer) wins over the tier
    /// descriptor.
    pub fn quota_for(
        &self,
        descriptors: &Descriptors,
        tier_override: Option<&str>,
    ) -> (Option<&str>, &Quota) {
        let listed = self.parts.tiers.as_ref().and_then(|tiers| {
            let tier =
                tier_override.or_else(|| descriptors.get(&tiers.descriptor).map(String::as_str))?;
            tiers.levels.get_key_value(tier)
        });
        match listed {
            Some((tier, algorithm)) => (Some(tier.as_str()), algorithm),
            None => (None, &self.parts.quota),
        }
    }

    /// What this request costs under this policy: the cost table's entry, else `requested`.
    pub fn cost_for(&self, descriptors: &Descriptors, requested: u64) -> u64 {
        self.parts
            .cost
            .as_ref()
            .and_then(|table| table.costs.get(descriptors.get(&table.descriptor)?))
            .copied()
            .unwrap_or(requested)
    }

    /// The counter this request spends from, or `None` when a key descriptor is missing. A
    /// `path` in the key is the path as this policy matches it (no `;` parameters or trailing
    /// slash; lowercased unless `path_case: exact`), so `/LOGIN` and `/login` are one partition
    /// wherever they are one match. Other values, template parameters included, are as sent.
    pub fn key_for(&self, descriptors: &Descriptors, captures: &Captures) -> Option<Key> {
        let values: Option<Vec<Cow<'_, str>>> = self
            .parts
            .key
            .iter()
            .map(|name| {
                let value = lookup(descriptors, captures, name)?;
                if name != PATH_DESCRIPTOR || !descriptors.contains_key(name) {
                    return Some(Cow::Borrowed(value));
                }
                Some(path_as_matched(value, self.parts.path_case))
            })
            .collect();
        Some(Key::new(
            Arc::clone(&self.name),
            values?.iter().map(|v| v.as_ref()),
        ))
    }

    /// Whether this partition is enforced (not shadow, and inside the rollout percentage); the
    /// same for every window of the partition.
    pub fn enforces(&self, key: &Key) -> bool {
        if self.parts.shadow {
            return false;
        }
        let percent = self.parts.enforce_percent;
        percent >= 100 || key.bucket_of_100() < percent
    }

    /// Whether every partition is enforced (not a shadow policy, no rollout below 100%): else
    /// some partitions only report would-blocks.
    pub fn enforces_every_partition(&self) -> bool {
        !self.parts.shadow && self.parts.enforce_percent >= 100
    }

    /// Whether the policy only reports and never blocks.
    pub fn shadow(&self) -> bool {
        self.parts.shadow
    }

    /// How long a reservation of this policy waits for its settle (µs); `None`: the policy
    /// takes no reservations.
    pub fn reservation_ttl_us(&self) -> Option<Micros> {
        self.parts.reservation_ttl_us
    }

    /// Whether the policy's checks may be answered from quota leases (`lease: true`).
    pub fn lease(&self) -> bool {
        self.parts.lease
    }

    /// Whether the policy is a block list (`deny: true`): it denies whatever it applies to.
    pub fn is_deny(&self) -> bool {
        self.parts.deny
    }

    /// The envoyproxy/ratelimit rule the policy stands in for, if it is one (`envoy_stand_in`).
    pub fn stand_in(&self) -> Option<StandIn> {
        self.parts.stand_in
    }

    /// What to do when the store cannot answer.
    pub fn failure_mode(&self) -> FailureMode {
        self.parts.failure_mode
    }

    /// The policies this one replaces where both apply (see [`PolicyParts::replaces`]).
    pub fn replaces(&self) -> &[String] {
        &self.parts.replaces
    }

    /// The policy's own store deadline, if it sets one.
    pub fn timeout_us(&self) -> Option<Micros> {
        self.parts.timeout_us
    }
}

/// A descriptor's value from the request, else from the template captures.
fn lookup<'a>(descriptors: &'a Descriptors, captures: &'a Captures, name: &str) -> Option<&'a str> {
    descriptors.get(name).map(String::as_str).or_else(|| {
        captures
            .iter()
            .find(|(captured, _)| captured == name)
            .map(|(_, value)| value.as_str())
    })
}

#[cfg(test)]
pub(crate) mod tests;

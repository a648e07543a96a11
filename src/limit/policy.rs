//! Policies: which requests a limit applies to, which counter they spend from, and what quota.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::{Algorithm, Key, Micros};

/// A request's attributes (tenant, api_key, ip, method, path, operation, ...), by name.
pub type Descriptors = BTreeMap<String, String>;

/// How a descriptor value is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: the descriptor must be present, any value.
    Any,
    /// `/v1/*`: the value must start with the text before the final `*`.
    Prefix(String),
    /// Anything else: the value must be exactly this.
    Exact(String),
}

impl Pattern {
    /// Reads the pattern syntax used in policy files.
    pub fn parse(text: &str) -> Self {
        match text.strip_suffix('*') {
            Some("") => Self::Any,
            Some(prefix) => Self::Prefix(prefix.to_owned()),
            None => Self::Exact(text.to_owned()),
        }
    }

    /// Whether `value` fits this pattern.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Prefix(prefix) => value.starts_with(prefix.as_str()),
            Self::Exact(exact) => value == exact,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
            Self::Exact(exact) => f.write_str(exact),
        }
    }
}

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

/// Per-tier quotas: the tier is read from a descriptor (e.g. `tier: enterprise`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// The descriptor that names the tier.
    pub descriptor: String,
    /// The algorithm (with its quota) for each named tier; unnamed tiers use the policy's own.
    pub levels: BTreeMap<String, Algorithm>,
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
    /// The descriptors whose values make the partition key, in order (e.g. tenant, api_key).
    pub key: Vec<String>,
    /// The algorithm and quota for requests without a listed tier.
    pub algorithm: Algorithm,
    /// Optional per-tier quotas.
    pub tiers: Option<Tiers>,
    /// What to do when the store cannot answer.
    pub failure_mode: FailureMode,
    /// Evaluate and report "would block", never block.
    pub shadow: bool,
    /// Deadline of this policy's store calls, overriding the store's default.
    pub timeout_us: Option<Micros>,
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

/// A validated rate-limit policy.
#[derive(Debug, Clone)]
pub struct Policy {
    name: Arc<str>,
    parts: PolicyParts,
}

/// The longest policy name accepted.
pub const MAX_POLICY_NAME: usize = 64;

impl Policy {
    /// Validates `parts` into a policy.
    pub fn new(parts: PolicyParts) -> Result<Self, PolicyError> {
        let err = |field, reason: String| Err(PolicyError { field, reason });
        if parts.name.is_empty() || parts.name.len() > MAX_POLICY_NAME {
            return err("name", format!("must be 1 to {MAX_POLICY_NAME} bytes"));
        }
        if !parts
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return err("name", "may contain only a-z, 0-9, `_` and `-`".into());
        }
        if parts.key.is_empty() {
            return err("key", "must name at least one descriptor".into());
        }
        for (i, name) in parts.key.iter().enumerate() {
            if parts.key[..i].contains(name) {
                return err("key", format!("descriptor `{name}` is listed twice"));
            }
        }
        Ok(Self {
            name: Arc::from(parts.name.as_str()),
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

    /// Whether the policy applies to a request that did not name a policy: every condition
    /// holds and every key descriptor is present.
    pub fn matches(&self, descriptors: &Descriptors) -> bool {
        self.missing_key_descriptor(descriptors).is_none()
            && self.parts.conditions.iter().all(|(name, pattern)| {
                descriptors
                    .get(name)
                    .is_some_and(|value| pattern.matches(value))
            })
    }

    /// The first key descriptor the request lacks, if any.
    pub fn missing_key_descriptor(&self, descriptors: &Descriptors) -> Option<&str> {
        self.parts
            .key
            .iter()
            .find(|name| !descriptors.contains_key(name.as_str()))
            .map(String::as_str)
    }

    /// The algorithm and quota for this request (its tier's, when it names a listed tier).
    pub fn algorithm_for(&self, descriptors: &Descriptors) -> &Algorithm {
        self.parts
            .tiers
            .as_ref()
            .and_then(|tiers| {
                let tier = descriptors.get(&tiers.descriptor)?;
                tiers.levels.get(tier)
            })
            .unwrap_or(&self.parts.algorithm)
    }

    /// The counter this request spends from, or `None` when a key descriptor is missing.
    pub fn key_for(&self, descriptors: &Descriptors) -> Option<Key> {
        let values: Option<Vec<&str>> = self
            .parts
            .key
            .iter()
            .map(|name| descriptors.get(name).map(String::as_str))
            .collect();
        Some(Key::new(Arc::clone(&self.name), values?))
    }

    /// Whether the policy only reports and never blocks.
    pub fn shadow(&self) -> bool {
        self.parts.shadow
    }

    /// What to do when the store cannot answer.
    pub fn failure_mode(&self) -> FailureMode {
        self.parts.failure_mode
    }

    /// The policy's own store deadline, if it sets one.
    pub fn timeout_us(&self) -> Option<Micros> {
        self.parts.timeout_us
    }
}

/// An ordered set of policies with unique names.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<Arc<Policy>>,
}

impl PolicySet {
    /// Builds a set; fails with the first duplicated name.
    pub fn new(policies: Vec<Policy>) -> Result<Self, String> {
        for (i, policy) in policies.iter().enumerate() {
            if policies[..i].iter().any(|p| p.name() == policy.name()) {
                return Err(policy.name().to_owned());
            }
        }
        Ok(Self {
            policies: policies.into_iter().map(Arc::new).collect(),
        })
    }

    /// The policy with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// Every policy that applies to a request that did not name one, in file order.
    pub fn matching<'a>(
        &'a self,
        descriptors: &'a Descriptors,
    ) -> impl Iterator<Item = &'a Arc<Policy>> + 'a {
        self.policies.iter().filter(|p| p.matches(descriptors))
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
    use crate::limit::FixedWindow;

    fn window(limit: u64) -> Algorithm {
        Algorithm::FixedWindow(FixedWindow::new(limit, 1_000_000).expect("valid"))
    }

    fn parts(name: &str) -> PolicyParts {
        PolicyParts {
            name: name.into(),
            description: String::new(),
            conditions: vec![("path".into(), Pattern::parse("/login"))],
            key: vec!["ip".into()],
            algorithm: window(10),
            tiers: Some(Tiers {
                descriptor: "tier".into(),
                levels: [("gold".to_owned(), window(100))].into(),
            }),
            failure_mode: FailureMode::Closed,
            shadow: false,
            timeout_us: None,
        }
    }

    fn descriptors(pairs: &[(&str, &str)]) -> Descriptors {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn patterns() {
        assert!(Pattern::parse("*").matches("anything"));
        assert!(Pattern::parse("/v1/*").matches("/v1/orders"));
        assert!(!Pattern::parse("/v1/*").matches("/v2/orders"));
        assert!(Pattern::parse("GET").matches("GET"));
        assert!(!Pattern::parse("GET").matches("GETX"));
    }

    #[test]
    fn matching_needs_conditions_and_key_descriptors() {
        let policy = Policy::new(parts("login")).expect("valid");
        assert!(policy.matches(&descriptors(&[("path", "/login"), ("ip", "1.2.3.4")])));
        assert!(!policy.matches(&descriptors(&[("path", "/login")])));
        assert!(!policy.matches(&descriptors(&[("path", "/other"), ("ip", "1.2.3.4")])));
        assert_eq!(policy.missing_key_descriptor(&descriptors(&[])), Some("ip"));
    }

    #[test]
    fn tiers_pick_their_quota() {
        let policy = Policy::new(parts("login")).expect("valid");
        let gold = descriptors(&[("tier", "gold")]);
        let other = descriptors(&[("tier", "bronze")]);
        assert_eq!(policy.algorithm_for(&gold).limit(), 100);
        assert_eq!(policy.algorithm_for(&other).limit(), 10);
    }

    #[test]
    fn invalid_parts_are_rejected_with_the_field() {
        assert_eq!(Policy::new(parts("Bad Name")).unwrap_err().field, "name");
        let mut no_key = parts("ok");
        no_key.key.clear();
        assert_eq!(Policy::new(no_key).unwrap_err().field, "key");
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let a = Policy::new(parts("a")).expect("valid");
        assert_eq!(
            PolicySet::new(vec![a.clone(), a]).unwrap_err(),
            "a".to_owned()
        );
    }
}

//! envoyproxy/ratelimit's configuration schema, field by field (every field it reads, so none
//! of them is refused as unknown): what sluice enforces, what it accepts as metrics-only, and
//! what it refuses with a reason naming the field.

use serde::Deserialize;

/// One document: a domain and its descriptors.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub domain: String,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
}

/// One descriptor node of the tree.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    #[serde(default)]
    pub key: String,
    /// An empty value is no value, as upstream reads it.
    pub value: Option<String>,
    pub rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    pub shadow_mode: bool,
    /// Upstream's quota mode (over-limit descriptors do not deny unless all quota ones are
    /// over): refused when set, sluice has no equivalent.
    #[serde(default)]
    pub quota_mode: bool,
    /// One counter for every value its wildcard matches.
    #[serde(default)]
    pub share_threshold: bool,
    /// Per-value metrics: sluice labels metrics by policy only (bounded), so these are accepted
    /// and have no effect.
    #[serde(default, rename = "detailed_metric")]
    pub _detailed_metric: bool,
    /// See `_detailed_metric`.
    #[serde(default, rename = "value_to_metric")]
    pub _value_to_metric: bool,
    /// Arbitrary data upstream passes on in its response metadata; accepted, not forwarded.
    #[serde(default, rename = "metadata")]
    pub _metadata: Option<serde_yaml::Value>,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
}

/// A `rate_limit` block.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub unit: Option<String>,
    pub requests_per_unit: Option<u64>,
    #[serde(default)]
    pub unlimited: bool,
    pub name: Option<String>,
    #[serde(default)]
    pub replaces: Vec<RawReplaces>,
}

/// One entry of `replaces`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplaces {
    pub name: Option<String>,
}

/// What a `rate_limit` block (or its absence) means for its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// `requests_per_unit` per period.
    Limit(u64, &'static str),
    /// `unlimited: true`: OK, with the largest remaining.
    Unlimited,
    /// `requests_per_unit: 0` (or none) over this period: every request is over the limit.
    Blocked(&'static str),
    /// No `rate_limit` (upstream's way to exempt a value, or a node with children only): no
    /// limit at this depth, even where a less specific sibling has one.
    Exempt,
}

impl RawRateLimit {
    /// The names of the limits this one replaces (checked non-empty and not its own by
    /// [`RawRateLimit::rule`]).
    pub fn replaced(&self) -> Vec<String> {
        self.replaces
            .iter()
            .filter_map(|r| r.name.clone())
            .collect()
    }

    /// The rule of this block, or why it is refused (upstream's own reasons where it has them).
    pub fn rule(&self) -> Result<Rule, String> {
        for replaces in &self.replaces {
            match replaces.name.as_deref() {
                None | Some("") => return Err("should not have an empty replaces entry".into()),
                Some(name) if Some(name) == self.name.as_deref() => {
                    return Err("replaces should not contain name of same descriptor".into())
                }
                Some(_) => {}
            }
        }
        let unit = self.unit.as_deref().map(str::to_ascii_lowercase);
        let period = match unit.as_deref() {
            Some("second") => Some("1s"),
            Some("minute") => Some("1m"),
            Some("hour") => Some("1h"),
            Some("day") => Some("1d"),
            Some("week") => Some("7d"),
            Some("month") => Some("30d"),
            Some("year") => Some("365d"),
            _ => None,
        };
        if self.unlimited {
            return match period {
                Some(_) => Err("should not specify rate limit unit when unlimited".into()),
                None => Ok(Rule::Unlimited),
            };
        }
        let Some(period) = period else {
            return Err(format!(
                "invalid rate limit unit {:?}: second, minute, hour, day, week, month or year",
                self.unit.as_deref().unwrap_or("")
            ));
        };
        // Upstream reads a missing `requests_per_unit` as 0.
        match self.requests_per_unit {
            None | Some(0) => Ok(Rule::Blocked(period)),
            Some(n) if n > crate::config::MAX_LIMIT => Err(format!(
                "`requests_per_unit` must be at most {}, got {n}",
                crate::config::MAX_LIMIT
            )),
            Some(n) => Ok(Rule::Limit(n, period)),
        }
    }
}

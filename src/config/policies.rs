//! Policy files (YAML) read and validated whole into a [`PolicySet`]; errors name the file, the
//! policy and the field, and every problem is reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::HumanDuration;
use crate::limit::{
    Algorithm, CostTable, FailureMode, FixedWindow, Pattern, Policy, PolicyParts, PolicySet,
    SlidingLog, Tiers, TokenBucket,
};

/// Largest limit or burst accepted (keeps all integer math far from overflow, in Lua too).
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Largest sliding-log limit: the log keeps one entry per admitted unit, so memory grows with it.
/// Use a token bucket for higher rates.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// Largest burst x period (in us) of a token bucket: keeps its Lua arithmetic exact.
pub const MAX_BURST_TIMES_PERIOD: u128 = 1 << 52;
/// Shortest period accepted.
pub const MIN_PERIOD_US: u64 = 1_000;
/// Longest period accepted (one year).
pub const MAX_PERIOD_US: u64 = 365 * 86_400_000_000;

/// A policy file that could not be read or is invalid; lists every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFileError {
    /// The file at fault.
    pub file: PathBuf,
    /// One line per problem: `policy `x`: field `y`: reason`.
    pub problems: Vec<String>,
}

impl fmt::Display for PolicyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {problem}", self.file.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyFileError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    policies: Vec<RawPolicy>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum AlgorithmName {
    TokenBucket,
    SlidingLog,
    FixedWindow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default, rename = "match")]
    conditions: BTreeMap<String, String>,
    group: Option<String>,
    key: Vec<String>,
    algorithm: AlgorithmName,
    limit: u64,
    period: HumanDuration,
    burst: Option<u64>,
    #[serde(default = "default_failure_mode")]
    failure_mode: FailureMode,
    #[serde(default)]
    shadow: bool,
    #[serde(default = "all_percent")]
    enforce_percent: u8,
    timeout: Option<HumanDuration>,
    tiers: Option<RawTiers>,
    cost: Option<RawCost>,
    /// Envoy rate limit service domain this policy belongs to (see [`super::envoy`]).
    domain: Option<String>,
    #[serde(default = "yes")]
    limit_override: bool,
}

fn yes() -> bool {
    true
}

fn all_percent() -> u8 {
    100
}

/// `cost: {descriptor: operation, table: {search: 40}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    descriptor: String,
    table: BTreeMap<String, u64>,
}

fn default_failure_mode() -> FailureMode {
    FailureMode::Open
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTiers {
    #[serde(default = "default_tier_descriptor")]
    descriptor: String,
    levels: BTreeMap<String, RawTier>,
}

fn default_tier_descriptor() -> String {
    "tier".into()
}

/// A tier either scales the policy's quota or replaces it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    multiplier: Option<u64>,
    limit: Option<u64>,
    burst: Option<u64>,
}

/// The version of a policy file's content: the low 32 bits of its SHA-1 (exported as
/// `sluice_policies_version`, so operators can see every pod runs the same file).
pub fn policy_file_version(text: &str) -> u32 {
    let digest = sha1_smol::Sha1::from(text.as_bytes()).digest().bytes();
    u32::from_be_bytes([digest[16], digest[17], digest[18], digest[19]])
}

/// Reads (within `limits`) and validates the policy file at `path`; also returns its
/// [`policy_file_version`].
pub fn load_policies(
    path: &Path,
    limits: &super::FileLimits,
) -> Result<(PolicySet, u32), PolicyFileError> {
    let (text, _) = super::bounded_read::read(path, limits).map_err(|e| PolicyFileError {
        file: path.to_owned(),
        problems: vec![format!("cannot read: {}", e.reason)],
    })?;
    Ok((parse_policies(path, &text)?, policy_file_version(&text)))
}

/// Validates policy YAML `text`; `path` only names the file in errors.
pub fn parse_policies(path: &Path, text: &str) -> Result<PolicySet, PolicyFileError> {
    let fail = |problems| PolicyFileError {
        file: path.to_owned(),
        problems,
    };
    if super::envoy::is_envoy_config(text) {
        let converted = super::envoy::convert(text).map_err(fail)?;
        return parse_policies(path, &converted);
    }
    let raw: RawFile = serde_yaml::from_str(text).map_err(|e| fail(vec![e.to_string()]))?;
    let mut problems = Vec::new();
    let mut policies = Vec::new();
    for (index, raw_policy) in raw.policies.into_iter().enumerate() {
        let label = if raw_policy.name.is_empty() {
            format!("policy #{}", index + 1)
        } else {
            format!("policy `{}`", raw_policy.name)
        };
        match build_policy(raw_policy) {
            Ok(policy) => policies.push(policy),
            Err((field, reason)) => problems.push(format!("{label}: field `{field}`: {reason}")),
        }
    }
    if problems.is_empty() {
        PolicySet::new(policies).map_err(|name| {
            fail(vec![format!(
                "policy `{name}`: field `name`: defined more than once"
            )])
        })
    } else {
        Err(fail(problems))
    }
}

type FieldError = (&'static str, String);

/// Longest store deadline a policy may set: past this a check is no longer "fast".
pub const MAX_TIMEOUT_US: u64 = 10_000_000;

fn build_policy(raw: RawPolicy) -> Result<Policy, FieldError> {
    if let Some(timeout) = raw.timeout {
        if timeout.0 == 0 || timeout.0 > MAX_TIMEOUT_US {
            return Err((
                "timeout",
                format!("must be above 0 and at most 10s, got {timeout}"),
            ));
        }
    }
    let algorithm = build_algorithm(raw.algorithm, raw.limit, raw.period, raw.burst)?;
    let tiers = match &raw.tiers {
        None => None,
        Some(tiers) => {
            let mut levels = BTreeMap::new();
            for (tier, level) in &tiers.levels {
                let (limit, burst) = tier_quota(&raw, tier, level)?;
                let algo = build_algorithm(raw.algorithm, limit, raw.period, burst).map_err(
                    |(field, reason)| ("tiers", format!("tier `{tier}`: {field}: {reason}")),
                )?;
                levels.insert(tier.clone(), algo);
            }
            Some(Tiers {
                descriptor: tiers.descriptor.clone(),
                levels,
            })
        }
    };
    let mut conditions = raw
        .conditions
        .into_iter()
        .map(|(name, text)| Pattern::parse(&text).map(|pattern| (name, pattern)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|reason| ("match", reason))?;
    if let Some(domain) = raw.domain {
        conditions.push(super::envoy::domain_condition(domain)?);
    }
    let cost = match raw.cost {
        None => None,
        Some(table) => {
            let limit = algorithm.limit();
            if let Some((value, cost)) = table.table.iter().find(|(_, c)| **c == 0 || **c > limit) {
                return Err((
                    "cost",
                    format!("`{value}` costs {cost}: each cost must be 1 to the limit ({limit})"),
                ));
            }
            Some(CostTable {
                descriptor: table.descriptor,
                costs: table.table,
            })
        }
    };
    Policy::new(PolicyParts {
        name: raw.name,
        description: raw.description,
        conditions,
        group: raw.group,
        key: raw.key,
        algorithm,
        tiers,
        cost,
        failure_mode: raw.failure_mode,
        shadow: raw.shadow,
        enforce_percent: raw.enforce_percent,
        timeout_us: raw.timeout.map(|t| t.0),
        limit_override: raw.limit_override,
    })
    .map_err(|e| (e.field, e.reason))
}

/// The limit and burst a tier gets: the policy's scaled by `multiplier`, or given outright.
fn tier_quota(
    raw: &RawPolicy,
    tier: &str,
    level: &RawTier,
) -> Result<(u64, Option<u64>), FieldError> {
    let bad = |reason: String| Err(("tiers", format!("tier `{tier}`: {reason}")));
    match (level.multiplier, level.limit) {
        (Some(_), Some(_)) => bad("give either `multiplier` or `limit`, not both".into()),
        (None, None) => bad("needs `multiplier` or `limit`".into()),
        (Some(0), None) => bad("`multiplier` must be at least 1".into()),
        (Some(m), None) => {
            if level.burst.is_some() {
                return bad("`burst` goes with `limit`, not with `multiplier`".into());
            }
            let limit = raw.limit.saturating_mul(m);
            Ok((limit, raw.burst.map(|b| b.saturating_mul(m))))
        }
        (None, Some(limit)) => Ok((limit, level.burst.or(raw.burst))),
    }
}

fn build_algorithm(
    name: AlgorithmName,
    limit: u64,
    period: HumanDuration,
    burst: Option<u64>,
) -> Result<Algorithm, FieldError> {
    let max_limit = if name == AlgorithmName::SlidingLog {
        MAX_LOG_LIMIT
    } else {
        MAX_LIMIT
    };
    if limit == 0 || limit > max_limit {
        return Err(("limit", format!("must be 1 to {max_limit}, got {limit}")));
    }
    if !(MIN_PERIOD_US..=MAX_PERIOD_US).contains(&period.0) {
        return Err((
            "period",
            format!("must be between 1ms and 365d, got {period}"),
        ));
    }
    let period_us = period.0;
    let algorithm = match (name, burst) {
        (AlgorithmName::TokenBucket, burst) => {
            let capacity = burst.unwrap_or(limit);
            if capacity == 0 || capacity > MAX_LIMIT {
                return Err(("burst", format!("must be 1 to {MAX_LIMIT}, got {capacity}")));
            }
            // The Lua twin works in 1/limit us units; burst x period must stay far below 2^53.
            if u128::from(capacity) * u128::from(period_us) > MAX_BURST_TIMES_PERIOD {
                return Err((
                    "burst",
                    format!("burst x period must be at most 2^52 us (e.g. 1,000,000 per hour); got {capacity} x {period}"),
                ));
            }
            TokenBucket::new(limit, period_us, capacity).map(Algorithm::TokenBucket)
        }
        (_, Some(_)) => return Err(("burst", "applies only to algorithm token_bucket".to_owned())),
        (AlgorithmName::SlidingLog, None) => {
            SlidingLog::new(limit, period_us).map(Algorithm::SlidingLog)
        }
        (AlgorithmName::FixedWindow, None) => {
            FixedWindow::new(limit, period_us).map(Algorithm::FixedWindow)
        }
    };
    algorithm.map_err(|e| ("algorithm", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../config/policies.yaml");

    fn parse(text: &str) -> Result<PolicySet, PolicyFileError> {
        parse_policies(Path::new("p.yaml"), text)
    }

    #[test]
    fn shipped_example_is_valid_and_matches_the_design() {
        let set = parse(SHIPPED).expect("shipped policies are valid");
        let api = set.get("public_api").expect("public_api");
        assert_eq!(api.algorithm_for(&Default::default(), None).limit(), 150);
        assert_eq!(api.failure_mode(), FailureMode::Open);
        let enterprise = [("tier".to_owned(), "enterprise".to_owned())].into();
        assert_eq!(api.algorithm_for(&enterprise, None).limit(), 1500);
        let login = set.get("login").expect("login");
        assert_eq!(login.failure_mode(), FailureMode::Closed);
        assert_eq!(login.algorithm_for(&Default::default(), None).limit(), 10);
        assert_eq!(login.parts().key, vec!["ip".to_owned()]);
    }

    #[test]
    fn errors_name_file_policy_and_field_and_list_all_problems() {
        let text = "policies:\n  - {name: a, key: [ip], algorithm: sliding_log, limit: 0, period: 1m}\n  - {name: b, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, burst: 3}\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("p.yaml: policy `a`: field `limit`"), "{err}");
        assert!(err.contains("p.yaml: policy `b`: field `burst`"), "{err}");
    }

    #[test]
    fn type_errors_and_unknown_fields_are_reported() {
        for text in [
            "policies:\n  - {name: a, key: [ip], algorithm: leaky, limit: 5, period: 1m}\n",
            "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 5x}\n",
            "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, colour: red}\n",
            "not yaml: [",
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{err}");
        }
    }

    #[test]
    fn a_policy_may_set_its_own_store_deadline() {
        let ok = "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, timeout: 20ms}\n";
        let set = parse(ok).expect("valid");
        assert_eq!(set.get("a").expect("a").timeout_us(), Some(20_000));
        let too_long = ok.replace("20ms", "11s");
        assert!(parse(&too_long)
            .unwrap_err()
            .to_string()
            .contains("field `timeout`"));
    }

    #[test]
    fn duplicate_names_and_bad_tiers_are_rejected() {
        let dup = "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 1m}\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 1m}\n";
        assert!(parse(dup)
            .unwrap_err()
            .to_string()
            .contains("more than once"));
        let tiers = "policies:\n  - {name: a, key: [ip], algorithm: token_bucket, limit: 5, period: 1m, tiers: {levels: {gold: {multiplier: 0}}}}\n";
        assert!(parse(tiers)
            .unwrap_err()
            .to_string()
            .contains("field `tiers`"));
        let huge_log = "policies:\n  - {name: a, key: [ip], algorithm: sliding_log, limit: 5000, period: 1m, tiers: {levels: {gold: {multiplier: 10}}}}\n";
        assert!(parse(huge_log)
            .unwrap_err()
            .to_string()
            .contains("tier `gold`"));
    }
}

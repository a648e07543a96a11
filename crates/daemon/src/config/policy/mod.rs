//! Policy files (YAML) read and validated whole into a [`PolicySet`]; errors name the file, the
//! policy and the field, and every problem is reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod policy_calendar;
mod policy_concurrency;
pub mod policy_dir;
mod policy_fields;
pub(super) mod policy_quota;
mod policy_replaces;
mod policy_reservations;
mod policy_stand_in;
pub(super) mod yaml_budget;
mod yaml_lines;

use self::policy_fields::{read_policy, RawPolicy};
use self::policy_quota::{AlgorithmName, FieldProblem, RawQuota};
// What the policy file's own modules (`super::` from them) share with the rest of config.
use crate::config::{bounded_read, check_expansion, envoy, FileLimits, HumanDuration};
use crate::limit::{field_problems, CostTable, Pattern, Policy, PolicyParts, PolicySet, Tiers};

pub use self::policy_quota::MAX_LIMIT;

/// A policy file that could not be read or is invalid; lists every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFileError {
    /// The file at fault.
    pub file: PathBuf,
    /// Every problem: `policy `x`: field `y`: reason`, with its line where known.
    pub problems: Vec<Problem>,
}

/// One problem in a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line of the field (or of its policy) when the file's layout shows it.
    pub line: Option<usize>,
    /// What is wrong: `policy `x`: field `y`: reason`.
    pub message: String,
}

impl Problem {
    pub(crate) fn at(line: Option<usize>, message: String) -> Self {
        Self { line, message }
    }
}

/// A problem without a line.
impl From<String> for Problem {
    fn from(message: String) -> Self {
        Self::at(None, message)
    }
}

impl fmt::Display for PolicyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match problem.line {
                Some(line) => write!(f, "{}:{line}: {}", self.file.display(), problem.message)?,
                None => write!(f, "{}: {}", self.file.display(), problem.message)?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for PolicyFileError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// Each policy stays a YAML value until it is read on its own, so that one bad policy does
    /// not hide the others' problems.
    policies: Vec<serde_yaml::Value>,
}

/// `message` (a YAML error about the whole file) without the text it quotes: a path pointed at
/// the wrong file (a symlinked secret, a token) is a YAML string, and serde's "invalid type:
/// string \"...\"" would copy it into the log. The file, line and reason are enough.
pub(crate) fn without_text(message: &str) -> String {
    const QUOTED: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(QUOTED) {
        out.push_str(&rest[..start]);
        out.push_str("a string (not shown)");
        let quoted = &rest[start + QUOTED.len()..];
        // The string is Debug-escaped: it ends at the first `"` not escaped by a `\`.
        let mut escaped = false;
        let end = quoted
            .char_indices()
            .find_map(|(at, c)| match (escaped, c) {
                (false, '\\') => {
                    escaped = true;
                    None
                }
                (false, '"') => Some(at),
                _ => {
                    escaped = false;
                    None
                }
            });
        rest = match end {
            Some(at) => &quoted[at + 1..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// The version of a policy file's content: the low 32 bits of its SHA-1 (exported as
/// `sluice_policies_version`, so operators can see every pod runs the same file).
pub fn policy_file_version(text: &str) -> u32 {
    let digest = sha1_smol::Sha1::from(text.as_bytes()).digest().bytes();
    u32::from_be_bytes([digest[16], digest[17], digest[18], digest[19]])
}

/// Reads (within `limits`) and validates the policy file at `path`, or every policy file of the
/// directory at `path` (see [`policy_dir`]); also returns its version.
pub fn load_policies(
    path: &Path,
    limits: &FileLimits,
) -> Result<(PolicySet, u32), PolicyFileError> {
    if path.is_dir() {
        return self::policy_dir::load(path, limits);
    }
    let (text, _) = bounded_read::read(path, limits).map_err(|e| PolicyFileError {
        file: path.to_owned(),
        problems: vec![Problem::at(None, format!("cannot read: {}", e.reason))],
    })?;
    Ok((parse_policies(path, &text)?, policy_file_version(&text)))
}

/// Validates policy YAML `text`; `path` only names the file in errors. Every policy is read and
/// checked on its own and every problem reported, each with the line of its field (or policy).
pub fn parse_policies(path: &Path, text: &str) -> Result<PolicySet, PolicyFileError> {
    let fail = |problems| PolicyFileError {
        file: path.to_owned(),
        problems,
    };
    check_expansion(text).map_err(|e| fail(vec![Problem::at(e.line, e.to_string())]))?;
    if envoy::is_envoy_config(text) {
        let converted = envoy::convert(text).map_err(|messages| {
            let at = |m: String| Problem::at(envoy::problem_line(text, &m), m);
            fail(messages.into_iter().map(at).collect())
        })?;
        return parse_policies(path, &converted);
    }
    let raw: RawFile = serde_yaml::from_str(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        fail(vec![Problem::at(line, without_text(&e.to_string()))])
    })?;
    let lines = self::yaml_lines::PolicyLines::new(text, raw.policies.len());
    let mut problems = Vec::new();
    let mut policies = Vec::new();
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (index, value) in raw.policies.into_iter().enumerate() {
        let name = value.get("name").and_then(|n| n.as_str()).unwrap_or("");
        let label = if name.is_empty() {
            format!("policy #{}", index + 1)
        } else {
            format!("policy `{name}`")
        };
        if !name.is_empty() {
            if let Some(first) = names.get(name) {
                let message = format!(
                    "{label}: field `name`: defined more than once (first as policy #{})",
                    first + 1
                );
                problems.push(Problem::at(lines.field(index, "name"), message));
            } else {
                names.insert(name.to_owned(), index);
            }
        }
        let (raw_policy, unread) = read_policy(value);
        // Fields already reported as unreadable are not reported again as missing.
        let reported: Vec<String> = unread.iter().filter_map(|(f, _)| f.clone()).collect();
        let clean = unread.is_empty();
        problems.extend(unread.into_iter().map(|(field, reason)| {
            let (line, message) = match &field {
                Some(field) => (
                    lines.field(index, field),
                    format!("{label}: field `{field}`: {reason}"),
                ),
                None => {
                    let line = quoted_field(&reason)
                        .map_or(lines.policy(index), |f| lines.field(index, f));
                    (line, format!("{label}: {reason}"))
                }
            };
            Problem::at(line, message)
        }));
        let Some(raw_policy) = raw_policy else {
            continue;
        };
        match build_policy(raw_policy) {
            Ok(policy) if clean => policies.push(policy),
            Ok(_) => {}
            Err(errors) => problems.extend(
                errors
                    .into_iter()
                    .filter(|p| !reported.iter().any(|f| f == p.field))
                    .map(|p| {
                        let line = match p.item {
                            Some(item) => lines.item(index, p.field, item),
                            None => lines.field(index, p.field),
                        };
                        Problem::at(line, format!("{label}: field `{}`: {}", p.field, p.reason))
                    }),
            ),
        }
    }
    if problems.is_empty() {
        problems = self::policy_replaces::problems(&policies, &lines);
    }
    // In file order (each policy's checks run field by field, not line by line).
    problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
    if problems.is_empty() {
        PolicySet::new(policies).map_err(|name| {
            fail(vec![Problem::at(
                None,
                format!("policy `{name}`: field `name`: defined more than once"),
            )])
        })
    } else {
        Err(fail(problems))
    }
}

/// The field a serde message is about (`unknown field `colour``, `missing field `key``).
fn quoted_field(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// Longest store deadline a policy may set: past this a check is no longer "fast".
pub const MAX_TIMEOUT_US: u64 = 10_000_000;

/// The debt bound of a policy that names none: a report leaves the next token waiting at most
/// one period, as a fixed window or sliding log never carries more than one period anyway.
pub const DEFAULT_REPORT_DEBT_PERIODS: u64 = 1;
/// The largest `report_debt_periods` accepted.
pub const MAX_REPORT_DEBT_PERIODS: u64 = 1000;

/// What a block list (`deny: true`) may not say: it has no quota, and it is enforced.
fn deny_problems(raw: &RawPolicy) -> Vec<FieldProblem> {
    let mut problems: Vec<FieldProblem> = Vec::new();
    let given = [
        ("algorithm", raw.algorithm.is_some()),
        ("limit", raw.limit.is_some()),
        ("burst", raw.burst.is_some()),
        ("limits", raw.limits.is_some()),
        ("local_limit", raw.local_limit.is_some()),
        ("tiers", raw.tiers.is_some()),
        ("cost", raw.cost.is_some()),
    ];
    for (field, _) in given.iter().filter(|(_, given)| *given) {
        let reason = "a deny policy has no quota: every request it applies to is denied";
        problems.push((*field, reason.to_owned()).into());
    }
    if raw.shadow || raw.enforce_percent < 100 {
        let field = if raw.shadow {
            "shadow"
        } else {
            "enforce_percent"
        };
        let reason = "a deny policy is enforced whole (try it first as a shadow policy with a \
                      limit)";
        problems.push((field, reason.to_owned()).into());
    }
    if raw.period.is_none() {
        let reason = "missing: a deny policy's `period` is the wait a denied client is told \
                      (Retry-After)";
        problems.push(("period", reason.to_owned()).into());
    }
    problems
}

/// What a leased policy (`lease: true`) may not be: a block list (no counter to lease) or a
/// sliding log (it records each admission's instant, which a lease would move to the take).
fn lease_problems(raw: &RawPolicy) -> Vec<FieldProblem> {
    let mut problems: Vec<FieldProblem> = Vec::new();
    if raw.deny {
        let reason = "a deny policy has no counter to lease";
        problems.push(("lease", reason.to_owned()).into());
    }
    if matches!(raw.algorithm, Some(AlgorithmName::SlidingLog)) {
        let reason = "a sliding log is never leased: it records each admission's instant, and a \
                      leased unit would count from its take (use a token bucket or a fixed \
                      window, see docs/policies.md)";
        problems.push(("lease", reason.to_owned()).into());
    }
    problems
}

/// Builds one policy, or every problem found in it (each field checked on its own).
fn build_policy(raw: RawPolicy) -> Result<Policy, Vec<FieldProblem>> {
    let mut problems: Vec<FieldProblem> = Vec::new();
    if let Some(timeout) = raw.timeout {
        if timeout.0 == 0 || timeout.0 > MAX_TIMEOUT_US {
            problems.push(
                (
                    "timeout",
                    format!("must be above 0 and at most 10s, got {timeout}"),
                )
                    .into(),
            );
        }
    }
    if raw.lease {
        problems.extend(lease_problems(&raw));
    }
    problems.extend(policy_stand_in::problems(&raw));
    let (calendar, calendar_problems) = policy_calendar::read(&raw);
    problems.extend(calendar_problems);
    let period = policy_calendar::quota_period(calendar.as_ref(), raw.period);
    problems.extend(policy_concurrency::problems(&raw));
    let (reservation_ttl_us, reservation_problems) = policy_reservations::read(&raw);
    problems.extend(reservation_problems);
    let written = if raw.deny {
        problems.extend(deny_problems(&raw));
        // A placeholder quota, never sent to a store: its period is the wait a denial tells.
        RawQuota {
            algorithm: AlgorithmName::FixedWindow,
            limit: Some(1),
            period,
            burst: None,
            limits: None,
            local_limit: None,
            calendar: None,
            permit_ttl: None,
        }
    } else {
        let algorithm = raw.algorithm.unwrap_or_else(|| {
            problems.push(("algorithm", "missing".to_owned()).into());
            AlgorithmName::FixedWindow
        });
        RawQuota {
            algorithm,
            limit: raw.limit,
            period,
            burst: raw.burst,
            limits: raw.limits.as_deref(),
            local_limit: raw.local_limit,
            calendar,
            permit_ttl: raw.permit_ttl,
        }
    };
    let debt = raw
        .report_debt_periods
        .unwrap_or(DEFAULT_REPORT_DEBT_PERIODS);
    if !(1..=MAX_REPORT_DEBT_PERIODS).contains(&debt) {
        let reason = format!("must be 1 to {MAX_REPORT_DEBT_PERIODS} (periods), got {debt}");
        problems.push(("report_debt_periods", reason).into());
    }
    let quota = written
        .build()
        .map(|quota| quota.with_report_debt(debt))
        .map_err(|e| problems.extend(e))
        .ok();
    let tiers = raw.tiers.as_ref().map(|tiers| {
        let mut levels = BTreeMap::new();
        for (tier, level) in &tiers.levels {
            match written.tier(tier, level) {
                Ok(quota) => {
                    levels.insert(tier.clone(), quota.with_report_debt(debt));
                }
                Err(tier_problems) => problems.extend(tier_problems),
            }
        }
        Tiers {
            descriptor: tiers.descriptor.clone(),
            levels,
        }
    });
    let mut conditions = Vec::new();
    for (name, text) in raw.conditions {
        match Pattern::parse(&text) {
            Ok(pattern) => conditions.push((name, pattern)),
            Err(reason) => problems.push(("match", format!("`{name}`: {reason}")).into()),
        }
    }
    if let Some(domain) = raw.domain {
        match envoy::domain_condition(domain) {
            Ok(condition) => conditions.push(condition),
            Err(problem) => problems.push(problem.into()),
        }
    }
    let cost = raw.cost.map(|table| {
        if let Some(limit) = quota.as_ref().map(|q| q.max_cost()) {
            if let Some((value, cost)) = table.table.iter().find(|(_, c)| **c == 0 || **c > limit) {
                let reason = format!(
                    "`{value}` costs {cost}: each cost must be 1 to the smallest limit ({limit})"
                );
                problems.push(("cost", reason).into());
            }
        }
        CostTable {
            descriptor: table.descriptor,
            costs: table.table,
        }
    });
    problems.extend(
        field_problems(&raw.name, &raw.key, raw.enforce_percent, &conditions)
            .into_iter()
            .map(|e| FieldProblem::from((e.field, e.reason))),
    );
    let Some(quota) = quota.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };
    Policy::new(PolicyParts {
        name: raw.name,
        description: raw.description,
        conditions,
        path_case: raw.path_case,
        group: raw.group,
        key: raw.key,
        quota,
        tiers,
        cost,
        failure_mode: raw.failure_mode,
        shadow: raw.shadow,
        enforce_percent: raw.enforce_percent,
        timeout_us: raw.timeout.map(|t| t.0),
        limit_override: raw.limit_override,
        reports: raw.reports,
        replaces: raw.replaces,
        deny: raw.deny,
        lease: raw.lease,
        reservation_ttl_us,
        stand_in: raw.envoy_stand_in,
    })
    .map_err(|e| vec![(e.field, e.reason).into()])
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::limit::{Descriptors, FailureMode};

    const SHIPPED: &str = include_str!("../../../../../config/policies.yaml");

    fn parse(text: &str) -> Result<PolicySet, PolicyFileError> {
        parse_policies(Path::new("p.yaml"), text)
    }

    #[test]
    fn a_lease_is_refused_on_a_sliding_log_and_on_a_block_list_with_its_line() {
        let log = "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, lease: true}\n  - {name: b, key: [ip], algorithm: sliding_log, limit: 5, period: 1m, lease: true}\n";
        let err = parse(log).unwrap_err().to_string();
        assert!(err.contains("p.yaml:3"), "{err}");
        assert!(err.contains("a sliding log is never leased"), "{err}");
        let deny = "policies:\n  - {name: b, key: [ip], deny: true, period: 1m, lease: true}\n";
        let err = parse(deny).unwrap_err().to_string();
        assert!(
            err.contains("a deny policy has no counter to lease"),
            "{err}"
        );
        let set = parse("policies:\n  - {name: t, key: [ip], algorithm: token_bucket, limit: 5, period: 1s, lease: true}\n").expect("valid");
        assert!(set.get("t").expect("t").lease());
    }

    #[test]
    fn shipped_example_is_valid_and_matches_the_design() {
        let set = parse(SHIPPED).expect("shipped policies are valid");
        let api = set.get("public_api").expect("public_api");
        let limit = |d: &Descriptors| api.quota_for(d, None).1.max_cost();
        assert_eq!(limit(&Descriptors::new()), 150);
        assert_eq!(api.failure_mode(), FailureMode::Open);
        let enterprise = [("tier".to_owned(), "enterprise".to_owned())].into();
        assert_eq!(limit(&enterprise), 1500);
        let login = set.get("login").expect("login");
        assert_eq!(login.failure_mode(), FailureMode::Closed);
        assert_eq!(login.quota_for(&Default::default(), None).1.max_cost(), 10);
        assert_eq!(login.parts().key, vec!["ip".to_owned()]);
    }

    #[test]
    fn errors_name_file_policy_and_field_and_list_all_problems() {
        let text = "policies:\n  - {name: a, key: [ip], algorithm: sliding_log, limit: 0, period: 1m}\n  - {name: b, key: [ip], algorithm: fixed_window, limit: 5, period: 1m, burst: 3}\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("p.yaml:2: policy `a`: field `limit`"), "{err}");
        assert!(err.contains("p.yaml:3: policy `b`: field `burst`"), "{err}");
    }

    #[test]
    fn every_problem_of_every_policy_is_reported_in_one_pass_with_its_line() {
        let text = "policies:\n  - name: a\n    key: [ip]\n    algorithm: sliding_log\n    limit: 0\n    period: 1m\n    timeout: 11s\n    match: {path: \"/v1/{\"}\n  - name: b\n    key: [ip]\n    algorithm: leaky\n    limit: 5\n    period: 1m\n  - name: c\n    key: [ip]\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n    colour: red\n";
        let err = parse(text).unwrap_err();
        let shown = err.to_string();
        assert_eq!(err.problems.len(), 5, "{shown}");
        for expected in [
            "p.yaml:5: policy `a`: field `limit`",
            "p.yaml:7: policy `a`: field `timeout`",
            "p.yaml:8: policy `a`: field `match`",
            "p.yaml:11: policy `b`:",
            "p.yaml:19: policy `c`: field `colour`: unknown field",
        ] {
            assert!(shown.contains(expected), "{expected} in\n{shown}");
        }
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

    #[test]
    fn a_file_that_is_not_a_policy_file_is_refused_without_its_text() {
        for secret in [
            "TOPSECRET-token-1234\n",
            "\"TOPSECRET \\\" quoted\"\n",
            "-----BEGIN KEY-----\n  TOPSECRET\n  -----END KEY-----\n",
        ] {
            let error = parse_policies(Path::new("p.yaml"), secret)
                .unwrap_err()
                .to_string();
            assert!(!error.contains("TOPSECRET"), "{error}");
            assert!(
                error.starts_with("p.yaml:1: invalid type: a string (not shown)"),
                "{error}"
            );
        }
        assert_eq!(
            without_text(r#"a string "x\"y" and string "z" end"#),
            "a a string (not shown) and a string (not shown) end"
        );
        let envoy = parse_policies(Path::new("e.yaml"), "domain: d\ndescriptors: TOPSECRET\n");
        let envoy = envoy.unwrap_err().to_string();
        assert!(!envoy.contains("TOPSECRET"), "{envoy}");
    }
}

//! envoyproxy/ratelimit configuration files, loaded as they are: each YAML document (`domain`,
//! nested `descriptors` with `key`/`value`, `rate_limit`, `shadow_mode`, ...) is converted into
//! sluice policies at load time, then validated like any policy file; `sluice config convert`
//! prints the result.
//!
//! The conversion keeps their semantics where sluice can express them exactly:
//! - a limit applies to a request descriptor whose entries follow the path to it, key by key and
//!   of the same length: the policy matches the pseudo-descriptors the gRPC adapter adds,
//!   [`DOMAIN_DESCRIPTOR`] and [`ENTRIES_DESCRIPTOR`] (the entry keys in order), plus each
//!   entry's value (exact, a glob with `*` anywhere, or any), read by sluice's own matcher
//!   ([`crate::limit::Glob`]), so `*` matches any run wherever it is, as upstream's does;
//! - one limit per descriptor, the most specific: every limit of one domain and key path is in
//!   one `group` (sluice ranks exact > glob (more literal characters first) > any per entry and
//!   sums over the path);
//! - their windows are fixed and aligned to the epoch: a `fixed_window` of one unit;
//! - `shadow_mode` is `shadow`; `unlimited` becomes a shadow policy where a limited sibling would
//!   otherwise apply to its values (so it wins the group and blocks nothing), else nothing.
//!
//! What sluice cannot express is refused with a reason: `replaces`, `requests_per_unit: 0` (a
//! block list), a key repeated along a path, keys outside `[A-Za-z0-9_.-]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{PolicyFileError, Problem};
use crate::limit::Pattern;

/// Pseudo-descriptor carrying a gRPC request's `domain`; a policy's `domain` matches on it.
pub const DOMAIN_DESCRIPTOR: &str = "rls.domain";
/// Pseudo-descriptor carrying a gRPC descriptor's entry keys in order, joined by `,`.
pub const ENTRIES_DESCRIPTOR: &str = "rls.entries";
/// Deepest nesting converted (their files rarely go past 3 levels).
pub const MAX_DEPTH: usize = 8;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    shadow_mode: bool,
    /// Per-value metrics: sluice labels metrics by policy only (bounded), so this is accepted
    /// and has no effect.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<serde_yaml::Value>,
}

/// A converted policy, in the policy file's own syntax.
#[derive(Serialize)]
struct OutPolicy {
    name: String,
    description: String,
    domain: String,
    #[serde(rename = "match")]
    conditions: BTreeMap<String, String>,
    group: String,
    key: Vec<String>,
    algorithm: &'static str,
    limit: u64,
    period: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
}

#[derive(Serialize)]
struct OutFile {
    policies: Vec<OutPolicy>,
}

/// One entry along a path: its key and value pattern (`None` = any value).
type Step = (String, Option<String>);

struct Leaf {
    domain: String,
    path: Vec<Step>,
    limit: Option<(u64, &'static str)>,
    name: Option<String>,
    shadow: bool,
}

/// Whether `text` is an envoyproxy/ratelimit file (a top-level `domain`) rather than a policy file.
pub fn is_envoy_config(text: &str) -> bool {
    serde_yaml::Deserializer::from_str(text)
        .next()
        .and_then(|doc| serde_yaml::Value::deserialize(doc).ok())
        .is_some_and(|value| value.get("domain").is_some() && value.get("policies").is_none())
}

/// The condition a policy's `domain` adds.
pub(crate) fn domain_condition(
    domain: String,
) -> Result<(String, Pattern), (&'static str, String)> {
    if domain.is_empty() || domain.contains(['*', '{', '}']) {
        return Err((
            "domain",
            format!("must be a plain non-empty name, got {domain:?}"),
        ));
    }
    Ok((DOMAIN_DESCRIPTOR.to_owned(), Pattern::Exact(domain)))
}

/// Reads an envoyproxy/ratelimit file and returns the equivalent policy file, validated, with a
/// header naming its source (`sluice config convert`).
pub fn convert_file(path: &Path) -> Result<String, PolicyFileError> {
    let fail = |problems: Vec<String>| PolicyFileError {
        file: path.to_owned(),
        problems: problems.into_iter().map(Problem::from).collect(),
    };
    let (text, _) = super::bounded_read::read(path, &super::FileLimits::default())
        .map_err(|e| fail(vec![format!("cannot read: {}", e.reason)]))?;
    super::check_expansion(&text).map_err(|e| fail(vec![e.to_string()]))?;
    if !is_envoy_config(&text) {
        return Err(fail(vec![
            "not an envoyproxy/ratelimit file (no top-level `domain`)".into(),
        ]));
    }
    let converted = convert(&text).map_err(fail)?;
    super::parse_policies(path, &converted)?;
    Ok(format!(
        "# sluice policies converted from the envoyproxy/ratelimit file {}\n{converted}",
        path.display()
    ))
}

/// Converts every document of an envoyproxy/ratelimit file into a sluice policy file (YAML).
/// Errors list every problem found.
pub fn convert(text: &str) -> Result<String, Vec<String>> {
    let mut problems = Vec::new();
    let mut leaves = Vec::new();
    let mut domains = BTreeSet::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let config = match RawConfig::deserialize(doc) {
            Ok(config) => config,
            Err(e) => {
                problems.push(format!("document {}: {e}", index + 1));
                continue;
            }
        };
        if config.domain.is_empty() || !domains.insert(config.domain.clone()) {
            problems.push(format!(
                "domain {:?}: must be non-empty and appear once",
                config.domain
            ));
            continue;
        }
        for descriptor in &config.descriptors {
            walk(
                &config.domain,
                descriptor,
                &mut Vec::new(),
                &mut leaves,
                &mut problems,
            );
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let policies = to_policies(leaves);
    serde_yaml::to_string(&OutFile { policies }).map_err(|e| vec![e.to_string()])
}

fn walk(
    domain: &str,
    node: &RawDescriptor,
    path: &mut Vec<Step>,
    leaves: &mut Vec<Leaf>,
    problems: &mut Vec<String>,
) {
    let here = |path: &[Step]| {
        let shown: Vec<String> = path
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("*")))
            .collect();
        format!("domain `{domain}`, descriptor {}", shown.join(" / "))
    };
    path.push((node.key.clone(), node.value.clone()));
    let valid_key = !node.key.is_empty()
        && node.key.len() <= crate::check::MAX_DESCRIPTOR_NAME
        && node
            .key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !node.key.starts_with("rls.");
    if !valid_key {
        problems.push(format!(
            "{}: key must be 1 to 64 characters of a-z, A-Z, 0-9, `_`, `-`, `.` (not `rls.*`)",
            here(path)
        ));
    } else if path[..path.len() - 1].iter().any(|(k, _)| *k == node.key) {
        problems.push(format!(
            "{}: key `{}` repeats along the path",
            here(path),
            node.key
        ));
    } else if node
        .value
        .as_deref()
        .is_some_and(|v| v.is_empty() || v.contains(['{', '}']))
    {
        problems.push(format!(
            "{}: value must be non-empty, without `{{` `}}`",
            here(path)
        ));
    } else if path.len() > MAX_DEPTH {
        problems.push(format!("{}: nested deeper than {MAX_DEPTH}", here(path)));
    } else if let Some(rate) = &node.rate_limit {
        match leaf(rate) {
            Ok(limit) => leaves.push(Leaf {
                domain: domain.to_owned(),
                path: path.clone(),
                limit,
                name: rate.name.clone(),
                shadow: node.shadow_mode,
            }),
            Err(reason) => problems.push(format!("{}: {reason}", here(path))),
        }
    }
    for child in &node.descriptors {
        walk(domain, child, path, leaves, problems);
    }
    path.pop();
}

/// The limit and period of a `rate_limit` block; `None` for `unlimited`.
fn leaf(rate: &RawRateLimit) -> Result<Option<(u64, &'static str)>, String> {
    if !rate.replaces.is_empty() {
        return Err(
            "`replaces` has no sluice equivalent (a limit that drops another one \
                    matched by a different descriptor); give the descriptors separate limits"
                .into(),
        );
    }
    if rate.unlimited {
        return Ok(None);
    }
    let period = match rate.unit.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("second") => "1s",
        Some("minute") => "1m",
        Some("hour") => "1h",
        Some("day") => "1d",
        Some("week") => "7d",
        Some("month") => "30d",
        Some("year") => "365d",
        other => {
            return Err(format!(
                "unit must be second, minute, hour, day, week, month or year, got {other:?}"
            ))
        }
    };
    match rate.requests_per_unit {
        None => Err("`requests_per_unit` is required".into()),
        Some(0) => Err(
            "`requests_per_unit: 0` (a block list) has no sluice equivalent: \
                        deny those requests in Envoy (RBAC) instead"
                .into(),
        ),
        Some(n) => Ok(Some((n, period))),
    }
}

fn to_policies(leaves: Vec<Leaf>) -> Vec<OutPolicy> {
    let mut taken = BTreeSet::new();
    let mut policies = Vec::new();
    for leaf in &leaves {
        let keys: Vec<String> = leaf.path.iter().map(|(k, _)| k.clone()).collect();
        let group = format!("rls:{}:{}", leaf.domain, keys.join(","));
        let (limit, period, shadow, kind) = match leaf.limit {
            Some((limit, period)) => (limit, period, leaf.shadow, "limit"),
            // An unlimited entry matters only where a limited one of its group covers it.
            None if covered(leaf, &leaves) => {
                (crate::config::policies::MAX_LIMIT, "1s", true, "unlimited")
            }
            None => continue,
        };
        let mut conditions: BTreeMap<String, String> = leaf
            .path
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().unwrap_or_else(|| "*".into())))
            .collect();
        conditions.insert(ENTRIES_DESCRIPTOR.into(), keys.join(","));
        let shown: Vec<String> = leaf
            .path
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("*")))
            .collect();
        policies.push(OutPolicy {
            name: unique_name(leaf, &mut taken),
            description: format!(
                "envoyproxy/ratelimit {kind}: {} {}",
                leaf.domain,
                shown.join(" / ")
            ),
            domain: leaf.domain.clone(),
            conditions,
            group,
            key: keys,
            algorithm: "fixed_window",
            limit,
            period,
            shadow,
        });
    }
    policies
}

/// Whether a limited entry of the same domain and key path could match the values `leaf` matches.
fn covered(leaf: &Leaf, leaves: &[Leaf]) -> bool {
    leaves.iter().any(|other| {
        other.limit.is_some()
            && other.domain == leaf.domain
            && other.path.len() == leaf.path.len()
            && other
                .path
                .iter()
                .zip(&leaf.path)
                .all(|((k1, v1), (k2, v2))| k1 == k2 && overlaps(v1.as_deref(), v2.as_deref()))
    })
}

/// Whether some value fits both patterns (`None` is any value), by the same globs the matcher
/// uses.
fn overlaps(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => crate::limit::globs_overlap(a, b),
        _ => true,
    }
}

/// The `rate_limit.name` when it is a valid policy name not yet taken, else one made from the
/// domain and path (shortened with a hash when long or taken).
fn unique_name(leaf: &Leaf, taken: &mut BTreeSet<String>) -> String {
    let valid = |n: &str| {
        !n.is_empty()
            && n.len() <= crate::limit::MAX_POLICY_NAME
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    };
    if let Some(name) = leaf
        .name
        .as_deref()
        .filter(|n| valid(n) && !taken.contains(*n))
    {
        taken.insert(name.to_owned());
        return name.to_owned();
    }
    let mut raw = leaf.domain.clone();
    for (k, v) in &leaf.path {
        raw.push('_');
        raw.push_str(k);
        if let Some(v) = v {
            raw.push('_');
            raw.push_str(v);
        }
    }
    let slug: String = raw
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '_',
        })
        .collect();
    let mut name = slug.clone();
    if name.len() > 48 || taken.contains(&name) || !valid(&name) {
        let digest = sha1_smol::Sha1::from(raw.as_bytes()).digest().to_string();
        name = format!("{}_{}", &slug[..slug.len().min(48)], &digest[..8]);
    }
    taken.insert(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_patterns_overlap_as_their_matches_do() {
        assert!(overlaps(None, Some("x")));
        assert!(overlaps(Some("ab*"), Some("abc")));
        assert!(overlaps(Some("ab*"), Some("a*")));
        assert!(!overlaps(Some("ab*"), Some("b")));
        assert!(!overlaps(Some("x"), Some("y")));
        assert!(overlaps(Some("x"), Some("x")));
        assert!(overlaps(Some("*.example.com"), Some("api.*")));
        assert!(!overlaps(Some("/v1/*/items"), Some("/v1/*/notes")));
    }

    #[test]
    fn names_are_valid_unique_and_prefer_the_configured_one() {
        let leaf = |name: Option<&str>, value: &str| Leaf {
            domain: "Edge.Proxy".into(),
            path: vec![("remote_address".into(), Some(value.into()))],
            limit: Some((1, "1s")),
            name: name.map(str::to_owned),
            shadow: false,
        };
        let mut taken = BTreeSet::new();
        assert_eq!(unique_name(&leaf(Some("mine"), "a"), &mut taken), "mine");
        // Taken or invalid configured names fall back to one made from the path.
        assert_eq!(
            unique_name(&leaf(Some("mine"), "10.0.0.1"), &mut taken),
            "edge_proxy_remote_address_10_0_0_1"
        );
        let again = unique_name(&leaf(Some("Not Valid"), "10.0.0.1"), &mut taken);
        assert!(
            again.starts_with("edge_proxy_remote_address_10_0_0_1_"),
            "{again}"
        );
        let long = unique_name(&leaf(None, &"v".repeat(100)), &mut taken);
        assert!(long.len() <= crate::limit::MAX_POLICY_NAME, "{long}");
    }
}

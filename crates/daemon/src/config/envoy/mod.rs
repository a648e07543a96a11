//! envoyproxy/ratelimit configuration files, loaded as they are: each YAML document (`domain`,
//! nested `descriptors` with `key`/`value`, `rate_limit`, `shadow_mode`, ...) is converted into
//! sluice policies at load time, then validated like any policy file; `sluice config convert`
//! prints the result. Several files (upstream's runtime directory) convert together, with one
//! domain split over several files merged when asked (upstream's `MERGE_DOMAIN_CONFIG`).
//!
//! The conversion keeps their semantics where sluice can express them exactly:
//! - a limit applies to a request descriptor whose entries follow the path to it, key by key and
//!   of the same length: the policy matches the pseudo-descriptors the gRPC adapter adds,
//!   [`DOMAIN_DESCRIPTOR`] and [`ENTRIES_DESCRIPTOR`] (the entry keys in order), plus each
//!   entry's value (exact, a glob with `*` anywhere, or any), read by sluice's own matcher
//!   ([`crate::limit::Glob`]), so `*` matches any run wherever it is, as upstream's does; a key
//!   repeated in one descriptor is named by its occurrence ([`entry_name`]);
//! - one limit per descriptor, the most specific: every limit of one domain and key path is in
//!   one `group` (sluice ranks exact > glob (more literal characters first) > any per entry and
//!   sums over the path);
//! - their windows are fixed and aligned to the epoch: a `fixed_window` of one unit;
//! - `share_threshold` leaves its entry out of the counter's key (one counter per wildcard);
//! - `shadow_mode` is `shadow`; `unlimited` becomes a no-op policy ([`StandIn`]: it wins its
//!   group and blocks nothing), and so does a node without `rate_limit` (upstream's way to exempt a
//!   value) where a limited sibling would otherwise apply to its values;
//! - `detailed_metric`, `value_to_metric` and `metadata` are accepted and have no effect (sluice's
//!   metrics are labelled by policy only, a bounded set).
//!
//! - `requests_per_unit: 0` (or none, which upstream reads as 0) becomes a
//!   [`StandIn::Blocked`] policy: the check's group denies every request it selects; with
//!   `shadow_mode`, [`StandIn::ShadowBlocked`]: OK with a limit of 0, counted as a shadow denial;
//! - `replaces` becomes the policy's `replaces`: the policies of the limits of its domain with
//!   that `name` (a `name` that no limit has is refused, where upstream ignores it);
//! - each domain gets one [`StandIn::Override`] policy, selected only by a descriptor carrying a
//!   limit override ([`OVERRIDE_DESCRIPTOR`]): upstream applies the override to any descriptor of
//!   a known domain, whatever its entries, with a counter per descriptor, and uses no other limit
//!   for it.
//!
//! What sluice cannot express is refused with a reason naming the field: `quota_mode`, keys
//! outside `[A-Za-z0-9_.-]`.

mod emit;
pub mod rlqs_filter;
mod schema;
mod walk;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{PolicyFileError, Problem};
use crate::limit::Pattern;
use schema::RawConfig;

/// Pseudo-descriptor carrying a gRPC request's `domain`; a policy's `domain` matches on it.
pub const DOMAIN_DESCRIPTOR: &str = "rls.domain";
/// Pseudo-descriptor carrying a gRPC descriptor's entry keys in order, joined by `,`.
pub const ENTRIES_DESCRIPTOR: &str = "rls.entries";
/// Pseudo-descriptor the gRPC adapter adds to a descriptor with a limit override (value `1`);
/// only a domain's [`StandIn::Override`] policy matches on it.
pub const OVERRIDE_DESCRIPTOR: &str = "rls.override";
/// Deepest nesting converted (their files rarely go past 3 levels).
pub const MAX_DEPTH: usize = 8;
/// Longest entry key.
pub const MAX_KEY: usize = crate::limit::MAX_DESCRIPTOR_NAME;
/// What the gRPC adapter puts in place of an empty entry value: upstream matches an empty
/// value against the value-less key only, and no converted value pattern but `*` matches this
/// (values with `{` `}` are refused).
pub const EMPTY_VALUE: &str = "{}";
/// The limit of a no-op policy (shadow, per second): it never limits.
const NO_LIMIT: u64 = crate::config::MAX_LIMIT;

/// The descriptor name of the `occurrence`-th entry (from 1) with `key` in one descriptor: the
/// key itself the first time, `rls.<n>.<key>` after.
pub fn entry_name(key: &str, occurrence: usize) -> Cow<'_, str> {
    if occurrence <= 1 {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("rls.{occurrence}.{key}"))
    }
}

/// Whether one domain split over several files is merged (upstream's `MERGE_DOMAIN_CONFIG`)
/// or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainMerge {
    /// A domain appears once (upstream's default): a second one is refused.
    Refuse,
    /// Descriptors of the same domain are merged (a key and value twice at one level is still
    /// refused).
    Merge,
}

#[derive(Serialize)]
struct OutFile {
    policies: Vec<emit::OutPolicy>,
}

/// Whether `text` is an envoyproxy/ratelimit file (a top-level `domain`) rather than a policy file.
/// Only the first document's top-level keys are looked at: no value is built (the values are
/// skipped), so a file not yet bounded by [`super::check_expansion`] costs no memory here.
pub fn is_envoy_config(text: &str) -> bool {
    /// The top-level keys that tell the two formats apart.
    #[derive(Deserialize)]
    struct Probe {
        domain: Option<serde::de::IgnoredAny>,
        policies: Option<serde::de::IgnoredAny>,
    }
    serde_yaml::Deserializer::from_str(text)
        .next()
        .and_then(|doc| Probe::deserialize(doc).ok())
        .is_some_and(|probe| probe.domain.is_some() && probe.policies.is_none())
}

/// The line (1-based) of the `replaces` entry a conversion problem is about, found in `text`
/// below its domain's `domain:` line; `None` for other problems.
pub(crate) fn problem_line(text: &str, message: &str) -> Option<usize> {
    let quoted = |after: &str| -> Option<String> {
        let start = message.find(after)? + after.len();
        let len = message[start..].find('`')?;
        Some(message[start..start + len].to_owned())
    };
    let (domain, replaced) = (quoted("domain `")?, quoted(": replaces `")?);
    let lines: Vec<&str> = text.lines().collect();
    let unquote = |v: &str| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned();
    let start = lines.iter().position(|line| {
        line.trim_start()
            .strip_prefix("domain:")
            .is_some_and(|v| unquote(v) == domain)
    })?;
    let mut in_replaces = false;
    for (at, line) in lines.iter().enumerate().skip(start + 1) {
        if line.trim_start().starts_with("domain:") {
            break;
        }
        in_replaces |= line.contains("replaces");
        let names_it = line.split("name:").skip(1).any(|rest| {
            let value = rest.split([',', '}', ']']).next().unwrap_or("");
            unquote(value) == replaced
        });
        if in_replaces && names_it {
            return Some(at + 1);
        }
    }
    None
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
    super::check_expansion(&text).map_err(|e| PolicyFileError {
        file: path.to_owned(),
        problems: vec![Problem::at(e.line, e.to_string())],
    })?;
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
    convert_sources(&[(Path::new(""), text)], DomainMerge::Refuse)
}

/// Converts several envoyproxy/ratelimit files (each `(path, text)`, e.g. upstream's runtime
/// directory or a ConfigMap's keys, in the order given) into one policy file (YAML). Errors list
/// every problem found, each naming its file when it has a path.
pub fn convert_sources(
    sources: &[(&Path, &str)],
    merge: DomainMerge,
) -> Result<String, Vec<String>> {
    let mut problems = Vec::new();
    let mut domains: BTreeMap<String, Vec<schema::RawDescriptor>> = BTreeMap::new();
    let mut order = Vec::new();
    for (path, text) in sources {
        let at = |message: String| {
            if path.as_os_str().is_empty() {
                message
            } else {
                format!("{}: {message}", path.display())
            }
        };
        for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let config = match RawConfig::deserialize(doc) {
                Ok(config) => config,
                Err(e) => {
                    let reason = crate::config::policy::without_text(&e.to_string());
                    problems.push(at(format!("document {}: {reason}", index + 1)));
                    continue;
                }
            };
            if config.domain.is_empty() {
                problems.push(at("config file cannot have empty domain".into()));
                continue;
            }
            match domains.get_mut(&config.domain) {
                Some(descriptors) if merge == DomainMerge::Merge => {
                    descriptors.extend(config.descriptors);
                }
                Some(_) => problems.push(at(format!(
                    "duplicate domain '{}' (merge domains across files to allow it)",
                    config.domain
                ))),
                None => {
                    order.push(config.domain.clone());
                    domains.insert(config.domain, config.descriptors);
                }
            }
        }
    }
    let mut leaves = Vec::new();
    for domain in &order {
        let nodes: Vec<&schema::RawDescriptor> = domains[domain].iter().collect();
        walk::walk(domain, &nodes, &mut Vec::new(), &mut leaves, &mut problems);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let policies = emit::to_policies(&order, &leaves)?;
    serde_yaml::to_string(&OutFile { policies }).map_err(|e| vec![e.to_string()])
}

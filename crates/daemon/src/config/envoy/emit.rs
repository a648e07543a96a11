//! Leaves turned into sluice policies: one group per domain and key path, so that the most
//! specific match applies; unlimited leaves become no-op policies (shadow, never limiting), and
//! exempt ones too where a limited sibling would otherwise apply to their values; `replaces`
//! names resolved to the policies of the limits so named in the domain; each domain's limit
//! overrides get a policy of their own.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::schema::Rule;
use super::walk::{shown, Leaf};
use super::{entry_name, ENTRIES_DESCRIPTOR, OVERRIDE_DESCRIPTOR};
use crate::limit::StandIn;

/// A converted policy, in the policy file's own syntax.
#[derive(Serialize)]
pub(super) struct OutPolicy {
    name: String,
    description: String,
    domain: String,
    #[serde(rename = "match")]
    conditions: BTreeMap<String, String>,
    group: String,
    key: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    period: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
    /// A block list (`requests_per_unit: 0`): denied by its kind, whatever it is named.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deny: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    replaces: Vec<String>,
    /// What a stand-in is (its kind's name), so that it keeps its meaning whatever it is named;
    /// a block list says so with `deny` instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    envoy_stand_in: Option<&'static str>,
}

/// The policies for `leaves`, in their order, then one [`StandIn::Override`] per domain of
/// `domains`; or every `replaces` entry that names no limit of its domain.
pub(super) fn to_policies(
    domains: &[String],
    leaves: &[Leaf],
) -> Result<Vec<OutPolicy>, Vec<String>> {
    let mut taken = BTreeSet::new();
    let mut policies = Vec::new();
    // (domain, upstream `name`) -> the policies of the limits so named (names need not be
    // unique upstream, nor valid sluice names).
    let mut named: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    let mut emitted = Vec::new();
    for leaf in leaves {
        // Each entry's descriptor name: a key repeated along the path gets its occurrence.
        let mut names: Vec<String> = Vec::with_capacity(leaf.path.len());
        for (at, step) in leaf.path.iter().enumerate() {
            let occurrence = leaf.path[..=at]
                .iter()
                .filter(|s| s.key == step.key)
                .count();
            names.push(entry_name(&step.key, occurrence).into_owned());
        }
        let keys: Vec<&str> = leaf.path.iter().map(|s| s.key.as_str()).collect();
        let entries = keys.join(",");
        let group = format!("rls:{}:{entries}", leaf.domain);
        let (limit, period, shadow, kind) = match leaf.rule {
            Rule::Limit(limit, period) => (limit, period, leaf.shadow, None),
            // Upstream answers `unlimited` with its own figures: always a no-op.
            Rule::Unlimited => (super::NO_LIMIT, "1s", true, Some(StandIn::Unlimited)),
            // An exemption matters only where a limited entry of its group covers it.
            Rule::Exempt if covered(leaf, leaves) => {
                (super::NO_LIMIT, "1s", true, Some(StandIn::Exempt))
            }
            Rule::Exempt => continue,
            // In shadow mode: answered by the check's group (a shadow policy never denies).
            Rule::Blocked(period) if leaf.shadow => {
                (super::NO_LIMIT, period, true, Some(StandIn::ShadowBlocked))
            }
            // A block list (`deny: true`): denied on every transport, by its kind.
            Rule::Blocked(period) => (0, period, false, Some(StandIn::Blocked)),
        };
        let deny = kind == Some(StandIn::Blocked);
        let mut conditions: BTreeMap<String, String> = names
            .iter()
            .zip(&leaf.path)
            .map(|(name, s)| (name.clone(), s.value.clone().unwrap_or_else(|| "*".into())))
            .collect();
        conditions.insert(ENTRIES_DESCRIPTOR.into(), entries.clone());
        // A shared entry is left out of the counter's key: one counter for all its values. A
        // no-op keeps one counter for its whole group.
        let mut key: Vec<String> = names
            .iter()
            .zip(&leaf.path)
            .filter(|(_, s)| !s.shared && kind.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        if key.is_empty() {
            key.push(ENTRIES_DESCRIPTOR.into());
        }
        let name = unique_name(leaf, kind, &mut taken);
        // Upstream never replaces an `unlimited` limit (it is answered before replacement).
        if let Some(upstream) = &leaf.name {
            let replaced = named
                .entry((leaf.domain.as_str(), upstream.as_str()))
                .or_default();
            if leaf.rule != Rule::Unlimited {
                replaced.push(name.clone());
            }
        }
        emitted.push(leaf);
        policies.push(OutPolicy {
            name,
            description: format!(
                "envoyproxy/ratelimit {}: {}",
                kind.map_or("limit", StandIn::as_str),
                shown(&leaf.domain, &leaf.path)
            ),
            domain: leaf.domain.clone(),
            conditions,
            group,
            key,
            algorithm: (!deny).then_some("fixed_window"),
            limit: (!deny).then_some(limit),
            period,
            shadow,
            deny,
            replaces: Vec::new(),
            envoy_stand_in: kind.filter(|k| *k != StandIn::Blocked).map(StandIn::as_str),
        });
    }
    let mut problems = Vec::new();
    for (policy, leaf) in policies.iter_mut().zip(emitted) {
        for upstream in &leaf.replaces {
            match named.get(&(leaf.domain.as_str(), upstream.as_str())) {
                Some(replaced) if !replaced.is_empty() => {
                    policy.replaces.extend(replaced.iter().cloned());
                }
                Some(_) => problems.push(format!(
                    "{}: replaces `{upstream}`, which only `unlimited` limits have as their \
                     `name`: upstream never replaces those (it answers them first), so the entry \
                     would do nothing",
                    shown(&leaf.domain, &leaf.path)
                )),
                None => problems.push(format!(
                    "{}: replaces `{upstream}`, which no limit of the domain has as its `name` \
                     (envoyproxy/ratelimit ignores such an entry; sluice refuses it, so that a \
                     misspelt name does not silently leave the other limit in force)",
                    shown(&leaf.domain, &leaf.path)
                )),
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    for domain in domains {
        policies.push(override_policy(domain, &mut taken));
    }
    Ok(policies)
}

/// The policy of `domain`'s limit overrides: it matches only a descriptor with a `limit` (any
/// entries), enforced, in a group of its own; the check's group gives it the override's quota
/// and a counter per descriptor.
fn override_policy(domain: &str, taken: &mut BTreeSet<String>) -> OutPolicy {
    let leaf = Leaf {
        domain: domain.to_owned(),
        path: Vec::new(),
        rule: Rule::Unlimited,
        name: None,
        replaces: Vec::new(),
        shadow: false,
    };
    OutPolicy {
        name: unique_name(&leaf, Some(StandIn::Override), taken),
        description: format!(
            "envoyproxy/ratelimit {}: domain `{domain}`, any descriptor with a `limit`",
            StandIn::Override.as_str()
        ),
        domain: domain.to_owned(),
        conditions: BTreeMap::from([(OVERRIDE_DESCRIPTOR.to_owned(), "1".to_owned())]),
        // Not an `rls:` group: no key path is ever named so.
        group: format!("rls-override:{domain}"),
        key: vec![ENTRIES_DESCRIPTOR.into()],
        algorithm: Some("fixed_window"),
        limit: Some(super::NO_LIMIT),
        period: "1s",
        shadow: false,
        deny: false,
        replaces: Vec::new(),
        envoy_stand_in: Some(StandIn::Override.as_str()),
    }
}

/// Whether a limited entry of the same domain and key path could match the values `leaf` matches.
fn covered(leaf: &Leaf, leaves: &[Leaf]) -> bool {
    leaves.iter().any(|other| {
        matches!(other.rule, Rule::Limit(..))
            && other.domain == leaf.domain
            && other.path.len() == leaf.path.len()
            && other
                .path
                .iter()
                .zip(&leaf.path)
                .all(|(a, b)| a.key == b.key && overlaps(a.value.as_deref(), b.value.as_deref()))
    })
}

/// Whether some value fits both patterns (`None` is any value), by the same globs the matcher
/// uses.
pub(super) fn overlaps(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => crate::limit::globs_overlap(a, b),
        _ => true,
    }
}

/// The `rate_limit.name` when it is a valid policy name not yet taken (and not a no-op's
/// prefix), else one made from the domain and path (shortened with a hash when long or taken).
/// A stand-in's name starts with its kind's prefix (for the reader; its kind is its
/// `envoy_stand_in`), and a limit's never does: such names are reserved.
pub(super) fn unique_name(
    leaf: &Leaf,
    kind: Option<StandIn>,
    taken: &mut BTreeSet<String>,
) -> String {
    let valid = |n: &str| {
        !n.is_empty()
            && n.len() <= crate::limit::MAX_POLICY_NAME
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    };
    let prefix = kind.map_or("", StandIn::prefix);
    if let Some(name) = leaf.name.as_deref().filter(|n| {
        kind.is_none() && valid(n) && !taken.contains(*n) && StandIn::reserving(n).is_none()
    }) {
        taken.insert(name.to_owned());
        return name.to_owned();
    }
    let mut raw = leaf.domain.clone();
    for step in &leaf.path {
        raw.push('_');
        raw.push_str(&step.key);
        if let Some(v) = &step.value {
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
    let mut name = format!("{prefix}{slug}");
    if name.len() > 48 || taken.contains(&name) || !valid(&name) {
        let digest = sha1_smol::Sha1::from(raw.as_bytes()).digest().to_string();
        let room = 48 - prefix.len();
        name = format!("{prefix}{}_{}", &slug[..slug.len().min(room)], &digest[..8]);
    }
    if kind.is_none() && StandIn::reserving(&name).is_some() {
        // A limit never looks like a no-op.
        name.insert(0, 'x');
    }
    taken.insert(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::envoy::walk::Step;

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
    fn replaces_lists_every_policy_of_the_name_in_its_domain() {
        // Upstream names need be neither unique nor valid sluice names.
        let file = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: Read Limit, unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: Read Limit, unit: hour, requests_per_unit: 0}\n  - key: c\n    rate_limit: {replaces: [{name: Read Limit}], unit: hour, requests_per_unit: 2}\n";
        let converted = crate::config::envoy::convert(file).expect("converts");
        let set = crate::config::parse_policies(std::path::Path::new("t.yaml"), &converted)
            .expect("valid");
        let replacer = set
            .iter()
            .find(|p| !p.replaces().is_empty())
            .expect("a replacing policy");
        let named: Vec<&str> = set
            .iter()
            .filter(|p| p.name() != replacer.name())
            .filter(|p| p.stand_in() != Some(StandIn::Override))
            .map(|p| p.name())
            .collect();
        assert_eq!(replacer.replaces(), named.as_slice(), "{converted}");
        assert_eq!(named.len(), 2);
    }

    #[test]
    fn every_stand_in_carries_its_kind_and_no_limit_does() {
        let file = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: k\n    value: a\n    rate_limit: {unlimited: true}\n  - key: k\n    value: b\n  - key: k\n    value: c\n    rate_limit: {unit: hour, requests_per_unit: 0}\n  - key: k\n    value: e\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 0}\n";
        let converted = crate::config::envoy::convert(file).expect("converts");
        let set = crate::config::parse_policies(std::path::Path::new("t.yaml"), &converted)
            .expect("valid");
        let mut kinds: Vec<Option<StandIn>> = Vec::new();
        for policy in set.iter() {
            // The name's prefix is the reader's; the kind is the field (a block list's, `deny`).
            let by_name = StandIn::reserving(policy.name());
            let by_kind = policy
                .stand_in()
                .or(policy.is_deny().then_some(StandIn::Blocked));
            assert_eq!(by_kind, by_name, "{}: {converted}", policy.name());
            kinds.push(by_kind);
        }
        let mut expected: Vec<Option<StandIn>> = StandIn::ALL.into_iter().map(Some).collect();
        expected.push(None);
        kinds.sort_by_key(|k| k.map(StandIn::as_str));
        expected.sort_by_key(|k| k.map(StandIn::as_str));
        assert_eq!(kinds, expected, "{converted}");
        // Renamed, the converted policies keep their kinds.
        let renamed = converted.replace("name: rls-", "name: mine-");
        let set = crate::config::parse_policies(std::path::Path::new("t.yaml"), &renamed)
            .expect("valid renamed");
        let stand_ins = set.iter().filter_map(|p| p.stand_in()).count();
        assert_eq!(stand_ins, 4, "{renamed}");
    }

    #[test]
    fn names_are_valid_unique_and_prefer_the_configured_one() {
        let leaf = |name: Option<&str>, value: &str| Leaf {
            domain: "Edge.Proxy".into(),
            path: vec![Step {
                key: "remote_address".into(),
                value: Some(value.into()),
                shared: false,
            }],
            rule: Rule::Limit(1, "1s"),
            name: name.map(str::to_owned),
            replaces: Vec::new(),
            shadow: false,
        };
        let mut taken = BTreeSet::new();
        assert_eq!(
            unique_name(&leaf(Some("mine"), "a"), None, &mut taken),
            "mine"
        );
        // Taken or invalid configured names fall back to one made from the path.
        assert_eq!(
            unique_name(&leaf(Some("mine"), "10.0.0.1"), None, &mut taken),
            "edge_proxy_remote_address_10_0_0_1"
        );
        let again = unique_name(&leaf(Some("Not Valid"), "10.0.0.1"), None, &mut taken);
        assert!(
            again.starts_with("edge_proxy_remote_address_10_0_0_1_"),
            "{again}"
        );
        let long = unique_name(&leaf(None, &"v".repeat(100)), None, &mut taken);
        assert!(long.len() <= crate::limit::MAX_POLICY_NAME, "{long}");
        // A no-op is named by its kind; a limit never looks like one, whatever its name.
        let exempt = unique_name(&leaf(Some("mine"), "b"), Some(StandIn::Exempt), &mut taken);
        assert_eq!(
            StandIn::reserving(&exempt),
            Some(StandIn::Exempt),
            "{exempt}"
        );
        let posing = unique_name(&leaf(Some("rls-unlimited-x"), "c"), None, &mut taken);
        assert_eq!(StandIn::reserving(&posing), None, "{posing}");
    }
}

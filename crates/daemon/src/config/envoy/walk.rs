//! The descriptor tree of one domain walked into leaves: one per node, with the path of entries
//! that leads to it and its rule, after upstream's load-time checks (empty or duplicate keys,
//! `share_threshold` without a wildcard, units) and sluice's own (key syntax, depth).

use std::collections::BTreeSet;

use super::schema::{RawDescriptor, Rule};
use super::MAX_DEPTH;

/// One entry along a path: its key, its value pattern (`None` = any value), and whether every
/// value its wildcard matches shares one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Step {
    pub key: String,
    pub value: Option<String>,
    pub shared: bool,
}

/// A node of the tree with its path and rule.
pub(super) struct Leaf {
    pub domain: String,
    pub path: Vec<Step>,
    pub rule: Rule,
    pub name: Option<String>,
    /// The `name`s of the limits it replaces (upstream's names, resolved by `emit`).
    pub replaces: Vec<String>,
    pub shadow: bool,
}

/// `domain`, descriptor `k=v / k2=*`, for messages.
pub(super) fn shown(domain: &str, path: &[Step]) -> String {
    let steps: Vec<String> = path
        .iter()
        .map(|s| format!("{}={}", s.key, s.value.as_deref().unwrap_or("*")))
        .collect();
    format!("domain `{domain}`, descriptor {}", steps.join(" / "))
}

/// Walks `nodes` (siblings under `path`), pushing a leaf per node or a problem.
pub(super) fn walk(
    domain: &str,
    nodes: &[&RawDescriptor],
    path: &mut Vec<Step>,
    leaves: &mut Vec<Leaf>,
    problems: &mut Vec<String>,
) {
    let mut siblings = BTreeSet::new();
    for node in nodes {
        let value = node.value.clone().filter(|v| !v.is_empty());
        path.push(Step {
            key: node.key.clone(),
            value: value.clone(),
            shared: node.share_threshold,
        });
        if let Err(reason) = check_node(node, value.as_deref(), path, &mut siblings) {
            problems.push(format!("{}: {reason}", shown(domain, path)));
        } else {
            let rule = match &node.rate_limit {
                Some(rate) => rate.rule(),
                None => Ok(Rule::Exempt),
            };
            match rule {
                Ok(rule) => leaves.push(Leaf {
                    domain: domain.to_owned(),
                    path: path.clone(),
                    rule,
                    name: node.rate_limit.as_ref().and_then(|r| r.name.clone()),
                    replaces: node
                        .rate_limit
                        .as_ref()
                        .map(|r| r.replaced())
                        .unwrap_or_default(),
                    shadow: node.shadow_mode,
                }),
                Err(reason) => problems.push(format!("{}: {reason}", shown(domain, path))),
            }
            let children: Vec<&RawDescriptor> = node.descriptors.iter().collect();
            walk(domain, &children, path, leaves, problems);
        }
        path.pop();
    }
}

fn check_node(
    node: &RawDescriptor,
    value: Option<&str>,
    path: &[Step],
    siblings: &mut BTreeSet<(String, Option<String>)>,
) -> Result<(), String> {
    if node.key.is_empty() {
        return Err("descriptor has empty key".into());
    }
    let valid_key = node.key.len() <= super::MAX_KEY
        && node
            .key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !node.key.starts_with("rls.");
    if !valid_key {
        return Err(format!(
            "key must be 1 to {} characters of a-z, A-Z, 0-9, `_`, `-`, `.` (not `rls.*`)",
            super::MAX_KEY
        ));
    }
    let occurrence = path.iter().filter(|s| s.key == node.key).count();
    if super::entry_name(&node.key, occurrence).len() > crate::limit::MAX_DESCRIPTOR_NAME {
        return Err(format!(
            "a key repeated along a path must be at most {} characters",
            crate::limit::MAX_DESCRIPTOR_NAME - 6
        ));
    }
    if !siblings.insert((node.key.clone(), value.map(str::to_owned))) {
        return Err(
            "duplicate descriptor composite key (the same key and value twice at one level)".into(),
        );
    }
    if value.is_some_and(|v| v.contains(['{', '}'])) {
        return Err("value must not contain `{` or `}`".into());
    }
    if node.share_threshold && !value.is_some_and(|v| v.contains('*')) {
        return Err(
            "share_threshold can only be used with wildcard values (containing '*')".into(),
        );
    }
    if node.quota_mode {
        return Err(
            "`quota_mode` (over-limit descriptors that do not deny) has no sluice equivalent; \
             use `shadow_mode` to observe a limit without enforcing it"
                .into(),
        );
    }
    if path.len() > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH}"));
    }
    Ok(())
}

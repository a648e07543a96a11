//! `envoy_stand_in`: a policy converted from an envoyproxy/ratelimit rule that sluice's limits
//! cannot say says what it stands for, and is accepted only with the shape `sluice config
//! convert` writes for that kind; the names the converter gives such policies are reserved, so
//! that no policy gets (or loses) a stand-in's meaning by its name.

use super::policy_fields::RawPolicy;
use super::policy_quota::{AlgorithmName, FieldProblem};
use super::MAX_LIMIT;
use crate::config::envoy::{ENTRIES_DESCRIPTOR, OVERRIDE_DESCRIPTOR};
use crate::limit::StandIn;

/// Every problem with `raw`'s stand-in field, or with a reserved name it has without the field.
pub(super) fn problems(raw: &RawPolicy) -> Vec<FieldProblem> {
    let mut problems: Vec<FieldProblem> = Vec::new();
    if let Some(reserved) = StandIn::reserving(&raw.name) {
        let (holds, written) = match reserved {
            StandIn::Blocked => (raw.deny, "`deny: true`".to_owned()),
            kind => (
                raw.envoy_stand_in == Some(kind),
                format!("`envoy_stand_in: {}`", kind.as_str()),
            ),
        };
        if !holds {
            let reason = format!(
                "names starting `{}` are reserved for converted envoyproxy/ratelimit stand-ins; \
                 `sluice config convert` writes them with {written} (convert the file again, or \
                 name the policy otherwise)",
                reserved.prefix()
            );
            problems.push(("name", reason).into());
        }
    }
    let Some(kind) = raw.envoy_stand_in else {
        return problems;
    };
    let mut refuse = |field: &'static str, reason: String| problems.push((field, reason).into());
    let what = format!("an `envoy_stand_in: {}` policy", kind.as_str());
    if kind == StandIn::Blocked {
        let reason = "a converted block list is a `deny: true` policy; the field takes \
                      `unlimited`, `exempt`, `shadow_blocked` or `limit_override`";
        refuse("envoy_stand_in", reason.to_owned());
        return problems;
    }
    if raw.domain.is_none() {
        refuse(
            "domain",
            format!("missing: {what} answers its Envoy domain"),
        );
    }
    if raw.group.is_none() {
        refuse(
            "group",
            format!("missing: {what} is one of its key path's group"),
        );
    }
    let given = [
        ("burst", raw.burst.is_some()),
        ("limits", raw.limits.is_some()),
        ("local_limit", raw.local_limit.is_some()),
        ("tiers", raw.tiers.is_some()),
        ("cost", raw.cost.is_some()),
        ("deny", raw.deny),
        ("lease", raw.lease),
        ("enforce_percent", raw.enforce_percent < 100),
    ];
    for (field, _) in given.iter().filter(|(_, given)| *given) {
        refuse(
            field,
            format!("{what} has a fixed window of one limit, enforced or shadow as a whole"),
        );
    }
    if raw.algorithm != Some(AlgorithmName::FixedWindow) {
        refuse("algorithm", format!("{what} is a `fixed_window`"));
    }
    if raw.limit != Some(MAX_LIMIT) {
        let reason = if kind == StandIn::Override {
            "its quota is each request's override"
        } else {
            "it never limits by itself"
        };
        refuse(
            "limit",
            format!("{what} has `limit: {MAX_LIMIT}`: {reason}"),
        );
    }
    if kind == StandIn::Override {
        if raw.shadow {
            refuse(
                "shadow",
                format!("{what} is enforced: upstream enforces an override"),
            );
        }
        if !raw.limit_override {
            refuse(
                "limit_override",
                format!("{what} takes each request's override"),
            );
        }
        let only_override = raw.conditions.len() == 1
            && raw.conditions.get(OVERRIDE_DESCRIPTOR).map(String::as_str) == Some("1");
        if !only_override {
            refuse(
                "match",
                format!(
                    "{what} matches `{OVERRIDE_DESCRIPTOR}: \"1\"` alone (any descriptor with a \
                     limit override)"
                ),
            );
        }
        if raw.key != [ENTRIES_DESCRIPTOR] {
            refuse(
                "key",
                format!("{what} has `key: [{ENTRIES_DESCRIPTOR}]` (a counter per descriptor)"),
            );
        }
    } else if !raw.shadow {
        refuse(
            "shadow",
            format!("{what} is `shadow: true`: it never limits by itself"),
        );
    }
    problems
}

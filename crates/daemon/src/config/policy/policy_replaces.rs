//! A policy file's `replaces` lists checked against the file: each name must be another policy
//! of the same file, so that a misspelt name is refused rather than silently replacing nothing.

use super::yaml_lines::PolicyLines;
use super::Problem;
use crate::limit::Policy;

/// Every `replaces` entry that does not name another policy of `policies` (the file's, in
/// order), with the line of the entry.
pub(super) fn problems(policies: &[Policy], lines: &PolicyLines<'_>) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (index, policy) in policies.iter().enumerate() {
        for (item, name) in policy.replaces().iter().enumerate() {
            let reason = if name == policy.name() {
                "a policy cannot replace itself".to_owned()
            } else if policies.iter().any(|p| p.name() == name) {
                continue;
            } else {
                format!("`{name}` is not a policy of this file")
            };
            problems.push(Problem {
                line: lines.item(index, "replaces", item),
                message: format!("policy `{}`: field `replaces`: {reason}", policy.name()),
            });
        }
    }
    problems
}

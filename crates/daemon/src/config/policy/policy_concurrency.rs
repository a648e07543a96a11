//! What a concurrency policy (`algorithm: concurrency`, `limit`, `permit_ttl`) may not say, and
//! `permit_ttl` on any other: each refusal names its field, so `sluice config check` shows its
//! line.
//!
//! A concurrency limit counts requests in flight, each holding a permit until it is released
//! (`POST /v1/release`) or its time to live ends. So it has no period, burst or windows; no
//! cost table (a permit is one request, whatever its cost); no lease (a pod cannot hold slots
//! for requests it has not seen); no `local` failure mode (a permit taken in one pod's memory
//! could not be released through another).

use super::policy_fields::RawPolicy;
use super::policy_quota::{AlgorithmName, FieldProblem};
use crate::limit::FailureMode;

/// Every problem of `raw` as a concurrency policy, or of its `permit_ttl` on another.
pub(super) fn problems(raw: &RawPolicy) -> Vec<FieldProblem> {
    let mut problems: Vec<FieldProblem> = Vec::new();
    let mut refuse = |field: &'static str, reason: &str| {
        problems.push((field, reason.to_owned()).into());
    };
    if raw.algorithm != Some(AlgorithmName::Concurrency) {
        if raw.permit_ttl.is_some() {
            refuse("permit_ttl", "applies only to algorithm concurrency");
        }
        return problems;
    }
    let fields = [
        (
            "period",
            raw.period.is_some(),
            "a concurrency limit has no period: a permit is held until it is released or its \
             `permit_ttl` ends",
        ),
        (
            "burst",
            raw.burst.is_some(),
            "applies only to algorithm token_bucket",
        ),
        (
            "limits",
            raw.limits.is_some(),
            "a concurrency limit has one `limit` (requests in flight), not windows",
        ),
        (
            "local_limit",
            raw.local_limit.is_some(),
            "a concurrency limit has no per-pod local limit",
        ),
        (
            "cost",
            raw.cost.is_some(),
            "a permit is one request in flight, whatever its cost: a concurrency limit takes \
             no cost table",
        ),
        (
            "lease",
            raw.lease,
            "a concurrency limit is never leased: every permit is taken in the store",
        ),
        (
            "failure_mode",
            raw.failure_mode == FailureMode::Local,
            "a concurrency limit fails `open` or `closed`, not `local`: a permit held in one \
             pod's memory could not be released through another",
        ),
    ];
    for (field, given, reason) in fields {
        if given {
            refuse(field, reason);
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse_policies;
    use crate::limit::Algorithm;

    fn check(text: &str) -> String {
        parse_policies(Path::new("p.yaml"), text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_concurrency_policy_reads_with_its_default_ttl() {
        let text = "policies:\n  - {name: gen, key: [tenant], algorithm: concurrency, limit: 8}\n  - {name: short, key: [tenant], algorithm: concurrency, limit: 2, permit_ttl: 1s}\n";
        let set = parse_policies(Path::new("p.yaml"), text).expect("valid");
        let window = |name| set.get(name).expect("policy").parts().quota.windows()[0];
        let Algorithm::Concurrency(gen) = window("gen") else {
            panic!("a concurrency limit");
        };
        assert_eq!((gen.limit(), gen.ttl_us()), (8, 30_000_000));
        assert_eq!(window("short").period_us(), 1_000_000);
    }

    #[test]
    fn bad_values_are_refused_with_their_line() {
        let cases = [
            ("limit: 0", "limit", "must be 1 to 10000"),
            ("limit: 10001", "limit", "must be 1 to 10000"),
            (
                "limit: 2, permit_ttl: 500ms",
                "permit_ttl",
                "between 1s and 1h",
            ),
            (
                "limit: 2, permit_ttl: 2h",
                "permit_ttl",
                "between 1s and 1h",
            ),
            ("limit: 2, period: 1s", "period", "has no period"),
            ("limit: 2, burst: 3", "burst", "token_bucket"),
            ("limit: 2, lease: true", "lease", "never leased"),
            (
                "limit: 2, failure_mode: local",
                "failure_mode",
                "not `local`",
            ),
            (
                "limit: 2, cost: {descriptor: op, table: {a: 2}}",
                "cost",
                "no cost table",
            ),
            ("permit_ttl: 5s", "limit", "missing"),
        ];
        for (fields, field, reason) in cases {
            let text = format!(
                "policies:\n  - name: ok\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n  - {{name: c, key: [ip], algorithm: concurrency, {fields}}}\n"
            );
            let err = check(&text);
            assert!(err.contains("p.yaml:7"), "{fields}: {err}");
            assert!(err.contains(&format!("field `{field}`")), "{fields}: {err}");
            assert!(err.contains(reason), "{fields}: {err}");
        }
        let other = "policies:\n  - {name: t, key: [ip], algorithm: token_bucket, limit: 1, period: 1s, permit_ttl: 5s}\n";
        assert!(
            check(other).contains("applies only to algorithm concurrency"),
            "{}",
            check(other)
        );
    }
}

//! Reservations (`reservations: true`, `reservation_ttl`): what a policy must be to take them,
//! each refusal naming its field, so `sluice config check` shows its line.
//!
//! A reservation spends an estimate at the check and gives back (or spends) the difference at
//! the settle, into the counter and window it was taken from. That is meaningful only where a
//! unit spent can be given back to its own counter exactly: a token bucket or a fixed window of
//! a period. Refused: a sliding log (each unit is an entry stamped with its instant: a refund
//! would pick which entries to drop, and the units used would keep the check's instant, not
//! the use's), a concurrency limit (a permit is one slot whatever the cost: there is nothing
//! to settle, release the permit), a calendar window (its window is not `now / period`, which
//! a give-back names), a block list (no counter), and a cost table (it fixes each request's
//! cost: nothing is estimated).

use super::policy_calendar::RawPeriod;
use super::policy_fields::RawPolicy;
use super::policy_quota::{AlgorithmName, FieldProblem};
use crate::config::HumanDuration;
use crate::limit::Micros;

/// Shortest `reservation_ttl` accepted (1 s).
pub const MIN_RESERVATION_TTL_US: Micros = 1_000_000;
/// Longest `reservation_ttl` accepted (1 h).
pub const MAX_RESERVATION_TTL_US: Micros = 3_600_000_000;
/// `reservation_ttl` when a policy with reservations names none (60 s).
pub const DEFAULT_RESERVATION_TTL_US: Micros = 60_000_000;

/// The reservations' time to live of `raw` (`None`: it takes none), or every problem.
pub(super) fn read(raw: &RawPolicy) -> (Option<Micros>, Vec<FieldProblem>) {
    let mut problems: Vec<FieldProblem> = Vec::new();
    let mut refuse = |field: &'static str, reason: String| {
        problems.push((field, reason).into());
    };
    if !raw.reservations {
        if raw.reservation_ttl.is_some() {
            refuse(
                "reservation_ttl",
                "applies only with `reservations: true`".to_owned(),
            );
        }
        return (None, problems);
    }
    let ttl = raw
        .reservation_ttl
        .unwrap_or(HumanDuration(DEFAULT_RESERVATION_TTL_US));
    if !(MIN_RESERVATION_TTL_US..=MAX_RESERVATION_TTL_US).contains(&ttl.0) {
        refuse(
            "reservation_ttl",
            format!("must be between 1s and 1h, got {ttl}"),
        );
    }
    let why_not = match raw.algorithm {
        Some(AlgorithmName::SlidingLog) => Some(
            "a sliding log keeps each unit with its instant: a refund cannot give units back to \
             the window they were counted in exactly (use a token bucket or a fixed window)",
        ),
        Some(AlgorithmName::Concurrency) => Some(
            "a permit is one slot whatever the cost: there is nothing to settle (release the \
             permit with POST /v1/release)",
        ),
        _ if raw.deny => Some("a deny policy has no counter to reserve from"),
        _ if raw.calendar || matches!(raw.period, Some(RawPeriod::Week | RawPeriod::Month)) => {
            Some(
                "a calendar window's reservations are not supported: a refund names the window by \
             `now / period`, which a calendar's days and months are not",
            )
        }
        _ => None,
    };
    if let Some(reason) = why_not {
        refuse("reservations", reason.to_owned());
    }
    if raw.cost.is_some() {
        refuse(
            "cost",
            "a cost table fixes each request's cost: a policy with reservations takes the \
             estimate from the check"
                .to_owned(),
        );
    }
    (Some(ttl.0), problems)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse_policies;

    fn check(text: &str) -> String {
        parse_policies(Path::new("p.yaml"), text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_policy_with_reservations_reads_with_its_default_ttl() {
        let text = "policies:\n  - {name: a, key: [t], algorithm: token_bucket, limit: 5, period: 1s, reservations: true}\n  - {name: b, key: [t], algorithm: fixed_window, limit: 5, period: 1m, reservations: true, reservation_ttl: 5s}\n  - {name: c, key: [t], algorithm: fixed_window, limit: 5, period: 1m}\n";
        let set = parse_policies(Path::new("p.yaml"), text).expect("valid");
        let ttl = |name| set.get(name).expect("policy").reservation_ttl_us();
        assert_eq!(
            (ttl("a"), ttl("b"), ttl("c")),
            (Some(60_000_000), Some(5_000_000), None)
        );
    }

    #[test]
    fn bad_values_are_refused_with_their_line() {
        let cases = [
            (
                "algorithm: fixed_window, limit: 5, period: 1m, reservations: true, reservation_ttl: 500ms",
                "reservation_ttl",
                "between 1s and 1h",
            ),
            (
                "algorithm: fixed_window, limit: 5, period: 1m, reservations: true, reservation_ttl: 2h",
                "reservation_ttl",
                "between 1s and 1h",
            ),
            (
                "algorithm: fixed_window, limit: 5, period: 1m, reservation_ttl: 5s",
                "reservation_ttl",
                "only with `reservations: true`",
            ),
            (
                "algorithm: sliding_log, limit: 5, period: 1m, reservations: true",
                "reservations",
                "sliding log",
            ),
            (
                "algorithm: concurrency, limit: 5, reservations: true",
                "reservations",
                "nothing to settle",
            ),
            (
                "algorithm: fixed_window, limit: 5, period: 1d, calendar: true, time_zone: UTC, reservations: true",
                "reservations",
                "calendar",
            ),
            (
                "deny: true, period: 1m, reservations: true",
                "reservations",
                "no counter",
            ),
            (
                "algorithm: fixed_window, limit: 5, period: 1m, reservations: true, cost: {descriptor: op, table: {a: 2}}",
                "cost",
                "fixes each request's cost",
            ),
        ];
        for (fields, field, reason) in cases {
            let text = format!(
                "policies:\n  - name: ok\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n  - {{name: r, key: [ip], {fields}}}\n"
            );
            let err = check(&text);
            assert!(err.contains("p.yaml:7"), "{fields}: {err}");
            assert!(err.contains(&format!("field `{field}`")), "{fields}: {err}");
            assert!(err.contains(reason), "{fields}: {err}");
        }
    }
}

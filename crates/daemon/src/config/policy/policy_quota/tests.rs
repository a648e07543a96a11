//! Tests of quotas from policy files: windows, local limits, tiers, their errors with lines,
//! and the warnings about local limits.

use std::path::Path;

use super::*;
use crate::config::parse_policies;
use crate::limit::Descriptors;

fn parse(text: &str) -> Result<PolicySet, String> {
    parse_policies(Path::new("p.yaml"), text).map_err(|e| e.to_string())
}

fn policy(body: &str) -> String {
    format!("policies:\n  - name: api\n    key: [user]\n{body}")
}

#[test]
fn several_windows_keep_their_order_bursts_and_local_limit() {
    let set = parse(&policy(
        "    algorithm: token_bucket\n    limits:\n      - {limit: 10, period: 1s, burst: 20}\n      - {limit: 1000, period: 1h}\n    local_limit: {limit: 50, period: 1s}\n    tiers: {levels: {gold: {multiplier: 3}}}\n",
    ))
    .expect("valid");
    let api = set.get("api").expect("api");
    let quota = &api.parts().quota;
    let figures: Vec<_> = quota
        .windows()
        .iter()
        .map(|w| (w.limit(), w.period_us()))
        .collect();
    assert_eq!(figures, [(20, 1_000_000), (1000, 3_600_000_000)]);
    assert_eq!(
        quota.local().map(|l| (l.limit(), l.capacity())),
        Some((50, 50))
    );
    let gold: Descriptors = [("tier".to_owned(), "gold".to_owned())].into();
    let tiered = api.quota_for(&gold, None).1;
    let limits: Vec<u64> = tiered.windows().iter().map(Algorithm::limit).collect();
    assert_eq!(limits, [60, 3000], "every window (burst included) times 3");
    assert_eq!(tiered.local().map(TokenBucket::limit), Some(150));
}

#[test]
fn one_window_in_a_list_is_the_plain_policy() {
    let listed = parse(&policy(
        "    algorithm: fixed_window\n    limits: [{limit: 5, period: 1m}]\n",
    ))
    .expect("valid");
    let plain = parse(&policy(
        "    algorithm: fixed_window\n    limit: 5\n    period: 1m\n",
    ))
    .expect("valid");
    assert_eq!(
        listed.get("api").expect("api").parts().quota,
        plain.get("api").expect("api").parts().quota
    );
    assert!(!listed.get("api").expect("api").parts().quota.is_multi());
}

#[test]
fn bad_windows_are_refused_with_their_line() {
    let cases = [
        (
            "    algorithm: fixed_window\n    limit: 5\n    period: 1m\n    limits: [{limit: 5, period: 1h}]\n",
            "p.yaml:7: policy `api`: field `limits`: give either",
        ),
        ("    algorithm: fixed_window\n    limits: []\n", "p.yaml:5: policy `api`: field `limits`: needs at least one"),
        (
            "    algorithm: fixed_window\n    limits:\n      - {limit: 5, period: 1s}\n      - {limit: 9, period: 1m}\n      - {limit: 7, period: 60s}\n",
            "p.yaml:8: policy `api`: field `limits`: windows 1 and 2 both have period 1m",
        ),
        (
            "    algorithm: sliding_log\n    limits:\n      - {limit: 5, period: 1s}\n      - {limit: 9, period: 1m, burst: 20}\n",
            "p.yaml:7: policy `api`: field `limits`: window 1: burst: applies only",
        ),
        (
            "    algorithm: token_bucket\n    burst: 3\n    limits: [{limit: 5, period: 1s}]\n",
            "p.yaml:5: policy `api`: field `burst`: with `limits`",
        ),
        ("    algorithm: fixed_window\n", "p.yaml:2: policy `api`: field `limit`: missing"),
        ("    algorithm: fixed_window\n    limit: 3\n", "field `period`: missing"),
        (
            "    algorithm: fixed_window\n    limits: [{limit: 5, period: 1s}, {limit: 9, period: 1h}]\n    tiers: {levels: {gold: {limit: 50}}}\n",
            "field `tiers`: tier `gold`: a policy of several windows takes tier `multiplier`s only",
        ),
        (
            "    algorithm: fixed_window\n    limits: [{limit: 5, period: 1s}, {limit: 9, period: 1h}]\n    cost: {descriptor: op, table: {big: 6}}\n",
            "field `cost`: `big` costs 6: each cost must be 1 to the smallest limit (5)",
        ),
        (
            "    algorithm: fixed_window\n    limit: 5\n    period: 1s\n    local_limit: {limit: 0, period: 1s}\n",
            "p.yaml:7: policy `api`: field `local_limit`: limit: must be 1",
        ),
        (
            "    algorithm: fixed_window\n    limit: 5\n    period: 1s\n    local_limit: {limit: 2, period: 1s, colour: red}\n",
            "unknown field `colour`",
        ),
    ];
    for (body, expected) in cases {
        let err = parse(&policy(body)).expect_err(body);
        assert!(err.contains(expected), "{expected}\nin\n{err}");
    }
    let many: Vec<String> = (1..=9)
        .map(|i| format!("{{limit: {i}, period: {i}s}}"))
        .collect();
    let err = parse(&policy(&format!(
        "    algorithm: fixed_window\n    limits: [{}]\n",
        many.join(", ")
    )))
    .expect_err("nine windows");
    assert!(err.contains("at most 8 windows, got 9"), "{err}");
}

#[test]
fn local_limits_below_the_shared_rate_are_warned_about() {
    let set = parse(&policy(
        "    algorithm: fixed_window\n    limits: [{limit: 10, period: 1s}, {limit: 1000, period: 1h}]\n    local_limit: {limit: 4, period: 1s}\n",
    ))
    .expect("valid");
    let warnings = local_limit_warnings(&set, 2);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("4 per 1s on each of 2 pods") && warnings[0].contains("10 per 1s"),
        "{warnings:?}"
    );
    assert!(local_limit_warnings(&set, 3).is_empty());
}

#[test]
fn the_readme_examples_of_windows_and_local_limits_are_valid() {
    let readme = include_str!("../../../../../../docs/policies.md");
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .filter(|block| block.starts_with("  - name:"))
        .filter(|block| block.contains("limits:") || block.contains("local_limit:"))
        .collect();
    assert_eq!(blocks.len(), 2, "the two examples");
    for block in blocks {
        parse(&format!("policies:\n{block}")).unwrap_or_else(|e| panic!("{e}\n{block}"));
    }
}

#[test]
fn the_report_debt_bound_reaches_every_bucket_and_is_checked_with_its_line() {
    let bucket = |a: &Algorithm| match a {
        Algorithm::TokenBucket(b) => b.report_debt(),
        _ => None,
    };
    // Unset: 1 period, on every window, tier and the local limit.
    let set = parse(&policy(
        "    algorithm: token_bucket\n    limits: [{limit: 10, period: 1s}, {limit: 100, period: 1h}]\n    local_limit: {limit: 5, period: 1s}\n    tiers: {levels: {gold: {multiplier: 3}}}\n",
    ))
    .expect("valid");
    let api = set.get("api").expect("api");
    let parts = api.parts();
    let gold = &parts.tiers.as_ref().expect("tiers").levels["gold"];
    for quota in [&parts.quota, gold] {
        assert!(quota.windows().iter().all(|w| bucket(w) == Some(1)));
        assert_eq!(quota.local().and_then(|l| l.report_debt()), Some(1));
    }
    assert!(parts.reports, "reports are accepted unless refused");
    let set = parse(&policy(
        "    algorithm: token_bucket\n    limit: 10\n    period: 1s\n    report_debt_periods: 24\n    reports: false\n",
    ))
    .expect("valid");
    let api = set.get("api").expect("api");
    assert_eq!(bucket(&api.parts().quota.windows()[0]), Some(24));
    assert!(!api.parts().reports);
    // Out of range, or not a number / boolean: named with its line.
    for (field, value, expected) in [
        (
            "report_debt_periods",
            "0",
            "must be 1 to 1000 (periods), got 0",
        ),
        (
            "report_debt_periods",
            "1001",
            "must be 1 to 1000 (periods), got 1001",
        ),
        ("report_debt_periods", "1d", "invalid type"),
        ("reports", "maybe", "invalid type"),
    ] {
        let err = parse(&policy(&format!(
            "    algorithm: sliding_log\n    limit: 10\n    period: 1m\n    {field}: {value}\n"
        )))
        .unwrap_err();
        let at = format!("p.yaml:7: policy `api`: field `{field}`: {expected}");
        assert!(err.contains(&at), "{at}\nin {err}");
    }
}

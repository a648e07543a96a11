//! Tests of policies: matching, keys from captures, tiers, costs, rollout.

use super::*;
use crate::limit::{Algorithm, FixedWindow};

fn window(limit: u64) -> Algorithm {
    Algorithm::FixedWindow(FixedWindow::new(limit, 1_000_000).expect("valid"))
}

pub(crate) fn parts(name: &str) -> PolicyParts {
    PolicyParts {
        name: name.into(),
        description: String::new(),
        conditions: vec![("path".into(), Pattern::parse("/login").expect("valid"))],
        path_case: PathCase::Insensitive,
        group: None,
        key: vec!["ip".into()],
        quota: window(10).into(),
        tiers: Some(Tiers {
            descriptor: "tier".into(),
            levels: [("gold".to_owned(), window(100).into())].into(),
        }),
        cost: None,
        failure_mode: FailureMode::Closed,
        shadow: false,
        enforce_percent: 100,
        timeout_us: None,
        limit_override: true,
        reports: true,
        replaces: Vec::new(),
        deny: false,
        lease: false,
        reservation_ttl_us: None,
        stand_in: None,
    }
}

fn descriptors(pairs: &[(&str, &str)]) -> Descriptors {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn matching_needs_conditions_and_key_descriptors() {
    let policy = Policy::new(parts("login")).expect("valid");
    assert!(policy
        .matches(&descriptors(&[("path", "/login"), ("ip", "1.2.3.4")]))
        .is_some());
    assert!(policy
        .matches(&descriptors(&[("path", "/login")]))
        .is_none());
    assert!(policy
        .matches(&descriptors(&[("path", "/other"), ("ip", "1.2.3.4")]))
        .is_none());
    assert_eq!(
        policy.missing_key_descriptor(&descriptors(&[]), &Vec::new()),
        Some("ip")
    );
}

#[test]
fn template_parameters_can_key_the_counter() {
    let mut p = parts("orders");
    p.conditions = vec![(
        "path".into(),
        Pattern::parse("/v1/orders/{id}").expect("valid"),
    )];
    p.key = vec!["tenant".into(), "id".into()];
    let policy = Policy::new(p).expect("valid");
    let request = descriptors(&[("path", "/v1/orders/42"), ("tenant", "acme")]);
    let captures = policy.matches(&request).expect("matches");
    assert_eq!(
        policy
            .key_for(&request, &captures)
            .expect("key")
            .partition(),
        "acme:42"
    );
}

#[test]
fn tiers_pick_their_quota_and_overrides_win() {
    let policy = Policy::new(parts("login")).expect("valid");
    let gold = descriptors(&[("tier", "gold")]);
    let other = descriptors(&[("tier", "bronze")]);
    let limit = |d, o| policy.quota_for(d, o).1.max_cost();
    assert_eq!(limit(&gold, None), 100);
    assert_eq!(limit(&other, None), 10);
    assert_eq!(limit(&other, Some("gold")), 100);
    assert_eq!(limit(&gold, Some("bronze")), 10);
}

#[test]
fn cost_tables_price_by_descriptor() {
    let mut p = parts("graphql");
    p.cost = Some(CostTable {
        descriptor: "operation".into(),
        costs: [("search".to_owned(), 40)].into(),
    });
    let policy = Policy::new(p).expect("valid");
    assert_eq!(
        policy.cost_for(&descriptors(&[("operation", "search")]), 1),
        40
    );
    assert_eq!(
        policy.cost_for(&descriptors(&[("operation", "getUser")]), 3),
        3
    );
}

#[test]
fn rollout_enforces_a_stable_share_of_partitions() {
    let mut p = parts("rollout");
    p.enforce_percent = 30;
    let policy = Policy::new(p).expect("valid");
    let enforced = (0..1_000)
        .filter(|i| policy.enforces(&Key::new(Arc::from("rollout"), [i.to_string().as_str()])))
        .count();
    assert!(
        (220..=380).contains(&enforced),
        "{enforced} of 1000 enforced at 30%"
    );
    let key = Key::new(Arc::from("rollout"), ["7"]);
    assert_eq!(policy.enforces(&key), policy.enforces(&key.clone()));
}

#[test]
fn invalid_parts_are_rejected_with_the_field() {
    assert_eq!(Policy::new(parts("Bad Name")).unwrap_err().field, "name");
    let mut no_key = parts("ok");
    no_key.key.clear();
    assert_eq!(Policy::new(no_key).unwrap_err().field, "key");
}

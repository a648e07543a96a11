//! One policy of a policy file, from its YAML value into the fields as written. serde stops at
//! the first bad field of a struct, so when a policy does not read whole, each of its fields is
//! read again on its own: a policy with an unknown field, a bad type and a missing key shows all
//! three in one `config check`.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml::Value;

use super::policy_calendar::RawPeriod;
use super::policy_quota::{AlgorithmName, RawTiers, RawWindow};
use super::HumanDuration;
use crate::limit::{FailureMode, PathCase, StandIn};

/// A policy as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default, rename = "match")]
    pub conditions: BTreeMap<String, String>,
    /// How `path` letters compare: `insensitive` (the default) or `exact`.
    #[serde(default)]
    pub path_case: PathCase,
    pub group: Option<String>,
    pub key: Vec<String>,
    /// Required unless `deny`.
    pub algorithm: Option<AlgorithmName>,
    /// One window: `limit` per `period` (with `burst` for a token bucket) ...
    pub limit: Option<u64>,
    pub period: Option<RawPeriod>,
    pub burst: Option<u64>,
    /// A concurrency policy's permits' time to live (1 s to 1 h, default 30 s).
    pub permit_ttl: Option<HumanDuration>,
    /// ... or several, checked together: `[{limit: 10, period: 1s}, {limit: 1000, period: 1h}]`.
    pub limits: Option<Vec<RawWindow>>,
    /// A per-pod token bucket checked before the store.
    pub local_limit: Option<RawWindow>,
    #[serde(default = "default_failure_mode")]
    pub failure_mode: FailureMode,
    #[serde(default)]
    pub shadow: bool,
    #[serde(default = "all_percent")]
    pub enforce_percent: u8,
    pub timeout: Option<HumanDuration>,
    pub tiers: Option<RawTiers>,
    pub cost: Option<RawCost>,
    /// Envoy rate limit service domain this policy belongs to (see [`super::envoy`]).
    pub domain: Option<String>,
    #[serde(default = "yes")]
    pub limit_override: bool,
    /// Whether `POST /v1/report` may spend on this policy (`false`: such reports are refused).
    #[serde(default = "yes")]
    pub reports: bool,
    /// The most periods a report may leave a token bucket's next token waiting.
    pub report_debt_periods: Option<u64>,
    /// Policies this one replaces where both apply (names, checked against the file).
    #[serde(default)]
    pub replaces: Vec<String>,
    /// A block list: deny every request the policy applies to (`period`: the wait told).
    #[serde(default)]
    pub deny: bool,
    /// Quota leases: admit from blocks of units taken from the store (token bucket, fixed window).
    #[serde(default)]
    pub lease: bool,
    /// Reservations: a check may reserve an estimate and settle the real cost later.
    #[serde(default)]
    pub reservations: bool,
    /// How long a reservation may wait for its settle (1 s to 1 h, default 60 s).
    pub reservation_ttl: Option<HumanDuration>,
    /// Calendar windows: local days, weeks or months in `time_zone` (see `policy_calendar`).
    #[serde(default)]
    pub calendar: bool,
    /// The IANA time zone of a calendar policy's windows.
    pub time_zone: Option<String>,
    /// A converted envoyproxy/ratelimit rule sluice's limits cannot say (see
    /// `policy_stand_in`).
    pub envoy_stand_in: Option<StandIn>,
}

fn yes() -> bool {
    true
}

fn all_percent() -> u8 {
    100
}

fn default_failure_mode() -> FailureMode {
    FailureMode::Open
}

/// `cost: {descriptor: operation, table: {search: 40}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCost {
    pub descriptor: String,
    pub table: BTreeMap<String, u64>,
}

/// The fields a policy must have.
const REQUIRED: [&str; 2] = ["name", "key"];

/// A field problem: the field's name as written (`None` for the policy as a whole) and why.
pub(super) type FieldError = (Option<String>, String);

/// Reads one policy: the policy, and every field that does not read (bad, unknown, or a
/// missing required one). When some fields are bad, the policy is read again without them
/// (`None` if it still does not read), so that the caller can check the rest as well.
pub(super) fn read_policy(value: Value) -> (Option<RawPolicy>, Vec<FieldError>) {
    let whole = match serde_yaml::from_value::<RawPolicy>(value.clone()) {
        Ok(policy) => return (Some(policy), Vec::new()),
        Err(error) => error.to_string(),
    };
    let Value::Mapping(mut map) = value else {
        return (None, vec![(None, whole)]);
    };
    let mut problems = Vec::new();
    let mut bad = Vec::new();
    for (key, field) in &map {
        let Some(name) = key.as_str() else {
            problems.push((None, format!("field name {key:?} is not a string")));
            bad.push(key.clone());
            continue;
        };
        if let Err(reason) = read_field(name, field.clone()) {
            problems.push((Some(name.to_owned()), reason));
            bad.push(key.clone());
        }
    }
    for name in REQUIRED {
        if !map.contains_key(name) {
            problems.push((Some(name.to_owned()), "missing".to_owned()));
        }
    }
    if problems.is_empty() {
        return (None, vec![(None, whole)]);
    }
    for key in &bad {
        map.remove(key);
    }
    let rest = serde_yaml::from_value::<RawPolicy>(Value::Mapping(map)).ok();
    (rest, problems)
}

/// Whether field `name` reads as its type on its own.
fn read_field(name: &str, value: Value) -> Result<(), String> {
    fn read<T: DeserializeOwned>(value: Value) -> Result<(), String> {
        serde_yaml::from_value::<T>(value)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    match name {
        "name" | "description" | "group" | "domain" | "time_zone" => read::<String>(value),
        "match" => read::<BTreeMap<String, String>>(value),
        "path_case" => read::<PathCase>(value),
        "key" | "replaces" => read::<Vec<String>>(value),
        "algorithm" => read::<AlgorithmName>(value),
        "limit" | "burst" | "report_debt_periods" => read::<u64>(value),
        "period" => read::<RawPeriod>(value),
        "timeout" | "permit_ttl" | "reservation_ttl" => read::<HumanDuration>(value),
        "limits" => read::<Vec<RawWindow>>(value),
        "local_limit" => read::<RawWindow>(value),
        "failure_mode" => read::<FailureMode>(value),
        "shadow" | "limit_override" | "reports" | "deny" | "lease" | "calendar"
        | "reservations" => read::<bool>(value),
        "enforce_percent" => read::<u8>(value),
        "tiers" => read::<RawTiers>(value),
        "cost" => read::<RawCost>(value),
        "envoy_stand_in" => read::<StandIn>(value),
        _ => Err("unknown field".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<RawPolicy, Vec<FieldError>> {
        match read_policy(serde_yaml::from_str(text).expect("yaml")) {
            (Some(policy), problems) if problems.is_empty() => Ok(policy),
            (_, problems) => Err(problems),
        }
    }

    #[test]
    fn every_field_of_a_full_policy_reads_on_its_own_too() {
        let full = "{name: a, description: d, match: {path: /x}, path_case: exact, group: g, \
                    key: [ip], algorithm: token_bucket, limit: 1, period: 1s, burst: 2, \
                    local_limit: {limit: 1, period: 1s}, failure_mode: closed, shadow: true, \
                    enforce_percent: 5, timeout: 1s, tiers: {levels: {gold: {multiplier: 2}}}, \
                    cost: {descriptor: op, table: {a: 1}}, domain: d, limit_override: false, \
                    reports: false, report_debt_periods: 3}";
        assert!(read(full).is_ok());
        let map: serde_yaml::Mapping = serde_yaml::from_str(full).expect("yaml");
        for (key, value) in map {
            let name = key.as_str().expect("string");
            assert_eq!(read_field(name, value), Ok(()), "{name}");
        }
        assert_eq!(
            read_field("limits", serde_yaml::from_str("[]").expect("yaml")),
            Ok(())
        );
    }

    #[test]
    fn every_bad_field_is_listed() {
        let problems = read("{name: a, algorithm: leaky, limit: x, colour: red, shadow: 3}")
            .err()
            .expect("invalid");
        let fields: Vec<_> = problems.iter().map(|(f, _)| f.as_deref()).collect();
        for expected in ["algorithm", "limit", "colour", "shadow", "key"] {
            assert!(
                fields.contains(&Some(expected)),
                "{expected} in {problems:?}"
            );
        }
        assert_eq!(problems.len(), 5, "{problems:?}");
        let value = serde_yaml::from_str(
            "{name: a, key: [ip], algorithm: fixed_window, limit: 0, colour: red}",
        );
        let (rest, problems) = read_policy(value.expect("yaml"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            rest.expect("read without `colour`").limit,
            Some(0),
            "for the caller to check"
        );
    }
}

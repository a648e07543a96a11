//! Calendar policies as `sluice config check` reads them: what builds, and every refusal with its
//! file and line.

use std::path::Path;

use crate::config::policy::parse_policies;
use crate::limit::{Algorithm, CalendarUnit, Descriptors};

fn check(text: &str) -> Result<crate::limit::PolicySet, String> {
    parse_policies(Path::new("p.yaml"), text).map_err(|e| e.to_string())
}

fn policy(fields: &str) -> String {
    format!(
        "policies:\n  - name: a\n    key: [tenant]\n    algorithm: fixed_window\n    limit: 500\n{fields}"
    )
}

#[test]
fn a_day_a_week_and_a_month_build_in_their_zone() {
    for (period, unit) in [
        ("1d", CalendarUnit::Day),
        ("24h", CalendarUnit::Day),
        ("1w", CalendarUnit::Week),
        ("7d", CalendarUnit::Week),
        ("1mo", CalendarUnit::Month),
    ] {
        let text = policy(&format!(
            "    period: {period}\n    calendar: true\n    time_zone: Europe/Berlin\n    tiers: {{levels: {{gold: {{multiplier: 2}}}}}}\n"
        ));
        let set = check(&text).unwrap_or_else(|e| panic!("{period}: {e}"));
        let a = set.get("a").expect("a");
        for tier in [None, Some("gold")] {
            let mut descriptors = Descriptors::new();
            if let Some(tier) = tier {
                descriptors.insert("tier".into(), tier.into());
            }
            let quota = a.quota_for(&descriptors, None).1;
            let Algorithm::FixedWindow(window) = quota.windows()[0] else {
                panic!("a fixed window");
            };
            let calendar = window.calendar_of().expect("a calendar");
            assert_eq!(
                (calendar.unit(), calendar.zone_name()),
                (unit, "Europe/Berlin")
            );
        }
    }
}

#[test]
fn bad_calendar_fields_are_refused_at_their_lines() {
    let cases = [
        (
            "    period: 1d\n    calendar: true\n    time_zone: Europe/Berlim\n",
            "p.yaml:8: policy `a`: field `time_zone`: unknown time zone \"Europe/Berlim\"",
        ),
        (
            "    period: 1h\n    calendar: true\n    time_zone: UTC\n",
            "p.yaml:6: policy `a`: field `period`: with `calendar: true`, period must be 1d",
        ),
        (
            "    period: 1d\n    calendar: true\n",
            "p.yaml:7: policy `a`: field `calendar`: needs `time_zone`",
        ),
        (
            "    period: 1d\n    time_zone: UTC\n",
            "p.yaml:7: policy `a`: field `time_zone`: applies only with `calendar: true`",
        ),
        (
            "    period: 1mo\n",
            "p.yaml:6: policy `a`: field `period`: 1w and 1mo are calendar periods",
        ),
        (
            "    period: 1d\n    calendar: true\n    time_zone: UTC\n    lease: true\n",
            "p.yaml:9: policy `a`: field `lease`: a calendar window is never leased",
        ),
        (
            "    period: 1fortnight\n",
            "p.yaml:6: policy `a`: field `period`: invalid duration",
        ),
    ];
    for (fields, expected) in cases {
        let error = check(&policy(fields)).expect_err(fields);
        assert!(error.contains(expected), "{expected}\nin\n{error}");
        assert_eq!(error.lines().count(), 1, "one problem each: {error}");
    }
    let log = "policies:\n  - {name: a, key: [ip], algorithm: sliding_log, limit: 5, period: 1d, calendar: true, time_zone: UTC}\n";
    let error = check(log).expect_err("a sliding log");
    assert!(
        error
            .contains("p.yaml:2: policy `a`: field `calendar`: calendar windows are fixed windows"),
        "{error}"
    );
    let several = "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limits: [{limit: 5, period: 1d}], calendar: true, time_zone: UTC}\n";
    let error = check(several).expect_err("several windows");
    assert!(
        error.contains("field `limits`: a calendar policy has one window"),
        "{error}"
    );
}

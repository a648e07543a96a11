//! Calendar windows in a policy file: `calendar: true` with `time_zone` (an IANA name) and a
//! `period` of `1d`, `1w` or `1mo` on a fixed window of one window. `period` reads as a duration
//! or as one of the calendar's own spellings (`1w`, `1mo`: a month has no fixed length, so it is
//! never a duration); what a calendar may not be combined with is refused here, each problem at
//! its field's line.

use serde::{Deserialize, Deserializer};

use super::policy_fields::RawPolicy;
use super::policy_quota::{AlgorithmName, FieldProblem};
use super::HumanDuration;
use crate::config::{parse_duration, DURATION_FORM};
use crate::limit::{Calendar, CalendarUnit};

const DAY_US: u64 = 86_400_000_000;

/// A policy's `period` as written: a duration, or a calendar's week or month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RawPeriod {
    /// `250ms`, `1h`, `1d`, `7d`, ...
    Span(HumanDuration),
    /// `1w`: a calendar week.
    Week,
    /// `1mo`: a calendar month.
    Month,
}

impl<'de> Deserialize<'de> for RawPeriod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(PeriodText)
    }
}

struct PeriodText;

impl serde::de::Visitor<'_> for PeriodText {
    type Value = RawPeriod;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{DURATION_FORM}, or 1w or 1mo with calendar: true")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<RawPeriod, E> {
        match text.trim() {
            "1w" => Ok(RawPeriod::Week),
            "1mo" => Ok(RawPeriod::Month),
            other => parse_duration(other)
                .map(|us| RawPeriod::Span(HumanDuration(us)))
                .map_err(E::custom),
        }
    }
}

/// The period a policy's quota is built with: a calendar's unit's nominal length (the windows
/// get their calendar after), or the duration written. A `1w` or `1mo` that is no calendar's is
/// reported by [`read`]: a day stands in for it, so that `period` is not also called missing.
pub(super) fn quota_period(
    calendar: Option<&Calendar>,
    period: Option<RawPeriod>,
) -> Option<HumanDuration> {
    match (calendar, period?) {
        (Some(calendar), _) => Some(HumanDuration(calendar.unit().nominal_us())),
        (None, RawPeriod::Span(span)) => Some(span),
        (None, RawPeriod::Week | RawPeriod::Month) => Some(HumanDuration(DAY_US)),
    }
}

/// The calendar unit a `period` names with `calendar: true`.
fn unit(period: RawPeriod) -> Option<CalendarUnit> {
    match period {
        RawPeriod::Span(HumanDuration(DAY_US)) => Some(CalendarUnit::Day),
        RawPeriod::Span(HumanDuration(us)) if us == 7 * DAY_US => Some(CalendarUnit::Week),
        RawPeriod::Week => Some(CalendarUnit::Week),
        RawPeriod::Month => Some(CalendarUnit::Month),
        RawPeriod::Span(_) => None,
    }
}

/// The policy's calendar (`None` without `calendar: true`) and every problem with the calendar
/// fields; a calendar policy's quota is built with the unit's nominal length as its period.
pub(super) fn read(raw: &RawPolicy) -> (Option<Calendar>, Vec<FieldProblem>) {
    let mut problems: Vec<FieldProblem> = Vec::new();
    let mut bad = |field: &'static str, reason: &str| problems.push((field, reason.into()).into());
    if !raw.calendar {
        if raw.time_zone.is_some() {
            bad("time_zone", "applies only with `calendar: true`");
        }
        if matches!(raw.period, Some(RawPeriod::Week | RawPeriod::Month)) {
            bad(
                "period",
                "1w and 1mo are calendar periods: add `calendar: true` and `time_zone`, or give \
                 a duration such as 7d",
            );
        }
        return (None, problems);
    }
    if raw.algorithm != Some(AlgorithmName::FixedWindow) {
        bad(
            "calendar",
            "calendar windows are fixed windows: give `algorithm: fixed_window`",
        );
    }
    if raw.deny {
        bad("calendar", "a deny policy has no window");
    }
    if raw.limits.is_some() {
        bad(
            "limits",
            "a calendar policy has one window: give `limit` and `period` (1d, 1w or 1mo)",
        );
    }
    if raw.lease {
        bad(
            "lease",
            "a calendar window is never leased (a lease's units are kept within a window of \
             fixed length)",
        );
    }
    let unit = match raw.period {
        Some(period) => unit(period).or_else(|| {
            bad(
                "period",
                "with `calendar: true`, period must be 1d (a local day), 1w (Monday to Monday) \
                 or 1mo (the 1st to the 1st)",
            );
            None
        }),
        None => None,
    };
    let zone = match raw.time_zone.as_deref() {
        None => {
            bad(
                "calendar",
                "needs `time_zone`: the IANA name of the zone whose midnights start the windows \
                 (Europe/Berlin, America/New_York, or UTC)",
            );
            None
        }
        Some(zone) => Some(zone),
    };
    let calendar = match (unit, zone) {
        (Some(unit), Some(zone)) => match Calendar::new(unit, zone) {
            Ok(calendar) => Some(calendar),
            Err(error) => {
                bad("time_zone", &error.to_string());
                None
            }
        },
        (None, Some(zone)) => {
            // The zone is checked even when the period is wrong: every problem at once.
            if let Err(error) = Calendar::new(CalendarUnit::Day, zone) {
                bad("time_zone", &error.to_string());
            }
            None
        }
        _ => None,
    };
    (calendar, problems)
}

#[cfg(test)]
#[path = "policy_calendar_tests.rs"]
mod tests;

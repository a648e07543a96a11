//! Calendar boundaries across both daylight saving changes of 2026 in Europe/Berlin (last Sundays
//! of March and October) and America/New_York (March 8, November 1): the 23-hour and the 25-hour
//! day, and the week and the month that hold them. Expected instants are written in UTC (checked
//! against Python's zoneinfo when written).

use super::*;

const HOUR: Micros = 3_600_000_000;

/// An instant written in UTC (`2026-03-28T23:00:00Z`) in µs since the epoch.
fn utc(text: &str) -> Micros {
    let at: Timestamp = text.parse().expect("a UTC instant");
    u64::try_from(at.as_microsecond()).expect("after 1970")
}

fn calendar(unit: CalendarUnit, zone: &str) -> Calendar {
    Calendar::new(unit, zone).expect("a known zone")
}

/// `window_at` anywhere in `[start, end)` gives that window, and the µs on either side of it
/// belong to its neighbours.
fn assert_window(cal: &Calendar, start: &str, end: &str, hours: u64) {
    let (start, end) = (utc(start), utc(end));
    assert_eq!(end - start, hours * HOUR, "{cal:?}: length");
    for now in [start, start + 1, (start + end) / 2, end - 1] {
        assert_eq!(cal.window_at(now), (start, end), "{cal:?} at {now}");
    }
    assert_eq!(
        cal.window_at(start - 1).1,
        start,
        "{cal:?}: the window before"
    );
    assert_eq!(cal.window_at(end).0, end, "{cal:?}: the window after");
    let near = cal.boundaries_near(start + HOUR);
    assert_eq!((near[1], near[2]), (start, end), "{cal:?}: boundaries");
    assert_eq!(near[0], cal.window_at(start - 1).0);
    assert_eq!(near[3], cal.window_at(end).1);
}

#[test]
fn berlin_days_of_23_and_25_hours() {
    let day = calendar(CalendarUnit::Day, "Europe/Berlin");
    assert_window(&day, "2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z", 24);
    assert_window(&day, "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23);
    assert_window(&day, "2026-03-29T22:00:00Z", "2026-03-30T22:00:00Z", 24);
    assert_window(&day, "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25);
    assert_window(&day, "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z", 24);
}

#[test]
fn new_york_days_of_23_and_25_hours() {
    let day = calendar(CalendarUnit::Day, "America/New_York");
    assert_window(&day, "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23);
    assert_window(&day, "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25);
    assert_window(&day, "2026-11-02T05:00:00Z", "2026-11-03T05:00:00Z", 24);
}

#[test]
fn weeks_start_on_monday_and_hold_the_changes() {
    let berlin = calendar(CalendarUnit::Week, "Europe/Berlin");
    assert_window(
        &berlin,
        "2026-03-22T23:00:00Z",
        "2026-03-29T22:00:00Z",
        7 * 24 - 1,
    );
    assert_window(
        &berlin,
        "2026-10-18T22:00:00Z",
        "2026-10-25T23:00:00Z",
        7 * 24 + 1,
    );
    assert_window(
        &berlin,
        "2026-10-25T23:00:00Z",
        "2026-11-01T23:00:00Z",
        7 * 24,
    );
    let new_york = calendar(CalendarUnit::Week, "America/New_York");
    assert_window(
        &new_york,
        "2026-03-02T05:00:00Z",
        "2026-03-09T04:00:00Z",
        7 * 24 - 1,
    );
    assert_window(
        &new_york,
        "2026-10-26T04:00:00Z",
        "2026-11-02T05:00:00Z",
        7 * 24 + 1,
    );
}

#[test]
fn months_start_on_the_first_and_hold_the_changes() {
    let berlin = calendar(CalendarUnit::Month, "Europe/Berlin");
    assert_window(
        &berlin,
        "2026-02-28T23:00:00Z",
        "2026-03-31T22:00:00Z",
        31 * 24 - 1,
    );
    assert_window(
        &berlin,
        "2026-09-30T22:00:00Z",
        "2026-10-31T23:00:00Z",
        31 * 24 + 1,
    );
    assert_window(
        &berlin,
        "2026-01-31T23:00:00Z",
        "2026-02-28T23:00:00Z",
        28 * 24,
    );
    let new_york = calendar(CalendarUnit::Month, "America/New_York");
    assert_window(
        &new_york,
        "2026-03-01T05:00:00Z",
        "2026-04-01T04:00:00Z",
        31 * 24 - 1,
    );
    assert_window(
        &new_york,
        "2026-11-01T04:00:00Z",
        "2026-12-01T05:00:00Z",
        30 * 24 + 1,
    );
}

/// Where a zone's clocks skip midnight (Sao Paulo, 18 October 2015: 00:00 became 01:00), the day
/// starts at its first instant, 01:00 local.
#[test]
fn a_day_without_midnight_starts_at_its_first_instant() {
    let day = calendar(CalendarUnit::Day, "America/Sao_Paulo");
    assert_window(&day, "2015-10-17T03:00:00Z", "2015-10-18T03:00:00Z", 24);
    assert_window(&day, "2015-10-18T03:00:00Z", "2015-10-19T02:00:00Z", 23);
}

#[test]
fn utc_windows_are_aligned_days() {
    let day = calendar(CalendarUnit::Day, "UTC");
    assert_window(&day, "2026-03-29T00:00:00Z", "2026-03-30T00:00:00Z", 24);
}

#[test]
fn zones_are_known_by_their_iana_name_only() {
    let lower = calendar(CalendarUnit::Day, "europe/berlin");
    assert_eq!(lower.zone_name(), "Europe/Berlin");
    assert_eq!(lower, calendar(CalendarUnit::Day, "Europe/Berlin"));
    assert_ne!(lower, calendar(CalendarUnit::Week, "Europe/Berlin"));
    for bad in [
        "Europe/Berlim",
        "CEST+2",
        "",
        "Etc/Unknown",
        &"A/".repeat(100),
    ] {
        let error = Calendar::new(CalendarUnit::Day, bad).unwrap_err();
        assert!(error.to_string().contains("unknown time zone"), "{error}");
    }
}

#[test]
fn times_far_from_now_do_not_panic() {
    let month = calendar(CalendarUnit::Month, "Europe/Berlin");
    for now in [
        0,
        1,
        3_600_000_000,
        Micros::MAX / 2,
        Micros::MAX - 1,
        Micros::MAX,
    ] {
        let (start, end) = month.window_at(now);
        assert!(start <= now && (now < end || end == Micros::MAX), "{now}");
        let near = month.boundaries_near(now);
        assert!(near.windows(2).all(|w| w[0] <= w[1]), "{near:?}");
    }
}

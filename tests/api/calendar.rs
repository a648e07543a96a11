//! Calendar windows (`calendar: true`) through `POST /v1/check` on the embedded store, on the
//! daemon's manual clock: local days, ISO weeks and months in Europe/Berlin and America/New_York
//! across both daylight saving changes of 2026 (the 23-hour and the 25-hour day, the week and the
//! month holding them). A denial's `Retry-After`, `retry_after_ms` and the reset point at the next
//! local boundary; the boundary itself starts a fresh window. The Lua twin on Redis is held to the
//! same instants in `redis/calendar.rs`.

use serde_json::{json, Value};

use crate::helpers::{get, header, json_of, spawn_app_with, TestApp};

const POLICIES: &str = "
policies:
  - {name: berlin_day, key: [tenant], algorithm: fixed_window, limit: 3, period: 1d, calendar: true, time_zone: Europe/Berlin, failure_mode: closed}
  - {name: berlin_week, key: [tenant], algorithm: fixed_window, limit: 3, period: 1w, calendar: true, time_zone: Europe/Berlin, failure_mode: closed}
  - {name: berlin_month, key: [tenant], algorithm: fixed_window, limit: 3, period: 1mo, calendar: true, time_zone: Europe/Berlin, failure_mode: closed}
  - {name: ny_day, key: [tenant], algorithm: fixed_window, limit: 3, period: 1d, calendar: true, time_zone: America/New_York, failure_mode: closed}
  - {name: ny_week, key: [tenant], algorithm: fixed_window, limit: 3, period: 1w, calendar: true, time_zone: America/New_York, failure_mode: closed}
  - {name: ny_month, key: [tenant], algorithm: fixed_window, limit: 3, period: 1mo, calendar: true, time_zone: America/New_York, failure_mode: closed}
";

const SEC_US: u64 = 1_000_000;
const HOUR_S: u64 = 3_600;

/// An instant written in UTC (`2026-03-28T23:00:00Z`), in µs since the epoch: proleptic
/// Gregorian days from the civil date (H. Hinnant's `days_from_civil`), no time zone library.
pub(crate) fn utc(text: &str) -> u64 {
    let number = |range: std::ops::Range<usize>| text[range].parse::<u64>().expect("digits");
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    let (hour, minute) = (number(11..13), number(14..16));
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    (days * 86_400 + hour * 3_600 + minute * 60) * SEC_US
}

fn body(policy: &str, tenant: &str) -> Value {
    json!({"policy": policy, "descriptors": {"tenant": tenant}})
}

/// Spends the whole limit at `at` (µs) and returns the denial's wait in seconds (checked against
/// its header and its ms figure) and its reset.
async fn exhaust_at(app: &TestApp, policy: &str, tenant: &str, at: u64) -> (u64, String) {
    app.clock.set(at);
    for i in 0..3 {
        let reply = app.check_tcp(&body(policy, tenant)).await;
        assert_eq!(reply.status, 200, "{policy} check {i}: {}", json_of(&reply));
    }
    let denied = app.check_tcp(&body(policy, tenant)).await;
    assert_eq!(denied.status, 429, "{policy}: {}", json_of(&denied));
    let answer = json_of(&denied);
    let retry_ms = answer["retry_after_ms"].as_u64().expect("retry_after_ms");
    let retry_s = header(&denied, "retry-after")
        .parse::<u64>()
        .expect("seconds");
    assert_eq!(retry_s, retry_ms.div_ceil(1_000), "{answer}");
    let reset = header(&denied, "x-ratelimit-reset").to_owned();
    (retry_ms, reset)
}

/// The limit is spent at `start` (the window's first µs): the wait is the whole window, in whole
/// hours; one µs before `end` it is still denied, at `end` a fresh window admits.
async fn window(app: &TestApp, policy: &str, start: &str, end: &str, hours: u64) {
    let (start, end) = (utc(start), utc(end));
    assert_eq!(
        end - start,
        hours * HOUR_S * SEC_US,
        "the expected window itself"
    );
    let tenant = format!("t{start}");
    let (retry_ms, reset) = exhaust_at(app, policy, &tenant, start).await;
    assert_eq!(
        retry_ms,
        hours * HOUR_S * 1_000,
        "{policy}: waits for the next boundary"
    );
    assert_eq!(reset, (hours * HOUR_S).to_string(), "{policy}: reset");
    app.clock.set(end - 1);
    let reply = app.check_tcp(&body(policy, &tenant)).await;
    assert_eq!(reply.status, 429, "{policy}: one µs before the boundary");
    assert_eq!(
        json_of(&reply)["retry_after_ms"],
        1,
        "{policy}: 1 µs, rounded up"
    );
    app.clock.set(end);
    let reply = app.check_tcp(&body(policy, &tenant)).await;
    assert_eq!(
        reply.status, 200,
        "{policy}: the boundary starts a fresh window"
    );
    assert_eq!(header(&reply, "x-ratelimit-remaining"), "2");
}

#[tokio::test]
async fn days_of_23_and_25_hours_in_berlin_and_new_york() {
    let app = spawn_app_with(POLICIES).await;
    window(
        &app,
        "berlin_day",
        "2026-03-28T23:00:00Z",
        "2026-03-29T22:00:00Z",
        23,
    )
    .await;
    window(
        &app,
        "berlin_day",
        "2026-10-24T22:00:00Z",
        "2026-10-25T23:00:00Z",
        25,
    )
    .await;
    window(
        &app,
        "berlin_day",
        "2026-10-25T23:00:00Z",
        "2026-10-26T23:00:00Z",
        24,
    )
    .await;
    window(
        &app,
        "ny_day",
        "2026-03-08T05:00:00Z",
        "2026-03-09T04:00:00Z",
        23,
    )
    .await;
    window(
        &app,
        "ny_day",
        "2026-11-01T04:00:00Z",
        "2026-11-02T05:00:00Z",
        25,
    )
    .await;
}

#[tokio::test]
async fn weeks_from_monday_across_both_changes() {
    let app = spawn_app_with(POLICIES).await;
    window(
        &app,
        "berlin_week",
        "2026-03-22T23:00:00Z",
        "2026-03-29T22:00:00Z",
        167,
    )
    .await;
    window(
        &app,
        "berlin_week",
        "2026-10-18T22:00:00Z",
        "2026-10-25T23:00:00Z",
        169,
    )
    .await;
    window(
        &app,
        "ny_week",
        "2026-03-02T05:00:00Z",
        "2026-03-09T04:00:00Z",
        167,
    )
    .await;
    window(
        &app,
        "ny_week",
        "2026-10-26T04:00:00Z",
        "2026-11-02T05:00:00Z",
        169,
    )
    .await;
}

#[tokio::test]
async fn months_from_the_first_across_both_changes() {
    let app = spawn_app_with(POLICIES).await;
    window(
        &app,
        "berlin_month",
        "2026-02-28T23:00:00Z",
        "2026-03-31T22:00:00Z",
        743,
    )
    .await;
    window(
        &app,
        "berlin_month",
        "2026-09-30T22:00:00Z",
        "2026-10-31T23:00:00Z",
        745,
    )
    .await;
    window(
        &app,
        "ny_month",
        "2026-03-01T05:00:00Z",
        "2026-04-01T04:00:00Z",
        743,
    )
    .await;
    window(
        &app,
        "ny_month",
        "2026-11-01T04:00:00Z",
        "2026-12-01T05:00:00Z",
        721,
    )
    .await;
}

/// Mid-window, the wait is what is left of the local day, not of a 24-hour period since the
/// epoch: 21:30 in Berlin on the 23-hour day waits 2.5 hours (to local midnight).
#[tokio::test]
async fn a_denial_mid_day_waits_for_local_midnight() {
    let app = spawn_app_with(POLICIES).await;
    let (retry_ms, reset) =
        exhaust_at(&app, "berlin_day", "mid", utc("2026-03-29T19:30:00Z")).await;
    assert_eq!(retry_ms, 2 * HOUR_S * 1_000 + 30 * 60 * 1_000);
    assert_eq!(reset, (2 * HOUR_S + 30 * 60).to_string());
}

/// The admin listener shows a calendar policy as written: its unit, `calendar` and its zone.
#[tokio::test]
async fn policies_show_the_calendar_as_written() {
    let app = spawn_app_with(POLICIES).await;
    let reply = get(&sluice::client::Target::Tcp(app.admin), "/v1/policies").await;
    let shown = json_of(&reply).to_string();
    let all = json_of(&reply);
    let list = all["policies"].as_array().cloned().unwrap_or_default();
    let month = list
        .iter()
        .find(|p| p["name"] == "ny_month")
        .unwrap_or_else(|| panic!("ny_month in {shown}"));
    assert_eq!(month["period"], "1mo", "{month}");
    assert_eq!(month["calendar"], true, "{month}");
    assert_eq!(month["time_zone"], "America/New_York", "{month}");
}

//! Calendar windows (`calendar: true`): a fixed window whose boundaries are local midnights in an
//! IANA time zone instead of multiples of its period since the epoch. A day starts at 00:00 local
//! time, a week on Monday 00:00 (ISO 8601), a month on the 1st at 00:00; where a zone's clocks
//! skip midnight (a daylight saving change at 00:00), the window starts at the first instant of
//! the local day. Daylight saving makes some days 23 and some 25 hours long, and months are 28 to
//! 31 days: a window's length comes from the zone's rules (jiff's bundled tzdb), never from a
//! fixed period.
//!
//! Pure: no clock, no I/O (the tzdb is compiled in). A zone is looked up once by name and kept for
//! the life of the process ([`Calendar::new`]), so that a calendar is `Copy` like the rest of an
//! [`Algorithm`](super::Algorithm).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use jiff::civil::Date;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::{Timestamp, ToSpan};

use super::Micros;

/// The length of a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From 00:00 local to the next 00:00 (23, 24 or 25 hours).
    Day,
    /// From Monday 00:00 local to the next Monday 00:00.
    Week,
    /// From the 1st at 00:00 local to the next month's 1st.
    Month,
}

impl CalendarUnit {
    /// The spelling policies use and answers show: `1d`, `1w`, `1mo`.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "1d",
            CalendarUnit::Week => "1w",
            CalendarUnit::Month => "1mo",
        }
    }

    /// The unit's usual length (a month: 30 days), for what needs one number: the advertised
    /// window of `RateLimit-Policy`, the sizing of per-pod shares. Never a boundary.
    pub fn nominal_us(self) -> Micros {
        const DAY: Micros = 86_400_000_000;
        match self {
            CalendarUnit::Day => DAY,
            CalendarUnit::Week => 7 * DAY,
            CalendarUnit::Month => 30 * DAY,
        }
    }
}

/// A time zone known to the bundled tzdb, interned: its canonical IANA name and rules, kept for
/// the process's life (at most one entry per zone of the tzdb, about 600).
#[derive(Clone, Copy)]
struct Zone {
    name: &'static str,
    tz: &'static TimeZone,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

/// A calendar: windows of one [`CalendarUnit`] in one time zone.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: Zone,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({} in {})", self.unit.name(), self.zone.name)
    }
}

/// Why a time zone was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownZone(pub String);

impl fmt::Display for UnknownZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown time zone {:?}: give an IANA name such as Europe/Berlin, America/New_York \
             or UTC",
            self.0
        )
    }
}

impl std::error::Error for UnknownZone {}

/// The bundled database and the zones interned so far, by the name as written.
fn zones() -> &'static (TimeZoneDatabase, Mutex<HashMap<String, Zone>>) {
    static ZONES: OnceLock<(TimeZoneDatabase, Mutex<HashMap<String, Zone>>)> = OnceLock::new();
    ZONES.get_or_init(|| (TimeZoneDatabase::bundled(), Mutex::new(HashMap::new())))
}

/// Longest zone name looked up (IANA names are at most about 30 bytes).
const MAX_ZONE_NAME: usize = 64;

impl Calendar {
    /// Windows of `unit` in the IANA time zone `zone` (case-insensitive, e.g. `Europe/Berlin`).
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Self, UnknownZone> {
        let unknown = || UnknownZone(zone.chars().take(MAX_ZONE_NAME).collect());
        if zone.len() > MAX_ZONE_NAME || zone.eq_ignore_ascii_case("Etc/Unknown") {
            return Err(unknown());
        }
        let (db, interned) = zones();
        let mut interned = interned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&zone) = interned.get(zone) {
            return Ok(Calendar { unit, zone });
        }
        let tz = db.get(zone).map_err(|_| unknown())?;
        let name = tz.iana_name().unwrap_or(zone).to_owned();
        // Leaked once per distinct name written; names are bounded by the tzdb (an unknown name
        // never gets here) and by their spellings' case only.
        let interned_zone = match interned.values().find(|z| z.name == name) {
            Some(&known) => known,
            None => Zone {
                name: Box::leak(name.into_boxed_str()),
                tz: Box::leak(Box::new(tz)),
            },
        };
        interned.insert(zone.to_owned(), interned_zone);
        Ok(Calendar {
            unit,
            zone: interned_zone,
        })
    }

    /// The window's unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's canonical IANA name.
    pub fn zone_name(&self) -> &'static str {
        self.zone.name
    }

    /// The first local date of the unit's window holding `date`.
    fn unit_start(&self, date: Date) -> Date {
        match self.unit {
            CalendarUnit::Day => date,
            CalendarUnit::Week => date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .unwrap_or(date),
            CalendarUnit::Month => date.first_of_month(),
        }
    }

    /// The first local date of the window after the one starting on `start`.
    fn next(&self, start: Date) -> Option<Date> {
        match self.unit {
            CalendarUnit::Day => start.checked_add(1.day()).ok(),
            CalendarUnit::Week => start.checked_add(7.days()).ok(),
            CalendarUnit::Month => start.checked_add(1.month()).ok(),
        }
    }

    /// The first local date of the window before the one starting on `start`.
    fn previous(&self, start: Date) -> Option<Date> {
        match self.unit {
            CalendarUnit::Day => start.checked_sub(1.day()).ok(),
            CalendarUnit::Week => start.checked_sub(7.days()).ok(),
            CalendarUnit::Month => start.checked_sub(1.month()).ok(),
        }
    }

    /// The instant (µs since the epoch, 0 before it) the local day `date` begins: its midnight,
    /// or where midnight falls in a gap, the first instant after the gap; where midnight comes
    /// twice, the first.
    fn instant(&self, date: Date) -> Option<Micros> {
        let zoned = date.to_zoned_datetime(self.zone.tz.clone()).ok()?;
        Some(u64::try_from(zoned.timestamp().as_microsecond()).unwrap_or(0))
    }

    /// The first date of the window holding `now`, or `None` beyond what the tzdb spans
    /// (years -9999 to 9999).
    fn start_date(&self, now: Micros) -> Option<Date> {
        let at = Timestamp::from_microsecond(i64::try_from(now).ok()?).ok()?;
        let local = at.to_zoned_datetime(self.zone.tz.clone()).date();
        let mut start = self.unit_start(local);
        // A zone whose clocks go back across midnight can show `now` under a date whose window
        // has not begun yet, or one already over: step to the window that holds it (boundaries
        // only grow, so once or twice at most).
        for _ in 0..4 {
            if self.instant(start)? > now {
                start = self.previous(start)?;
            } else if self.instant(self.next(start)?)? <= now {
                start = self.next(start)?;
            } else {
                break;
            }
        }
        Some(start)
    }

    /// The window holding `now`: `[start, end)` in µs since the epoch. Outside the years the tzdb
    /// spans (never in practice), one window from 0 to `u64::MAX`.
    pub fn window_at(&self, now: Micros) -> (Micros, Micros) {
        let window = || {
            let start = self.start_date(now)?;
            Some((self.instant(start)?, self.instant(self.next(start)?)?))
        };
        window().unwrap_or((0, Micros::MAX))
    }

    /// The boundaries around `near` that a store picks its window from by its own clock: the
    /// start of the window before the one holding `near`, that window's start and end, and the
    /// end of the window after it (three windows, ascending). What Redis is sent: its own clock
    /// decides the window among them.
    pub fn boundaries_near(&self, near: Micros) -> [Micros; 4] {
        let bounds = || {
            let start = self.start_date(near)?;
            let next = self.next(start)?;
            Some([
                self.instant(self.previous(start)?)?,
                self.instant(start)?,
                self.instant(next)?,
                self.instant(self.next(next)?)?,
            ])
        };
        let (start, end) = self.window_at(near);
        bounds().unwrap_or([start, start, end, end])
    }
}

#[cfg(test)]
#[path = "calendar_tests.rs"]
mod tests;

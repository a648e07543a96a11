//! The one canonical spelling of a period ("1h30m", "1s", "250ms"): how policies, settings and
//! answers print a period, and part of a stored key's name for each window of a policy of
//! several, so it never changes.

use std::fmt;

use super::Micros;

/// Units from the longest down, with their length in µs.
const UNITS: [(Micros, &str); 6] = [
    (86_400_000_000, "d"),
    (3_600_000_000, "h"),
    (60_000_000, "m"),
    (1_000_000, "s"),
    (1_000, "ms"),
    (1, "us"),
];

/// The canonical spelling of `period_us`: every unit that is not zero, longest first
/// (`1h30m`, `1ms500us`; `0s` for none). Written straight into the formatter.
pub fn period_name(period_us: Micros) -> PeriodName {
    PeriodName(period_us)
}

/// A period shown in its canonical spelling (see [`period_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodName(Micros);

impl fmt::Display for PeriodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0s");
        }
        let mut rest = self.0;
        for (scale, unit) in UNITS {
            if rest >= scale {
                write!(f, "{}{unit}", rest / scale)?;
                rest %= scale;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::period_name;

    #[test]
    fn every_unit_that_is_not_zero_longest_first() {
        assert_eq!(period_name(5_400_000_000).to_string(), "1h30m");
        assert_eq!(period_name(1_500).to_string(), "1ms500us");
        assert_eq!(period_name(86_400_000_000).to_string(), "1d");
        assert_eq!(period_name(0).to_string(), "0s");
    }
}

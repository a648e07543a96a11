//! Human durations ("250ms", "1m", "1h30m") for policy and settings files, read into microseconds.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limit::{period_name, Micros};

/// Parses `<integer><unit>` groups, summed: units `us`, `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Micros, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total: Micros = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number, e.g. \"500ms\", \"1m\", \"1h30m\""
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let scale: u64 = match &rest[..unit_len] {
            "us" => 1,
            "ms" => 1_000,
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            "d" => 86_400_000_000,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit (us, ms, s, m, h, d)"
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (use us, ms, s, m, h, d)"
                ))
            }
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(scale)
            .and_then(|us| total.checked_add(us))
            .ok_or_else(|| format!("invalid duration {text:?}: too large"))?;
    }
    Ok(total)
}

/// A duration written the human way in config files; holds microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Micros);

impl HumanDuration {
    /// As a std duration.
    pub fn as_std(self) -> std::time::Duration {
        std::time::Duration::from_micros(self.0)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The canonical spelling, which key names use too.
        fmt::Display::fmt(&period_name(self.0), f)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(DurationText)
    }
}

/// Reads a duration's text; anything else is "expected a duration such as 250ms or 1m", which
/// is what an operator needs to read (not serde's "expected a string").
struct DurationText;

impl serde::de::Visitor<'_> for DurationText {
    type Value = HumanDuration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(DURATION_FORM)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<HumanDuration, E> {
        parse_duration(text).map(HumanDuration).map_err(E::custom)
    }
}

/// How a duration is written, for error messages.
pub const DURATION_FORM: &str = "a duration such as 250ms or 1m";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("1m"), Ok(60_000_000));
        assert_eq!(parse_duration("5m"), Ok(300_000_000));
        assert_eq!(parse_duration("250ms"), Ok(250_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000_000));
        assert_eq!(parse_duration("7us"), Ok(7));
    }

    #[test]
    fn rejects_nonsense_with_a_reason() {
        for bad in ["", "5", "m", "5x", "1.5s", "-1s", "99999999999999999999d"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_back() {
        assert_eq!(HumanDuration(5_400_000_000).to_string(), "1h30m");
        assert_eq!(HumanDuration(1_500).to_string(), "1ms500us");
        assert_eq!(
            parse_duration(&HumanDuration(93_784_005_006).to_string()),
            Ok(93_784_005_006)
        );
    }
}

//! Kubernetes resource quantities (`50m`, `32Mi`, `0.5`), the subset a sidecar's requests and
//! limits need: a plain decimal number and an optional SI (`m`, `k`, `M`, ...) or binary (`Ki`,
//! `Mi`, ...) suffix. Parsed so that a value the API server would refuse (which would fail the
//! pod's admission) is refused here first, and so that a request can be compared to its limit.

/// A valid quantity: the text as written (that is what goes into the manifest) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    text: String,
    /// The value in billionths of the unit (nano-cores, nano-bytes): exact for every suffix.
    nanos: u128,
}

/// Longest quantity accepted, in bytes.
const MAX_LEN: usize = 24;
/// Most digits before and after the decimal point.
const MAX_INT_DIGITS: usize = 15;
const MAX_FRACTION_DIGITS: usize = 9;

/// The value of one unit of each suffix, in billionths.
fn suffix_nanos(suffix: &str) -> Option<u128> {
    const GIGA: u128 = 1_000_000_000;
    let power = |base: u128, exp: u32| base.pow(exp);
    Some(match suffix {
        "n" => 1,
        "u" => 1_000,
        "m" => 1_000_000,
        "" => GIGA,
        "k" => GIGA * power(10, 3),
        "M" => GIGA * power(10, 6),
        "G" => GIGA * power(10, 9),
        "T" => GIGA * power(10, 12),
        "P" => GIGA * power(10, 15),
        "E" => GIGA * power(10, 18),
        "Ki" => GIGA * power(1024, 1),
        "Mi" => GIGA * power(1024, 2),
        "Gi" => GIGA * power(1024, 3),
        "Ti" => GIGA * power(1024, 4),
        "Pi" => GIGA * power(1024, 5),
        "Ei" => GIGA * power(1024, 6),
        _ => return None,
    })
}

impl Quantity {
    /// Parses `text`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() || text.len() > MAX_LEN {
            return Err(format!(
                "{text:?} is not a quantity (1 to {MAX_LEN} characters)"
            ));
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let (int, fraction) = number.split_once('.').unwrap_or((number, ""));
        let plain = !int.is_empty()
            && int.len() <= MAX_INT_DIGITS
            && int.bytes().all(|b| b.is_ascii_digit())
            && fraction.len() <= MAX_FRACTION_DIGITS
            && fraction.bytes().all(|b| b.is_ascii_digit())
            && number.contains('.') != fraction.is_empty();
        if !plain {
            return Err(format!(
                "{text:?} is not a quantity: expected digits, an optional fraction and a suffix \
                 such as 50m, 0.5, 32Mi or 1Gi"
            ));
        }
        let unit = suffix_nanos(suffix).ok_or_else(|| {
            format!("{text:?}: unknown suffix {suffix:?} (use m, k, M, G, Ki, Mi or Gi)")
        })?;
        let scale = 10u128.pow(fraction.len() as u32);
        // At most 24 digits (below 2^80); the product with the unit is checked.
        let digits: u128 = format!("{int}{fraction}")
            .parse()
            .map_err(|_| format!("{text:?} is not a quantity"))?;
        let nanos = digits
            .checked_mul(unit)
            .map(|n| n / scale)
            .ok_or_else(|| format!("{text:?} is too large"))?;
        Ok(Self {
            text: text.to_owned(),
            nanos,
        })
    }

    /// The quantity as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it lies within `[min, max]` (both parsed from trusted constants).
    pub fn within(&self, min: &str, max: &str) -> bool {
        let bound = |text: &str| Self::parse(text).map_or(0, |q| q.nanos);
        (bound(min)..=bound(max)).contains(&self.nanos)
    }

    /// Whether it is at most `other`.
    pub fn at_most(&self, other: &Quantity) -> bool {
        self.nanos <= other.nanos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(text: &str) -> u128 {
        Quantity::parse(text).expect(text).nanos
    }

    #[test]
    fn suffixes_scale_exactly() {
        assert_eq!(nanos("50m"), 50_000_000);
        assert_eq!(nanos("0.5"), 500_000_000);
        assert_eq!(nanos("1"), 1_000_000_000);
        assert_eq!(nanos("32Mi"), 32 * 1024 * 1024 * 1_000_000_000);
        assert_eq!(nanos("1.5Gi"), 3 * 512 * 1024 * 1024 * 1_000_000_000);
        assert_eq!(nanos("128M"), 128_000_000 * 1_000_000_000);
        assert!(Quantity::parse("1Gi")
            .expect("1Gi")
            .at_most(&Quantity::parse("1024Mi").expect("1024Mi")));
        assert!(!Quantity::parse("1025Mi")
            .expect("q")
            .at_most(&Quantity::parse("1Gi").expect("q")));
        assert!(Quantity::parse("100m").expect("q").within("1m", "64"));
        assert!(!Quantity::parse("65").expect("q").within("1m", "64"));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "-1",
            "+1",
            "1e3",
            "1.",
            ".5",
            "1..5",
            "1.2.3",
            "Mi",
            "1mi",
            "1 Mi",
            "1MiB",
            "abc",
            "0x10",
            "1.0000000001",
            "9999999999999999",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} accepted");
        }
        let huge = Quantity::parse("999999999999999Ei").expect_err("overflows");
        assert!(huge.contains("too large"), "{huge}");
    }
}

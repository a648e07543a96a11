//! The serving certificate's `notAfter`, read from its DER (RFC 5280: `Certificate` ->
//! `tbsCertificate` -> `validity`), for `sluice_injector_certificate_expiry_seconds`. A few
//! bounded reads of definite-length DER; anything unexpected is `None` (the metric then reads
//! as expired rather than guessed).

use time::{Date, Month, PrimitiveDateTime, Time};

/// Tags used on the way to `validity`.
const SEQUENCE: u8 = 0x30;
const EXPLICIT_VERSION: u8 = 0xA0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The certificate's `notAfter` as Unix seconds.
pub fn not_after_unix(der: &[u8]) -> Option<i64> {
    let (tag, certificate, _) = element(der)?;
    check(tag == SEQUENCE)?;
    let (tag, tbs, _) = element(certificate)?;
    check(tag == SEQUENCE)?;
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == EXPLICIT_VERSION {
        rest = after;
    }
    // serialNumber, signature, issuer; then validity.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (tag, validity, _) = element(rest)?;
    check(tag == SEQUENCE)?;
    let (_, _, after_not_before) = element(validity)?;
    let (tag, not_after, _) = element(after_not_before)?;
    let text = std::str::from_utf8(not_after).ok()?;
    match tag {
        UTC_TIME => {
            // YYMMDDHHMMSSZ; RFC 5280 4.1.2.5.1: YY >= 50 is 19YY.
            let yy: i32 = digits(text, 0, 2)?;
            let year = if yy >= 50 { 1900 + yy } else { 2000 + yy };
            unix(year, &text[2..], 13 - 2)
        }
        GENERALIZED_TIME => unix(digits(text, 0, 4)?, &text[4..], 15 - 4),
        _ => None,
    }
}

/// `MMDDHHMMSSZ` after the year, `len` bytes in all.
fn unix(year: i32, text: &str, len: usize) -> Option<i64> {
    check(text.len() == len && text.ends_with('Z'))?;
    let month = Month::try_from(digits::<u8>(text, 0, 2)?).ok()?;
    let date = Date::from_calendar_date(year, month, digits(text, 2, 4)?).ok()?;
    let time = Time::from_hms(
        digits(text, 4, 6)?,
        digits(text, 6, 8)?,
        digits(text, 8, 10)?,
    )
    .ok()?;
    Some(
        PrimitiveDateTime::new(date, time)
            .assume_utc()
            .unix_timestamp(),
    )
}

fn digits<T: std::str::FromStr>(text: &str, from: usize, to: usize) -> Option<T> {
    let part = text.get(from..to)?;
    check(part.bytes().all(|b| b.is_ascii_digit()))?;
    part.parse().ok()
}

fn check(condition: bool) -> Option<()> {
    condition.then_some(())
}

/// One DER element: its tag, its content and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        // Indefinite lengths (0x80) are not DER; over 4 bytes is over any certificate.
        check((1..=4).contains(&count) && rest.len() >= count)?;
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |length, &b| (length << 8) | usize::from(b))
    };
    check(rest.len() >= length)?;
    let (content, after) = rest.split_at(length);
    Some((tag, content, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(not_after: time::OffsetDateTime) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(vec!["injector.example".to_owned()]).expect("params");
        params.not_after = not_after;
        let key = rcgen::KeyPair::generate().expect("key");
        params
            .self_signed(&key)
            .expect("certificate")
            .der()
            .to_vec()
    }

    #[test]
    fn reads_not_after_in_both_time_forms() {
        // 2049 is written as UTCTime, 2050 on as GeneralizedTime (RFC 5280).
        for year in [2027, 2049, 2050, 2100] {
            let when = Date::from_calendar_date(year, Month::March, 7)
                .expect("date")
                .with_hms(12, 34, 56)
                .expect("time")
                .assume_utc();
            assert_eq!(
                not_after_unix(&certificate(when)),
                Some(when.unix_timestamp()),
                "{year}"
            );
        }
    }

    #[test]
    fn anything_else_is_none() {
        let good = certificate(time::OffsetDateTime::now_utc());
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &good[..good.len() / 2],
        ] {
            assert_eq!(not_after_unix(bad), None);
        }
    }
}

//! A reservation's token: what a settle needs, signed ([`tokens`]), so that any pod may settle
//! it without shared state besides the store's mark.

use std::fmt::Write as _;

use super::{Reservations, SettleError, DOMAIN, MAX_RESERVATION_TOKEN};
use crate::check::tokens::{self, TokenError};
use crate::limit::{Algorithm, Decision, FixedWindow, Grant, Key, Micros, TokenBucket};

/// One counter a reservation spent on, as its token carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Taken {
    pub(super) key: Key,
    pub(super) window_index: Option<usize>,
    pub(super) generation: u64,
    pub(super) algorithm: Algorithm,
    pub(super) grant: Grant,
}

/// A reservation read back from its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reservation {
    pub(super) id: u128,
    pub(super) expires_us: Micros,
    pub(super) parts: Vec<Taken>,
}

impl From<TokenError> for SettleError {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::Malformed(why) => Self::Malformed(why),
            TokenError::Forged => Self::Forged,
        }
    }
}

impl Reservations {
    pub(super) fn token(&self, reservation: &Reservation) -> String {
        self.signer
            .seal(DOMAIN, reservation.id, payload(reservation).as_bytes())
    }

    pub(super) fn read(&self, token: &str) -> Result<Reservation, SettleError> {
        let (id, text) = self.signer.open(DOMAIN, token, MAX_RESERVATION_TOKEN)?;
        // Signed by this fleet: the payload is one `payload` wrote; anything else is forged.
        read_payload(id, &text).ok_or(SettleError::Forged)
    }
}

/// `<expires_us>`, then a line per counter: its key ([`tokens::push_key`]) and `\0`-separated
/// `period window generation alg limit period_us capacity debt units window at hold epoch`
/// (`-` for an absent period or window).
fn payload(reservation: &Reservation) -> String {
    let mut out = reservation.expires_us.to_string();
    for part in &reservation.parts {
        out.push('\n');
        tokens::push_key(&mut out, &part.key);
        let or_dash = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let (alg, limit, period, capacity, debt) = match part.algorithm {
            Algorithm::TokenBucket(b) => (
                "tb",
                b.limit(),
                b.period_us(),
                b.capacity(),
                b.report_debt().unwrap_or(0),
            ),
            Algorithm::FixedWindow(w) => ("fw", w.limit(), w.period_us(), 0, 0),
            // Never reserved (config refuses it): written so that it never reads back.
            _ => ("-", 0, 0, 0, 0),
        };
        let g = &part.grant;
        let _ = write!(
            out,
            "\0{}\0{}\0{}\0{alg}\0{limit}\0{period}\0{capacity}\0{debt}\0{}\0{}\0{}\0{}\0{}",
            or_dash(part.key.period_us()),
            or_dash(part.window_index.map(|i| i as u64)),
            part.generation,
            g.units,
            g.window,
            g.at_us,
            g.hold_us,
            g.epoch,
        );
    }
    out
}

fn read_payload(id: u128, text: &str) -> Option<Reservation> {
    let mut lines = text.split('\n');
    let expires_us = lines.next()?.parse().ok()?;
    let mut parts = Vec::new();
    for line in lines {
        let mut fields = line.split('\0');
        let (policy, partition) = (fields.next()?, fields.next()?);
        let key = tokens::read_key(&format!("{policy}\0{partition}")).ok()?;
        let mut next = || fields.next();
        let maybe = |text: &str| -> Option<Option<u64>> {
            if text == "-" {
                Some(None)
            } else {
                text.parse().ok().map(Some)
            }
        };
        let period = maybe(next()?)?;
        let window_index = maybe(next()?)?.and_then(|i| usize::try_from(i).ok());
        let generation: u64 = next()?.parse().ok()?;
        let alg = next()?;
        let mut numbers = [0u64; 9];
        for n in &mut numbers {
            *n = next()?.parse().ok()?;
        }
        let [limit, period_us, capacity, debt, units, window, at_us, hold_us, epoch] = numbers;
        let algorithm = match alg {
            "tb" => {
                let bucket = TokenBucket::new(limit, period_us, capacity).ok()?;
                Algorithm::TokenBucket(if debt > 0 {
                    bucket.with_report_debt(debt)
                } else {
                    bucket
                })
            }
            "fw" => Algorithm::FixedWindow(FixedWindow::new(limit, period_us).ok()?),
            _ => return None,
        };
        let key = match period {
            Some(period) => key.for_window(period),
            None => key,
        };
        parts.push(Taken {
            key,
            window_index,
            generation,
            algorithm,
            grant: Grant {
                units,
                decision: Decision {
                    allowed: true,
                    limit,
                    remaining: 0,
                    reset_after_us: 0,
                    retry_after_us: 0,
                },
                window,
                hold_us,
                at_us,
                epoch,
            },
        });
    }
    (!parts.is_empty()).then_some(Reservation {
        id,
        expires_us,
        parts,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prometheus::{IntCounterVec, Opts};

    use super::*;

    fn reservations(secret: &[u8]) -> Reservations {
        let events = IntCounterVec::new(Opts::new("e", "e"), &["policy", "event"]).expect("m");
        let units = IntCounterVec::new(Opts::new("u", "u"), &["policy", "kind"]).expect("m");
        Reservations::with_metrics(Some(secret), events, units)
    }

    fn sample() -> Reservation {
        let bucket = TokenBucket::new(10, 1_000_000, 20)
            .expect("bucket")
            .with_report_debt(3);
        let grant = |units, epoch| Grant {
            units,
            decision: Decision {
                allowed: true,
                limit: 0,
                remaining: 0,
                reset_after_us: 0,
                retry_after_us: 0,
            },
            window: 7,
            hold_us: 250,
            at_us: 1_000,
            epoch,
        };
        Reservation {
            id: 99,
            expires_us: 61_000,
            parts: vec![
                Taken {
                    key: Key::new(Arc::from("tok"), ["acme", "a\nb"]),
                    window_index: None,
                    generation: 3,
                    algorithm: bucket.into(),
                    grant: grant(5, 11),
                },
                Taken {
                    key: Key::new(Arc::from("win"), ["acme"]).for_window(60_000_000),
                    window_index: Some(1),
                    generation: 4,
                    algorithm: FixedWindow::new(100, 60_000_000).expect("window").into(),
                    grant: grant(5, 12),
                },
            ],
        }
    }

    #[test]
    fn a_token_reads_back_whole_only_where_it_was_signed_and_unaltered() {
        let fleet = reservations(b"secret");
        let mut reservation = sample();
        let token = fleet.token(&reservation);
        let read = fleet.read(&token).expect("reads");
        // The decision is not carried (a settle never reads it) but its limit.
        for (part, back) in reservation.parts.iter_mut().zip(&read.parts) {
            part.grant.decision = back.grant.decision;
        }
        assert_eq!(read, reservation);
        assert_eq!(
            reservations(b"other").read(&token),
            Err(SettleError::Forged)
        );
        // Another partition's payload under this token's id and MAC.
        let mut moved = sample();
        moved.parts[0].key = Key::new(Arc::from("tok"), ["evil"]);
        let other = fleet.token(&moved);
        let (head, _) = token.rsplit_once('.').expect("three fields");
        let (_, tail) = other.rsplit_once('.').expect("three fields");
        assert_eq!(
            fleet.read(&format!("{head}.{tail}")),
            Err(SettleError::Forged)
        );
        assert!(matches!(fleet.read("x.y"), Err(SettleError::Malformed(_))));
    }
}

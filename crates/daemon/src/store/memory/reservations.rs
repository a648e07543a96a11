//! The embedded store's reservation marks ([`RateStore::settle_mark`]): the ids of settled
//! reservations, each kept until its time to live ends (a later settle is refused as expired
//! then, so the mark is no longer needed), bounded in number.
//!
//! [`RateStore::settle_mark`]: crate::store::RateStore::settle_mark

use std::collections::HashMap;
use std::sync::Mutex;

use crate::limit::Micros;
use crate::store::{ErrorKind, SettleMark, StoreError};

/// Settled reservations' ids and when each expires, at most `cap` of them.
pub(super) struct Marks {
    settled: Mutex<HashMap<u128, Micros>>,
    cap: usize,
}

impl Marks {
    /// At most `cap` marks held at once (the store's key cap: a mark is smaller than a key).
    pub(super) fn new(cap: usize) -> Self {
        Self {
            settled: Mutex::new(HashMap::new()),
            cap: cap.max(1),
        }
    }

    /// Marks `id` settled at `now` unless it was, or `expires_us` has passed. With the cap
    /// reached even after dropping the expired marks, the settle fails (the reservation then
    /// settles at its estimate when its time to live ends): a mark is never dropped early,
    /// which would let a second settle give back twice.
    pub(super) fn settle(
        &self,
        id: u128,
        expires_us: Micros,
        now: Micros,
    ) -> Result<SettleMark, StoreError> {
        if now >= expires_us {
            return Ok(SettleMark::Expired);
        }
        let mut settled = self.settled.lock().unwrap_or_else(|p| p.into_inner());
        if settled.get(&id).is_some_and(|&until| until > now) {
            return Ok(SettleMark::AlreadySettled);
        }
        if settled.len() >= self.cap {
            settled.retain(|_, until| *until > now);
            if settled.len() >= self.cap {
                return Err(StoreError::failed(
                    ErrorKind::Other,
                    "the embedded store holds as many settled reservations as it has keys",
                ));
            }
        }
        settled.insert(id, expires_us);
        Ok(SettleMark::First)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_settles_once_until_it_expires_and_marks_are_bounded() {
        let marks = Marks::new(2);
        assert_eq!(marks.settle(1, 100, 10), Ok(SettleMark::First));
        assert_eq!(marks.settle(1, 100, 20), Ok(SettleMark::AlreadySettled));
        assert_eq!(marks.settle(1, 100, 100), Ok(SettleMark::Expired));
        assert_eq!(marks.settle(2, 50, 99), Ok(SettleMark::Expired));
        assert_eq!(marks.settle(3, 200, 30), Ok(SettleMark::First));
        assert!(
            marks.settle(4, 200, 30).is_err(),
            "full: never drops a live mark"
        );
        // Once 1 has expired its mark makes room.
        assert_eq!(marks.settle(4, 200, 150), Ok(SettleMark::First));
    }
}

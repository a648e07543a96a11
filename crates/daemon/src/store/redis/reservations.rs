//! The Redis store's reservation marks: one call of `lua/reservation.lua` per settle, outside
//! the batcher (as leases and permits are), on a key in the reservation's first partition's hash
//! tag, so a Cluster routes it to that partition's slot. The mark's expiry is on Redis' clock,
//! the clock the reservation's take read.

use std::time::Duration;

use super::{eval_figures, keys, ErrorKind, RedisStore};
use crate::limit::Key;
use crate::store::{SettleMark, StoreError};

impl RedisStore {
    /// Marks reservation `id` (made on `key`'s counter) settled unless it was or has expired.
    pub(super) async fn mark_settled(
        &self,
        key: &Key,
        id: u128,
        expires_us: u64,
        deadline: Duration,
    ) -> Result<SettleMark, StoreError> {
        if !self.health.allows_calls() {
            return Err(StoreError::CircuitOpen);
        }
        let mut conn = self.current()?;
        let mark = keys::reservation_key(&keys::redis_key(&self.prefix, key), id);
        let command = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(1).arg(&mark).arg(expires_us).arg(0);
            cmd
        };
        let figures = eval_figures(
            &mut conn,
            &self.reservation,
            command,
            deadline,
            "reservation",
        )
        .await?;
        match figures.as_slice() {
            [0] => Ok(SettleMark::First),
            [1] => Ok(SettleMark::AlreadySettled),
            [2] => Ok(SettleMark::Expired),
            other => Err(StoreError::failed(
                ErrorKind::Other,
                format!("reservation reply {other:?}, not one of 0, 1, 2"),
            )),
        }
    }
}

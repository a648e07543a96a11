//! `POST /v1/settle`: the mark, then each counter's refund or charge.

use super::token::Taken;
use super::{SettleError, Settled, SettledPart};
use crate::check::CheckService;
use crate::limit::{Algorithm, Grant, Micros};
use crate::store::{SettleMark, StoreCheck};

impl CheckService {
    /// Settles reservation `token` at `cost` (`POST /v1/settle`; see the module's doc).
    pub async fn settle(&self, token: &str, cost: u64) -> Result<Settled, SettleError> {
        if cost > self.limits.max_cost {
            return Err(SettleError::Invalid(format!(
                "cost must be 0 to {}, got {cost}",
                self.limits.max_cost
            )));
        }
        let reservation = self.reservations.read(token)?;
        let first = &reservation.parts[0];
        let policy = first.key.policy().to_owned();
        let mark = self
            .store
            .settle_mark(&first.key, reservation.id, reservation.expires_us, None)
            .await
            .map_err(SettleError::Unavailable)?;
        match mark {
            SettleMark::First => self.reservations.count(&policy, "settled"),
            SettleMark::AlreadySettled => {
                self.reservations.count(&policy, "already_settled");
                return Err(SettleError::AlreadySettled);
            }
            SettleMark::Expired => {
                self.reservations.count(&policy, "expired");
                return Err(SettleError::Expired);
            }
        }
        let policies = self.policies();
        let mut parts = Vec::with_capacity(reservation.parts.len());
        let mut extra = Vec::new();
        let mut estimate = 0;
        for part in &reservation.parts {
            let name = part.key.policy();
            let units = part.grant.units;
            estimate = estimate.max(units);
            let applied =
                policies.get(name).is_some() && policies.revision(name) == part.generation;
            let mut settled = SettledPart {
                policy: name.to_owned(),
                window: part.window_index,
                refunded: 0,
                charged: 0,
                applied,
            };
            if applied && cost < units {
                let check = self.settle_check(part, 0);
                let grant = Grant {
                    // The tokens used are the first of the reservation to refill, the unused
                    // ones the last: they start to refill after the used ones' refill time.
                    hold_us: part
                        .grant
                        .hold_us
                        .saturating_add(refill_us(&part.algorithm, cost)),
                    ..part.grant
                };
                settled.refunded = self
                    .store
                    .give_back(&check, units - cost, grant, None)
                    .await
                    .map_err(SettleError::Unavailable)?;
                self.reservations
                    .count_units(name, "refunded", settled.refunded);
            } else if applied && cost > units {
                extra.push((parts.len(), self.settle_check(part, cost - units)));
                settled.charged = cost - units;
            }
            parts.push(settled);
        }
        if !extra.is_empty() {
            let checks: Vec<StoreCheck> = extra.iter().map(|(_, c)| c.clone()).collect();
            self.store
                .spend(&checks, None)
                .await
                .map_err(SettleError::Unavailable)?;
            for (at, check) in &extra {
                self.reservations
                    .count_units(&parts[*at].policy, "charged", check.cost);
            }
        }
        Ok(Settled {
            estimate,
            cost,
            parts,
        })
    }

    fn settle_check(&self, part: &Taken, cost: u64) -> StoreCheck {
        StoreCheck {
            key: part.key.clone(),
            algorithm: part.algorithm,
            cost,
            enforce: true,
            generation: part.generation,
        }
    }
}

/// The time a token bucket takes to refill `units` (rounded down: a refund measured from it
/// only ever returns less); 0 for a fixed window.
fn refill_us(algorithm: &Algorithm, units: u64) -> Micros {
    match algorithm {
        Algorithm::TokenBucket(b) => {
            let us = u128::from(units) * u128::from(b.period_us()) / u128::from(b.limit());
            Micros::try_from(us).unwrap_or(Micros::MAX)
        }
        _ => 0,
    }
}

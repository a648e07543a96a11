//! The outcome of asking a limiter whether a request may pass, and the time type it is expressed in.

/// Time in whole microseconds. The limiter never reads a clock: callers pass `now` in, so the
/// same inputs always give the same answer (and tests can drive time exactly).
pub type Micros = u64;

/// Marker for "never": a request whose cost exceeds the capacity can never be admitted.
pub const NEVER: Micros = u64::MAX;

/// What a limiter answers for one request; it maps directly onto `RateLimit-*` / `Retry-After`
/// style response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The most units that can ever be available at once (bucket capacity or window limit).
    pub limit: u64,
    /// Whole units still available after this request (if allowed) or now (if denied);
    /// always in `0..=limit`.
    pub remaining: u64,
    /// Time until the quota would be fully restored (`remaining == limit`) if nothing else
    /// arrives, measured after this decision. 0 when it is already full.
    pub reset_after_us: Micros,
    /// 0 when allowed. When denied: the exact delay until the earliest integer microsecond at
    /// which the same request would be admitted if nothing else happens (at `now + retry` it
    /// passes, at `now + retry - 1` it fails), or [`NEVER`] when the cost exceeds `limit`.
    pub retry_after_us: Micros,
}

impl Decision {
    /// An admitting decision; `retry_after_us` is 0 by definition.
    pub(super) fn allow(limit: u64, remaining: u64, reset_after_us: Micros) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: 0,
        }
    }

    /// A denying decision.
    pub(super) fn deny(
        limit: u64,
        remaining: u64,
        reset_after_us: Micros,
        retry_after_us: Micros,
    ) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
        }
    }
}

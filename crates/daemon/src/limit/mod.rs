//! Pure rate-limiting algorithms: given parameters, a per-key state and the current time, decide
//! whether a request of some cost may pass. No I/O, no clock reading and no floats: time is
//! passed in as integer microseconds, and every product is taken in `u128` so that limits and
//! costs up to 1e9 and periods up to a year cannot overflow.
//!
//! Each algorithm offers the same three operations:
//! - `decide(&state, now, cost)` is pure, so it serves dry runs and all-or-nothing checks
//!   across several keys (decide on all, then admit on all only if every one allowed);
//! - `admit(&mut state, now, cost)` records a request that `decide` allowed at the same
//!   `now`/`cost`; denied requests are never recorded, so a denial destroys no credit;
//! - `idle_at(&state)` is the instant from which the state behaves exactly like a fresh one,
//!   so the caller may drop it (use it as the key's expiry).
//!
//! `now` may go backwards (clock steps, requests from several threads): nothing panics or
//! underflows; results are then merely conservative.

mod algorithm;
mod calendar;
mod concurrency;
mod decision;
mod fixed_window;
mod glob;
mod key;
mod lease;
mod matcher;
mod period;
mod policy;
mod policy_set;
mod quota;
mod sliding_log;
mod stand_in;
mod subject;
mod token_bucket;

#[cfg(test)]
mod spend_tests;
#[cfg(test)]
mod tests;

use std::fmt;

pub use algorithm::{Algorithm, State};
pub use calendar::{Calendar, CalendarUnit, UnknownZone};
pub use concurrency::{Concurrency, PermitState};
pub use decision::{Decision, Micros, NEVER};
pub use fixed_window::{FixedWindow, WindowState};
pub use glob::{globs_overlap, Glob};
pub use key::Key;
pub use lease::{bucket_lease_shrunk, Grant};
pub use matcher::{Captures, Pattern, Segment};
pub use period::{period_name, PeriodName};
pub use policy::{
    field_problems, CostTable, Descriptors, FailureMode, Policy, PolicyError, PolicyParts, Tiers,
    MAX_DESCRIPTOR_NAME, MAX_POLICY_NAME,
};
pub use policy_set::{Applicable, PolicySet};
pub use quota::{Quota, QuotaError, MAX_WINDOWS};
pub use sliding_log::{LogState, SlidingLog};
pub use stand_in::StandIn;
pub use subject::{canonical_path, path_pattern_problem, PathCase, Subject, PATH_DESCRIPTOR};
pub use token_bucket::{BucketState, TokenBucket, MAX_AHEAD};

/// Why limiter parameters were rejected. Only degenerate values are refused here; sensible
/// upper bounds are the configuration layer's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamError {
    /// `limit` was 0: nothing could ever pass, and the rate `limit / period` would be 0.
    ZeroLimit,
    /// `capacity` was 0: the bucket could never hold a token.
    ZeroCapacity,
    /// `period_us` was 0: a rate over no time is meaningless (and would divide by zero).
    ZeroPeriod,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = match self {
            ParamError::ZeroLimit => "limit must be at least 1",
            ParamError::ZeroCapacity => "capacity must be at least 1",
            ParamError::ZeroPeriod => "period must be at least 1 microsecond",
        };
        f.write_str(msg)
    }
}

impl std::error::Error for ParamError {}

/// Narrows a `u128` intermediate back to `u64`, saturating (only reachable with parameters far
/// beyond any sensible configuration).
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Validates the `(limit, period)` pair shared by every algorithm.
fn check_rate(limit: u64, period_us: Micros) -> Result<(), ParamError> {
    if limit == 0 {
        Err(ParamError::ZeroLimit)
    } else if period_us == 0 {
        Err(ParamError::ZeroPeriod)
    } else {
        Ok(())
    }
}

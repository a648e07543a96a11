//! A policy's quota from its file form: one window (`limit`, `period`, `burst`) or several
//! (`limits`), the per-pod `local_limit`, and the tiers that scale or replace them; each value
//! bounded so that the integer math (and its Lua twin) stays exact.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::HumanDuration;
use crate::limit::{
    Algorithm, Calendar, Concurrency, FixedWindow, PolicySet, Quota, QuotaError, SlidingLog,
    TokenBucket, MAX_WINDOWS,
};

/// Largest limit or burst accepted (keeps all integer math far from overflow, in Lua too).
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Largest sliding-log limit: the log keeps one entry per admitted unit, so memory grows with it.
/// Use a token bucket for higher rates.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// Largest burst x period (in us) of a token bucket: keeps its Lua arithmetic exact.
pub const MAX_BURST_TIMES_PERIOD: u128 = 1 << 52;
/// Largest concurrency limit: each permit held is one member of the partition's sorted set.
pub const MAX_CONCURRENCY: u64 = 10_000;
/// Shortest `permit_ttl` accepted (1 s).
pub const MIN_PERMIT_TTL_US: u64 = 1_000_000;
/// Longest `permit_ttl` accepted (1 h).
pub const MAX_PERMIT_TTL_US: u64 = 3_600_000_000;
/// A concurrency policy's `permit_ttl` when it names none (30 s).
pub const DEFAULT_PERMIT_TTL_US: u64 = 30_000_000;

/// Shortest period accepted.
pub const MIN_PERIOD_US: u64 = 1_000;
/// Longest period accepted (one year).
pub const MAX_PERIOD_US: u64 = 365 * 86_400_000_000;

/// The algorithm a policy names.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum AlgorithmName {
    TokenBucket,
    SlidingLog,
    FixedWindow,
    Concurrency,
}

/// One window of `limits`, or the `local_limit`: `{limit: 10, period: 1s, burst: 20}`.
#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    limit: u64,
    period: HumanDuration,
    burst: Option<u64>,
}

/// The quota fields of a policy, as written.
pub(super) struct RawQuota<'a> {
    pub algorithm: AlgorithmName,
    pub limit: Option<u64>,
    pub period: Option<HumanDuration>,
    pub burst: Option<u64>,
    pub limits: Option<&'a [RawWindow]>,
    pub local_limit: Option<RawWindow>,
    /// A calendar policy's calendar (`policy_calendar`): its one fixed window follows it.
    pub calendar: Option<Calendar>,
    /// A concurrency policy's permits' time to live (its one window's "period").
    pub permit_ttl: Option<HumanDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTiers {
    #[serde(default = "default_tier_descriptor")]
    pub descriptor: String,
    pub levels: BTreeMap<String, RawTier>,
}

fn default_tier_descriptor() -> String {
    "tier".into()
}

/// A tier either scales the policy's quota or replaces it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTier {
    multiplier: Option<u64>,
    limit: Option<u64>,
    burst: Option<u64>,
}

/// A problem with one field of a policy; `item` is the entry of a list field (`limits`) at
/// fault, so that its own line can be shown.
#[derive(Debug)]
pub(super) struct FieldProblem {
    pub field: &'static str,
    pub item: Option<usize>,
    pub reason: String,
}

impl From<(&'static str, String)> for FieldProblem {
    fn from((field, reason): (&'static str, String)) -> Self {
        Self {
            field,
            item: None,
            reason,
        }
    }
}

impl RawQuota<'_> {
    /// The windows as written: `limits`, or the one window of `limit`/`period`/`burst`.
    fn windows(&self) -> Result<Vec<RawWindow>, FieldProblem> {
        let bad = |field, reason: &str| Err(FieldProblem::from((field, reason.to_owned())));
        if self.algorithm == AlgorithmName::Concurrency {
            // Its other fields are refused by `policy_concurrency`; its one window lasts a
            // permit's time to live.
            return match self.limit {
                Some(limit) => Ok(vec![RawWindow {
                    limit,
                    period: self
                        .permit_ttl
                        .unwrap_or(HumanDuration(DEFAULT_PERMIT_TTL_US)),
                    burst: None,
                }]),
                None => bad("limit", "missing: the most requests in flight at once"),
            };
        }
        match (self.limits, self.limit, self.period) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => bad(
                "limits",
                "give either `limit` and `period` (one window) or `limits` (several), not both",
            ),
            (Some(_), None, None) if self.burst.is_some() => bad(
                "burst",
                "with `limits`, each window takes its own `burst`: {limit: 10, period: 1s, burst: 20}",
            ),
            (Some([]), None, None) => bad("limits", "needs at least one window"),
            (Some(list), None, None) if list.len() > MAX_WINDOWS => bad(
                "limits",
                &format!("at most {MAX_WINDOWS} windows, got {}", list.len()),
            ),
            (Some(list), None, None) => Ok(list.to_vec()),
            (None, Some(limit), Some(period)) => Ok(vec![RawWindow {
                limit,
                period,
                burst: self.burst,
            }]),
            (None, None, _) => bad(
                "limit",
                "missing: give `limit` and `period`, or `limits: [{limit: 10, period: 1s}, ...]`",
            ),
            (None, Some(_), None) => bad("period", "missing"),
        }
    }

    /// The policy's own quota: every window, then the local limit.
    pub fn build(&self) -> Result<Quota, Vec<FieldProblem>> {
        let windows = self.windows().map_err(|p| vec![p])?;
        self.quota_of(&windows, self.local_limit)
    }

    /// A quota of `windows` (as written, or as a tier scaled them) and `local`.
    fn quota_of(
        &self,
        windows: &[RawWindow],
        local: Option<RawWindow>,
    ) -> Result<Quota, Vec<FieldProblem>> {
        let mut problems = Vec::new();
        let listed = self.limits.is_some();
        let mut built = Vec::with_capacity(windows.len());
        for (i, window) in windows.iter().enumerate() {
            let algorithm =
                build_algorithm(self.algorithm, window.limit, window.period, window.burst)
                    .map(|algorithm| with_calendar(algorithm, self.calendar));
            match algorithm {
                Ok(algorithm) => built.push(algorithm),
                Err((field, reason)) if listed => problems.push(FieldProblem {
                    field: "limits",
                    item: Some(i),
                    reason: format!("window {i}: {field}: {reason}"),
                }),
                Err(problem) => problems.push(problem.into()),
            }
        }
        let local = local.and_then(|l| match local_bucket(l) {
            Ok(bucket) => Some(bucket),
            Err(problem) => {
                problems.push(problem.into());
                None
            }
        });
        // Windows that all built are checked together even when other fields failed.
        let checked = (built.len() == windows.len()).then(|| Quota::new(built, local));
        match checked {
            Some(Ok(quota)) if problems.is_empty() => Ok(quota),
            Some(Err(e)) => {
                problems.push(window_problem(e, windows));
                Err(problems)
            }
            _ => Err(problems),
        }
    }

    /// The quota of tier `tier`: every window (and the local limit) scaled by `multiplier`, or,
    /// for a policy of one window, that window given outright by `limit` (and `burst`).
    pub fn tier(&self, tier: &str, level: &RawTier) -> Result<Quota, Vec<FieldProblem>> {
        let bad = |reason: String| {
            vec![FieldProblem::from((
                "tiers",
                format!("tier `{tier}`: {reason}"),
            ))]
        };
        let windows = self.windows().map_err(|_| Vec::new())?;
        let (windows, local) = match (level.multiplier, level.limit) {
            (Some(_), Some(_)) => {
                return Err(bad("give either `multiplier` or `limit`, not both".into()))
            }
            (None, None) => return Err(bad("needs `multiplier` or `limit`".into())),
            (Some(0), None) => return Err(bad("`multiplier` must be at least 1".into())),
            (Some(m), None) => {
                if level.burst.is_some() {
                    return Err(bad(
                        "`burst` goes with `limit`, not with `multiplier`".into()
                    ));
                }
                let scale = |w: RawWindow| RawWindow {
                    limit: w.limit.saturating_mul(m),
                    period: w.period,
                    burst: w.burst.map(|b| b.saturating_mul(m)),
                };
                let scaled = windows.into_iter().map(scale).collect();
                (scaled, self.local_limit.map(scale))
            }
            (None, Some(_)) if windows.len() > 1 => {
                return Err(bad(
                    "a policy of several windows takes tier `multiplier`s only".into(),
                ))
            }
            (None, Some(limit)) => {
                let window = RawWindow {
                    limit,
                    period: windows[0].period,
                    burst: level.burst.or(windows[0].burst),
                };
                (vec![window], self.local_limit)
            }
        };
        self.quota_of(&windows, local).map_err(|problems| {
            problems
                .into_iter()
                .map(|p| FieldProblem::from(("tiers", format!("tier `{tier}`: {}", p.reason))))
                .collect()
        })
    }
}

/// `algorithm` following `calendar`, if any (a fixed window's: `policy_calendar` refuses a
/// calendar on the others).
fn with_calendar(algorithm: Algorithm, calendar: Option<Calendar>) -> Algorithm {
    match (algorithm, calendar) {
        (Algorithm::FixedWindow(window), Some(calendar)) => {
            FixedWindow::calendar(window.limit(), calendar).map_or(algorithm, Algorithm::from)
        }
        _ => algorithm,
    }
}

/// A problem of the windows as a whole (at the second of two windows of one period).
fn window_problem(error: QuotaError, windows: &[RawWindow]) -> FieldProblem {
    let (item, reason) = match error {
        QuotaError::DuplicatePeriod(first) => {
            let period = HumanDuration(windows[first].period.0);
            let second =
                (first + 1..windows.len()).find(|&i| windows[i].period == windows[first].period);
            let shown = second.unwrap_or(first);
            (
                second,
                format!("windows {first} and {shown} both have period {period}: each period is one counter"),
            )
        }
        other => (None, other.to_string()),
    };
    FieldProblem {
        field: "limits",
        item,
        reason,
    }
}

/// Warnings (not errors) about local limits too low for the shared quota: `replicas` pods, each
/// held to its `local_limit`, could never fill a window even with the traffic spread evenly,
/// so the pods deny before the shared limit is reached. Deliberate as a per-pod cap; usually
/// a mistake.
pub fn local_limit_warnings(set: &PolicySet, replicas: u64) -> Vec<String> {
    let mut warnings = Vec::new();
    for policy in set.iter() {
        let parts = policy.parts();
        let tiers = parts.tiers.iter().flat_map(|t| t.levels.iter());
        let quotas = [(None, &parts.quota)]
            .into_iter()
            .chain(tiers.map(|(tier, quota)| (Some(tier), quota)));
        for (tier, quota) in quotas {
            let (Some(local), short) = (quota.local(), quota.beyond_local_limit(replicas)) else {
                continue;
            };
            for window in short {
                let tier = tier.map_or(String::new(), |t| format!(" (tier `{t}`)"));
                warnings.push(format!(
                    "policy `{}`{tier}: field `local_limit`: {} per {} on each of {replicas} pods \
                     (local.replicas) admits less than the window of {} per {}: the pods deny \
                     before the shared limit is reached, even with traffic spread evenly",
                    policy.name(),
                    local.limit(),
                    HumanDuration(local.period_us()),
                    window.limit(),
                    HumanDuration(window.period_us()),
                ));
            }
        }
    }
    warnings
}

/// The local limit: a token bucket whatever the policy's algorithm.
fn local_bucket(window: RawWindow) -> Result<TokenBucket, (&'static str, String)> {
    let algorithm = build_algorithm(
        AlgorithmName::TokenBucket,
        window.limit,
        window.period,
        window.burst,
    );
    match algorithm {
        Ok(Algorithm::TokenBucket(bucket)) => Ok(bucket),
        Ok(_) => Err(("local_limit", "must be a token bucket".into())),
        Err((field, reason)) => Err(("local_limit", format!("{field}: {reason}"))),
    }
}

pub(super) fn build_algorithm(
    name: AlgorithmName,
    limit: u64,
    period: HumanDuration,
    burst: Option<u64>,
) -> Result<Algorithm, (&'static str, String)> {
    let max_limit = match name {
        AlgorithmName::SlidingLog => MAX_LOG_LIMIT,
        AlgorithmName::Concurrency => MAX_CONCURRENCY,
        _ => MAX_LIMIT,
    };
    if limit == 0 || limit > max_limit {
        return Err(("limit", format!("must be 1 to {max_limit}, got {limit}")));
    }
    if name == AlgorithmName::Concurrency {
        if !(MIN_PERMIT_TTL_US..=MAX_PERMIT_TTL_US).contains(&period.0) {
            return Err((
                "permit_ttl",
                format!("must be between 1s and 1h, got {period}"),
            ));
        }
        return Concurrency::new(limit, period.0)
            .map(Algorithm::Concurrency)
            .map_err(|e| ("algorithm", e.to_string()));
    }
    if !(MIN_PERIOD_US..=MAX_PERIOD_US).contains(&period.0) {
        return Err((
            "period",
            format!("must be between 1ms and 365d, got {period}"),
        ));
    }
    let period_us = period.0;
    let algorithm = match (name, burst) {
        (AlgorithmName::TokenBucket, burst) => {
            let capacity = burst.unwrap_or(limit);
            if capacity == 0 || capacity > MAX_LIMIT {
                return Err(("burst", format!("must be 1 to {MAX_LIMIT}, got {capacity}")));
            }
            // The Lua twin works in 1/limit us units; burst x period must stay far below 2^53.
            if u128::from(capacity) * u128::from(period_us) > MAX_BURST_TIMES_PERIOD {
                return Err((
                    "burst",
                    format!("burst x period must be at most 2^52 us (e.g. 1,000,000 per hour); got {capacity} x {period}"),
                ));
            }
            TokenBucket::new(limit, period_us, capacity).map(Algorithm::TokenBucket)
        }
        (_, Some(_)) => return Err(("burst", "applies only to algorithm token_bucket".to_owned())),
        (AlgorithmName::SlidingLog, None) => {
            SlidingLog::new(limit, period_us).map(Algorithm::SlidingLog)
        }
        (AlgorithmName::FixedWindow | AlgorithmName::Concurrency, None) => {
            FixedWindow::new(limit, period_us).map(Algorithm::FixedWindow)
        }
    };
    algorithm.map_err(|e| ("algorithm", e.to_string()))
}

#[cfg(test)]
mod tests;

//! The Lua scripts (one per algorithm from `lua/`, plus the batch script composed of their
//! functions and `lua/batch.lua`), their SHA-1s, and how their integer replies become
//! [`Decision`]s without intermediate vectors. The commands the daemon sends are built in
//! `scripts/command.rs`; the calls only tests and the bench make are in [`oracle`].

use std::sync::Arc;

use redis::Value;

mod command;
/// Behind the `test-util` feature (the bench and the tests): the daemon never makes these calls.
#[cfg(any(test, feature = "test-util"))]
pub mod oracle;

pub(crate) use self::command::{batch_command, has_own_script, single_command};
pub(crate) use self::command::{Counters, ScriptRef};

use crate::limit::{Algorithm, Decision, NEVER};
use crate::store::Spend;

const STATE: &str = include_str!("../../../lua/state.lua");
const NOW: &str = include_str!("../../../lua/now.lua");
const TOKEN_BUCKET: &str = include_str!("../../../lua/token_bucket.lua");
const SLIDING_LOG: &str = include_str!("../../../lua/sliding_log.lua");
const FIXED_WINDOW: &str = include_str!("../../../lua/fixed_window.lua");
const BATCH: &str = include_str!("../../../lua/batch.lua");
const LEASE: &str = include_str!("../../../lua/lease.lua");
const CONCURRENCY: &str = include_str!("../../../lua/concurrency.lua");
const RESERVATION: &str = include_str!("../../../lua/reservation.lua");

/// Where the reservation script's test-only `now_us` is (see `lua/reservation.lua`).
pub(crate) const RESERVATION_NOW_ARGV: usize = 2;

/// Where the concurrency script's test-only `now_us` is (see `lua/concurrency.lua`).
pub(crate) const CONCURRENCY_NOW_ARGV: usize = 5;

/// Where the lease script's test-only `now_us` is (see `lua/lease.lua`).
pub(crate) const LEASE_NOW_ARGV: usize = 9;

/// The line that separates an algorithm script's reusable functions from its own entry point.
const ENTRY_MARKER: &str = "-- sluice:entry";

/// A script's source and its SHA-1 (what `EVALSHA` names).
#[derive(Debug, Clone)]
pub struct Script {
    /// Lua source, sent with `EVAL` when a node answers `NOSCRIPT`.
    pub source: Arc<str>,
    /// Hex SHA-1 of the source.
    pub sha: Arc<str>,
}

impl Script {
    fn new(source: String) -> Self {
        let sha = sha1_smol::Sha1::from(source.as_bytes())
            .digest()
            .to_string();
        Self {
            source: Arc::from(source),
            sha: Arc::from(sha),
        }
    }
}

/// The algorithm scripts and the batch script.
#[derive(Debug, Clone)]
pub struct Scripts {
    token_bucket: Script,
    sliding_log: Script,
    fixed_window: Script,
    batch: Script,
    node_batch: Script,
    lease: Script,
    concurrency: Script,
    reservation: Script,
}

/// The first line of the Cluster node script: script flags (Redis >= 7.0) that let one call touch
/// keys of several slots served by the same node. Older servers refuse to load it.
const NODE_FLAGS: &str = "#!lua flags=allow-cross-slot-keys\n";

/// The part of an algorithm script before its entry point: its functions.
fn functions(source: &str) -> &str {
    source.split(ENTRY_MARKER).next().unwrap_or(source)
}

/// The part of an algorithm script from its entry point on (the marker line's rest first).
fn entry(source: &str) -> &str {
    source
        .split_once(ENTRY_MARKER)
        .map_or("", |(_, entry)| entry)
}

/// What `lua/now.lua` holds in place of the test-only `now_us` argument's position.
const NOW_ARGV: &str = "$NOW_ARGV";

/// The `now` prelude of an entry point whose test-only `now_us` is `ARGV[now_argv]`.
fn now_prelude(now_argv: usize) -> String {
    NOW.replace(NOW_ARGV, &now_argv.to_string())
}

impl Default for Scripts {
    fn default() -> Self {
        // Every script opens with the bounded readers and the clock of `state.lua`, and its entry
        // point with the `now` prelude; the sliding log's also needs the token bucket's parser,
        // which knows the other algorithms' values.
        let batch = [
            STATE,
            functions(TOKEN_BUCKET),
            functions(SLIDING_LOG),
            functions(FIXED_WINDOW),
            &now_prelude(command::BATCH_NOW_ARGV),
            BATCH,
        ]
        .join("\n");
        let compose = |parts: &[&str]| Script::new(parts.join("\n"));
        let (bucket_now, now) = (
            now_prelude(command::single_now_argv(command::BUCKET_QUOTA)),
            now_prelude(command::single_now_argv(command::QUOTA)),
        );
        Self {
            token_bucket: compose(&[
                STATE,
                functions(TOKEN_BUCKET),
                &bucket_now,
                entry(TOKEN_BUCKET),
            ]),
            sliding_log: compose(&[
                STATE,
                functions(TOKEN_BUCKET),
                functions(SLIDING_LOG),
                &now,
                entry(SLIDING_LOG),
            ]),
            fixed_window: compose(&[STATE, functions(FIXED_WINDOW), &now, entry(FIXED_WINDOW)]),
            lease: compose(&[
                STATE,
                functions(TOKEN_BUCKET),
                functions(FIXED_WINDOW),
                &now_prelude(LEASE_NOW_ARGV),
                functions(LEASE),
                entry(LEASE),
            ]),
            concurrency: compose(&[
                STATE,
                functions(CONCURRENCY),
                &now_prelude(CONCURRENCY_NOW_ARGV),
                entry(CONCURRENCY),
            ]),
            reservation: compose(&[
                STATE,
                &now_prelude(RESERVATION_NOW_ARGV),
                entry(RESERVATION),
            ]),
            node_batch: Script::new(format!("{NODE_FLAGS}{batch}")),
            batch: Script::new(batch),
        }
    }
}

impl Scripts {
    /// Every script the daemon sends by SHA on a single primary or one Cluster slot (the batch
    /// script, and each algorithm's for a batch of one), to preload.
    pub fn sources(&self) -> Vec<Arc<str>> {
        [
            &self.token_bucket,
            &self.sliding_log,
            &self.fixed_window,
            &self.batch,
            &self.lease,
            &self.concurrency,
            &self.reservation,
        ]
        .map(|s| Arc::clone(&s.source))
        .to_vec()
    }

    /// The batch script (what the daemon runs).
    pub fn batch(&self) -> &Script {
        &self.batch
    }

    /// The same batch script for a Cluster node call: no declared keys (they come after the
    /// checks in ARGV), flagged `allow-cross-slot-keys`. Not in [`Self::sources`]: only Redis
    /// >= 7.0 loads it, and only a Cluster uses it.
    pub fn node_batch(&self) -> &Script {
        &self.node_batch
    }

    /// The lease script (`lua/lease.lua`): takes and give-backs.
    pub fn lease(&self) -> &Script {
        &self.lease
    }

    /// The concurrency script (`lua/concurrency.lua`): permits acquired, peeked and released.
    pub fn concurrency(&self) -> &Script {
        &self.concurrency
    }

    /// The reservation script (`lua/reservation.lua`): a settle's mark.
    pub fn reservation(&self) -> &Script {
        &self.reservation
    }

    /// The script for `algorithm`.
    pub fn for_algorithm(&self, algorithm: &Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket(_) => &self.token_bucket,
            Algorithm::SlidingLog(_) => &self.sliding_log,
            // Never sent: the store refuses a concurrency check before encoding it.
            Algorithm::FixedWindow(_) | Algorithm::Concurrency(_) => &self.fixed_window,
        }
    }
}

/// What a check of a script call records: the batch script's `commit` field (`lua/batch.lua`),
/// and an algorithm script's `commit` argument (a check's two values only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// 0: decide only (a check's [`Spend::DryRun`]).
    DryRun,
    /// 1: record the allowed items if every enforced one allowed (a check's [`Spend::Record`]).
    IfAllowed,
    /// 2: spend every item whatever its decision (a report: the cost was known afterwards).
    Report,
}

impl From<Spend> for Commit {
    fn from(spend: Spend) -> Self {
        match spend {
            Spend::Record => Self::IfAllowed,
            Spend::DryRun => Self::DryRun,
        }
    }
}

impl Commit {
    /// The flag the scripts read: the one place it is written.
    pub(crate) fn flag(self) -> u64 {
        match self {
            Self::DryRun => 0,
            Self::IfAllowed => 1,
            Self::Report => 2,
        }
    }
}

/// One counter of a check in a batch.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its Redis key.
    pub key: String,
    /// Algorithm and quota.
    pub algorithm: Algorithm,
    /// Units to spend.
    pub cost: u64,
    /// False for shadow policies (they never block the check).
    pub enforce: bool,
}

/// Reads the five figures of one decision.
fn parse_fields(fields: &[Value]) -> Result<Decision, String> {
    let [allowed, limit, remaining, reset, retry] = fields else {
        return Err(format!(
            "script reply has {} fields, expected 5",
            fields.len()
        ));
    };
    let int = |value: &Value| match value {
        Value::Int(n) => Ok(*n),
        other => Err(format!("unexpected field {other:?} in script reply")),
    };
    let non_negative = |value: &Value| {
        let n = int(value)?;
        u64::try_from(n).map_err(|_| format!("negative field {n} in script reply"))
    };
    let retry = int(retry)?;
    Ok(Decision {
        allowed: int(allowed)? == 1,
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        reset_after_us: non_negative(reset)?,
        retry_after_us: if retry < 0 {
            NEVER
        } else {
            u64::try_from(retry).unwrap_or(NEVER)
        },
    })
}

/// One check's part of a batch reply: its figures (five per item), or its error.
pub type CheckPart<'a> = Result<&'a [Value], &'a redis::ServerError>;

/// Splits the batch script's flat reply by the checks' item counts, in order: each check is one
/// error entry or five figures per item (see `lua/batch.lua`). Fails if the reply does not hold
/// exactly that.
pub fn split_batch_reply(
    flat: &[Value],
    items: impl IntoIterator<Item = usize>,
) -> Result<Vec<CheckPart<'_>>, String> {
    let items = items.into_iter();
    let mut parts = Vec::with_capacity(items.size_hint().0);
    let mut rest = flat;
    for count in items {
        if let Some((Value::ServerError(error), tail)) = rest.split_first() {
            parts.push(Err(error));
            rest = tail;
            continue;
        }
        let Some((figures, tail)) = rest.split_at_checked(5 * count) else {
            return Err(format!(
                "batch reply of {} values ends inside check {}",
                flat.len(),
                parts.len() + 1
            ));
        };
        parts.push(Ok(figures));
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(format!(
            "batch reply has {} values after its last check",
            rest.len()
        ));
    }
    Ok(parts)
}

/// Reads one check's figures (five per item) from a [`split_batch_reply`] part.
pub fn parse_figures(figures: &[Value]) -> Result<Vec<Decision>, String> {
    figures.chunks_exact(5).map(parse_fields).collect()
}

#[cfg(test)]
mod tests;

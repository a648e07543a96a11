//! The Lua scripts (one per algorithm from `lua/`, plus the batch script composed of their
//! functions and `lua/batch.lua`), their SHA-1s, the arguments each takes and how their integer
//! replies become [`Decision`]s without intermediate vectors.

use std::sync::Arc;

use redis::Value;

mod command;
pub(crate) use self::command::{batch_command, single_command};
use self::command::{batch_keys_and_checks, quota_args, Packed};
pub use self::command::{Counters, ScriptRef};

use crate::limit::{Algorithm, Decision, Micros, NEVER};
use crate::store::{Spend, StoreCheck};

const STATE: &str = include_str!("../../../lua/state.lua");
const TOKEN_BUCKET: &str = include_str!("../../../lua/token_bucket.lua");
const SLIDING_LOG: &str = include_str!("../../../lua/sliding_log.lua");
const FIXED_WINDOW: &str = include_str!("../../../lua/fixed_window.lua");
const BATCH: &str = include_str!("../../../lua/batch.lua");

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
}

/// The first line of the Cluster node script: script flags (Redis >= 7.0) that let one call touch
/// keys of several slots served by the same node. Older servers refuse to load it.
const NODE_FLAGS: &str = "#!lua flags=allow-cross-slot-keys\n";

/// The part of an algorithm script before its entry point: its functions.
fn functions(source: &str) -> &str {
    source.split(ENTRY_MARKER).next().unwrap_or(source)
}

impl Default for Scripts {
    fn default() -> Self {
        // Every script opens with the bounded readers and the clock of `state.lua`; the sliding
        // log's also needs the token bucket's parser, which knows the other algorithms' values.
        let batch = [
            STATE,
            functions(TOKEN_BUCKET),
            functions(SLIDING_LOG),
            functions(FIXED_WINDOW),
            BATCH,
        ]
        .join("\n");
        let compose = |parts: &[&str]| Script::new(parts.join("\n"));
        Self {
            token_bucket: compose(&[STATE, TOKEN_BUCKET]),
            sliding_log: compose(&[STATE, functions(TOKEN_BUCKET), SLIDING_LOG]),
            fixed_window: compose(&[STATE, FIXED_WINDOW]),
            node_batch: Script::new(format!("{NODE_FLAGS}{batch}")),
            batch: Script::new(batch),
        }
    }
}

/// One script invocation.
#[derive(Debug, Clone)]
pub struct ScriptCall {
    /// The script to run.
    pub script: Script,
    /// `KEYS`.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<Vec<u8>>,
}

impl Scripts {
    /// Every script's source, to preload.
    pub fn sources(&self) -> Vec<Arc<str>> {
        [
            &self.token_bucket,
            &self.sliding_log,
            &self.fixed_window,
            &self.batch,
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

    /// The script for `algorithm`.
    pub fn for_algorithm(&self, algorithm: &Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket(_) => &self.token_bucket,
            Algorithm::SlidingLog(_) => &self.sliding_log,
            Algorithm::FixedWindow(_) => &self.fixed_window,
        }
    }

    /// The single-algorithm call that decides (and, with [`Spend::Record`], records) `cost` on
    /// `key`; the daemon batches instead, this is for baselines and tests. `now` is for tests
    /// only.
    pub fn call(
        &self,
        algorithm: &Algorithm,
        key: String,
        cost: u64,
        spend: Spend,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args: Vec<u64> = quota_args(algorithm).collect();
        args.extend([cost, Commit::from(spend).flag()]);
        args.extend(now);
        ScriptCall {
            script: self.for_algorithm(algorithm).clone(),
            keys: vec![key],
            args: args.iter().map(|n| n.to_string().into_bytes()).collect(),
        }
    }

    /// A batch call holding one check over `checks` (with their Redis keys): all allowed ones
    /// are recorded (with `commit`) if every enforced one allows, else none. `now` as in
    /// [`Scripts::call`]; `None` is sent as 0, the batch script's "read TIME".
    pub fn group_call(
        &self,
        checks: &[(String, &StoreCheck)],
        commit: impl Into<Commit>,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut packed = Packed::with_capacity(2 + 7 * checks.len());
        packed.check(checks.len(), commit);
        for (i, (_, check)) in checks.iter().enumerate() {
            packed.item(i + 1, &check.algorithm, check.cost, check.enforce);
        }
        ScriptCall {
            script: self.batch.clone(),
            keys: checks.iter().map(|(key, _)| key.clone()).collect(),
            args: vec![now.unwrap_or(0).to_string().into_bytes(), packed.finish()],
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

/// `KEYS` and `ARGV` of a batch script call for `checks` (each: commit, items), in order: each
/// distinct key once in `KEYS`, so that the script reads and writes it once; `ARGV` is `now` (0:
/// read `TIME`; for tests only) and the checks packed as MessagePack.
pub fn batch_arguments<'a, C: Into<Commit>>(
    checks: impl ExactSizeIterator<Item = (C, &'a [Item])>,
    now: Option<Micros>,
) -> (Vec<&'a str>, Vec<Vec<u8>>) {
    let (keys, packed) = batch_keys_and_checks(checks);
    (
        keys,
        vec![now.unwrap_or(0).to_string().into_bytes(), packed],
    )
}

/// Reads a script reply `{allowed, limit, remaining, reset_after_us, retry_after_us}`.
pub fn parse_reply(value: &Value) -> Result<Decision, String> {
    let Value::Array(fields) = value else {
        return Err(format!("unexpected script reply: {value:?}"));
    };
    parse_fields(fields)
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

/// Reads one check's entry of a batch reply: five figures per item, one decision per item.
pub fn parse_check_reply(value: &Value, items: usize) -> Result<Vec<Decision>, String> {
    let Value::Array(fields) = value else {
        return Err(format!("unexpected check reply: {value:?}"));
    };
    if fields.len() != 5 * items {
        return Err(format!(
            "check reply has {} figures for {items} items",
            fields.len()
        ));
    }
    fields.chunks_exact(5).map(parse_fields).collect()
}

/// Reads the reply of a [`Scripts::group_call`]: one decision per key.
pub fn parse_group_reply(value: &Value, keys: usize) -> Result<Vec<Decision>, String> {
    let Value::Array(flat) = value else {
        return Err(format!("unexpected group reply: {value:?}"));
    };
    match split_batch_reply(flat, [keys])?.as_slice() {
        [Ok(figures)] => figures.chunks_exact(5).map(parse_fields).collect(),
        [Err(error)] => Err(format!("the group's check failed: {error:?}")),
        _ => Err("unexpected group reply".to_owned()),
    }
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

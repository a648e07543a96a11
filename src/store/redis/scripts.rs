//! The Lua scripts (one per algorithm from `lua/`, plus the batch script composed of their
//! functions and `lua/batch.lua`), their SHA-1s, the arguments each takes and how their integer
//! replies become [`Decision`]s without intermediate vectors.

use std::collections::HashMap;
use std::sync::Arc;

use redis::Value;

use crate::limit::{Algorithm, Decision, Micros, NEVER};
use crate::store::StoreCheck;

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
}

/// The part of an algorithm script before its entry point: its functions.
fn functions(source: &str) -> &str {
    source.split(ENTRY_MARKER).next().unwrap_or(source)
}

impl Default for Scripts {
    fn default() -> Self {
        let batch = [
            functions(TOKEN_BUCKET),
            functions(SLIDING_LOG),
            functions(FIXED_WINDOW),
            BATCH,
        ]
        .join("\n");
        Self {
            token_bucket: Script::new(TOKEN_BUCKET.to_owned()),
            sliding_log: Script::new(SLIDING_LOG.to_owned()),
            fixed_window: Script::new(FIXED_WINDOW.to_owned()),
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

    /// The script for `algorithm`.
    pub fn for_algorithm(&self, algorithm: &Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket(_) => &self.token_bucket,
            Algorithm::SlidingLog(_) => &self.sliding_log,
            Algorithm::FixedWindow(_) => &self.fixed_window,
        }
    }

    /// The single-algorithm call that decides (and, with `commit`, records) `cost` on `key`;
    /// the daemon batches instead, this is for baselines and tests. `now` is for tests only.
    pub fn call(
        &self,
        algorithm: &Algorithm,
        key: String,
        cost: u64,
        commit: bool,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args = Vec::with_capacity(6);
        match algorithm {
            Algorithm::TokenBucket(b) => args.extend([b.limit(), b.period_us(), b.capacity()]),
            Algorithm::SlidingLog(l) => args.extend([l.limit(), l.period_us()]),
            Algorithm::FixedWindow(w) => args.extend([w.limit(), w.period_us()]),
        }
        args.extend([cost, u64::from(commit)]);
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
        commit: bool,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args = BatchArgs::new(now);
        args.check(checks.len(), commit);
        for (i, (_, check)) in checks.iter().enumerate() {
            args.item(i + 1, &check.algorithm, check.cost, check.enforce);
        }
        ScriptCall {
            script: self.batch.clone(),
            keys: checks.iter().map(|(key, _)| key.clone()).collect(),
            args: args.finish(),
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
/// distinct key once in `KEYS`, so that the script reads and writes it once. `now` for tests only.
pub fn batch_arguments<'a>(
    checks: impl ExactSizeIterator<Item = (bool, &'a [Item])>,
    now: Option<Micros>,
) -> (Vec<&'a str>, Vec<Vec<u8>>) {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(checks.len());
    let mut keys: Vec<&str> = Vec::with_capacity(checks.len());
    let mut args = BatchArgs::new(now);
    for (commit, items) in checks {
        args.check(items.len(), commit);
        for item in items {
            let at = *index.entry(&item.key).or_insert_with(|| {
                keys.push(&item.key);
                keys.len()
            });
            args.item(at, &item.algorithm, item.cost, item.enforce);
        }
    }
    (keys, args.finish())
}

/// `ARGV` of the batch script, built check by check (see `lua/batch.lua`): the time, and the
/// checks' integers as one MessagePack array, which the script unpacks in C.
#[derive(Debug)]
pub struct BatchArgs {
    now: Micros,
    args: Vec<u64>,
}

impl BatchArgs {
    /// An empty batch; `now` for tests only.
    pub fn new(now: Option<Micros>) -> Self {
        Self {
            now: now.unwrap_or(0),
            args: Vec::with_capacity(64),
        }
    }

    /// Starts the next check: `items` items follow ([`BatchArgs::item`]), recorded if `commit`.
    pub fn check(&mut self, items: usize, commit: bool) {
        self.args.extend([items as u64, u64::from(commit)]);
    }

    /// One item of the current check: `key` is the 1-based index of its key in `KEYS`.
    pub fn item(&mut self, key: usize, algorithm: &Algorithm, cost: u64, enforce: bool) {
        let (kind, limit, period, capacity) = match *algorithm {
            Algorithm::TokenBucket(b) => (1, b.limit(), b.period_us(), Some(b.capacity())),
            Algorithm::SlidingLog(l) => (2, l.limit(), l.period_us(), None),
            Algorithm::FixedWindow(w) => (3, w.limit(), w.period_us(), None),
        };
        self.args
            .extend([key as u64, kind, u64::from(enforce), cost, limit, period]);
        self.args.extend(capacity);
    }

    /// The finished `ARGV`: `now` (0: read `TIME`) and the packed checks.
    pub fn finish(self) -> Vec<Vec<u8>> {
        vec![self.now.to_string().into_bytes(), msgpack_array(&self.args)]
    }
}

/// `values` as a MessagePack array of unsigned integers, each in its smallest form.
fn msgpack_array(values: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + values.len() * 5);
    match u32::try_from(values.len()) {
        Ok(n) if n < 16 => out.push(0x90 | n as u8),
        Ok(n) if n <= u32::from(u16::MAX) => {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        Ok(n) => {
            out.push(0xdd);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Err(_) => unreachable!("a batch never holds 2^32 integers"),
    }
    for &value in values {
        if value < 0x80 {
            out.push(value as u8);
        } else if let Ok(v) = u8::try_from(value) {
            out.extend_from_slice(&[0xcc, v]);
        } else if let Ok(v) = u16::try_from(value) {
            out.push(0xcd);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = u32::try_from(value) {
            out.push(0xce);
            out.extend_from_slice(&v.to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
    out
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
    match value {
        Value::Array(checks) if checks.len() == 1 => parse_check_reply(&checks[0], keys),
        other => Err(format!("unexpected group reply: {other:?}")),
    }
}

#[cfg(test)]
mod tests;

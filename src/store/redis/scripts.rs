//! The Lua scripts (one per algorithm from `lua/`, plus the group script composed of their
//! functions and `lua/group.lua`), their SHA-1s, the arguments each takes and how their integer
//! replies become [`Decision`]s.

use std::sync::Arc;

use redis::Value;

use crate::limit::{Algorithm, Decision, Micros, NEVER};
use crate::store::StoreCheck;

const TOKEN_BUCKET: &str = include_str!("../../../lua/token_bucket.lua");
const SLIDING_LOG: &str = include_str!("../../../lua/sliding_log.lua");
const FIXED_WINDOW: &str = include_str!("../../../lua/fixed_window.lua");
const GROUP: &str = include_str!("../../../lua/group.lua");

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

/// The algorithm scripts and the group script.
#[derive(Debug, Clone)]
pub struct Scripts {
    token_bucket: Script,
    sliding_log: Script,
    fixed_window: Script,
    group: Script,
}

/// The part of an algorithm script before its entry point: its functions.
fn functions(source: &str) -> &str {
    source.split(ENTRY_MARKER).next().unwrap_or(source)
}

impl Default for Scripts {
    fn default() -> Self {
        let group = [
            functions(TOKEN_BUCKET),
            functions(SLIDING_LOG),
            functions(FIXED_WINDOW),
            GROUP,
        ]
        .join("\n");
        Self {
            token_bucket: Script::new(TOKEN_BUCKET.to_owned()),
            sliding_log: Script::new(SLIDING_LOG.to_owned()),
            fixed_window: Script::new(FIXED_WINDOW.to_owned()),
            group: Script::new(group),
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
    /// `ARGV`, as integers.
    pub args: Vec<u64>,
}

impl Scripts {
    /// Every script's source, to preload.
    pub fn sources(&self) -> Vec<Arc<str>> {
        [
            &self.token_bucket,
            &self.sliding_log,
            &self.fixed_window,
            &self.group,
        ]
        .map(|s| Arc::clone(&s.source))
        .to_vec()
    }

    /// The script for `algorithm`.
    pub fn for_algorithm(&self, algorithm: &Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket(_) => &self.token_bucket,
            Algorithm::SlidingLog(_) => &self.sliding_log,
            Algorithm::FixedWindow(_) => &self.fixed_window,
        }
    }

    /// The call that decides (and, with `commit`, records) `cost` on `key`. `now` is for tests
    /// only: the daemon passes `None` so that scripts read Redis `TIME`.
    pub fn call(
        &self,
        algorithm: &Algorithm,
        key: String,
        cost: u64,
        commit: bool,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args = match algorithm {
            Algorithm::TokenBucket(b) => vec![b.limit(), b.period_us(), b.capacity(), cost],
            Algorithm::SlidingLog(l) => vec![l.limit(), l.period_us(), cost],
            Algorithm::FixedWindow(w) => vec![w.limit(), w.period_us(), cost],
        };
        args.push(u64::from(commit));
        args.extend(now);
        ScriptCall {
            script: self.for_algorithm(algorithm).clone(),
            keys: vec![key],
            args,
        }
    }

    /// The group call over `checks` (with their Redis keys): all allowed ones are recorded (with
    /// `commit`) if every enforced one allows, else none. `now` as in [`Scripts::call`]; `None`
    /// is sent as 0, the group script's "read TIME".
    pub fn group_call(
        &self,
        checks: &[(String, &StoreCheck)],
        commit: bool,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args = vec![u64::from(commit), now.unwrap_or(0)];
        for (_, check) in checks {
            let (kind, limit, period, capacity) = match check.algorithm {
                Algorithm::TokenBucket(b) => (1, b.limit(), b.period_us(), Some(b.capacity())),
                Algorithm::SlidingLog(l) => (2, l.limit(), l.period_us(), None),
                Algorithm::FixedWindow(w) => (3, w.limit(), w.period_us(), None),
            };
            args.extend([kind, u64::from(check.enforce), check.cost, limit, period]);
            args.extend(capacity);
        }
        ScriptCall {
            script: self.group.clone(),
            keys: checks.iter().map(|(key, _)| key.clone()).collect(),
            args,
        }
    }
}

/// Reads a script reply `{allowed, limit, remaining, reset_after_us, retry_after_us}`.
pub fn parse_reply(value: &Value) -> Result<Decision, String> {
    let fields: Vec<i64> =
        redis::from_redis_value_ref(value).map_err(|e| format!("unexpected script reply: {e}"))?;
    let [allowed, limit, remaining, reset, retry] = fields[..] else {
        return Err(format!(
            "script reply has {} fields, expected 5",
            fields.len()
        ));
    };
    let non_negative =
        |n: i64| u64::try_from(n).map_err(|_| format!("negative field {n} in script reply"));
    Ok(Decision {
        allowed: allowed == 1,
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        reset_after_us: non_negative(reset)?,
        retry_after_us: if retry < 0 {
            NEVER
        } else {
            non_negative(retry)?
        },
    })
}

/// Reads a group reply: one decision per key.
pub fn parse_group_reply(value: &Value, keys: usize) -> Result<Vec<Decision>, String> {
    let Value::Array(items) = value else {
        return Err("unexpected group reply".into());
    };
    if items.len() != keys {
        return Err(format!(
            "group reply has {} results for {keys} keys",
            items.len()
        ));
    }
    items.iter().map(parse_reply).collect()
}

#[cfg(test)]
mod tests;

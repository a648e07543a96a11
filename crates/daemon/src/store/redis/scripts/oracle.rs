//! The scripts as tests and the bench call them, apart from what the daemon sends: one script
//! call as plain `KEYS` and `ARGV` (with a test's fixed `now`), and readers of a whole reply. The
//! differential tests run these against the Rust twins; the bench's baselines call the algorithm
//! scripts one by one.

use redis::Value;

use super::command::{
    batch_keys_and_checks, quota_args, BatchArgs, Packed, BUCKET_QUOTA, CHECK_HEAD, ITEM_HEAD, LEAN,
};
use super::{parse_fields, parse_figures, split_batch_reply, Commit, Item, Script, Scripts};
use crate::limit::{Algorithm, Decision, Micros};
use crate::store::{Spend, StoreCheck};

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

/// The calls tests and baselines make of [`Scripts`] (the daemon batches instead).
pub trait ScriptCalls {
    /// The scripts called.
    fn scripts(&self) -> &Scripts;

    /// The single-algorithm call that decides (and, with [`Spend::Record`], records) `cost` on
    /// `key`. `now` is for tests only.
    fn call(
        &self,
        algorithm: &Algorithm,
        key: String,
        cost: u64,
        spend: Spend,
        now: Option<Micros>,
    ) -> ScriptCall {
        let mut args: Vec<u64> = quota_args(algorithm, now).collect();
        args.extend([cost, Commit::from(spend).flag()]);
        args.extend(now);
        ScriptCall {
            script: self.scripts().for_algorithm(algorithm).clone(),
            keys: vec![key],
            args: args.iter().map(|n| n.to_string().into_bytes()).collect(),
        }
    }

    /// The lease script's call (`lua/lease.lua`): `mode` `take` (at most `units`, at most
    /// `1/extra` of what is left) or `back` (`units` into fixed window number `extra`, if the
    /// counter's lease epoch is still `epoch`) on `key` of a token bucket or fixed window. `now`
    /// as in [`ScriptCalls::call`].
    #[allow(clippy::too_many_arguments)]
    fn lease_call(
        &self,
        algorithm: &Algorithm,
        key: String,
        mode: &str,
        units: u64,
        extra: u64,
        epoch: u64,
        now: Option<Micros>,
    ) -> ScriptCall {
        let (kind, limit, period, capacity) = match *algorithm {
            Algorithm::TokenBucket(b) => ("tb", b.limit(), b.period_us(), b.capacity()),
            Algorithm::FixedWindow(w) => ("fw", w.limit(), w.period_us(), 0),
            Algorithm::SlidingLog(l) => ("sl", l.limit(), l.period_us(), 0),
            Algorithm::Concurrency(c) => ("cc", c.limit(), c.ttl_us(), 0),
        };
        let mut args = vec![mode.as_bytes().to_vec(), kind.as_bytes().to_vec()];
        args.extend(
            [limit, period, capacity, units, extra, epoch]
                .into_iter()
                .chain(now)
                .map(|n| n.to_string().into_bytes()),
        );
        let epoch_key = crate::store::redis::keys::lease_epoch_key(&key);
        ScriptCall {
            script: self.scripts().lease().clone(),
            keys: vec![key, epoch_key],
            args,
        }
    }

    /// A batch call holding one check over `checks` (with their Redis keys): all allowed ones
    /// are recorded (with `commit`) if every enforced one allows, else none. `now` as in
    /// [`ScriptCalls::call`]; `None` is sent as 0, the batch script's "read TIME".
    fn group_call(
        &self,
        checks: &[(String, &StoreCheck)],
        commit: impl Into<Commit>,
        now: Option<Micros>,
    ) -> ScriptCall {
        // A token bucket's item ends with its most_ahead too.
        let widest = ITEM_HEAD + BUCKET_QUOTA + 1;
        let mut packed = Packed::with_capacity(CHECK_HEAD + widest * checks.len());
        packed.near = now;
        packed.check(checks.len(), commit);
        for (i, (_, check)) in checks.iter().enumerate() {
            packed.item(i + 1, &check.algorithm, check.cost, check.enforce);
        }
        ScriptCall {
            script: self.scripts().batch().clone(),
            keys: checks.iter().map(|(key, _)| key.clone()).collect(),
            args: vec![now.unwrap_or(0).to_string().into_bytes(), packed.finish()],
        }
    }
}

impl ScriptCalls for Scripts {
    fn scripts(&self) -> &Scripts {
        self
    }
}

/// `KEYS` and `ARGV` of a batch script call for `checks` (each: commit, items), in order, as the
/// daemon sends them: each distinct key once in `KEYS`, so that the script reads and writes it
/// once; `ARGV` is `now` (0: read `TIME`; for tests only), the checks packed as MessagePack, and
/// the lean flag when the batch qualifies (`lua/batch.lua`).
pub fn batch_arguments<'a, C: Into<Commit>>(
    checks: impl ExactSizeIterator<Item = (C, &'a [Item])>,
    now: Option<Micros>,
) -> (Vec<&'a str>, Vec<Vec<u8>>) {
    batch_arguments_near(checks, now, now)
}

/// As [`batch_arguments`], with calendar windows' boundaries drawn around `near` (the daemon's
/// clock; `None`: read now) rather than around `now` (the store's): a daemon and a Redis whose
/// clocks disagree.
pub fn batch_arguments_near<'a, C: Into<Commit>>(
    checks: impl ExactSizeIterator<Item = (C, &'a [Item])>,
    now: Option<Micros>,
    near: Option<Micros>,
) -> (Vec<&'a str>, Vec<Vec<u8>>) {
    let BatchArgs { keys, packed, lean } = batch_keys_and_checks(checks, near);
    let mut args = vec![now.unwrap_or(0).to_string().into_bytes(), packed];
    if lean {
        args.push(LEAN.as_bytes().to_vec());
    }
    (keys, args)
}

/// Reads a script reply `{allowed, limit, remaining, reset_after_us, retry_after_us}`.
pub fn parse_reply(value: &Value) -> Result<Decision, String> {
    let Value::Array(fields) = value else {
        return Err(format!("unexpected script reply: {value:?}"));
    };
    parse_fields(fields)
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
    parse_figures(fields)
}

/// Reads the reply of a [`ScriptCalls::group_call`]: one decision per key.
pub fn parse_group_reply(value: &Value, keys: usize) -> Result<Vec<Decision>, String> {
    let Value::Array(flat) = value else {
        return Err(format!("unexpected group reply: {value:?}"));
    };
    match split_batch_reply(flat, [keys])?.as_slice() {
        [Ok(figures)] => parse_figures(figures),
        [Err(error)] => Err(format!("the group's check failed: {error:?}")),
        _ => Err("unexpected group reply".to_owned()),
    }
}

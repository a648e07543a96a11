//! Script calls as Redis commands: an algorithm script's `ARGV`, the batch script's `KEYS` (each
//! distinct key once) and its checks packed as one MessagePack array, and the `EVALSHA` / `EVAL`
//! command the batcher writes.

use std::collections::HashMap;

use redis::Cmd;

use super::{Commit, Item, Script, Scripts};
use crate::limit::{Algorithm, Micros};

/// How a call names its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptRef {
    /// `EVALSHA sha`: the normal, small form.
    Sha,
    /// `EVAL source`: after `NOSCRIPT`; runs and caches the script.
    Source,
}

impl ScriptRef {
    /// The verb and its first argument for `script`.
    fn of(self, script: &Script) -> (&'static str, &str) {
        match self {
            Self::Sha => ("EVALSHA", &script.sha),
            Self::Source => ("EVAL", &script.source),
        }
    }
}

/// Where a batch call names its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// Declared in `KEYS`, so that Redis (or a Cluster client) routes by them.
    Declared,
    /// In `ARGV` after the checks, no key declared: a Cluster node call (the node script).
    AfterChecks,
}

/// A packed item's algorithm kind (`lua/batch.lua` names them alike: `TOKEN_BUCKET`, ...).
pub(crate) const TOKEN_BUCKET: u64 = 1;
/// See [`TOKEN_BUCKET`].
pub(crate) const SLIDING_LOG: u64 = 2;
/// See [`TOKEN_BUCKET`].
pub(crate) const FIXED_WINDOW: u64 = 3;
/// See [`TOKEN_BUCKET`]: a fixed window on a calendar, sent to the batch script only.
pub(crate) const CALENDAR_WINDOW: u64 = 4;

/// How many integers start a packed check: its item count and its commit flag (named for the
/// layout test and the oracle; the encoder writes them in place).
#[cfg(any(test, feature = "test-util"))]
pub(crate) const CHECK_HEAD: usize = 2;
/// How many integers start a packed item, before its quota: key index, kind, enforce, cost.
#[cfg(any(test, feature = "test-util"))]
pub(crate) const ITEM_HEAD: usize = 4;
/// A token bucket's quota arguments: limit, period_us, capacity.
pub(crate) const BUCKET_QUOTA: usize = 3;
/// A sliding log's or fixed window's quota arguments: limit, period_us.
pub(crate) const QUOTA: usize = 2;
/// A calendar window's quota arguments: limit, and four boundaries in place of period_us.
pub(crate) const CALENDAR_QUOTA: usize = 5;

/// Where the batch script's test-only `now_us` is: `ARGV[1]`, before the packed checks.
pub(crate) const BATCH_NOW_ARGV: usize = 1;

/// Where an algorithm script's test-only `now_us` is: after its `quota` arguments, the cost and
/// the commit flag.
pub(crate) const fn single_now_argv(quota: usize) -> usize {
    quota + 3
}

/// An item's algorithm kind in the packed checks. A concurrency limit is never packed: it has
/// its own script (`lua/concurrency.lua`), and the store refuses its checks before encoding.
pub(crate) fn kind(algorithm: &Algorithm) -> u64 {
    match algorithm {
        Algorithm::TokenBucket(_) => TOKEN_BUCKET,
        Algorithm::SlidingLog(_) => SLIDING_LOG,
        Algorithm::FixedWindow(w) if w.calendar_of().is_some() => CALENDAR_WINDOW,
        Algorithm::FixedWindow(_) | Algorithm::Concurrency(_) => FIXED_WINDOW,
    }
}

/// Whether a check of `algorithm` alone may go out as its algorithm's own script: every one but a
/// calendar window (its script knows only periods; the batch script knows calendars).
pub(crate) fn has_own_script(algorithm: &Algorithm) -> bool {
    kind(algorithm) != CALENDAR_WINDOW
}

/// The daemon's own wall clock, in µs since the epoch: only to choose the calendar boundaries a
/// call carries (Redis' clock picks the window among them).
pub(crate) fn wall_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// An algorithm script's quota arguments, `ARGV[1..]` as its header gives them (limit,
/// period_us, and for a token bucket capacity); a packed item's last fields, in that order. A
/// calendar window's are its limit and the four boundaries around `near` (the daemon's clock,
/// read only then when `None`; a test's `now` otherwise).
pub(crate) fn quota_args(algorithm: &Algorithm, near: Option<Micros>) -> impl Iterator<Item = u64> {
    let (args, len) = match *algorithm {
        Algorithm::TokenBucket(b) => ([b.limit(), b.period_us(), b.capacity(), 0, 0], BUCKET_QUOTA),
        Algorithm::SlidingLog(l) => ([l.limit(), l.period_us(), 0, 0, 0], QUOTA),
        Algorithm::FixedWindow(w) => match w.calendar_of() {
            Some(calendar) => {
                let [b1, b2, b3, b4] = calendar.boundaries_near(near.unwrap_or_else(wall_now));
                ([w.limit(), b1, b2, b3, b4], CALENDAR_QUOTA)
            }
            None => ([w.limit(), w.period_us(), 0, 0, 0], QUOTA),
        },
        Algorithm::Concurrency(c) => ([c.limit(), c.ttl_us(), 0, 0, 0], QUOTA),
    };
    args.into_iter().take(len)
}

/// The batch script call for `checks` (each: commit, items), in arrival order.
pub(crate) fn batch_command<'a>(
    script: &Script,
    checks: impl ExactSizeIterator<Item = (Commit, &'a [Item])>,
    by: ScriptRef,
    counters: Counters,
) -> Cmd {
    let BatchArgs { keys, packed, lean } = batch_keys_and_checks(checks, None);
    let (verb, script) = by.of(script);
    let size = script.len() + packed.len() + keys.iter().map(|k| k.len()).sum::<usize>() + 32;
    let mut cmd = Cmd::with_capacity(keys.len() + 6, size);
    cmd.arg(verb).arg(script);
    // `now` 0: the script reads Redis `TIME`. A node call's ARGV[3..] are its counters: never
    // lean.
    match counters {
        Counters::Declared => {
            cmd.arg(keys.len()).arg(&keys).arg(0).arg(packed);
            if lean {
                cmd.arg(LEAN);
            }
        }
        Counters::AfterChecks => {
            cmd.arg(0).arg(0).arg(packed).arg(&keys);
        }
    }
    cmd
}

/// The algorithm script call for one check (not a report) of one counter.
pub(crate) fn single_command(scripts: &Scripts, item: &Item, commit: Commit, by: ScriptRef) -> Cmd {
    let (verb, script) = by.of(scripts.for_algorithm(&item.algorithm));
    let mut cmd = Cmd::with_capacity(10, item.key.len() + 128);
    cmd.arg(verb).arg(script).arg(1).arg(&item.key);
    // ARGV as each script's header gives it; no `now` (the script reads Redis `TIME`).
    for arg in quota_args(&item.algorithm, None) {
        cmd.arg(arg);
    }
    cmd.arg(item.cost).arg(commit.flag());
    cmd
}

/// A batch call's arguments: `KEYS` (each distinct key once), the packed checks, and whether
/// the lean loop of `lua/batch.lua` may run it (every check one item and not a report, no key
/// in two checks: each check is then its algorithm's own script).
pub(crate) struct BatchArgs<'a> {
    pub(crate) keys: Vec<&'a str>,
    pub(crate) packed: Vec<u8>,
    pub(crate) lean: bool,
}

/// The `ARGV[3]` that selects the lean loop.
pub(crate) const LEAN: &str = "1";

/// The arguments of a batch of `checks`.
/// `near`: what calendar boundaries are drawn around (`None`: the daemon's clock; a test's `now`).
pub(crate) fn batch_keys_and_checks<'a, C: Into<Commit>>(
    checks: impl ExactSizeIterator<Item = (C, &'a [Item])>,
    near: Option<Micros>,
) -> BatchArgs<'a> {
    // Small batches (most of them at low load) scan; large ones hash.
    const SCAN: usize = 16;
    let count = checks.len();
    let mut keys: Vec<&str> = Vec::with_capacity(count);
    let mut index: HashMap<&str, usize> = HashMap::new();
    let hashed = count > SCAN;
    let mut packed = Packed::with_capacity(count * 12);
    packed.near = near;
    let mut one_item_each = true;
    for (commit, items) in checks {
        let commit = commit.into();
        one_item_each &= items.len() == 1 && commit != Commit::Report;
        packed.check(items.len(), commit);
        for item in items {
            let known = if hashed {
                index.get(item.key.as_str()).copied()
            } else {
                keys.iter().position(|k| *k == item.key).map(|i| i + 1)
            };
            let at = known.unwrap_or_else(|| {
                keys.push(&item.key);
                if hashed {
                    index.insert(&item.key, keys.len());
                }
                keys.len()
            });
            packed.item(at, &item.algorithm, item.cost, item.enforce);
        }
    }
    BatchArgs {
        lean: one_item_each && keys.len() == count,
        keys,
        packed: packed.finish(),
    }
}

/// The checks of a batch as one MessagePack array of unsigned integers (see `lua/batch.lua`),
/// encoded as they are appended; the array's 32-bit length is filled in at the end.
#[derive(Debug)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    len: u32,
    /// The instant calendar windows' boundaries are drawn around: a test's `now`, or the
    /// daemon's clock read at the first calendar item.
    pub(crate) near: Option<Micros>,
}

impl Packed {
    /// An empty array with room for about `integers` integers.
    pub(crate) fn with_capacity(integers: usize) -> Self {
        let mut bytes = Vec::with_capacity(5 + integers * 5);
        bytes.extend_from_slice(&[0xdd, 0, 0, 0, 0]);
        Self {
            bytes,
            len: 0,
            near: None,
        }
    }

    /// Starts the next check: `items` items follow ([`Packed::item`]), recorded as `commit` says.
    pub(crate) fn check(&mut self, items: usize, commit: impl Into<Commit>) {
        self.push(items as u64);
        self.push(commit.into().flag());
    }

    /// One item of the current check: `key` is the 1-based index of its key in `KEYS`.
    /// A token bucket's quota is followed by its `most_ahead` (how far a report may put its TAT
    /// past now, [`TokenBucket::max_ahead`](crate::limit::TokenBucket::max_ahead)), which the
    /// script reads only for a report.
    pub(crate) fn item(&mut self, key: usize, algorithm: &Algorithm, cost: u64, enforce: bool) {
        for value in [key as u64, kind(algorithm), u64::from(enforce), cost] {
            self.push(value);
        }
        if kind(algorithm) == CALENDAR_WINDOW && self.near.is_none() {
            self.near = Some(wall_now());
        }
        for value in quota_args(algorithm, self.near) {
            self.push(value);
        }
        if let Algorithm::TokenBucket(bucket) = algorithm {
            // At most MAX_AHEAD (2^52): always a u64.
            self.push(u64::try_from(bucket.max_ahead()).unwrap_or(u64::MAX));
        }
    }

    /// Each integer in its smallest MessagePack form.
    fn push(&mut self, value: u64) {
        self.len += 1;
        let out = &mut self.bytes;
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

    /// The encoded array.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.bytes[1..5].copy_from_slice(&self.len.to_be_bytes());
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::limit::{FixedWindow, SlidingLog, TokenBucket};

    /// The integer constants `lua/batch.lua` declares on its `local A, B = 1, 2` lines.
    fn lua_constants() -> HashMap<&'static str, u64> {
        let mut constants = HashMap::new();
        for line in super::super::BATCH.lines() {
            let Some((names, values)) = line
                .strip_prefix("local ")
                .and_then(|rest| rest.split_once(" = "))
            else {
                continue;
            };
            let names: Vec<&str> = names.split(", ").collect();
            let values: Vec<Option<u64>> = values.split(", ").map(|v| v.parse().ok()).collect();
            if names.len() == values.len()
                && names
                    .iter()
                    .all(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            {
                for (name, value) in names.into_iter().zip(values) {
                    constants.insert(name, value.expect("an integer constant"));
                }
            }
        }
        constants
    }

    #[test]
    fn the_packed_layout_is_named_alike_in_rust_and_lua() {
        let lua = lua_constants();
        let named = |name: &str| {
            *lua.get(name)
                .unwrap_or_else(|| panic!("{name} not in batch.lua"))
        };
        let bucket = Algorithm::TokenBucket(TokenBucket::new(10, 1_000, 20).expect("valid"));
        let log = Algorithm::SlidingLog(SlidingLog::new(10, 1_000).expect("valid"));
        let window = Algorithm::FixedWindow(FixedWindow::new(10, 1_000).expect("valid"));
        assert_eq!(kind(&bucket), named("TOKEN_BUCKET"));
        assert_eq!(kind(&log), named("SLIDING_LOG"));
        assert_eq!(kind(&window), named("FIXED_WINDOW"));
        assert_eq!(Commit::DryRun.flag(), named("DRY_RUN"));
        assert_eq!(Commit::IfAllowed.flag(), named("RECORD"));
        assert_eq!(Commit::Report.flag(), named("REPORT"));
        // Widths as the encoder writes them, not as the constants above claim.
        let mut packed = Packed::with_capacity(0);
        packed.check(3, Commit::IfAllowed);
        assert_eq!(packed.len as usize, CHECK_HEAD);
        assert_eq!(named("HEAD_WIDTH"), CHECK_HEAD as u64);
        for (algorithm, width) in [
            (bucket, "BUCKET_WIDTH"),
            (log, "ITEM_WIDTH"),
            (window, "ITEM_WIDTH"),
        ] {
            let before = packed.len;
            packed.item(1, &algorithm, 1, true);
            assert_eq!(
                u64::from(packed.len - before),
                named(width),
                "{algorithm:?}"
            );
        }
    }

    #[test]
    fn each_prelude_reads_the_now_its_script_header_names() {
        let scripts = Scripts::default();
        for (source, header, script) in [
            (
                super::super::TOKEN_BUCKET,
                single_now_argv(BUCKET_QUOTA),
                &scripts.token_bucket,
            ),
            (
                super::super::SLIDING_LOG,
                single_now_argv(QUOTA),
                &scripts.sliding_log,
            ),
            (
                super::super::FIXED_WINDOW,
                single_now_argv(QUOTA),
                &scripts.fixed_window,
            ),
            (super::super::BATCH, BATCH_NOW_ARGV, &scripts.batch),
        ] {
            let documented = format!("-- ARGV[{header}]");
            assert!(
                source
                    .lines()
                    .any(|l| l.starts_with(&documented) && l.contains("now_us")),
                "{documented} now_us"
            );
            let read = format!("local test_now = ARGV[{header}]");
            assert_eq!(script.source.matches(&read).count(), 1, "{read}");
            assert!(!script.source.contains(super::super::NOW_ARGV));
            assert!(
                !source.contains("test_now = ARGV"),
                "the prelude is composed in"
            );
        }
    }
}

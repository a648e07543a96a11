//! The embedded store's byte budget against the process's real footprint: with the default
//! `memory.max_keys` and `memory.max_bytes`, and the daemon's allocator (mimalloc), 2 million
//! distinct 200-byte partitions leave the process's resident set within `memory.max_bytes` plus
//! the documented fixed overhead. Its own binary, so the resident set is this test's alone.

use std::sync::Arc;

use futures_util::FutureExt;
use sluice::clock::ManualClock;
use sluice::config::MemorySettings;
use sluice::limit::{Algorithm, Key, TokenBucket};
use sluice::store::{MemoryStore, RateStore, Spend, StoreCheck};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEYS: usize = 2_000_000;
const MIB: usize = 1 << 20;
/// What the process may hold beyond `memory.max_bytes` (docs/operations.md: `memory.max_bytes`).
const FIXED_OVERHEAD: usize = 32 * MIB;

fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn two_million_keys_stay_within_the_byte_budget_plus_the_fixed_overhead() {
    let defaults = MemorySettings::default();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let store = MemoryStore::new(defaults.max_keys, clock, None).with_max_bytes(defaults.max_bytes);
    let policy: Arc<str> = Arc::from("public_api");
    let algorithm =
        Algorithm::TokenBucket(TokenBucket::new(1000, 60_000_000, 150).expect("valid bucket"));
    let before = resident_bytes();
    let mut value = String::with_capacity(200);
    let padding = "k".repeat(200 - 12);
    for i in 0..KEYS {
        value.clear();
        std::fmt::Write::write_fmt(&mut value, format_args!("{i:012}{padding}")).expect("write");
        let check = [StoreCheck {
            key: Key::new(policy.clone(), [value.as_str()]),
            algorithm,
            cost: 1,
            enforce: true,
            generation: 0,
        }];
        let decisions = store
            .check(&check, Spend::Record, None)
            .now_or_never()
            .expect("the embedded store answers at once")
            .expect("decided");
        assert!(decisions[0].allowed);
    }
    let rss = resident_bytes();
    println!(
        "{KEYS} keys: {} held, store estimate {} MiB, resident {} MiB (before {} MiB; budget {} MiB + {} MiB)",
        store.len(),
        store.bytes() / MIB,
        rss / MIB,
        before / MIB,
        defaults.max_bytes / MIB,
        FIXED_OVERHEAD / MIB
    );
    assert!(store.bytes() <= defaults.max_bytes);
    assert!(
        rss <= defaults.max_bytes + FIXED_OVERHEAD,
        "resident {} MiB over the budget",
        rss / MIB
    );
    assert!(rss < 100 * MIB, "resident {} MiB", rss / MIB);
}

//! Redis memory per key for each algorithm's layout, next to the naive layouts an app might use:
//! `used_memory` growth divided by the key count, and the mean `MEMORY USAGE` of a sample.

use anyhow::Result;
use serde::Serialize;

use super::clients::{daemon_key, NAIVE_SCRIPT};
use super::procs::Redis;
use sluice::limit::{Algorithm, FixedWindow, SlidingLog, TokenBucket};
use sluice::store::redis::scripts::oracle::ScriptCalls;
use sluice::store::redis::scripts::Scripts;
use sluice::store::Spend;

/// One layout's footprint.
#[derive(Debug, Clone, Serialize)]
pub struct Footprint {
    /// What was stored.
    pub layout: String,
    /// Keys written.
    pub keys: usize,
    /// `used_memory` growth per key, bytes.
    pub used_memory_per_key: f64,
    /// Mean `MEMORY USAGE` of up to 200 keys, bytes.
    pub memory_usage: f64,
}

fn naive_sha() -> String {
    sha1_smol::Sha1::from(NAIVE_SCRIPT.as_bytes())
        .digest()
        .to_string()
}

fn used_memory(conn: &mut redis::Connection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Measures every layout over `keys` keys, each on a fresh server.
pub fn measure(keys: usize) -> Result<Vec<Footprint>> {
    let scripts = Scripts::default();
    // Quotas whose state outlives the measurement (a key that expires is not memory).
    let bucket = Algorithm::TokenBucket(
        TokenBucket::new(10, 3_600_000_000, 150).map_err(anyhow::Error::msg)?,
    );
    let log = Algorithm::SlidingLog(SlidingLog::new(10, 300_000_000).map_err(anyhow::Error::msg)?);
    let window =
        Algorithm::FixedWindow(FixedWindow::new(1000, 3_600_000_000).map_err(anyhow::Error::msg)?);
    let script = |algorithm: Algorithm, policy: &'static str, repeat: usize| {
        let scripts = scripts.clone();
        move |pipe: &mut redis::Pipeline, k: usize| {
            let call = scripts.call(&algorithm, daemon_key(policy, k), 1, Spend::Record, None);
            for _ in 0..repeat {
                pipe.cmd("EVALSHA")
                    .arg(&*call.script.sha)
                    .arg(1)
                    .arg(&call.keys)
                    .arg(&call.args);
            }
            call.keys[0].clone()
        }
    };
    type Writer = Box<dyn Fn(&mut redis::Pipeline, usize) -> String>;
    let layouts: Vec<(&str, Writer)> = vec![
        (
            "sluice token bucket (10/h, burst 150)",
            Box::new(script(bucket, "public_api", 1)),
        ),
        (
            "sluice sliding log, 10 entries",
            Box::new(script(log, "login", 10)),
        ),
        ("sluice fixed window", Box::new(script(window, "window", 1))),
        (
            "naive token bucket (hash of floats + TTL)",
            Box::new(|pipe: &mut redis::Pipeline, k: usize| {
                let key = format!("rl:public_api:{k}");
                pipe.cmd("EVALSHA")
                    .arg(naive_sha())
                    .arg(1)
                    .arg(&key)
                    .arg(1000.0 / 60.0)
                    .arg(150);
                key
            }),
        ),
        (
            "naive counter (INCR + EXPIRE)",
            Box::new(|pipe: &mut redis::Pipeline, k: usize| {
                let key = format!("rl:window:{k}");
                pipe.cmd("INCR").arg(&key).cmd("EXPIRE").arg(&key).arg(60);
                key
            }),
        ),
        (
            "naive sorted set, 10 unique members",
            Box::new(|pipe: &mut redis::Pipeline, k: usize| {
                let key = format!("rl:login:{k}");
                for i in 0..10u64 {
                    let now = 1_764_000_000_000_000u64 + i * 1_000;
                    pipe.cmd("ZADD")
                        .arg(&key)
                        .arg(now)
                        .arg(format!("{now}-{:08x}", (k as u64) * 31 + i));
                }
                pipe.cmd("EXPIRE").arg(&key).arg(300);
                key
            }),
        ),
    ];
    let mut footprints = Vec::new();
    for (name, write) in layouts {
        let redis = Redis::start()?;
        let mut conn = redis::Client::open(redis.url())?.get_connection()?;
        for source in scripts
            .sources()
            .iter()
            .map(|s| s.to_string())
            .chain([NAIVE_SCRIPT.to_owned()])
        {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query::<String>(&mut conn)?;
        }
        let before = used_memory(&mut conn)?;
        let mut sample = Vec::new();
        for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
            let mut pipe = redis::pipe();
            for &k in chunk {
                let key = write(&mut pipe, k);
                if sample.len() < 200 && k % (keys / 200).max(1) == 0 {
                    sample.push(key);
                }
            }
            pipe.query::<redis::Value>(&mut conn)?;
        }
        let after = used_memory(&mut conn)?;
        let usage: Vec<f64> = sample
            .iter()
            .filter_map(|key| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(key)
                    .query::<f64>(&mut conn)
                    .ok()
            })
            .collect();
        footprints.push(Footprint {
            layout: name.to_owned(),
            keys,
            used_memory_per_key: (after - before) / keys as f64,
            memory_usage: usage.iter().sum::<f64>() / usage.len().max(1) as f64,
        });
    }
    Ok(footprints)
}

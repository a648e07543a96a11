//! The clients a benchmark drives: sluice over TCP or the Unix socket, and the baselines an app
//! without sluice would use: the same Lua script by EVALSHA, and a naive token-bucket script of the
//! kind most teams write (floats in a hash, HMGET then HSET), both one call at a time.

use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use redis::aio::MultiplexedConnection;

use super::load::{CallFuture, Client, Factory};
use sluice::client::{Connection, Target};
use sluice::limit::{Algorithm, Key};
use sluice::store::redis::keys::redis_key;
use sluice::store::redis::scripts::oracle::ScriptCalls;
use sluice::store::redis::scripts::Scripts;
use sluice::store::Spend;

/// A naive token bucket: tokens and timestamp as floats in a hash, HMGET then HSET.
pub const NAIVE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000))
return {allowed, math.floor(tokens)}
";

struct Sluice {
    conn: Connection,
    bodies: Arc<Vec<Bytes>>,
}

impl Client for Sluice {
    fn call(&mut self, key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let body = self.bodies[key % self.bodies.len()].clone();
            let reply = self.conn.post_bytes("/v1/check", body).await?;
            Ok(matches!(reply.status.as_u16(), 200 | 429))
        })
    }
}

/// Clients of the daemon at `target`, checking `policy` with descriptor `k` = key number.
pub fn sluice(target: Target, policy: &str, keys: usize) -> Factory {
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..keys.max(1))
            .map(|k| {
                Bytes::from(format!(
                    r#"{{"policy":"{policy}","descriptors":{{"k":"{k}"}}}}"#
                ))
            })
            .collect(),
    );
    Arc::new(move || {
        let (target, bodies) = (target.clone(), Arc::clone(&bodies));
        Box::pin(async move {
            let conn = Connection::open(&target).await?;
            Ok(Box::new(Sluice { conn, bodies }) as Box<dyn Client>)
        })
    })
}

struct Script {
    conn: MultiplexedConnection,
    sha: Arc<str>,
    keys: Arc<Vec<String>>,
    args: Arc<Vec<Vec<u8>>>,
}

impl Client for Script {
    fn call(&mut self, key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let reply: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
                .arg(&*self.sha)
                .arg(1)
                .arg(&self.keys[key % self.keys.len()])
                .arg(&*self.args)
                .query_async(&mut self.conn)
                .await;
            Ok(reply.is_ok())
        })
    }
}

async fn script_factory(
    url: &str,
    source: &str,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
) -> Result<Factory> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query_async(&mut conn)
        .await
        .context("loading a baseline script")?;
    let (sha, keys, args) = (Arc::<str>::from(sha), Arc::new(keys), Arc::new(args));
    Ok(Arc::new(move || {
        let (client, sha, keys, args) = (
            client.clone(),
            Arc::clone(&sha),
            Arc::clone(&keys),
            Arc::clone(&args),
        );
        Box::pin(async move {
            // One connection per client: each waits for its reply before the next call.
            let conn = client.get_multiplexed_async_connection().await?;
            Ok(Box::new(Script {
                conn,
                sha,
                keys,
                args,
            }) as Box<dyn Client>)
        })
    }))
}

/// The daemon's own key for policy `policy` and key number `k`, as the daemon would build it.
pub fn daemon_key(policy: &str, k: usize) -> String {
    redis_key("rl", &Key::new(Arc::from(policy), [k.to_string().as_str()]))
}

/// Raw, unpipelined EVALSHA of sluice's own script for `algorithm`, on the daemon's keys.
pub async fn raw_evalsha(
    url: &str,
    policy: &str,
    algorithm: &Algorithm,
    keys: usize,
) -> Result<Factory> {
    let scripts = Scripts::default();
    let call = scripts.call(algorithm, String::new(), 1, Spend::Record, None);
    let keys = (0..keys.max(1)).map(|k| daemon_key(policy, k)).collect();
    script_factory(url, &call.script.source, keys, call.args).await
}

/// Raw, unpipelined EVALSHA of [`NAIVE_SCRIPT`] at `rate` per second, burst `capacity`.
pub async fn naive(url: &str, keys: usize, rate: u64, capacity: u64) -> Result<Factory> {
    let keys = (0..keys.max(1)).map(|k| format!("naive:{k}")).collect();
    let args = [rate, capacity]
        .map(|n| n.to_string().into_bytes())
        .to_vec();
    script_factory(url, NAIVE_SCRIPT, keys, args).await
}

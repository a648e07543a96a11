//! Redis settings: where it is (one primary, a Cluster, or Sentinels), deadlines, pipelining and
//! the circuit breaker.

use serde::{Deserialize, Serialize};

use super::HumanDuration;

/// Redis connection settings. None of `url`, `cluster`, `sentinel.nodes`: the embedded store.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// One primary: `redis://[user:password@]host:port[/db]`.
    pub url: Option<String>,
    /// Seed nodes of a Redis Cluster.
    pub cluster: Vec<String>,
    /// A Sentinel set watching the primary.
    pub sentinel: SentinelSettings,
    /// Prefix of every key: `<prefix>:{<policy>:<partition>}`.
    pub key_prefix: String,
    /// Deadline of one check's Redis calls (policies may set their own); past it the policy's
    /// failure mode answers.
    pub timeout: HumanDuration,
    /// Timeout of one connection attempt.
    pub connect_timeout: HumanDuration,
    /// Most checks coalesced into one pipeline.
    pub max_batch: usize,
    /// Pipelines in flight at once.
    pub pipelines_in_flight: usize,
    /// Checks waiting for a pipeline, at most (back-pressure beyond).
    pub queue: usize,
    /// The circuit breaker.
    pub breaker: BreakerSettings,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: None,
            cluster: Vec::new(),
            sentinel: SentinelSettings::default(),
            key_prefix: "rl".into(),
            timeout: HumanDuration(5_000),
            connect_timeout: HumanDuration(1_000_000),
            max_batch: 128,
            pipelines_in_flight: 4,
            queue: 10_000,
            breaker: BreakerSettings::default(),
        }
    }
}

impl RedisSettings {
    /// Whether Redis is configured at all.
    pub fn enabled(&self) -> bool {
        self.sources() > 0
    }

    /// How many of `url`, `cluster`, `sentinel.nodes` are set.
    pub(crate) fn sources(&self) -> usize {
        usize::from(self.url.as_ref().is_some_and(|url| !url.is_empty()))
            + usize::from(!self.cluster.is_empty())
            + usize::from(!self.sentinel.nodes.is_empty())
    }
}

/// Sentinel discovery of the primary.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SentinelSettings {
    /// Sentinel URLs (`redis://host:26379`).
    pub nodes: Vec<String>,
    /// The monitored primary's name.
    pub master: String,
    /// Username for the data nodes.
    pub username: Option<String>,
    /// Password for the data nodes.
    pub password: Option<String>,
}

/// When the circuit opens and how fast the prober retries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    /// Consecutive failed checks that open the circuit (errors that mean "this node cannot
    /// serve", such as READONLY or a refused connection, open it at once).
    pub failures: u32,
    /// First delay between reconnection attempts.
    pub probe_min: HumanDuration,
    /// Longest delay between reconnection attempts.
    pub probe_max: HumanDuration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            probe_min: HumanDuration(50_000),
            probe_max: HumanDuration(500_000),
        }
    }
}

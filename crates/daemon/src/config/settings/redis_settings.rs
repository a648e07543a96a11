//! Redis settings: where it is (one primary, a Cluster, or Sentinels), who sluice is there (ACL
//! user, TLS), deadlines, pipelining and the circuit breaker.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{HumanDuration, SettingsError};

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
    /// ACL user on the data nodes (`SLUICE_REDIS__USERNAME`); overrides the URLs' user.
    pub username: Option<String>,
    /// Password on the data nodes (`SLUICE_REDIS__PASSWORD`); overrides the URLs' password.
    pub password: Option<String>,
    /// TLS for `rediss://` URLs.
    pub tls: TlsSettings,
    /// Prefix of every key: `<prefix>:{<policy>:<partition>}`.
    pub key_prefix: String,
    /// Deadline of one check's Redis calls from their write (policies may set their own): past
    /// it with no reply to any call, Redis is out (the circuit opens, the failure modes answer);
    /// past it while Redis answers other calls, the call keeps waiting (up to 1 s).
    pub timeout: HumanDuration,
    /// Timeout of one connection attempt.
    pub connect_timeout: HumanDuration,
    /// Most checks coalesced into one pipeline.
    pub max_batch: usize,
    /// Pipelines in flight at once.
    pub pipelines_in_flight: usize,
    /// Checks waiting for a pipeline, at most (back-pressure beyond).
    pub queue: usize,
    /// In a Cluster of Redis >= 7.0, a batch goes out as one call per node (`true`) rather than
    /// one per hash slot; older servers get one per slot either way.
    pub cluster_node_calls: bool,
    /// The circuit breaker.
    pub breaker: BreakerSettings,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: None,
            cluster: Vec::new(),
            sentinel: SentinelSettings::default(),
            username: None,
            password: None,
            tls: TlsSettings::default(),
            key_prefix: "rl".into(),
            timeout: HumanDuration(100_000),
            connect_timeout: HumanDuration(1_000_000),
            max_batch: 128,
            pipelines_in_flight: 4,
            queue: 10_000,
            cluster_node_calls: true,
            breaker: BreakerSettings::default(),
        }
    }
}

/// Where Redis is: the one of `redis.url`, `redis.cluster` and `redis.sentinel` that is set, from
/// [`RedisSettings::target`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One primary: `redis://[user:password@]host:port[/db]`.
    Single(String),
    /// Seed nodes of a Cluster.
    Cluster(Vec<String>),
    /// A Sentinel set watching a primary.
    Sentinel(SentinelTarget),
}

/// The Sentinels, the name of the primary they watch, and the primary's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// Sentinel URLs.
    pub nodes: Vec<String>,
    /// The monitored primary's name (`sentinel monitor <name> ...`).
    pub master: String,
    /// Username for the data nodes, if any.
    pub username: Option<String>,
    /// Password for the data nodes, if any.
    pub password: Option<String>,
}

impl RedisSettings {
    /// Where Redis is, `None` for the embedded store; refuses several sources at once, a
    /// Sentinel set without the primary's name, and credentials or TLS settings that contradict
    /// the URLs.
    pub fn target(&self) -> Result<Option<RedisTarget>, SettingsError> {
        let url = self.url.as_ref().filter(|url| !url.is_empty());
        let sentinel = &self.sentinel;
        let sources = usize::from(url.is_some())
            + usize::from(!self.cluster.is_empty())
            + usize::from(!sentinel.nodes.is_empty());
        if sources > 1 {
            return Err(SettingsError(
                "redis: set one of redis.url (one primary), redis.cluster (seed nodes) or \
                 redis.sentinel.nodes (Sentinels), not several"
                    .into(),
            ));
        }
        self.validate_access().map_err(SettingsError)?;
        if !sentinel.nodes.is_empty() && sentinel.master.is_empty() {
            return Err(SettingsError(
                "redis.sentinel.master: name the primary the Sentinels watch".into(),
            ));
        }
        Ok(if let Some(url) = url {
            Some(RedisTarget::Single(url.clone()))
        } else if !sentinel.nodes.is_empty() {
            Some(RedisTarget::Sentinel(SentinelTarget {
                nodes: sentinel.nodes.clone(),
                master: sentinel.master.clone(),
                username: sentinel.username.clone(),
                password: sentinel.password.clone(),
            }))
        } else if !self.cluster.is_empty() {
            Some(RedisTarget::Cluster(self.cluster.clone()))
        } else {
            None
        })
    }

    /// Every URL sluice connects to: the primary, the Cluster seeds or the Sentinels.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.url
            .iter()
            .chain(&self.cluster)
            .chain(&self.sentinel.nodes)
            .map(String::as_str)
            .filter(|url| !url.is_empty())
    }

    /// Whether the URLs are `rediss://` (all of them, once validated).
    pub fn uses_tls(&self) -> bool {
        self.urls().any(|url| url.starts_with("rediss://"))
    }

    /// Checks credentials and TLS settings against the URLs (no I/O: the files are read when the
    /// store is built, by `serve` and `config check` alike).
    fn validate_access(&self) -> Result<(), String> {
        let sentinel = &self.sentinel;
        if (self.username.is_some() && sentinel.username.is_some())
            || (self.password.is_some() && sentinel.password.is_some())
        {
            return Err(
                "redis: set the data nodes' credentials in redis.username/redis.password \
                 or in redis.sentinel.username/password, not both"
                    .into(),
            );
        }
        let tls = self
            .urls()
            .filter(|url| url.starts_with("rediss://"))
            .count();
        let total = self.urls().count();
        if tls > 0 && tls < total {
            return Err(
                "redis: mix of redis:// and rediss:// URLs; use rediss:// for all of them \
                 or none"
                    .into(),
            );
        }
        if tls == 0 && self.tls.is_set() {
            return Err(
                "redis.tls is set but no URL uses rediss://; TLS is chosen by the URL \
                 scheme (rediss://host:6380)"
                    .into(),
            );
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err("redis.tls: cert_file and key_file go together (mutual TLS)".into());
        }
        if !self.tls.verify_hostname && !self.sentinel.nodes.is_empty() {
            return Err(
                "redis.tls.verify_hostname = false is not available with Sentinel; give \
                 the data nodes certificates that name their announced addresses (IP SANs, or \
                 Sentinel's announce-hostnames)"
                    .into(),
            );
        }
        if self.tls.insecure && self.tls.ca_file.is_some() {
            return Err(
                "redis.tls: insecure skips verification, so ca_file would be ignored; \
                 set one of them"
                    .into(),
            );
        }
        Ok(())
    }
}

/// TLS to Redis, used by every `rediss://` URL (to the Sentinels and to the primary they name, to
/// every Cluster node). Files are read once, at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM bundle of the CAs that may sign the server's certificate; unset: the system's roots
    /// (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the OS bundle; the built-in Mozilla set only where the
    /// system has none).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Check that the certificate names the URL's host (default). `false` still verifies the
    /// chain against the CA but accepts any name, as `redis-cli` does: for servers whose
    /// certificate does not name the address clients use (GCP Memorystore puts its IP in the CN
    /// only). Not available with Sentinel (redis-rs has no such switch for the primary it names).
    pub verify_hostname: bool,
    /// Accept any server certificate (no chain, no hostname check). For self-signed test setups
    /// only; logged as a warning at start.
    pub insecure: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca_file: None,
            cert_file: None,
            key_file: None,
            verify_hostname: true,
            insecure: false,
        }
    }
}

impl TlsSettings {
    /// Whether any TLS setting is set (they only mean something with a `rediss://` URL).
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || !self.verify_hostname
            || self.insecure
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
    /// Username for the data nodes (same as `redis.username`; set one of them).
    pub username: Option<String>,
    /// Password for the data nodes (same as `redis.password`; set one of them).
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

//! Daemon settings: named defaults, then a TOML file, then `SLUICE_*` environment variables
//! (`__` for nesting), extracted and validated before anything is bound; validation parses the
//! values that are more than strings and numbers (addresses, socket mode, where Redis is) once,
//! into [`Resolved`].

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub(super) mod authz_settings;
pub(super) mod envoy_settings;
mod field_names;
pub(super) mod listen_settings;
pub(super) mod local_peers;
mod log_level;
pub(super) mod redact;
pub(super) mod redis_settings;
pub(super) mod rlqs_settings;
mod settings_errors;
pub(super) mod shadow_settings;
pub(super) mod socket_group;
pub(super) mod tracing_settings;

use self::listen_settings::{Listen, ListenAddrs};
use self::redis_settings::{RedisSettings, RedisTarget};
// What the settings' own modules (`super::` from them) share with the rest of config.
use crate::config::{AuthzSettings, FileLimits, HumanDuration, SocketGroup, TracingSettings};

/// The settings file used when none is given and it exists.
pub const DEFAULT_SETTINGS_FILE: &str = "config/sluice.toml";

/// Settings are invalid; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

/// Everything the daemon is configured with.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Where the listeners bind.
    pub listen: Listen,
    /// Path of the policy file.
    pub policies: PathBuf,
    /// Redis; unset means the embedded store.
    pub redis: RedisSettings,
    /// The embedded store.
    pub memory: MemorySettings,
    /// The `local` failure mode.
    pub local: LocalSettings,
    /// The tenant tier table.
    pub tenants: TenantSettings,
    /// The local layer (hot partitions) in front of Redis.
    pub local_layer: LocalLayerSettings,
    /// Quota leases of the policies that ask for them (`lease: true`), with Redis.
    pub leases: LeaseSettings,
    /// How often the policy file is checked for changes (SIGHUP reloads at once).
    pub policies_poll: HumanDuration,
    /// Caps on what a request may carry.
    pub limits: RequestLimits,
    /// Logging.
    pub log: LogSettings,
    /// Envoy's rate limit service API (gRPC).
    pub envoy: self::envoy_settings::EnvoySettings,
    /// How long in-flight checks get to finish on SIGTERM.
    pub shutdown_grace: HumanDuration,
    /// Tokio worker threads; 0 means half the cores, 1 to 4 (a sidecar shares its node); at
    /// most [`MAX_WORKER_THREADS`]. One thread is tokio's current-thread runtime.
    pub worker_threads: usize,
    /// What `/v1/authz` believes of the headers a proxy forwards.
    pub authz: AuthzSettings,
    /// Bounds on the files read while running (policies, tenant table).
    pub files: FileLimits,
    /// Accept a reload to a policy file with no policies (which removes every limit); without
    /// it such a reload is refused. Logged loudly either way.
    pub policies_allow_empty: bool,
    /// The settings file these were read from (`None`: defaults and `SLUICE_*` only); set by
    /// [`Settings::load`], never read from a file.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// OpenTelemetry trace export (OTLP); off unless `tracing.endpoint` is set.
    pub tracing: TracingSettings,
    /// The secret keying partition fingerprints (shadow log lines, `/v1/top`).
    pub shadow: self::shadow_settings::ShadowSettings,
}

/// What [`Settings::validate`] parsed, in the types the daemon uses: nothing downstream parses an
/// address or works out where Redis is again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Where each listener binds.
    pub listen: ListenAddrs,
    /// Where Redis is; `None`: the embedded store.
    pub redis: Option<RedisTarget>,
}

/// Most worker threads accepted.
pub const MAX_WORKER_THREADS: usize = 64;

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: Listen::default(),
            policies: PathBuf::from("config/policies.yaml"),
            redis: RedisSettings::default(),
            memory: MemorySettings::default(),
            local: LocalSettings::default(),
            tenants: TenantSettings::default(),
            local_layer: LocalLayerSettings::default(),
            leases: LeaseSettings::default(),
            policies_poll: HumanDuration(1_000_000),
            limits: RequestLimits::default(),
            log: LogSettings::default(),
            envoy: Default::default(),
            shutdown_grace: HumanDuration(10_000_000),
            worker_threads: 0,
            authz: AuthzSettings::default(),
            files: FileLimits::default(),
            policies_allow_empty: false,
            file: None,
            tracing: Default::default(),
            shadow: Default::default(),
        }
    }
}

/// The per-tenant tier table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantSettings {
    /// With the embedded store: a YAML file `tenants: {acme: enterprise}` (unset: no table).
    /// With Redis the table is the hash `<key_prefix>:tenant-tiers`.
    pub file: Option<PathBuf>,
    /// How long a tenant's tier is cached; a change is seen everywhere within it.
    pub refresh: HumanDuration,
    /// Most tenants cached.
    pub cache_size: u64,
}

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            file: None,
            refresh: HumanDuration(10_000_000),
            cache_size: 100_000,
        }
    }
}

/// The local layer in front of Redis.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalLayerSettings {
    /// Remember partitions Redis denied until they could pass again, answering them locally.
    pub enabled: bool,
    /// Most partitions remembered.
    pub max_keys: u64,
}

impl Default for LocalLayerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_keys: 100_000,
        }
    }
}

/// Quota leases (policies with `lease: true`, Redis only): how much a pod takes and for how
/// long it holds it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSettings {
    /// A take gets at most 1/fraction of what the counter has left, so pods racing for the last
    /// units get none and those are decided per check (at least 2).
    pub fraction: u64,
    /// How long a lease should last at this pod's recent demand: a take asks for the units this
    /// pod admitted in the last second times this.
    pub span: HumanDuration,
    /// Fewest units worth a take: a partition this pod checks less often than this per second
    /// stays per check.
    pub min_units: u64,
    /// Most units one take asks for.
    pub max_units: u64,
    /// A lease unused this long is given back.
    pub idle: HumanDuration,
    /// Most partitions with lease bookkeeping at once (more are decided per check).
    pub max_keys: usize,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            fraction: 4,
            span: HumanDuration(1_000_000),
            min_units: 64,
            max_units: 10_000,
            idle: HumanDuration(2_000_000),
            max_keys: 10_000,
        }
    }
}

impl LeaseSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        let problem = if self.fraction < 2 || self.fraction > 1_000 {
            Some(format!(
                "leases.fraction must be 2..=1000, got {}",
                self.fraction
            ))
        } else if self.span.0 < 1_000 || self.span.0 > 60_000_000 {
            Some(format!("leases.span must be 1ms..=60s, got {}", self.span))
        } else if self.min_units == 0 || self.min_units > self.max_units {
            Some(format!(
                "leases.min_units must be 1..=leases.max_units ({}), got {}",
                self.max_units, self.min_units
            ))
        } else if self.max_units > 1_000_000_000 {
            Some(format!(
                "leases.max_units must be at most 1e9, got {}",
                self.max_units
            ))
        } else if self.idle.0 < 10_000 || self.idle.0 > 600_000_000 {
            Some(format!("leases.idle must be 10ms..=10m, got {}", self.idle))
        } else if self.max_keys == 0 || self.max_keys > 10_000_000 {
            Some(format!(
                "leases.max_keys must be 1..=10000000, got {}",
                self.max_keys
            ))
        } else {
            None
        };
        problem.map_or(Ok(()), |p| Err(SettingsError(p)))
    }
}

/// The `local` failure mode: while Redis is unreachable, each pod enforces
/// `(limit - margin) / replicas` in memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalSettings {
    /// Pods sharing the limit (in Kubernetes: the Deployment's replicas).
    pub replicas: u64,
    /// Percent of the limit held back, for the pods' uneven traffic.
    pub margin_percent: u64,
}

impl Default for LocalSettings {
    fn default() -> Self {
        Self {
            replicas: 1,
            margin_percent: 10,
        }
    }
}

/// Embedded store settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySettings {
    /// Most keys kept; past this, keys are evicted (soonest-to-expire of a sample).
    pub max_keys: usize,
    /// Most bytes the keys may hold (estimated per key, sliding-log entries included); past
    /// this, keys are evicted likewise. The default is half the 128 MiB memory limit that
    /// `sluice inject` sets, so the sidecar is never OOM-killed by its own store.
    pub max_bytes: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Caps on requests, so that a bad client gets a 4xx instead of costing memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestLimits {
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most checks in one batch.
    pub max_batch: usize,
    /// Most descriptors in one check.
    pub max_descriptors: usize,
    /// Longest descriptor value (names are capped at 64 bytes).
    pub max_value_bytes: usize,
    /// Largest cost of one check.
    pub max_cost: u64,
    /// Longest a client may take to send a request's body (headers have their own 10 s).
    pub body_read_timeout: HumanDuration,
    /// Most connections open at once on each check listener; past it, accepting waits.
    pub max_connections: usize,
    /// The memory budget of every gRPC connection together (both gRPC listeners, RLQS
    /// included): each connection reserves its base when accepted (about 1 MiB at the
    /// defaults); past the budget, new streams of the heaviest connections and then new
    /// connections are refused.
    pub grpc_memory_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_batch: 100,
            max_descriptors: 32,
            max_value_bytes: 256,
            max_cost: 1_000_000,
            body_read_timeout: HumanDuration(10_000_000),
            max_connections: 1024,
            grpc_memory_bytes: 32 * 1024 * 1024,
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `sluice=debug`; `RUST_LOG` overrides it.
    pub level: String,
    /// Log a warn line (at most one per 10 s) when a check matches no policy; such checks are
    /// always counted (`sluice_decisions_total{outcome="unmatched"}`).
    pub unmatched: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
            unmatched: false,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Settings {
    /// Loads defaults, then `file` (or [`DEFAULT_SETTINGS_FILE`] if present), then the
    /// environment, and validates the result: the settings as written and what
    /// [`Settings::validate`] parsed of them.
    pub fn load(file: Option<&Path>) -> Result<(Self, Resolved), SettingsError> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        let mut read = None;
        match file {
            Some(path) if !path.is_file() => {
                return Err(SettingsError(format!(
                    "settings file {} does not exist",
                    path.display()
                )))
            }
            Some(path) => {
                figment = figment.merge(Toml::file(path));
                read = Some(path.to_owned());
            }
            None if Path::new(DEFAULT_SETTINGS_FILE).is_file() => {
                figment = figment.merge(Toml::file(DEFAULT_SETTINGS_FILE));
                read = Some(PathBuf::from(DEFAULT_SETTINGS_FILE));
            }
            None => {}
        }
        // Only variables naming a key: others (such as `SLUICE_CONFIG`) are left alone instead
        // of failing the unknown-field check.
        let keys = self::field_names::of::<Settings>();
        let env = Env::prefixed("SLUICE_").split("__").filter(move |key| {
            let top = key.as_str().split('.').next().unwrap_or("");
            keys.iter().any(|known| known.eq_ignore_ascii_case(top))
        });
        let mut settings: Settings = figment
            .merge(env)
            .extract()
            .map_err(|e| SettingsError(self::settings_errors::describe(e)))?;
        settings.file = read;
        let resolved = settings.validate()?;
        Ok((settings, resolved))
    }

    /// The warning for settings that enforce a limit several times over: `local.replicas` above 1
    /// (the pods are meant to share one limit) with no Redis (`redis` is [`Resolved::redis`]), so
    /// each pod's embedded store enforces the whole limit on its own. In Kubernetes this is a pod
    /// started without its Redis Secret (`envFrom` marks it optional). `serve` logs it at warn,
    /// `config check` prints it.
    pub fn embedded_store_warning(&self, redis: Option<&RedisTarget>) -> Option<String> {
        let replicas = self.local.replicas;
        (redis.is_none() && replicas > 1).then(|| {
            format!(
                "local.replicas is {replicas} but no Redis is set (redis.url, redis.cluster or \
                 redis.sentinel.nodes): each pod enforces every limit alone on its embedded store, so \
                 {replicas} pods admit up to {replicas} times the limit"
            )
        })
    }

    /// Checks everything that extraction cannot (addresses, modes, ranges, where Redis is) and
    /// returns what it parsed.
    pub fn validate(&self) -> Result<Resolved, SettingsError> {
        let listen = self.listen.parse()?;
        let redis = &self.redis;
        let target = redis.target()?;
        if redis.breaker.probe_min.0 == 0 || redis.breaker.probe_min > redis.breaker.probe_max {
            return Err(SettingsError(
                "redis.breaker: need 0 < probe_min <= probe_max".into(),
            ));
        }
        if self.policies_poll.0 == 0 || self.tenants.refresh.0 == 0 {
            return Err(SettingsError(
                "policies_poll and tenants.refresh must be above 0".into(),
            ));
        }
        if self.local.replicas == 0 || self.local.margin_percent > 90 {
            return Err(SettingsError(
                "local: replicas must be at least 1 and margin_percent at most 90".into(),
            ));
        }
        if redis.timeout.0 == 0 || redis.connect_timeout.0 == 0 {
            return Err(SettingsError(
                "redis.timeout and redis.connect_timeout must be above 0".into(),
            ));
        }
        let l = &self.limits;
        for (name, value) in [
            ("limits.max_body_bytes", l.max_body_bytes),
            ("limits.max_batch", l.max_batch),
            ("limits.max_descriptors", l.max_descriptors),
            ("limits.max_value_bytes", l.max_value_bytes),
            ("limits.grpc_memory_bytes", l.grpc_memory_bytes),
            ("memory.max_keys", self.memory.max_keys),
            ("memory.max_bytes", self.memory.max_bytes),
            ("redis.max_batch", redis.max_batch),
            ("redis.pipelines_in_flight", redis.pipelines_in_flight),
            ("redis.queue", redis.queue),
            ("redis.breaker.failures", redis.breaker.failures as usize),
        ] {
            if value == 0 {
                return Err(SettingsError(format!("{name}: must be at least 1")));
            }
        }
        if l.max_cost == 0 {
            return Err(SettingsError("limits.max_cost: must be at least 1".into()));
        }
        if l.max_connections == 0 || l.body_read_timeout.0 == 0 {
            return Err(SettingsError(
                "limits.max_connections and limits.body_read_timeout must be above 0".into(),
            ));
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(SettingsError(format!(
                "worker_threads: {} is over {MAX_WORKER_THREADS} (0 picks half the cores, 1 to 4)",
                self.worker_threads
            )));
        }
        if self.files.max_bytes == 0 || self.files.read_timeout.0 == 0 {
            return Err(SettingsError(
                "files.max_bytes and files.read_timeout must be above 0".into(),
            ));
        }
        self.authz.validate()?;
        self.leases.validate()?;
        self.envoy.validate()?;
        self.tracing.validate()?;
        self.shadow.validate()?;
        self::log_level::validate(&self.log.level)
            .map_err(|reason| SettingsError(format!("log.level: {reason}")))?;
        Ok(Resolved {
            listen,
            redis: target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_wire_contract() {
        let s = Settings::default();
        let listen = s.validate().expect("defaults are valid").listen;
        assert_eq!(s.listen.http, "127.0.0.1:7070");
        assert_eq!(s.listen.admin, "127.0.0.1:7071");
        assert_eq!(s.policies, PathBuf::from("config/policies.yaml"));
        assert!(listen
            .socket
            .expect("enabled")
            .ends_with("sluice/sluice.sock"));
        assert_eq!(listen.socket_mode, 0o660);
    }

    #[test]
    fn shipped_settings_file_is_valid() {
        let shipped: Settings =
            toml_settings(include_str!("../../../../../config/sluice.toml")).expect("parses");
        shipped.validate().expect("valid");
    }

    fn toml_settings(text: &str) -> Result<Settings, String> {
        Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut s = Settings::default();
        s.listen.http = "nowhere".into();
        assert!(s.validate().unwrap_err().0.starts_with("listen.http"));
        let mut s = Settings::default();
        s.listen.socket_mode = "999".into();
        assert!(s
            .validate()
            .unwrap_err()
            .0
            .starts_with("listen.socket_mode"));
        let err = toml_settings("[listen]\nhtpp = \"x\"\n").unwrap_err();
        assert!(err.contains("htpp"), "{err}");
    }

    #[test]
    fn variables_may_set_every_key_a_file_may() {
        let keys = crate::config::settings::field_names::of::<Settings>();
        for key in [
            "listen",
            "redis",
            "worker_threads",
            "tracing",
            "policies_allow_empty",
        ] {
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
        // Set by `load` only.
        assert!(!keys.contains(&"file"), "{keys:?}");
        let written = serde_json::to_value(Settings::default()).expect("serializes");
        let mut written: Vec<&str> = written
            .as_object()
            .expect("a table")
            .keys()
            .map(String::as_str)
            .collect();
        let mut keys = keys.to_vec();
        written.sort_unstable();
        keys.sort_unstable();
        assert_eq!(written, keys);
    }

    #[test]
    fn the_embedded_store_with_replicas_warns_and_redis_or_one_replica_does_not() {
        let mut s = Settings::default();
        s.local.replicas = 6;
        let resolved = s.validate().expect("valid");
        let warning = s
            .embedded_store_warning(resolved.redis.as_ref())
            .expect("6 pods, each alone");
        assert!(
            warning.starts_with("local.replicas is 6 but no Redis is set")
                && warning.ends_with("6 pods admit up to 6 times the limit"),
            "{warning}"
        );
        s.redis.url = Some("redis://127.0.0.1:1".into());
        let resolved = s.validate().expect("valid");
        assert!(resolved.redis.is_some());
        assert_eq!(s.embedded_store_warning(resolved.redis.as_ref()), None);
        s.redis.url = None;
        s.local.replicas = 1;
        assert_eq!(s.embedded_store_warning(None), None);
    }
}

//! Daemon settings: named defaults, then a TOML file, then `SLUICE_*` environment variables
//! (`__` for nesting), extracted and validated before anything is bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize};

use super::redis_settings::RedisSettings;
use super::{AuthzSettings, FileLimits, HumanDuration};

/// The settings file used when none is given and it exists.
pub const DEFAULT_SETTINGS_FILE: &str = "config/sluice.toml";

/// Top-level keys that `SLUICE_*` variables may set; others (such as `SLUICE_CONFIG`) are left
/// alone instead of failing the unknown-field check.
const ENV_KEYS: [&str; 17] = [
    "listen",
    "envoy",
    "authz",
    "files",
    "policies_allow_empty",
    "policies",
    "policies_poll",
    "tenants",
    "local_layer",
    "redis",
    "memory",
    "local",
    "limits",
    "log",
    "shutdown_grace",
    "worker_threads",
    "tracing",
];

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
    /// How often the policy file is checked for changes (SIGHUP reloads at once).
    pub policies_poll: HumanDuration,
    /// Caps on what a request may carry.
    pub limits: RequestLimits,
    /// Logging.
    pub log: LogSettings,
    /// Envoy's rate limit service API (gRPC).
    pub envoy: super::envoy_settings::EnvoySettings,
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
    pub tracing: super::TracingSettings,
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
        }
    }
}

/// Listener addresses; an empty string disables the check listener it names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// Check API over TCP.
    pub http: String,
    /// Check API over a Unix socket; unset means `$TMPDIR/sluice/sluice.sock`.
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket file, octal.
    #[serde(deserialize_with = "octal_mode")]
    pub socket_mode: String,
    /// The group the Unix sockets (check API and gRPC) are given, a name or a numeric id,
    /// resolved at load: with mode `0660`, members of it (nginx workers as `www-data`) may
    /// connect. Unset: the group sluice runs as. sluice's user must be in the group (or root).
    pub socket_group: Option<super::SocketGroup>,
    /// Admin listener (probes, metrics, policy dump).
    pub admin: String,
    /// Envoy's rate limit service (gRPC) over TCP; empty (the default) disables it. Its
    /// conventional address is `127.0.0.1:8081`.
    pub grpc: String,
    /// Envoy's rate limit service (gRPC) over a Unix socket (Envoy's `pipe` address); unset
    /// disables it.
    pub grpc_socket: Option<PathBuf>,
    /// Bind the socket even if its directory is writable by others or owned by another user:
    /// only for a directory no one else can reach (a Kubernetes `emptyDir` shared by the pod's
    /// containers). Otherwise such a directory is refused: its other writers could replace
    /// the socket with their own.
    pub trust_socket_dir: bool,
    /// Who may reset counters (`DELETE /v1/counters`) on the admin listener.
    pub admin_resets: AdminResets,
}

/// Who may reset counters on the admin listener. The admin listener often binds the pod's
/// address (probes, metrics): a reset lifts a limit, so by default only a client on loopback
/// (`kubectl port-forward`, `kubectl exec`) may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminResets {
    /// Clients connected from a loopback address.
    #[default]
    Loopback,
    /// Any client that reaches the admin listener.
    Any,
    /// Nobody: `DELETE /v1/counters` is refused.
    Off,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            http: "127.0.0.1:7070".into(),
            socket: None,
            socket_mode: "0660".into(),
            socket_group: None,
            admin: "127.0.0.1:7071".into(),
            grpc: String::new(),
            grpc_socket: None,
            trust_socket_dir: false,
            admin_resets: AdminResets::Loopback,
        }
    }
}

/// Accepts `"0660"` or, as environment values arrive as numbers, `660`.
fn octal_mode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Mode {
        Text(String),
        Number(u64),
    }
    Ok(match Mode::deserialize(deserializer)? {
        Mode::Text(text) => text,
        Mode::Number(n) => n.to_string(),
    })
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
    /// Loads defaults, then `file` (or [`DEFAULT_SETTINGS_FILE`] if present), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
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
        let env = Env::prefixed("SLUICE_").split("__").filter(|key| {
            let top = key.as_str().split('.').next().unwrap_or("");
            ENV_KEYS.iter().any(|known| known.eq_ignore_ascii_case(top))
        });
        let mut settings: Settings = figment
            .merge(env)
            .extract()
            .map_err(|e| SettingsError(super::settings_errors::describe(e)))?;
        settings.file = read;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks everything that extraction cannot: addresses, modes, ranges.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.http_addr()?;
        self.grpc_addr()?;
        self.admin_addr()?;
        self.socket_mode_bits()?;
        if self.http_addr()?.is_none() && self.socket_path().is_none() {
            return Err(SettingsError(
                "listen: both listen.http and listen.socket are disabled; enable at least one"
                    .into(),
            ));
        }
        let redis = &self.redis;
        if redis.sources() > 1 {
            return Err(SettingsError(
                "redis: set one of redis.url (one primary), redis.cluster (seed nodes) or \
                 redis.sentinel.nodes (Sentinels), not several"
                    .into(),
            ));
        }
        redis.validate_access().map_err(SettingsError)?;
        if !redis.sentinel.nodes.is_empty() && redis.sentinel.master.is_empty() {
            return Err(SettingsError(
                "redis.sentinel.master: name the primary the Sentinels watch".into(),
            ));
        }
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
        self.envoy.validate()?;
        self.tracing.validate()?;
        super::log_level::validate(&self.log.level)
            .map_err(|reason| SettingsError(format!("log.level: {reason}")))?;
        Ok(())
    }

    /// The TCP check address, `None` when disabled.
    pub fn http_addr(&self) -> Result<Option<SocketAddr>, SettingsError> {
        if self.listen.http.is_empty() {
            return Ok(None);
        }
        parse_addr("listen.http", &self.listen.http).map(Some)
    }

    /// The admin address.
    pub fn admin_addr(&self) -> Result<SocketAddr, SettingsError> {
        parse_addr("listen.admin", &self.listen.admin)
    }

    /// The Unix socket path, `None` when disabled.
    pub fn socket_path(&self) -> Option<PathBuf> {
        match &self.listen.socket {
            None => Some(std::env::temp_dir().join("sluice").join("sluice.sock")),
            Some(path) if path.as_os_str().is_empty() => None,
            Some(path) => Some(path.clone()),
        }
    }

    /// The socket file's permission bits.
    pub fn socket_mode_bits(&self) -> Result<u32, SettingsError> {
        let text = &self.listen.socket_mode;
        u32::from_str_radix(text, 8)
            .ok()
            .filter(|mode| *mode <= 0o777)
            .ok_or_else(|| {
                SettingsError(format!(
                    "listen.socket_mode: {text:?} is not an octal permission such as \"0660\""
                ))
            })
    }
}

pub(super) fn parse_addr(key: &str, text: &str) -> Result<SocketAddr, SettingsError> {
    text.parse().map_err(|_| {
        SettingsError(format!(
            "{key}: {text:?} is not an address such as \"127.0.0.1:7070\""
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_wire_contract() {
        let s = Settings::default();
        s.validate().expect("defaults are valid");
        assert_eq!(s.listen.http, "127.0.0.1:7070");
        assert_eq!(s.listen.admin, "127.0.0.1:7071");
        assert_eq!(s.policies, PathBuf::from("config/policies.yaml"));
        assert!(s
            .socket_path()
            .expect("enabled")
            .ends_with("sluice/sluice.sock"));
        assert_eq!(s.socket_mode_bits().expect("valid"), 0o660);
    }

    #[test]
    fn shipped_settings_file_is_valid() {
        let shipped: Settings =
            toml_settings(include_str!("../../config/sluice.toml")).expect("parses");
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
}

//! Configuration: daemon settings (figment: defaults, TOML file, `SLUICE_*` env) and policy files
//! (YAML, validated whole into domain types).

mod authz_settings;
pub mod bounded_read;
mod duration;
pub mod envoy;
mod envoy_settings;
mod field_names;
mod listen_settings;
mod log_level;
mod policies;
pub mod policy_dir;
mod policy_fields;
mod policy_quota;
mod policy_replaces;
mod redact;
mod redis_settings;
mod settings;
mod settings_errors;
mod socket_group;
mod tracing_settings;
mod yaml_budget;
mod yaml_lines;

pub use authz_settings::{AuthzSettings, ControlHeader, OriginalFrom};
pub use bounded_read::FileLimits;
pub use duration::{parse_duration, HumanDuration, DURATION_FORM};
pub use envoy_settings::EnvoySettings;
pub use listen_settings::{AdminResets, Listen, ListenAddrs};
pub use policies::policy_file_version;
pub use policies::{load_policies, parse_policies, PolicyFileError, Problem};
pub use policy_quota::local_limit_warnings;
pub use redact::mask_url;
pub use redis_settings::{
    BreakerSettings, RedisSettings, RedisTarget, SentinelSettings, SentinelTarget, TlsSettings,
};
pub use settings::{
    LocalLayerSettings, LocalSettings, LogFormat, LogSettings, MemorySettings, RequestLimits,
    Resolved, Settings, SettingsError, TenantSettings,
};
pub use socket_group::SocketGroup;
pub use tracing_settings::{OtlpEndpoint, OtlpProtocol, TracingSettings};
pub use yaml_budget::{check_expansion, ExpansionError};

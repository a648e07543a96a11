//! Configuration: daemon settings (figment: defaults, TOML file, `SLUICE_*` env) and policy files
//! (YAML, validated whole into domain types).

mod duration;
pub mod envoy;
mod envoy_settings;
mod policies;
mod redis_settings;
mod settings;

pub use duration::{parse_duration, HumanDuration};
pub use envoy_settings::EnvoySettings;
pub use policies::policy_file_version;
pub use policies::{load_policies, parse_policies, PolicyFileError};
pub use redis_settings::{BreakerSettings, RedisSettings, SentinelSettings, TlsSettings};
pub use settings::{
    LocalLayerSettings, LocalSettings, LogFormat, LogSettings, MemorySettings, RequestLimits,
    Settings, SettingsError, TenantSettings,
};

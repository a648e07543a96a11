//! Configuration: daemon settings (figment: defaults, TOML file, `SLUICE_*` env) and policy files
//! (YAML, validated whole into domain types).

mod duration;
mod policies;
mod settings;

pub use duration::{parse_duration, HumanDuration};
pub use policies::{load_policies, parse_policies, PolicyFileError};
pub use settings::{
    BreakerSettings, LocalSettings, LogFormat, LogSettings, MemorySettings, RedisSettings,
    RequestLimits, SentinelSettings, Settings, SettingsError,
};

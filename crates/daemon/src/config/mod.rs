//! Configuration, in two parts: [`settings`] (the daemon's own: figment defaults, a TOML file,
//! `SLUICE_*` env; validated into typed values before anything binds) and [`policy`] (policy files
//! and directories: YAML validated whole into the domain's `PolicySet`, every problem with its
//! file and line), plus [`envoy`] (envoyproxy/ratelimit files converted to policies) and what they
//! share (durations, bounded file reads).

pub mod bounded_read;
mod duration;
pub mod envoy;
mod policy;
mod settings;

pub use bounded_read::FileLimits;
pub use duration::{parse_duration, HumanDuration, DURATION_FORM};
pub use policy::policy_dir;
pub use policy::policy_quota::local_limit_warnings;
pub use policy::yaml_budget::{check_expansion, ExpansionError};
pub use policy::{
    load_policies, parse_policies, policy_file_version, PolicyFileError, Problem, MAX_LIMIT,
};
pub use settings::authz_settings::{AuthzSettings, ControlHeader, OriginalFrom};
pub use settings::envoy_settings::EnvoySettings;
pub use settings::listen_settings::{AdminResets, Listen, ListenAddrs};
pub use settings::local_peers::{LocalPeers, PeerNet};
pub use settings::redact::mask_url;
pub use settings::redis_settings::{
    BreakerSettings, RedisSettings, RedisTarget, SentinelSettings, SentinelTarget, TlsSettings,
};
pub use settings::rlqs_settings::RlqsSettings;
pub use settings::socket_group::SocketGroup;
pub use settings::tracing_settings::{OtlpEndpoint, OtlpProtocol, TracingSettings};
pub use settings::{
    LeaseSettings, LocalLayerSettings, LocalSettings, LogFormat, LogSettings, MemorySettings,
    RequestLimits, Resolved, Settings, SettingsError, TenantSettings,
};

//! Settings of Envoy's rate limit service API (`[envoy]`; its addresses are `listen.grpc*`): how
//! it answers and the bounds of its HTTP/2 connections (streams, handshake, idle time, keepalive,
//! age, the RLQS bucket budget), on top of the `limits.*` every check listener shares.

use serde::{Deserialize, Serialize};

use super::rlqs_settings::RlqsSettings;
use super::{HumanDuration, SettingsError};

/// Default most concurrent streams (in-flight checks) per connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 256;
/// Default time a new connection gets to send the HTTP/2 preface and its SETTINGS.
pub const DEFAULT_HANDSHAKE_TIMEOUT: HumanDuration = HumanDuration(10_000_000);
/// Default time a connection with no stream open is kept.
pub const DEFAULT_IDLE_TIMEOUT: HumanDuration = HumanDuration(300_000_000);
/// Default interval of keepalive PINGs.
pub const DEFAULT_KEEPALIVE_INTERVAL: HumanDuration = HumanDuration(30_000_000);
/// Default time a keepalive PING's ACK may take before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: HumanDuration = HumanDuration(20_000_000);
/// Default age after which a connection is asked to go (GOAWAY; Envoy reconnects).
pub const DEFAULT_MAX_CONNECTION_AGE: HumanDuration = HumanDuration(1_800_000_000);
/// Most concurrent streams per connection accepted in settings.
pub const MAX_CONCURRENT_STREAMS: u32 = 65_536;

/// `[envoy]`: how the gRPC rate limit service answers, and its connections' bounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoySettings {
    /// Add rate-limit headers (`RateLimit`, `RateLimit-Policy`, `X-RateLimit-*`, `Retry-After`)
    /// to answers, for Envoy to forward to the client.
    pub response_headers: bool,
    /// Most concurrent streams per HTTP/2 connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// Longest a new connection may take to send the HTTP/2 preface and SETTINGS; then it is
    /// closed.
    pub handshake_timeout: HumanDuration,
    /// A connection with no stream open for this long is asked to go (GOAWAY).
    pub idle_timeout: HumanDuration,
    /// Interval of keepalive PINGs on each connection.
    pub keepalive_interval: HumanDuration,
    /// A PING not acknowledged within this closes the connection.
    pub keepalive_timeout: HumanDuration,
    /// A connection older than this is asked to go (GOAWAY) once; the client reconnects.
    pub max_connection_age: HumanDuration,
    /// The budget of the rate limit quota service's buckets (`[envoy.rlqs]`).
    pub rlqs: RlqsSettings,
}

impl Default for EnvoySettings {
    fn default() -> Self {
        Self {
            response_headers: true,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_connection_age: DEFAULT_MAX_CONNECTION_AGE,
            rlqs: RlqsSettings::default(),
        }
    }
}

impl EnvoySettings {
    /// Checks the bounds: every duration above 0, streams 1 to [`MAX_CONCURRENT_STREAMS`].
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.max_concurrent_streams == 0 || self.max_concurrent_streams > MAX_CONCURRENT_STREAMS
        {
            return Err(SettingsError(format!(
                "envoy.max_concurrent_streams: must be 1 to {MAX_CONCURRENT_STREAMS}, got {}",
                self.max_concurrent_streams
            )));
        }
        for (name, value) in [
            ("envoy.handshake_timeout", self.handshake_timeout),
            ("envoy.idle_timeout", self.idle_timeout),
            ("envoy.keepalive_interval", self.keepalive_interval),
            ("envoy.keepalive_timeout", self.keepalive_timeout),
            ("envoy.max_connection_age", self.max_connection_age),
        ] {
            if value.0 == 0 {
                return Err(SettingsError(format!("{name}: must be above 0")));
            }
        }
        self.rlqs.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_by_name() {
        EnvoySettings::default().validate().expect("defaults valid");
        let mut s = EnvoySettings {
            max_concurrent_streams: 0,
            ..EnvoySettings::default()
        };
        let err = s.validate().unwrap_err().0;
        assert!(err.starts_with("envoy.max_concurrent_streams"), "{err}");
        s.max_concurrent_streams = 10;
        s.idle_timeout = HumanDuration(0);
        let err = s.validate().unwrap_err().0;
        assert!(err.starts_with("envoy.idle_timeout"), "{err}");
    }
}

//! Settings of Envoy's rate limit service API (`[envoy]`, and the `listen.grpc*` addresses).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::settings::parse_addr;
use super::{Settings, SettingsError};

/// `[envoy]`: how the gRPC rate limit service answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoySettings {
    /// Add rate-limit headers (`RateLimit`, `RateLimit-Policy`, `X-RateLimit-*`, `Retry-After`)
    /// to answers, for Envoy to forward to the client.
    pub response_headers: bool,
}

impl Default for EnvoySettings {
    fn default() -> Self {
        Self {
            response_headers: true,
        }
    }
}

impl Settings {
    /// The gRPC TCP address, if enabled.
    pub fn grpc_addr(&self) -> Result<Option<SocketAddr>, SettingsError> {
        if self.listen.grpc.is_empty() {
            return Ok(None);
        }
        parse_addr("listen.grpc", &self.listen.grpc).map(Some)
    }

    /// The gRPC Unix socket path, if enabled.
    pub fn grpc_socket_path(&self) -> Option<PathBuf> {
        self.listen
            .grpc_socket
            .clone()
            .filter(|path| !path.as_os_str().is_empty())
    }
}

//! `[listen]`: where each listener binds, as written (strings an operator types, `""` to disable
//! one), and the same parsed once into [`ListenAddrs`] when the settings are validated, so that
//! nothing downstream parses an address again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use super::SettingsError;

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
    /// The admin clients that count as local (raw partitions in `/v1/top`, resets under
    /// `admin_resets = "loopback"`): `127.0.0.1` and `::1` unless widened, since a mesh's sidecar
    /// connects from other `127.0.0.0/8` addresses (Istio: `127.0.0.6`) for remote peers.
    pub local_peers: super::local_peers::LocalPeers,
}

/// Who may reset counters on the admin listener. The admin listener often binds the pod's
/// address (probes, metrics): a reset lifts a limit, so by default only a local client
/// (`listen.local_peers`: `kubectl port-forward`, `kubectl exec`) may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminResets {
    /// Clients connected from an address of `listen.local_peers` (127.0.0.1 and ::1 unless
    /// widened).
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
            local_peers: super::local_peers::LocalPeers::default(),
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

/// The listeners' addresses in the types they are bound with, from [`Listen::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddrs {
    /// Check API over TCP; `None`: disabled.
    pub http: Option<SocketAddr>,
    /// Check API over a Unix socket; `None`: disabled.
    pub socket: Option<PathBuf>,
    /// Permission bits of both socket files (check API and gRPC).
    pub socket_mode: u32,
    /// Admin listener.
    pub admin: SocketAddr,
    /// Envoy's rate limit service over TCP; `None`: disabled.
    pub grpc: Option<SocketAddr>,
    /// Envoy's rate limit service over a Unix socket; `None`: disabled.
    pub grpc_socket: Option<PathBuf>,
}

impl Listen {
    /// Parses every address and the socket mode; the error names the key. At least one check
    /// listener (`http` or `socket`) must be on.
    pub fn parse(&self) -> Result<ListenAddrs, SettingsError> {
        let optional = |key, text: &str| match text {
            "" => Ok(None),
            text => parse_addr(key, text).map(Some),
        };
        let http = optional("listen.http", &self.http)?;
        let grpc = optional("listen.grpc", &self.grpc)?;
        let admin = parse_addr("listen.admin", &self.admin)?;
        let socket_mode = octal_bits(&self.socket_mode)?;
        let socket = match &self.socket {
            None => Some(std::env::temp_dir().join("sluice").join("sluice.sock")),
            Some(path) => enabled(path),
        };
        if http.is_none() && socket.is_none() {
            return Err(SettingsError(
                "listen: both listen.http and listen.socket are disabled; enable at least one"
                    .into(),
            ));
        }
        Ok(ListenAddrs {
            http,
            socket,
            socket_mode,
            admin,
            grpc,
            grpc_socket: self.grpc_socket.as_deref().and_then(enabled),
        })
    }
}

/// A socket path, `None` when empty (disabled).
fn enabled(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

/// The permission bits `text` (octal) names, at most `0777`.
fn octal_bits(text: &str) -> Result<u32, SettingsError> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| {
            SettingsError(format!(
                "listen.socket_mode: {text:?} is not an octal permission such as \"0660\""
            ))
        })
}

fn parse_addr(key: &str, text: &str) -> Result<SocketAddr, SettingsError> {
    text.parse().map_err(|_| {
        SettingsError(format!(
            "{key}: {text:?} is not an address such as \"127.0.0.1:7070\""
        ))
    })
}

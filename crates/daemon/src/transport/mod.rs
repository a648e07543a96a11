//! Transports: the check API router (served on TCP and on a Unix socket alike), its JSON wire
//! format and headers, the Unix socket binding, and the admin listener (with `/v1/counters`).

pub mod admin;
pub mod authz;
pub mod counters;
pub mod grpc;
pub mod http;
pub mod path;
pub mod report;
pub mod request_caps;
pub mod serve;
pub mod top;
mod traced;
pub mod uds;
pub mod wire;

/// Which listener a request came in on; a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// HTTP over TCP on loopback.
    Tcp,
    /// HTTP over the Unix socket.
    Uds,
    /// Envoy's rate limit service (gRPC), on TCP or the Unix socket.
    Grpc,
}

impl Transport {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Uds => "uds",
            Self::Grpc => "grpc",
        }
    }
}

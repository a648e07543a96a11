//! What went wrong talking to Redis, as a bounded set of kinds: the `kind` label of
//! `sluice_redis_errors_total`, and what the circuit breaker branches on.

use redis::RedisError;

/// A kind of Redis failure (never the message: it may hold a key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A call got no reply within its deadline (`redis.timeout`, counted from its write).
    Deadline,
    /// The client library's own reply timeout (a backstop) or a connect timeout.
    Timeout,
    /// Refused, reset or broken connection.
    Connection,
    /// No connection yet (start-up, or being rebuilt).
    NotConnected,
    /// The script was not cached (restart, failover, `SCRIPT FLUSH`); resent once with `EVAL`.
    Noscript,
    /// The node is a replica.
    Readonly,
    /// The node is loading its data set.
    Loading,
    /// A script ran too long on the node.
    Busy,
    /// The node is out of memory.
    Oom,
    /// `NOAUTH` / `WRONGPASS`, or an ACL refusal (`NOPERM`).
    Auth,
    /// TLS handshake or certificate verification failed (wrong CA, wrong name, client
    /// certificate refused).
    Tls,
    /// Slot errors (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `CROSSSLOT`).
    Cluster,
    /// A Cluster node call refused because one of its keys is not served by that node: sluice's
    /// slot map is stale (a resharding). Resent one call per slot; not a Redis failure.
    SlotMap,
    /// One counter's key holds something else (`WRONGTYPE`, a foreign value): that check alone
    /// fails; Redis itself is fine.
    BadKey,
    /// A reply sluice did not expect.
    Protocol,
    /// The check waited past its backstop inside sluice (a stalled or saturated daemon); not a
    /// Redis failure.
    Overloaded,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Every kind, for pre-registering metric series.
    pub const ALL: [ErrorKind; 17] = [
        Self::Deadline,
        Self::Timeout,
        Self::Connection,
        Self::NotConnected,
        Self::Noscript,
        Self::Readonly,
        Self::Loading,
        Self::Busy,
        Self::Oom,
        Self::Auth,
        Self::Tls,
        Self::Cluster,
        Self::SlotMap,
        Self::BadKey,
        Self::Protocol,
        Self::Overloaded,
        Self::Other,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::NotConnected => "not_connected",
            Self::Noscript => "noscript",
            Self::Readonly => "readonly",
            Self::Loading => "loading",
            Self::Busy => "busy",
            Self::Oom => "oom",
            Self::Auth => "auth",
            Self::Tls => "tls",
            Self::Cluster => "cluster",
            Self::SlotMap => "slot_map",
            Self::BadKey => "bad_key",
            Self::Protocol => "protocol",
            Self::Overloaded => "overloaded",
            Self::Other => "other",
        }
    }

    /// Whether one such error means the node cannot serve this daemon until something changes
    /// (a failover, a restart, new credentials): the circuit opens at once.
    pub fn opens_at_once(self) -> bool {
        matches!(
            self,
            Self::Readonly
                | Self::Loading
                | Self::Connection
                | Self::NotConnected
                | Self::Auth
                | Self::Tls
        )
    }

    /// Whether the error says something about Redis' health (a bad key, or a check that waited
    /// too long inside sluice, does not).
    pub fn is_redis_failure(self) -> bool {
        !matches!(self, Self::BadKey | Self::Overloaded | Self::SlotMap)
    }

    /// The kind of a Redis error reply's code (`READONLY`, `OOM`, ...).
    pub fn of_code(code: &str) -> Self {
        match code {
            "NOSCRIPT" => Self::Noscript,
            "READONLY" => Self::Readonly,
            "LOADING" => Self::Loading,
            "BUSY" => Self::Busy,
            "OOM" => Self::Oom,
            "NOAUTH" | "WRONGPASS" | "NOPERM" => Self::Auth,
            "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "CROSSSLOT" => Self::Cluster,
            "WRONGTYPE" | "BADSTATE" => Self::BadKey,
            // The node script's own refusal (see lua/batch.lua).
            "NONLOCAL" => Self::SlotMap,
            _ => Self::Other,
        }
    }

    /// The kind of a client-side error.
    pub fn of(error: &RedisError) -> Self {
        if super::access::is_tls_error(error) {
            Self::Tls
        } else if error.is_timeout() {
            Self::Timeout
        } else if error.kind() == redis::ErrorKind::AuthenticationFailed {
            Self::Auth
        } else if error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_io_error()
        {
            Self::Connection
        } else {
            Self::of_code(error.code().unwrap_or(""))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_codes_map() {
        let mut labels: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ErrorKind::ALL.len());
        assert_eq!(ErrorKind::of_code("WRONGTYPE"), ErrorKind::BadKey);
        assert_eq!(ErrorKind::of_code("READONLY"), ErrorKind::Readonly);
        assert_eq!(ErrorKind::of_code("MOVED"), ErrorKind::Cluster);
        assert_eq!(ErrorKind::of_code("WHATEVER"), ErrorKind::Other);
        assert!(ErrorKind::Readonly.opens_at_once() && !ErrorKind::Timeout.opens_at_once());
        assert!(!ErrorKind::BadKey.is_redis_failure());
        assert_eq!(ErrorKind::of_code("NONLOCAL"), ErrorKind::SlotMap);
        assert!(!ErrorKind::SlotMap.is_redis_failure());
    }
}

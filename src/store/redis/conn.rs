//! Connections to Redis: one primary through an auto-reconnecting multiplexed connection, the
//! primary named by a Sentinel set (resolved again on every rebuild, never reconnecting to an old
//! address), or a Cluster (which follows MOVED/ASK itself). Connecting never blocks start-up: the
//! prober connects in the background and publishes the connection.

use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{socket2, TcpSettings};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisConnectionInfo, RedisResult, Value,
};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One primary: `redis://[user:password@]host:port[/db]`.
    Single(String),
    /// Seed nodes of a Cluster.
    Cluster(Vec<String>),
    /// A Sentinel set watching a primary.
    Sentinel(SentinelTarget),
}

/// The Sentinels, the name of the primary they watch, and the primary's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// Sentinel URLs.
    pub nodes: Vec<String>,
    /// The monitored primary's name (`sentinel monitor <name> ...`).
    pub master: String,
    /// Username for the data nodes, if any.
    pub username: Option<String>,
    /// Password for the data nodes, if any.
    pub password: Option<String>,
}

/// A live connection of either kind; cheap to clone (both multiplex one socket per node).
#[derive(Clone)]
pub enum Conn {
    /// A single primary.
    Single(ConnectionManager),
    /// A Cluster.
    Cluster(ClusterConnection),
    /// The primary a Sentinel named; rebuilt through Sentinel, never reconnected in place.
    Resolved(MultiplexedConnection),
}

impl Conn {
    /// Whether pipelines must stay within one hash slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Sends one command and returns its raw reply: error replies nested in an array stay
    /// `Value::ServerError` entries (the batch script answers a bad key's check that way).
    pub async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd).await,
            Self::Cluster(conn) => conn.req_packed_command(cmd).await,
            Self::Resolved(conn) => conn.req_packed_command(cmd).await,
        }
    }

    async fn expect_ok(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.query(cmd).await?.extract_error()
    }

    /// Loads a script into the script cache (of every primary, in a Cluster).
    pub async fn load_script(&mut self, source: &str) -> RedisResult<()> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(source);
        self.expect_ok(&cmd).await.map(drop)
    }

    /// `HGET key field`.
    pub async fn hash_get(&mut self, key: &str, field: &str) -> RedisResult<Option<String>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg(field);
        Ok(redis::from_redis_value(self.expect_ok(&cmd).await?)?)
    }

    /// A small write that fails exactly when checks would: on a replica (READONLY), a node out of
    /// memory (OOM), loading, or without auth. The key expires.
    pub async fn probe(&mut self, key: &str) -> RedisResult<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(1).arg("PX").arg(10_000);
        self.expect_ok(&cmd).await.map(drop)
    }
}

/// No Nagle delay (a check is one small write), and keepalive probes so that a peer that vanished
/// without a FIN (a dead node, a dropped NAT entry) is noticed.
fn tcp_settings() -> TcpSettings {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
}

/// Timeouts for connecting and for any one reply.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Per connection attempt.
    pub connect: Duration,
    /// Per reply (a backstop; checks carry their own, shorter deadline).
    pub response: Duration,
}

/// Connects (for Sentinel: asks the Sentinels for the primary, which must say it is one).
pub async fn connect(target: &RedisTarget, timeouts: Timeouts) -> RedisResult<Conn> {
    match target {
        RedisTarget::Single(url) => {
            let info = url
                .as_str()
                .into_connection_info()?
                .set_tcp_settings(tcp_settings());
            let client = redis::Client::open(info)?;
            // One attempt per (re)connection: the prober does the retrying, with its own pacing,
            // and sees every error (NOAUTH, refused, ...) instead of a retry loop's timeout.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeouts.connect))
                .set_response_timeout(Some(timeouts.response))
                .set_number_of_retries(0);
            let manager = ConnectionManager::new_lazy_with_config(client, config)?;
            Ok(Conn::Single(manager))
        }
        RedisTarget::Cluster(nodes) => {
            let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                .connection_timeout(timeouts.connect)
                .response_timeout(timeouts.response)
                .tcp_settings(tcp_settings())
                .build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        }
        RedisTarget::Sentinel(sentinel) => {
            let mut auth = RedisConnectionInfo::default();
            if let Some(username) = &sentinel.username {
                auth = auth.set_username(username);
            }
            if let Some(password) = &sentinel.password {
                auth = auth.set_password(password);
            }
            let node = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(auth)
                .set_tcp_settings(tcp_settings());
            let mut client = SentinelClient::build(
                sentinel.nodes.iter().map(String::as_str).collect(),
                sentinel.master.clone(),
                Some(node),
                SentinelServerType::Master,
            )?;
            let primary = tokio::time::timeout(timeouts.connect, client.async_get_client())
                .await
                .map_err(|_| timed_out("asking Sentinel for the primary"))??;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeouts.connect))
                .set_response_timeout(Some(timeouts.response));
            let conn = primary
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok(Conn::Resolved(conn))
        }
    }
}

fn timed_out(what: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}

/// Validates `target` (URL syntax) without connecting.
pub fn validate(target: &RedisTarget) -> Result<(), String> {
    let urls = match target {
        RedisTarget::Single(url) => std::slice::from_ref(url),
        RedisTarget::Cluster(nodes) => nodes.as_slice(),
        RedisTarget::Sentinel(sentinel) => {
            if sentinel.master.is_empty() {
                return Err("redis.sentinel.master names no primary".into());
            }
            sentinel.nodes.as_slice()
        }
    };
    for url in urls {
        url.as_str()
            .into_connection_info()
            .map_err(|e| format!("{}: {e}", mask_password(url)))?;
    }
    Ok(())
}

/// The target for logs, passwords masked.
pub fn describe(target: &RedisTarget) -> String {
    match target {
        RedisTarget::Single(url) => mask_password(url),
        RedisTarget::Cluster(nodes) => {
            let masked: Vec<String> = nodes.iter().map(|n| mask_password(n)).collect();
            format!("cluster [{}]", masked.join(", "))
        }
        RedisTarget::Sentinel(sentinel) => {
            let masked: Vec<String> = sentinel.nodes.iter().map(|n| mask_password(n)).collect();
            format!("sentinel `{}` [{}]", sentinel.master, masked.join(", "))
        }
    }
}

/// `redis://user:secret@host` -> `redis://user:***@host`, for every log line.
pub fn mask_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let credentials = &rest[..at];
    let user = credentials.split_once(':').map_or("", |(user, _)| user);
    format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            mask_password("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(mask_password("rediss://app:s3cret@h"), "rediss://app:***@h");
        assert_eq!(mask_password("redis://h:6379"), "redis://h:6379");
        let cluster = RedisTarget::Cluster(vec!["redis://:pw@a:1".into(), "redis://b:2".into()]);
        assert!(!describe(&cluster).contains("pw"));
    }

    #[test]
    fn bad_urls_are_refused_before_connecting() {
        assert!(validate(&RedisTarget::Single("nonsense".into())).is_err());
        assert!(validate(&RedisTarget::Single("redis://127.0.0.1:6379".into())).is_ok());
    }
}

//! Connections to Redis: one primary through an auto-reconnecting multiplexed connection, or a
//! Cluster (which follows MOVED/ASK itself). Connecting never blocks start-up: a background task
//! connects, retrying with backoff, and publishes the connection when it has one.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{socket2, TcpSettings};
use redis::{IntoConnectionInfo, Pipeline, RedisResult, Value};
use tokio::sync::watch;

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One primary: `redis://[user:password@]host:port[/db]`.
    Single(String),
    /// Seed nodes of a Cluster.
    Cluster(Vec<String>),
}

/// A live connection of either kind; cheap to clone (both multiplex one socket per node).
#[derive(Clone)]
pub enum Conn {
    /// A single primary.
    Single(ConnectionManager),
    /// A Cluster.
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether pipelines must stay within one hash slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Loads a script into the script cache (of every primary, in a Cluster).
    pub async fn load_script(&mut self, source: &str) -> RedisResult<String> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(source);
        match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => cmd.query_async(conn).await,
        }
    }

    /// Sends a pipeline; per-command errors come back as `Value::ServerError` entries.
    pub async fn run(&mut self, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            Self::Single(conn) => pipeline.query_async(conn).await,
            Self::Cluster(conn) => pipeline.query_async(conn).await,
        }
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

async fn connect(target: &RedisTarget, timeouts: Timeouts) -> RedisResult<Conn> {
    match target {
        RedisTarget::Single(url) => {
            let info = url
                .as_str()
                .into_connection_info()?
                .set_tcp_settings(tcp_settings());
            let client = redis::Client::open(info)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeouts.connect))
                .set_response_timeout(Some(timeouts.response));
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
    }
}

/// Validates `target` (URL syntax) without connecting.
pub fn validate(target: &RedisTarget) -> Result<(), String> {
    let urls = match target {
        RedisTarget::Single(url) => std::slice::from_ref(url),
        RedisTarget::Cluster(nodes) => nodes.as_slice(),
    };
    for url in urls {
        url.as_str()
            .into_connection_info()
            .map_err(|e| format!("{}: {e}", mask_password(url)))?;
    }
    Ok(())
}

/// Starts connecting in the background; the receiver holds `Some` once connected. The `scripts`
/// are loaded right away so that the first checks need no `NOSCRIPT` round trip.
pub fn spawn_connector(
    target: RedisTarget,
    timeouts: Timeouts,
    scripts: Vec<&'static str>,
) -> watch::Receiver<Option<Conn>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(50);
        loop {
            match connect(&target, timeouts).await {
                Ok(mut conn) => {
                    for source in &scripts {
                        if let Err(error) = conn.load_script(source).await {
                            tracing::debug!(%error, "could not preload a script; NOSCRIPT will load it");
                        }
                    }
                    tracing::info!(redis = %describe(&target), "Redis connection ready");
                    let _ = tx.send(Some(conn));
                    return;
                }
                Err(error) => {
                    tracing::warn!(redis = %describe(&target), %error, retry_in = ?delay, "cannot connect to Redis");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = tx.closed() => return,
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    });
    rx
}

/// The target for logs, passwords masked.
pub fn describe(target: &RedisTarget) -> String {
    match target {
        RedisTarget::Single(url) => mask_password(url),
        RedisTarget::Cluster(nodes) => {
            let masked: Vec<String> = nodes.iter().map(|n| mask_password(n)).collect();
            format!("cluster [{}]", masked.join(", "))
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

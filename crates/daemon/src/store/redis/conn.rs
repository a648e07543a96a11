//! Connections to Redis: one primary through an auto-reconnecting multiplexed connection, the
//! primary named by a Sentinel set (resolved again on every rebuild, never reconnecting to an old
//! address), or a Cluster (which follows MOVED/ASK itself). Connecting never blocks start-up: the
//! prober connects in the background and publishes the connection. Every connection carries the
//! same [`Access`]: the ACL user and password, and TLS for `rediss://` URLs.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::{socket2, TcpSettings};
use redis::sentinel::SentinelClientBuilder;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult,
    TlsMode, Value,
};

use super::access::{install_crypto_provider, Access};
use super::slot_map::{NodeCalls, SlotMap};

// Where Redis is, as parsed from the settings (the one place its rules are checked).
use crate::config::{RedisTarget, SentinelTarget};

/// A live connection of either kind; cheap to clone (both multiplex one socket per node).
#[derive(Clone)]
pub enum Conn {
    /// A single primary.
    Single(ConnectionManager),
    /// A Cluster, and its slot map when its nodes took the node script (one call per node).
    Cluster(ClusterConnection, Option<Arc<NodeCalls>>),
    /// The primary a Sentinel named; rebuilt through Sentinel, never reconnected in place.
    Resolved(MultiplexedConnection),
}

impl Conn {
    /// Whether pipelines must stay within one hash slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(..))
    }

    /// A Cluster connection's slot map for node calls, when it makes them.
    pub fn node_calls(&self) -> Option<&Arc<NodeCalls>> {
        match self {
            Self::Cluster(_, calls) => calls.as_ref(),
            _ => None,
        }
    }

    /// Sends one command to the primary serving `slot` (a Cluster node call; elsewhere the one
    /// primary), raw reply as [`Self::query`].
    pub async fn query_slot(&mut self, cmd: Cmd, slot: u16) -> RedisResult<Value> {
        match self {
            Self::Cluster(conn, _) => {
                let route = Route::new(slot, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.route_command(cmd, routing).await
            }
            _ => self.query(&cmd).await,
        }
    }

    /// Sends one command and returns its raw reply: error replies nested in an array stay
    /// `Value::ServerError` entries (the batch script answers a bad key's check that way).
    pub async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd).await,
            Self::Cluster(conn, _) => conn.req_packed_command(cmd).await,
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

    /// For a Cluster: loads the node script into every primary and reads the slot map, so that
    /// batches go out as one call per node. A server that refuses the script (Redis < 7.0 knows
    /// no script flags) or a map that cannot be read leaves one call per slot; logged, not fatal.
    pub async fn enable_node_calls(self, node_script: &str) -> Self {
        let Self::Cluster(mut conn, _) = self else {
            return self;
        };
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(node_script);
        if let Err(error) = conn
            .req_packed_command(&load)
            .await
            .and_then(Value::extract_error)
        {
            tracing::info!(%error, "Cluster nodes refused the node script (Redis < 7.0?): one call per hash slot");
            return Self::Cluster(conn, None);
        }
        let calls = Arc::new(NodeCalls::default());
        refresh_slot_map(&mut conn, &calls).await;
        Self::Cluster(conn, Some(calls))
    }

    /// Reads a Cluster's slot map again (after a node refused a call grouped by a stale one).
    pub async fn refresh_slot_map(&mut self) {
        if let Self::Cluster(conn, Some(calls)) = self {
            let calls = Arc::clone(calls);
            refresh_slot_map(conn, &calls).await;
        }
    }

    /// `HGET key field`.
    pub async fn hash_get(&mut self, key: &str, field: &str) -> RedisResult<Option<String>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg(field);
        Ok(redis::from_redis_value(self.expect_ok(&cmd).await?)?)
    }

    /// `DEL keys` (keys of one hash tag, routed by it in a Cluster); whether any existed.
    pub async fn delete(&mut self, keys: &[&str]) -> RedisResult<bool> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(keys);
        let deleted: u64 = redis::from_redis_value(self.expect_ok(&cmd).await?)?;
        Ok(deleted > 0)
    }

    /// A script call (`EVALSHA` or `EVAL`) outside the batcher; its error reply as an error.
    pub async fn eval(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.expect_ok(cmd).await
    }

    /// `PUBLISH channel message`; how many subscribers the node delivered it to (a Cluster
    /// forwards it to the other nodes' subscribers over its bus).
    pub async fn publish(&mut self, channel: &str, message: &str) -> RedisResult<u64> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(channel).arg(message);
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

async fn refresh_slot_map(conn: &mut ClusterConnection, calls: &NodeCalls) {
    let read = conn
        .req_packed_command(&redis::cmd("CLUSTER").arg("SLOTS").clone())
        .await
        .map_err(|error| error.to_string())
        .and_then(|reply| SlotMap::from_cluster_slots(&reply));
    match read {
        Ok(map) => calls.set(Some(map)),
        Err(error) => {
            tracing::warn!(%error, "could not read the Cluster slot map: one call per hash slot until it is read");
            calls.set(None);
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

fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// A client for one node: the URL, with `credentials` (when given) replacing the URL's, and for
/// `rediss://` the TLS material (and the `insecure` switch) applied.
pub fn node_client(
    url: &str,
    credentials: Option<&Access>,
    access: &Access,
) -> RedisResult<redis::Client> {
    let mut info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    if let Some(credentials) = credentials {
        let mut redis = info.redis_settings().clone();
        if let Some(username) = &credentials.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &credentials.password {
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
    }
    if !is_tls(&info) {
        return redis::Client::open(info);
    }
    install_crypto_provider();
    let client = redis::Client::build_with_tls(info, access.tls.certificates())?;
    if !access.tls.insecure && !access.tls.skip_hostname {
        return Ok(client);
    }
    let info = client.get_connection_info().clone();
    if !access.tls.insecure {
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        return redis::Client::open(info.set_addr(addr));
    }
    let addr = match info.addr().clone() {
        ConnectionAddr::TcpTls {
            host,
            port,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: true,
            tls_params,
        },
        other => other,
    };
    redis::Client::open(info.set_addr(addr))
}

fn tls_mode(access: &Access) -> TlsMode {
    if access.tls.insecure {
        TlsMode::Insecure
    } else {
        TlsMode::Secure
    }
}

/// How often redis-rs retries a Cluster call inside one send: it follows `MOVED`/`ASK` at once and
/// waits 1-5 ms before resending on `TRYAGAIN` (a slot's keys split by a resharding) or
/// `CLUSTERDOWN`. Few, so that it gives a refusal back well within a deadline (at most about
/// 20 ms of waiting): a refusal is Redis answering, which the call's deadline must see (the
/// batcher resends a resharding's refusal itself, each send with its deadline; see
/// `batcher/call.rs`). Hidden retries past the deadline made a split longer than 100 ms look
/// like a silent Redis, which opened the circuit for every check.
const CLUSTER_RETRIES: u32 = 6;

/// Connects (for Sentinel: asks the Sentinels for the primary, which must say it is one).
pub async fn connect(
    target: &RedisTarget,
    access: &Access,
    timeouts: Timeouts,
) -> RedisResult<Conn> {
    match target {
        RedisTarget::Single(url) => {
            let client = node_client(url, Some(access), access)?;
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
            // A resharding answers MOVED and ASK (followed at once) and, while a slot's keys are
            // split between two nodes, TRYAGAIN for a call naming several of them: redis-rs'
            // default waits (at least 1.28 s) are far past any check's deadline; here a few
            // retries 1-5 ms apart, then the refusal comes back to the batcher.
            let builder = cluster_builder(nodes, access)
                .connection_timeout(timeouts.connect)
                .response_timeout(timeouts.response)
                .retries(CLUSTER_RETRIES)
                .min_retry_wait(1)
                .max_retry_wait(5)
                .retry_wait_formula(1, 2)
                .tcp_settings(tcp_settings());
            let client = builder.build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?, None))
        }
        RedisTarget::Sentinel(sentinel) => {
            let mut client = sentinel_client(sentinel, access)?;
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

/// A pub/sub connection for `SUBSCRIBE`: to the single primary; to the primary the Sentinels
/// name now; in a Cluster to seed node number `attempt` (round robin), since a Cluster delivers
/// every `PUBLISH` to the subscribers of every node.
pub async fn subscriber(
    target: &RedisTarget,
    access: &Access,
    timeouts: Timeouts,
    attempt: usize,
) -> RedisResult<redis::aio::PubSub> {
    let client = match target {
        RedisTarget::Single(url) => node_client(url, Some(access), access)?,
        RedisTarget::Cluster(nodes) => {
            let url = nodes
                .get(attempt % nodes.len().max(1))
                .ok_or_else(|| timed_out("finding a Cluster node (none configured)"))?;
            node_client(url, Some(access), access)?
        }
        RedisTarget::Sentinel(sentinel) => {
            let mut client = sentinel_client(sentinel, access)?;
            tokio::time::timeout(timeouts.connect, client.async_get_client())
                .await
                .map_err(|_| timed_out("asking Sentinel for the primary"))??
        }
    };
    tokio::time::timeout(timeouts.connect, client.get_async_pubsub())
        .await
        .map_err(|_| timed_out("connecting for SUBSCRIBE"))?
}

/// A Cluster client for the seed `nodes`: `access`'s credentials, and when the seeds are
/// `rediss://`, its TLS for them and for every node found through CLUSTER SLOTS.
fn cluster_builder(nodes: &[String], access: &Access) -> ClusterClientBuilder {
    let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str));
    if let Some(username) = &access.username {
        builder = builder.username(username);
    }
    if let Some(password) = &access.password {
        builder = builder.password(password);
    }
    let first = nodes.first().map(String::as_str).unwrap_or_default();
    if first.into_connection_info().is_ok_and(|info| is_tls(&info)) {
        install_crypto_provider();
        builder = builder
            .certs(access.tls.certificates())
            .tls(tls_mode(access))
            .danger_accept_invalid_hostnames(access.tls.skip_hostname);
    }
    builder
}

/// The Sentinels (their URLs' credentials; TLS when they are `rediss://`, which then also applies
/// to the primary they name) and the primary's credentials.
fn sentinel_client(sentinel: &SentinelTarget, access: &Access) -> RedisResult<SentinelClient> {
    let infos = sentinel
        .nodes
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<ConnectionInfo>>>()?;
    let tls = infos.iter().any(is_tls);
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|info| info.addr().clone()),
        &sentinel.master,
        SentinelServerType::Master,
    )?
    .set_client_to_sentinel_tcp_settings(tcp_settings())
    .set_client_to_redis_tcp_settings(tcp_settings());
    let sentinel_auth = infos.iter().map(ConnectionInfo::redis_settings);
    if let Some(username) = sentinel_auth.clone().find_map(|r| r.username()) {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = sentinel_auth.clone().find_map(|r| r.password()) {
        builder = builder.set_client_to_sentinel_password(password);
    }
    let username = access.username.as_ref().or(sentinel.username.as_ref());
    if let Some(username) = username {
        builder = builder.set_client_to_redis_username(username);
    }
    let password = access.password.as_ref().or(sentinel.password.as_ref());
    if let Some(password) = password {
        builder = builder.set_client_to_redis_password(password);
    }
    if tls {
        install_crypto_provider();
        builder = builder
            .set_client_to_sentinel_tls_mode(tls_mode(access))
            .set_client_to_sentinel_certificates(access.tls.certificates())
            .set_client_to_redis_tls_mode(tls_mode(access))
            .set_client_to_redis_certificates(access.tls.certificates());
    }
    builder.build()
}

fn timed_out(what: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}

/// Validates `target` and `access` without connecting: every URL parses and its scheme is
/// supported, and the clients build (TLS material included) exactly as the prober will build them.
pub fn validate(target: &RedisTarget, access: &Access) -> Result<(), String> {
    let urls = match target {
        RedisTarget::Single(url) => std::slice::from_ref(url),
        RedisTarget::Cluster(nodes) => nodes.as_slice(),
        RedisTarget::Sentinel(sentinel) => sentinel.nodes.as_slice(),
    };
    for url in urls {
        let info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| format!("{}: {e}", mask_password(url)))?;
        if !info.addr().is_supported() {
            return Err(format!("{}: unsupported address", mask_password(url)));
        }
        if let RedisTarget::Single(_) = target {
            node_client(url, Some(access), access)
                .map_err(|e| format!("{}: {e}", mask_password(url)))?;
        }
    }
    let built = match target {
        RedisTarget::Single(_) => Ok(()),
        RedisTarget::Cluster(nodes) => cluster_builder(nodes, access).build().map(drop),
        RedisTarget::Sentinel(sentinel) => sentinel_client(sentinel, access).map(drop),
    };
    built.map_err(|e| format!("{}: {e}", describe(target)))
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
    crate::config::mask_url(url)
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
        let access = Access::default();
        assert!(validate(&RedisTarget::Single("nonsense".into()), &access).is_err());
        assert!(validate(
            &RedisTarget::Single("redis://127.0.0.1:6379".into()),
            &access
        )
        .is_ok());
        assert!(validate(
            &RedisTarget::Single("rediss://127.0.0.1:6380".into()),
            &access
        )
        .is_ok());
    }
}

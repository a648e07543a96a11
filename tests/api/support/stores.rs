//! Every scenario on every store: a [`Backend`] (the embedded store, one Redis, a Redis Cluster),
//! the running [`Store`] behind a daemon, and [`on_stores!`], which turns one scenario body into
//! one `#[tokio::test]` per backend (after limitador's `test_with_all_storage_impls!`).
//!
//! Redis keeps its own clock: a scenario that advances the daemon's manual clock, or whose
//! windows could cross a boundary in the real time the test takes, holds on the embedded store
//! only.

use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use sluice::config::{HumanDuration, Settings};

use crate::helpers::{spawn_app_in, test_settings, TestApp};
use crate::redis_server::{RedisCluster, RedisServer};

/// Which store a daemon counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The embedded in-memory store (on the daemon's manual clock).
    Memory,
    /// One `redis-server`.
    Redis,
    /// A 3-primary Redis Cluster.
    Cluster,
}

/// A running store: nothing for the embedded one, else a Redis server or Cluster (killed when
/// its last holder drops it).
#[derive(Clone)]
pub enum Store {
    /// The embedded store lives in the daemon.
    Memory,
    /// One `redis-server`.
    Redis(Arc<RedisServer>),
    /// A 3-primary Redis Cluster.
    Cluster(Arc<RedisCluster>),
}

/// The Redis server the scenarios running at the same time share.
static SHARED_REDIS: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
/// The Cluster the scenarios running at the same time share (a Cluster takes seconds to form).
static SHARED_CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

/// The live server in `slot`, or a new one.
fn shared<T>(slot: &Mutex<Weak<T>>, start: fn() -> T) -> Arc<T> {
    let mut held = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(live) = held.upgrade() {
        return live;
    }
    let fresh = Arc::new(start());
    *held = Arc::downgrade(&fresh);
    fresh
}

impl Store {
    /// A store of its own, for a test that flushes, restarts or counts server-wide.
    pub fn start(backend: Backend) -> Self {
        match backend {
            Backend::Memory => Self::Memory,
            Backend::Redis => Self::Redis(Arc::new(RedisServer::start())),
            Backend::Cluster => Self::Cluster(Arc::new(RedisCluster::start())),
        }
    }

    /// The server of `backend` that the scenarios running now share (each daemon keys under a
    /// prefix of its own).
    pub fn shared(backend: Backend) -> Self {
        match backend {
            Backend::Memory => Self::Memory,
            Backend::Redis => Self::Redis(shared(&SHARED_REDIS, RedisServer::start)),
            Backend::Cluster => Self::Cluster(shared(&SHARED_CLUSTER, RedisCluster::start)),
        }
    }

    /// Points `settings` at this store, keys under `prefix`.
    pub fn configure(&self, settings: &mut Settings, prefix: &str) {
        match self {
            Self::Memory => return,
            Self::Redis(server) => settings.redis.url = Some(server.url()),
            Self::Cluster(cluster) => settings.redis.cluster = cluster.urls(),
        }
        settings.redis.key_prefix = prefix.into();
        // Generous: CI machines are small and shared; timing is the benchmark's job.
        settings.redis.timeout = HumanDuration(2_000_000);
    }

    /// One connection per primary (none for the embedded store).
    pub fn primaries(&self) -> Vec<redis::Connection> {
        match self {
            Self::Memory => Vec::new(),
            Self::Redis(server) => vec![server.connection()],
            Self::Cluster(cluster) => cluster.connections(),
        }
    }

    /// Every key matching `pattern`, with the index of the primary that holds it.
    pub fn keys(&self, pattern: &str) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        for (node, mut conn) in self.primaries().into_iter().enumerate() {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query(&mut conn)
                .expect("KEYS");
            found.extend(keys.into_iter().map(|k| (node, k)));
        }
        found
    }
}

/// A daemon (a [`TestApp`] or a wrapper of one) and the store it counts in, which outlives it.
pub struct OnStore<D> {
    /// The daemon.
    pub daemon: D,
    /// Its store.
    pub store: Store,
    /// Its Redis key prefix.
    pub prefix: String,
}

impl<D> Deref for OnStore<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.daemon
    }
}

/// The key prefix of a scenario: its module path, `-` for `::`.
pub fn prefix_of(module_path: &str) -> String {
    module_path.replace("::", "-")
}

/// A daemon enforcing `policies` on the shared store of `backend`, once the store takes calls.
pub async fn spawn_on(backend: Backend, policies: &str, prefix: &str) -> OnStore<TestApp> {
    spawn_on_with(Store::shared(backend), policies, prefix, |_| {}).await
}

/// [`spawn_on`] on `store`, with `tweak` applied to the settings last.
pub async fn spawn_on_with(
    store: Store,
    policies: &str,
    prefix: &str,
    tweak: impl FnOnce(&mut Settings),
) -> OnStore<TestApp> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    store.configure(&mut settings, prefix);
    tweak(&mut settings);
    let daemon = spawn_app_in(dir, settings, policies).await;
    daemon.wait_for_store().await;
    OnStore {
        daemon,
        store,
        prefix: prefix.to_owned(),
    }
}

/// The [`Backend`] named by a lower-case identifier (`memory`, `redis`, `cluster`).
macro_rules! backend {
    (memory) => {
        $crate::stores::Backend::Memory
    };
    (redis) => {
        $crate::stores::Backend::Redis
    };
    (cluster) => {
        $crate::stores::Backend::Cluster
    };
}
pub(crate) use backend;

/// One scenario, one test per listed backend: `on_stores! { async fn name(app: &T) via spawn,
/// on [memory, redis, cluster] { body } }` makes a module `name` holding the body as `run` and
/// a test per backend (`name::memory`, `name::redis`, ...). `spawn(backend, prefix)` (found from
/// the calling module) builds the daemon; the prefix is unique to the test.
macro_rules! on_stores {
    (
        $(#[$meta:meta])*
        async fn $name:ident($app:ident: &$ty:ty) via $spawn:ident, on [$($backend:ident),+ $(,)?]
        $body:block
    ) => {
        $(#[$meta])*
        pub(crate) mod $name {
            #[allow(unused_imports)]
            use super::*;

            pub(crate) async fn run($app: &$ty) $body

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $backend() {
                    let prefix = $crate::stores::prefix_of(concat!(
                        module_path!(),
                        "::",
                        stringify!($backend)
                    ));
                    let app = $spawn($crate::stores::backend!($backend), &prefix).await;
                    run(&app).await;
                }
            )+
        }
    };
}
pub(crate) use on_stores;

//! The tenant tier table in Redis: the hash `<prefix>:tenant-tiers`, field = tenant, value =
//! tier (`HSET rl:tenant-tiers acme enterprise`), shared by every daemon.

use std::sync::Arc;

use super::{TierFuture, TierSource};
use crate::store::redis::RedisStore;

/// The hash's name after the key prefix.
pub const TABLE: &str = "tenant-tiers";

/// Tiers from Redis.
pub struct RedisTiers {
    store: Arc<RedisStore>,
}

impl RedisTiers {
    /// Reads through `store`'s connection.
    pub fn new(store: Arc<RedisStore>) -> Self {
        Self { store }
    }
}

impl TierSource for RedisTiers {
    fn fetch<'a>(&'a self, tenant: &'a str) -> TierFuture<'a> {
        Box::pin(async move {
            self.store
                .hash_get(TABLE, tenant)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

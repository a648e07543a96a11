//! The per-tenant tier table: which tier a tenant is in (e.g. `acme: enterprise`), changeable at
//! run time without a restart. Kept in Redis (a hash, shared by every daemon) or, for the
//! embedded store, in a YAML file; each daemon caches answers in a bounded moka cache whose
//! entries live for the refresh interval, so a change is seen everywhere within that interval.
//! A lookup that fails (Redis down) means "no override": the tier descriptor applies.

mod file;
mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use file::FileTiers;
pub use redis::{RedisTiers, TABLE as REDIS_TABLE};

/// What [`TierSource::fetch`] returns: the tenant's tier, if the table lists it.
pub type TierFuture<'a> = Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + 'a>>;

/// Where the table lives.
pub trait TierSource: Send + Sync + 'static {
    /// Looks a tenant up.
    fn fetch<'a>(&'a self, tenant: &'a str) -> TierFuture<'a>;
}

/// The cached table.
pub struct TenantTiers {
    cache: moka::future::Cache<String, Option<Arc<str>>>,
    source: Arc<dyn TierSource>,
    timeout: Duration,
}

impl TenantTiers {
    /// A cache of at most `capacity` tenants over `source`, each answer kept for `refresh`;
    /// a lookup waits at most `timeout` for the source.
    pub fn new(
        source: Arc<dyn TierSource>,
        capacity: u64,
        refresh: Duration,
        timeout: Duration,
    ) -> Self {
        Self {
            cache: moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(refresh)
                .build(),
            source,
            timeout,
        }
    }

    /// The tenant's tier, if the table lists it (cached).
    pub async fn tier_of(&self, tenant: &str) -> Option<Arc<str>> {
        let fetch = async {
            match tokio::time::timeout(self.timeout, self.source.fetch(tenant)).await {
                Ok(Ok(tier)) => Ok(tier.map(Arc::from)),
                Ok(Err(error)) => Err(error),
                Err(_) => Err("timed out".to_owned()),
            }
        };
        match self.cache.try_get_with(tenant.to_owned(), fetch).await {
            Ok(tier) => tier,
            Err(error) => {
                tracing::debug!(%error, "tenant tier lookup failed; no override applies");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    struct Table {
        tier: Mutex<Option<String>>,
        fetches: AtomicUsize,
    }

    impl TierSource for Table {
        fn fetch<'a>(&'a self, _: &'a str) -> TierFuture<'a> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            let tier = self.tier.lock().expect("lock").clone();
            Box::pin(async move { Ok(tier) })
        }
    }

    #[tokio::test]
    async fn answers_are_cached_for_the_refresh_interval() {
        let table = Arc::new(Table {
            tier: Mutex::new(Some("gold".into())),
            fetches: AtomicUsize::new(0),
        });
        let tiers = TenantTiers::new(
            table.clone(),
            100,
            Duration::from_millis(200),
            Duration::from_secs(1),
        );
        assert_eq!(tiers.tier_of("acme").await.as_deref(), Some("gold"));
        *table.tier.lock().expect("lock") = None;
        assert_eq!(
            tiers.tier_of("acme").await.as_deref(),
            Some("gold"),
            "cached"
        );
        assert_eq!(table.fetches.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(tiers.tier_of("acme").await, None, "refreshed");
    }
}

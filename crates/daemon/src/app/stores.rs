//! Builds the check service from settings: the store (embedded, or Redis with its tenant tier
//! table and local layer), the `local` failure mode's share, the policies' local limits, and the
//! tenant table for the embedded store.

use std::sync::Arc;
use std::time::Duration;

use super::StartError;
use crate::check::{CheckService, HotKeys, Leases, LocalShare};
use crate::clock::Clock;
use crate::config::{RedisSettings, RedisTarget, Settings};
use crate::limit::PolicySet;
use crate::store::redis::access::{Access, TlsFiles, TlsOptions};
use crate::store::redis::batcher::BatchConfig;
use crate::store::redis::conn::Timeouts;
use crate::store::redis::prober::Backoff;
use crate::store::redis::resets::ResetEvent;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::{MemoryMetrics, MemoryStore};
use crate::telemetry::Metrics;
use crate::tenants::{FileTiers, RedisTiers, TenantTiers, TierSource};

/// Estimated bytes one local-limit bucket may hold on average before buckets are evicted (a
/// bucket with a short partition takes about 170): the key cap binds first unless partitions
/// are long.
const LOCAL_LIMIT_BYTES_PER_KEY: usize = 256;

/// The check service, and the embedded stores (to be swept) that it uses as its store, for the
/// `local` failure mode and for the policies' local limits.
pub(super) fn service(
    settings: &Settings,
    redis: Option<&RedisTarget>,
    policies: PolicySet,
    clock: Arc<dyn Clock>,
    metrics: &Metrics,
) -> Result<(CheckService, Vec<Arc<MemoryStore>>), StartError> {
    // The policies' local limits: one bucket per policy and partition, as many as the local
    // layer remembers partitions. An evicted bucket starts full: it only ever denied earlier.
    let local_keys = usize::try_from(settings.local_layer.max_keys).unwrap_or(usize::MAX);
    let local_limits = Arc::new(
        MemoryStore::new(local_keys, clock.clone(), None)
            .with_max_bytes(local_keys.saturating_mul(LOCAL_LIMIT_BYTES_PER_KEY)),
    );
    let memory = Arc::new(
        MemoryStore::new(
            settings.memory.max_keys,
            clock,
            Some(MemoryMetrics {
                keys: metrics.memory_keys.clone(),
                evictions: metrics.memory_evictions.clone(),
            }),
        )
        .with_max_bytes(settings.memory.max_bytes),
    );
    let local = LocalShare::new(
        memory.clone(),
        settings.local.replicas,
        settings.local.margin_percent,
    );
    let tenants = &settings.tenants;
    let tiers = |source: Arc<dyn TierSource>, timeout: Duration| {
        TenantTiers::new(
            source,
            tenants.cache_size,
            tenants.refresh.as_std(),
            timeout,
        )
    };
    let service = if let Some(target) = redis {
        let options = RedisOptions {
            tracing: metrics.tracing().clone(),
            ..redis_options(&settings.redis, target.clone()).map_err(StartError::Config)?
        };
        let redis = RedisStore::start(options, metrics.registry())
            .map_err(|e| StartError::Config(format!("redis: {e}")))?;
        let redis = Arc::new(redis);
        let table = tiers(
            Arc::new(RedisTiers::new(redis.clone())),
            settings.redis.timeout.as_std(),
        );
        let hot = settings
            .local_layer
            .enabled
            .then(|| HotKeys::new(settings.local_layer.max_keys));
        // Resets on any pod drop the partition from this pod's remembered denials and refill its
        // local-limit bucket. A missed reset (resubscribed: `All`) clears the remembered denials
        // only: a bucket refills within its own period anyway.
        let leases = Leases::new(redis.clone(), settings.leases, metrics.registry())
            .map_err(|e| StartError::Config(format!("registering the lease metrics: {e}")))?;
        // A reset also drops this pod's lease of the partition (not given back: the counter
        // starts afresh); a missed reset drops every lease (under-admission, never over).
        let (forget, buckets, dropped) = (hot.clone(), local_limits.clone(), leases.clone());
        redis.follow_resets(move |event| match event {
            ResetEvent::Key(key) => {
                if let Some(hot) = &forget {
                    hot.forget(&key);
                }
                dropped.forget(&key);
                buckets.reset_now(&key.without_window());
            }
            ResetEvent::All => {
                if let Some(hot) = &forget {
                    hot.clear();
                }
                dropped.clear();
            }
        });
        let mut service = CheckService::new(
            policies,
            redis,
            local,
            settings.limits.clone(),
            metrics.clone(),
        )
        .with_tenant_tiers(table)
        .with_leases(leases);
        if let Some(hot) = hot {
            service = service.with_local_layer(hot);
        }
        service
    } else {
        let service = CheckService::new(
            policies,
            memory.clone(),
            local,
            settings.limits.clone(),
            metrics.clone(),
        );
        match &tenants.file {
            Some(path) => {
                let source = FileTiers::new(path.clone(), tenants.refresh.as_std(), settings.files)
                    .map_err(|e| StartError::Config(format!("tenants.file: {e}")))?;
                service.with_tenant_tiers(tiers(Arc::new(source), Duration::from_secs(1)))
            }
            None => service,
        }
    };
    let service = service.with_local_limits(local_limits.clone());
    Ok((service, vec![memory, local_limits]))
}

/// Checks the Redis settings the way `serve` uses them (TLS files read and parsed, URLs and
/// clients built, nothing connected), for `sluice config check`; `target` is where the settings
/// say Redis is (`None`: the embedded store, nothing to check).
pub fn check_redis(settings: &RedisSettings, target: Option<&RedisTarget>) -> Result<(), String> {
    let Some(target) = target else {
        return Ok(());
    };
    let options = redis_options(settings, target.clone())?;
    crate::store::redis::conn::validate(&options.target, &options.access)
        .map_err(|e| format!("redis: {e}"))
}

/// The Redis store's options for `target`: credentials and TLS material (files read here,
/// once), deadlines, batching and the breaker.
fn redis_options(settings: &RedisSettings, target: RedisTarget) -> Result<RedisOptions, String> {
    let tls = &settings.tls;
    let files = TlsFiles {
        ca: tls.ca_file.as_deref(),
        cert: tls.cert_file.as_deref(),
        key: tls.key_file.as_deref(),
    };
    let access = Access {
        username: settings.username.clone(),
        password: settings.password.clone(),
        tls: TlsOptions {
            skip_hostname: !tls.verify_hostname,
            ..TlsOptions::load(files, tls.insecure, settings.uses_tls())?
        },
    };
    Ok(RedisOptions {
        target,
        access,
        key_prefix: settings.key_prefix.clone(),
        timeout: settings.timeout.as_std(),
        timeouts: Timeouts {
            connect: settings.connect_timeout.as_std(),
            response: settings
                .connect_timeout
                .as_std()
                .max(settings.timeout.as_std()),
        },
        batch: BatchConfig {
            max_batch: settings.max_batch,
            in_flight: settings.pipelines_in_flight,
            queue: settings.queue,
        },
        breaker_failures: settings.breaker.failures,
        backoff: Backoff {
            min: settings.breaker.probe_min.as_std(),
            max: settings.breaker.probe_max.as_std(),
        },
        node_calls: settings.cluster_node_calls,
        tracing: Default::default(),
    })
}

//! A check planned before a reload that reaches Redis after checks of the new policy set (it
//! waited for a CPU, or for a tenant's tier): the store's dispatcher answers it superseded
//! (denied, nothing spent, retry at once) instead of letting it restart the partition under the
//! old algorithm, as the embedded store does (issue 36 item 2; docs/policies.md). Driven through
//! the store itself so that the interleaving is the one a busy machine produced, every time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::config::RedisTarget;
use sluice::limit::{Algorithm, Decision, FixedWindow, Key, TokenBucket};
use sluice::store::redis::access::Access;
use sluice::store::redis::batcher::BatchConfig;
use sluice::store::redis::conn::Timeouts;
use sluice::store::redis::prober::Backoff;
use sluice::store::redis::{RedisOptions, RedisStore};
use sluice::store::{RateStore, Spend, StoreCheck};
use sluice::telemetry::Tracing;

use crate::redis_server::{RedisCluster, RedisServer};

const HOUR: u64 = 3_600_000_000;

pub(super) fn store(target: RedisTarget) -> RedisStore {
    let options = RedisOptions {
        target,
        access: Access::default(),
        key_prefix: "gen".into(),
        timeout: Duration::from_secs(2),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
        },
        batch: BatchConfig {
            max_batch: 64,
            in_flight: 4,
            queue: 256,
        },
        breaker_failures: 5,
        backoff: Backoff {
            min: Duration::from_millis(10),
            max: Duration::from_millis(100),
        },
        node_calls: true,
        tracing: Tracing::default(),
    };
    RedisStore::start(options, &prometheus::Registry::new()).expect("starts")
}

fn check(algorithm: Algorithm, generation: u64) -> StoreCheck {
    StoreCheck {
        key: Key::new(Arc::from("swap"), ["192.0.2.1"]),
        algorithm,
        cost: 1,
        enforce: true,
        generation,
    }
}

async fn decide(store: &RedisStore, check: &StoreCheck) -> Decision {
    let decisions = store
        .check(std::slice::from_ref(check), Spend::Record, None)
        .await
        .expect("Redis answers");
    decisions[0]
}

/// Waits (bounded) until the store answers a check of an unrelated key.
pub(super) async fn connected(store: &RedisStore) {
    let probe = StoreCheck {
        key: Key::new(Arc::from("probe"), ["p"]),
        ..check(
            Algorithm::FixedWindow(FixedWindow::new(1_000, HOUR).expect("valid")),
            0,
        )
    };
    let started = Instant::now();
    while store
        .check(std::slice::from_ref(&probe), Spend::DryRun, None)
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "Redis never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn late_plan_is_superseded(store: RedisStore) {
    connected(&store).await;
    let old = Algorithm::TokenBucket(TokenBucket::new(1_000, HOUR, 1_000).expect("valid"));
    let new = Algorithm::FixedWindow(FixedWindow::new(5, 7 * 24 * HOUR).expect("valid"));
    assert!(decide(&store, &check(old, 1)).await.allowed);
    let mut admitted = 0;
    for _ in 0..4 {
        admitted += u64::from(decide(&store, &check(new, 2)).await.allowed);
    }
    // The check planned under generation 1 reaches the store now.
    let late = decide(&store, &check(old, 1)).await;
    assert!(!late.allowed, "{late:?}");
    assert_eq!((late.limit, late.retry_after_us), (1_000, 1), "{late:?}");
    for _ in 0..3 {
        admitted += u64::from(decide(&store, &check(new, 2)).await.allowed);
    }
    assert_eq!(admitted, 5, "the new limit, exactly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_planned_before_a_reload_never_restarts_the_new_policys_partition_on_redis() {
    let server = RedisServer::start();
    late_plan_is_superseded(store(RedisTarget::Single(server.url()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_planned_before_a_reload_never_restarts_the_new_policys_partition_on_a_cluster() {
    let cluster = RedisCluster::start();
    late_plan_is_superseded(store(RedisTarget::Cluster(cluster.urls()))).await;
}

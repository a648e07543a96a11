//! The store's background tasks live as long as the store.

use std::time::Duration;

use super::access::Access;
use super::batcher::BatchConfig;
use super::conn::Timeouts;
use super::prober::Backoff;
use super::{RedisOptions, RedisStore};
use crate::config::{RedisTarget, SentinelTarget};
use crate::telemetry::Tracing;

#[test]
fn every_background_task_ends_when_the_store_is_dropped() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        // Nothing listens on port 1: every attempt fails at once, and each task waits to retry.
        let unreachable = "redis://127.0.0.1:1".to_owned();
        let options = RedisOptions {
            target: RedisTarget::Sentinel(SentinelTarget {
                nodes: vec![unreachable],
                master: "m".into(),
                username: None,
                password: None,
            }),
            access: Access::default(),
            key_prefix: "lifetime".into(),
            timeout: Duration::from_millis(50),
            timeouts: Timeouts {
                connect: Duration::from_millis(100),
                response: Duration::from_millis(100),
            },
            batch: BatchConfig {
                max_batch: 8,
                in_flight: 2,
                queue: 16,
            },
            breaker_failures: 3,
            backoff: Backoff {
                min: Duration::from_millis(10),
                max: Duration::from_millis(50),
            },
            node_calls: false,
            tracing: Tracing::default(),
        };
        let store = RedisStore::start(options, &prometheus::Registry::new()).expect("starts");
        store.follow_resets(|_| {});
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The prober, the dispatcher, the Sentinel watch and the reset follower.
        assert_eq!(tasks(), 4);
        drop(store);
        // Promptly: none finishes its wait to retry first (the Sentinel watch's is 1 s).
        for _ in 0..40 {
            if tasks() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(tasks(), 0, "a task outlived the store");
    });
}

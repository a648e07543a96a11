//! The Redis store's metrics, registered by the store itself on the registry it is given.

use std::sync::Arc;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::batcher::{BatchMetrics, Excuse};
use super::error::ErrorKind;
use super::permissions::{AclWatch, COMMANDS};
use crate::telemetry::LATENCY_BUCKETS;

/// Metrics the Redis store keeps.
#[derive(Clone)]
pub struct RedisMetrics {
    /// Script calls, batch sizes, call durations and errors.
    pub batch: BatchMetrics,
    /// `sluice_redis_circuit_state`: 0 healthy, 1 degraded, 2 open, 3 half-open.
    pub circuit: IntGauge,
    /// `sluice_redis_up`: 1 while checks may go to Redis (circuit not open), else 0.
    pub up: IntGauge,
}

impl RedisMetrics {
    /// Creates the metrics, every label value pre-set (a series exists before its first event),
    /// and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_redis_batch_size",
                "Checks per Redis script call (one call of the batch script per batch).",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0,
            ]),
        )?;
        let call_duration = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_redis_pipeline_duration_seconds",
                "Time from writing a Redis script call to its reply.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let calls = IntCounterVec::new(
            Opts::new(
                "sluice_redis_calls_total",
                "Batch script calls by scope: slot (one primary, or one Cluster hash slot), node \
                 (a Cluster node call covering several slots of one node).",
            ),
            &["scope"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new("sluice_redis_errors_total", "Redis errors by kind."),
            &["kind"],
        )?;
        let excused = IntCounterVec::new(
            Opts::new(
                "sluice_redis_deadlines_excused_total",
                "Redis calls past their deadline not taken for Redis's silence (the call waited \
                 on), by reason: reply_ready (the reply was readable when the timer was acted \
                 on), timer_late (the timer fired late: this daemon was not scheduled), \
                 redis_answering (Redis answered other calls).",
            ),
            &["reason"],
        )?;
        let circuit = IntGauge::new(
            "sluice_redis_circuit_state",
            "Redis circuit breaker: 0 healthy, 1 degraded, 2 open (checks skip Redis), 3 half-open.",
        )?;
        let up = IntGauge::new(
            "sluice_redis_up",
            "1 while checks may go to Redis (circuit not open), else 0.",
        )?;
        let acl_missing = IntGaugeVec::new(
            Opts::new(
                "sluice_redis_acl_missing",
                "1 for each command sluice sends that the Redis ACL user may not run, as the \
                 permission probe found at the last connect (0 otherwise).",
            ),
            &["command"],
        )?;
        for command in COMMANDS {
            acl_missing.with_label_values(&[command]);
        }
        for scope in ["slot", "node"] {
            calls.with_label_values(&[scope]);
        }
        for kind in ErrorKind::ALL {
            errors.with_label_values(&[kind.as_str()]);
        }
        for excuse in Excuse::ALL {
            excused.with_label_values(&[excuse.as_str()]);
        }
        registry.register(Box::new(batch_size.clone()))?;
        registry.register(Box::new(call_duration.clone()))?;
        registry.register(Box::new(calls.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(excused.clone()))?;
        registry.register(Box::new(circuit.clone()))?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(acl_missing.clone()))?;
        let acl = Arc::new(AclWatch::new(acl_missing, errors.clone()));
        Ok(Self {
            batch: BatchMetrics {
                batch_size,
                call_duration,
                calls,
                errors,
                excused,
                acl,
            },
            circuit,
            up,
        })
    }
}

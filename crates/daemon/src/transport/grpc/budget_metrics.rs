//! The gRPC listeners' memory budget as Prometheus metrics, read from the budget when scraped
//! (nothing on the request path): `sluice_grpc_memory_bytes` (held now),
//! `sluice_grpc_memory_budget_bytes` (`limits.grpc_memory_bytes`) and
//! `sluice_grpc_budget_refusals_total{kind}` (`connection`, `stream`, `enhance_your_calm`).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, Opts};

use sluice_http2::{Budget, Refusal};

/// Reads a [`Budget`] at each scrape.
pub(crate) struct BudgetMetrics {
    budget: Arc<Budget>,
    used: IntGauge,
    limit: IntGauge,
    refusals: IntCounterVec,
}

impl BudgetMetrics {
    /// Registers the budget's metrics on `registry` (an error is logged, not fatal).
    pub(crate) fn register(budget: Arc<Budget>, registry: &prometheus::Registry) {
        let made = (|| {
            let used = IntGauge::new(
                "sluice_grpc_memory_bytes",
                "Bytes the gRPC connections hold (each at least its base), against limits.grpc_memory_bytes",
            )?;
            let limit = IntGauge::new(
                "sluice_grpc_memory_budget_bytes",
                "The gRPC connections' memory budget (limits.grpc_memory_bytes)",
            )?;
            let refusals = IntCounterVec::new(
                Opts::new(
                    "sluice_grpc_budget_refusals_total",
                    "gRPC connections and streams refused for the memory budget, and connections sent GOAWAY(ENHANCE_YOUR_CALM), by kind",
                ),
                &["kind"],
            )?;
            for kind in Refusal::ALL {
                refusals.with_label_values(&[kind.as_str()]);
            }
            registry.register(Box::new(Self {
                budget,
                used,
                limit,
                refusals,
            }))
        })();
        if let Err(error) = made {
            tracing::warn!(%error, "registering the gRPC budget metrics failed");
        }
    }
}

impl Collector for BudgetMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.used.desc();
        descs.extend(self.limit.desc());
        descs.extend(self.refusals.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.used
            .set(i64::try_from(self.budget.used()).unwrap_or(i64::MAX));
        self.limit
            .set(i64::try_from(self.budget.limit()).unwrap_or(i64::MAX));
        for kind in Refusal::ALL {
            let counter = self.refusals.with_label_values(&[kind.as_str()]);
            let seen = self.budget.refusals(kind);
            let delta = seen.saturating_sub(counter.get());
            counter.inc_by(delta);
        }
        let mut families = self.used.collect();
        families.extend(self.limit.collect());
        families.extend(self.refusals.collect());
        families
    }
}

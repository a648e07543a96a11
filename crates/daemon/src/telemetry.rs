//! Logs (tracing), metrics (a Prometheus registry created here and passed down, never global)
//! and, when `[tracing]` names a collector, OpenTelemetry traces ([`Tracing`], carried by
//! [`Metrics`] so every component given the metrics has it too).

mod otlp;
mod trace;

pub use trace::{Carrier, CheckSpan, SpanTransport, StoreSpan, Tracing};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Check latency buckets, in seconds: from 25 µs, since a check should take well under 1 ms.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 1.0,
];

/// The daemon's own metrics, registered on one registry; components with metrics of their own
/// (the Redis store) register them on [`Metrics::registry`] when they start.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Decisions by policy and outcome (`check::DecisionOutcome::ALL`): `allowed`, `denied`,
    /// `shadow_denied`, `fail_open`, `fail_closed`, `local_allowed`, `local_denied`,
    /// `local_limit_denied`, and `unmatched` (with an empty policy).
    pub decisions: IntCounterVec,
    /// Time to answer a check request, by transport (tcp, uds).
    pub check_duration: HistogramVec,
    /// Check API responses by transport and status code (HTTP: the status; gRPC:
    /// `transport::grpc::GrpcCode::ALL`, `ok`, `over_limit`, `invalid_argument`,
    /// `deadline_exceeded`, `resource_exhausted`, `cancelled`).
    pub responses: IntCounterVec,
    /// Keys held by the embedded store.
    pub memory_keys: IntGauge,
    /// Keys the embedded store evicted because it was full (their counters restart).
    pub memory_evictions: IntCounter,
    /// Policies currently loaded.
    pub policies_loaded: IntGauge,
    /// Policy file reloads by result (`ok`, `unchanged`, `invalid`).
    pub policy_reloads: IntCounterVec,
    /// The loaded policy file's version: the low 32 bits of its content's SHA-1.
    pub policies_version: IntGauge,
    /// Times the reloader looked at the policy file (each poll and each SIGHUP), whatever it
    /// found: a flat line means it has stopped looking.
    pub policy_file_polls: IntCounter,
    /// Checks answered by the local layer (a partition known to be over its limit) without the
    /// store, by policy.
    pub local_layer_hits: IntCounterVec,
    /// The tracer (off unless `[tracing]` is set).
    tracing: Tracing,
}

impl Metrics {
    /// Creates and registers every metric, plus process metrics, on a new registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "sluice_decisions_total",
                "Limit decisions by policy and outcome.",
            ),
            &["policy", "outcome"],
        )
        .expect("valid metric");
        let check_duration = HistogramVec::new(
            HistogramOpts::new(
                "sluice_check_duration_seconds",
                "Time to answer a check request, from parsed request to response.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["transport"],
        )
        .expect("valid metric");
        let responses = IntCounterVec::new(
            Opts::new(
                "sluice_http_responses_total",
                "Check API responses by transport and status code.",
            ),
            &["transport", "code"],
        )
        .expect("valid metric");
        let memory_keys = IntGauge::new(
            "sluice_memory_store_keys",
            "Keys held by the embedded in-memory store.",
        )
        .expect("valid metric");
        let memory_evictions = IntCounter::new(
            "sluice_memory_store_evictions_total",
            "Keys evicted from the embedded store because it was full.",
        )
        .expect("valid metric");
        let policies_loaded = IntGauge::new("sluice_policies_loaded", "Policies currently loaded.")
            .expect("valid metric");
        let policy_reloads = IntCounterVec::new(
            Opts::new(
                "sluice_policy_reloads_total",
                "Policy file reloads by result: ok, unchanged, invalid (the old set keeps serving).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let policies_version = IntGauge::new(
            "sluice_policies_version",
            "Version of the loaded policy file: the low 32 bits of its content's SHA-1.",
        )
        .expect("valid metric");
        let policy_file_polls = IntCounter::new(
            "sluice_policy_file_polls_total",
            "Times the policy file was looked at (each poll and each SIGHUP), changed or not.",
        )
        .expect("valid metric");
        let local_layer_hits = IntCounterVec::new(
            Opts::new(
                "sluice_local_layer_hits_total",
                "Checks denied by the local layer (partition known to be over its limit) without asking the store.",
            ),
            &["policy"],
        )
        .expect("valid metric");
        let build_info = IntGauge::with_opts(
            Opts::new("sluice_build_info", "Always 1; labels carry the version.")
                .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("valid metric");
        build_info.set(1);
        for collector in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(check_duration.clone()),
            Box::new(responses.clone()),
            Box::new(memory_keys.clone()),
            Box::new(memory_evictions.clone()),
            Box::new(policies_loaded.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(policies_version.clone()),
            Box::new(policy_file_polls.clone()),
            Box::new(local_layer_hits.clone()),
            Box::new(build_info),
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
            Box::new(crate::process_cpu::ProcessCpu::new().expect("a valid metric")),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
        Self {
            registry,
            decisions,
            check_duration,
            responses,
            memory_keys,
            memory_evictions,
            policies_loaded,
            policy_reloads,
            policies_version,
            policy_file_polls,
            local_layer_hits,
            tracing: Tracing::off(),
        }
    }

    /// The same metrics, with `tracing` for the components that make spans.
    pub fn with_tracing(mut self, tracing: Tracing) -> Self {
        self.tracing = tracing;
        self
    }

    /// The tracer (off unless `[tracing]` is set).
    pub fn tracing(&self) -> &Tracing {
        &self.tracing
    }

    /// The registry components register their own metrics on.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(error) = encoder.encode(&self.registry.gather(), &mut buffer) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Installs the global tracing subscriber (text or JSON lines on stderr). `RUST_LOG` overrides the
/// configured level. Safe to call more than once: later calls are ignored.
pub fn init_tracing(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a file or a log collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match settings.format {
        LogFormat::Text => builder.fmt_fields(crate::logging::text_fields()).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The doc comment of the [`Metrics`] field `field`, as written here: tests hold it to the label
/// sets it lists.
#[cfg(test)]
pub(crate) fn field_doc(field: &str) -> String {
    let source = include_str!("telemetry.rs");
    let at = source
        .find(&format!("pub {field}: "))
        .unwrap_or_else(|| panic!("no field `{field}` in telemetry.rs"));
    let mut lines: Vec<&str> = source[..at]
        .lines()
        .rev()
        .skip(1)
        .take_while(|line| line.trim_start().starts_with("///"))
        .collect();
    lines.reverse();
    lines.join("\n")
}

/// Asserts that `field`'s doc comment names every one of `labels` (in backticks).
#[cfg(test)]
pub(crate) fn assert_doc_lists(field: &str, labels: impl IntoIterator<Item = &'static str>) {
    let doc = field_doc(field);
    for label in labels {
        let label = format!("`{label}`");
        assert!(
            doc.contains(&label),
            "{label} missing from `{field}`'s doc: {doc}"
        );
    }
}

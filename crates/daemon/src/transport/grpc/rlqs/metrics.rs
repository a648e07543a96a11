//! The quota service's metrics (`sluice_rlqs_*`), registered once on the daemon's registry.
//! Units lost to Envoys that did not report their use (a closed stream, a replaced
//! assignment) are `assigned - given_back - reported allowed` (times the cost, 1 for most
//! policies): never admitted, never returned before their lease ended; `written_off` counts
//! the part dropped when a bucket's policy changed or it was given a blanket rule.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

use crate::telemetry::Metrics;

/// What an assignment told an Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A token bucket backed by a lease.
    TokenBucket,
    /// A running token bucket renewed (the same settings, a fresh time to live).
    Renewal,
    /// `ALLOW_ALL` (no policy applies, or only shadow ones).
    AllowAll,
    /// `DENY_ALL` (a block list, or a bucket sluice cannot lease exactly).
    DenyAll,
    /// The bucket was abandoned.
    Abandon,
}

impl Kind {
    /// Every kind (each series exists from the start).
    pub const ALL: [Self; 5] = [
        Self::TokenBucket,
        Self::Renewal,
        Self::AllowAll,
        Self::DenyAll,
        Self::Abandon,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::Renewal => "renewal",
            Self::AllowAll => "allow_all",
            Self::DenyAll => "deny_all",
            Self::Abandon => "abandon",
        }
    }
}

/// Why a bucket got no lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its policies cannot be leased exactly (a sliding log, several windows or policies).
    Unsupported,
    /// Its `bucket_id` is not a valid descriptor set (nothing of it is kept).
    Invalid,
    /// Its stream keeps `envoy.rlqs.max_buckets_per_stream` buckets already.
    StreamBudget,
    /// Its connection's streams keep `envoy.rlqs.max_buckets_per_connection` already.
    ConnectionBudget,
    /// The daemon keeps `envoy.rlqs.max_buckets` already.
    DaemonBudget,
    /// The store could not answer the take (the policy's failure mode applied).
    Store,
}

impl Refusal {
    /// Every reason.
    pub const ALL: [Self; 6] = [
        Self::Unsupported,
        Self::Invalid,
        Self::StreamBudget,
        Self::ConnectionBudget,
        Self::DaemonBudget,
        Self::Store,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unsupported => "unsupported",
            Self::Invalid => "invalid",
            Self::StreamBudget => "stream_budget",
            Self::ConnectionBudget => "connection_budget",
            Self::DaemonBudget => "daemon_budget",
            Self::Store => "store",
        }
    }
}

/// The counters and gauges.
#[derive(Clone)]
pub struct RlqsMetrics {
    /// `sluice_rlqs_streams`: open streams.
    pub streams: IntGauge,
    /// `sluice_rlqs_buckets`: buckets tracked over every stream.
    pub buckets: IntGauge,
    assignments: IntCounterVec,
    refusals: IntCounterVec,
    reported: IntCounterVec,
    /// `sluice_rlqs_units_taken_total`: units taken from the store for assignments.
    pub taken: IntCounter,
    /// `sluice_rlqs_units_assigned_total`: units backing the tokens sent (a token bucket
    /// policy's lease refills by itself what it cannot hand out in time).
    pub assigned: IntCounter,
    /// `sluice_rlqs_units_given_back_total`.
    pub given_back: IntCounter,
    /// `sluice_rlqs_units_written_off_total`: what a bucket's units had left when its policy
    /// changed or it was given a blanket rule (what Envoy admits on them is no longer followed,
    /// so none of it is given back).
    pub written_off: IntCounter,
    /// `sluice_rlqs_unmatched_buckets_total`: new buckets that match no policy (`ALLOW_ALL`).
    pub unmatched: IntCounter,
}

impl RlqsMetrics {
    /// Registers the metrics on `metrics`' registry.
    pub fn new(metrics: &Metrics) -> Self {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("a valid metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("a valid metric");
        let vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid metric")
        };
        let this = Self {
            streams: gauge("sluice_rlqs_streams", "Open RLQS streams."),
            buckets: gauge(
                "sluice_rlqs_buckets",
                "Quota buckets tracked on RLQS streams.",
            ),
            assignments: vec(
                "sluice_rlqs_assignments_total",
                "Bucket actions sent to Envoys, by kind.",
                "kind",
            ),
            refusals: vec(
                "sluice_rlqs_refusals_total",
                "RLQS buckets that got no lease, by reason (invalid ids and buckets past the budget are not kept).",
                "reason",
            ),
            reported: vec(
                "sluice_rlqs_requests_reported_total",
                "Requests Envoys reported on RLQS streams, by outcome.",
                "outcome",
            ),
            taken: counter(
                "sluice_rlqs_units_taken_total",
                "Units taken from the store to back RLQS assignments.",
            ),
            assigned: counter(
                "sluice_rlqs_units_assigned_total",
                "Units backing the tokens of RLQS assignments sent.",
            ),
            given_back: counter(
                "sluice_rlqs_units_given_back_total",
                "Units of RLQS leases given back to the store unused.",
            ),
            written_off: counter(
                "sluice_rlqs_units_written_off_total",
                "Units an RLQS bucket held when its policy changed or a blanket rule replaced them, never given back.",
            ),
            unmatched: counter(
                "sluice_rlqs_unmatched_buckets_total",
                "New RLQS buckets that match no policy (allowed everything).",
            ),
        };
        for kind in Kind::ALL {
            this.assignments.with_label_values(&[kind.as_str()]);
        }
        for reason in Refusal::ALL {
            this.refusals.with_label_values(&[reason.as_str()]);
        }
        for outcome in ["allowed", "denied"] {
            this.reported.with_label_values(&[outcome]);
        }
        let collectors: [Box<dyn prometheus::core::Collector>; 10] = [
            Box::new(this.streams.clone()),
            Box::new(this.buckets.clone()),
            Box::new(this.assignments.clone()),
            Box::new(this.refusals.clone()),
            Box::new(this.reported.clone()),
            Box::new(this.taken.clone()),
            Box::new(this.assigned.clone()),
            Box::new(this.given_back.clone()),
            Box::new(this.written_off.clone()),
            Box::new(this.unmatched.clone()),
        ];
        for collector in collectors {
            if let Err(error) = metrics.registry().register(collector) {
                tracing::debug!(%error, "an RLQS metric was not registered");
            }
        }
        this
    }

    /// Counts an action sent.
    pub fn assigned(&self, kind: Kind) {
        self.assignments.with_label_values(&[kind.as_str()]).inc();
    }

    /// Counts a bucket refused a lease.
    pub fn refused(&self, reason: Refusal) {
        self.refusals.with_label_values(&[reason.as_str()]).inc();
    }

    /// Counts a report's requests.
    pub fn reported(&self, allowed: u64, denied: u64) {
        self.reported
            .with_label_values(&["allowed"])
            .inc_by(allowed);
        self.reported.with_label_values(&["denied"]).inc_by(denied);
    }
}

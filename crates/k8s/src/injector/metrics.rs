//! The injector's metrics, on a registry of its own (the injector is its own process): admissions
//! by outcome, refusals by reason, certificate reloads by result, the serving certificate's time
//! to expiry, and process metrics.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder,
};

use super::mutate::Outcome;
use crate::inject::Refusal;

/// Buckets of the admission time, in seconds: a mutation takes well under a millisecond; the API
/// server's timeout is seconds.
const DURATION_BUCKETS: [f64; 10] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// Result of a certificate reload: a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// A new certificate and key were loaded and are served.
    Loaded,
    /// The files changed but did not make a valid pair; the last good one is still served.
    Rejected,
}

impl Reload {
    const ALL: [Reload; 2] = [Self::Loaded, Self::Rejected];

    fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Rejected => "rejected",
        }
    }
}

/// Every metric of the injector.
#[derive(Clone)]
pub struct InjectorMetrics {
    registry: Registry,
    admissions: IntCounterVec,
    refusals: IntCounterVec,
    reloads: IntCounterVec,
    duration: Histogram,
    expiry: Gauge,
    /// The served certificate's `notAfter` (Unix seconds); [`i64::MIN`] until one is known.
    not_after: Arc<AtomicI64>,
}

impl InjectorMetrics {
    /// Creates and registers every metric, label values pre-registered at 0.
    pub fn new() -> Self {
        let registry = Registry::new();
        let admissions = IntCounterVec::new(
            Opts::new(
                "sluice_injector_admissions_total",
                "Pod admission reviews by outcome: injected, unchanged (already injected), \
                 skipped (opted out), refused (allowed unchanged, with a warning), bad_request.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let refusals = IntCounterVec::new(
            Opts::new(
                "sluice_injector_refusals_total",
                "Pods that asked for the sidecar but could not take it, by reason.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let reloads = IntCounterVec::new(
            Opts::new(
                "sluice_injector_certificate_reloads_total",
                "Serving certificate reloads after the files changed, by result (loaded, \
                 rejected: the last good pair stays).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_injector_admission_duration_seconds",
                "Time to answer an admission review, reading its body included.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let expiry = Gauge::new(
            "sluice_injector_certificate_expiry_seconds",
            "Seconds until the serving certificate's notAfter (negative once expired), as of the \
             scrape; the certificate is the one served, re-read when its files change.",
        )
        .expect("valid metric");
        for outcome in Outcome::ALL {
            admissions.with_label_values(&[outcome.as_str()]);
        }
        for refusal in Refusal::ALL {
            refusals.with_label_values(&[refusal.as_str()]);
        }
        for reload in Reload::ALL {
            reloads.with_label_values(&[reload.as_str()]);
        }
        for collector in [
            Box::new(admissions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(refusals.clone()),
            Box::new(reloads.clone()),
            Box::new(duration.clone()),
            Box::new(expiry.clone()),
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
        Self {
            registry,
            admissions,
            refusals,
            reloads,
            duration,
            expiry,
            not_after: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }

    /// Notes the certificate now served (its leaf, DER). One that cannot be read counts as
    /// expired: an alert on a wrong figure is better than silence.
    pub fn certificate(&self, leaf: &[u8]) {
        let not_after = super::cert_expiry::not_after_unix(leaf);
        if not_after.is_none() {
            tracing::warn!("the serving certificate's notAfter could not be read");
        }
        self.not_after
            .store(not_after.unwrap_or(0), Ordering::Relaxed);
    }

    /// Counts one admission (and its refusal reason).
    pub fn admission(&self, outcome: Outcome, refusal: Option<Refusal>, seconds: f64) {
        self.admissions.with_label_values(&[outcome.as_str()]).inc();
        if let Some(refusal) = refusal {
            self.refusals.with_label_values(&[refusal.as_str()]).inc();
        }
        self.duration.observe(seconds);
    }

    /// Counts one certificate reload.
    pub fn reload(&self, result: Reload) {
        self.reloads.with_label_values(&[result.as_str()]).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let not_after = self.not_after.load(Ordering::Relaxed);
        if not_after != i64::MIN {
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            self.expiry.set(not_after.saturating_sub(now) as f64);
        }
        let mut buffer = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for InjectorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

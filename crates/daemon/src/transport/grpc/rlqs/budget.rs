//! The RLQS bucket budget (`[envoy.rlqs]`): every bucket a stream keeps is counted against its
//! stream, its connection and the daemon, reserved before it is kept and released when it is
//! forgotten (abandoned, or its stream ends); a new bucket past any of the three is answered
//! without being kept. A bucket's id is checked before anything of it is kept: at most
//! `max_descriptors` entries of bounded names and values, at most `max_bucket_id_bytes` in all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::metrics::Refusal;
use crate::config::{RequestLimits, RlqsSettings};
use crate::limit::MAX_DESCRIPTOR_NAME;
use crate::logging::LogGate;

/// Least time between two warn lines about buckets refused for the budget.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The daemon's count of kept buckets and the bounds.
pub(super) struct Budget {
    settings: RlqsSettings,
    kept: AtomicUsize,
    warned: LogGate,
}

/// Buckets kept by the streams of one connection.
pub(in crate::transport::grpc) type ConnectionBuckets = Arc<AtomicUsize>;

impl Budget {
    pub(super) fn new(settings: RlqsSettings) -> Self {
        Self {
            settings,
            kept: AtomicUsize::new(0),
            warned: LogGate::new(WARN_EVERY),
        }
    }

    /// Whether a bucket id's size keeps within the bounds (`None`), or why not: its entries,
    /// each key and value, and all of it together. Checked on the decoded id, before any copy.
    pub(super) fn oversized<'a>(
        &self,
        limits: &RequestLimits,
        entries: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
    ) -> Option<String> {
        if entries.len() >= limits.max_descriptors {
            return Some(format!(
                "{} entries (at most {} with the domain)",
                entries.len(),
                limits.max_descriptors
            ));
        }
        let mut total = 0usize;
        for (key, value) in entries {
            if key.len() > MAX_DESCRIPTOR_NAME || value.len() > limits.max_value_bytes {
                return Some(format!(
                    "an entry of {} + {} bytes (keys at most {MAX_DESCRIPTOR_NAME}, values {})",
                    key.len(),
                    value.len(),
                    limits.max_value_bytes
                ));
            }
            total += key.len() + value.len();
        }
        (total > self.settings.max_bucket_id_bytes).then(|| {
            format!(
                "{total} bytes (envoy.rlqs.max_bucket_id_bytes {})",
                self.settings.max_bucket_id_bytes
            )
        })
    }

    /// Reserves one bucket for a stream that keeps `on_stream` and a connection that keeps
    /// `connection`; the refusal that applies when any budget is spent.
    pub(super) fn reserve(
        &self,
        on_stream: usize,
        connection: &AtomicUsize,
    ) -> Result<(), Refusal> {
        if on_stream >= self.settings.max_buckets_per_stream {
            return Err(self.refuse(Refusal::StreamBudget));
        }
        let below = |max: usize| move |kept: usize| (kept < max).then_some(kept + 1);
        let per_connection = self.settings.max_buckets_per_connection;
        if connection
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, below(per_connection))
            .is_err()
        {
            return Err(self.refuse(Refusal::ConnectionBudget));
        }
        let max = self.settings.max_buckets;
        if self
            .kept
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, below(max))
            .is_err()
        {
            connection.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refuse(Refusal::DaemonBudget));
        }
        Ok(())
    }

    /// Releases `buckets` buckets of a connection's streams.
    pub(super) fn release(&self, buckets: usize, connection: &AtomicUsize) {
        if buckets > 0 {
            connection.fetch_sub(buckets, Ordering::AcqRel);
            self.kept.fetch_sub(buckets, Ordering::AcqRel);
        }
    }

    /// `reason`, said in a warn line at most once a minute.
    fn refuse(&self, reason: Refusal) -> Refusal {
        if let Some(held_back) = self.warned.pass() {
            tracing::warn!(
                reason = reason.as_str(),
                held_back,
                max_buckets_per_stream = self.settings.max_buckets_per_stream,
                max_buckets_per_connection = self.settings.max_buckets_per_connection,
                max_buckets = self.settings.max_buckets,
                "RLQS buckets past the budget are answered without being kept \
                 (envoy.rlqs; sluice_rlqs_refusals_total counts each; said once a minute)"
            );
        }
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(stream: usize, connection: usize, daemon: usize) -> Budget {
        Budget::new(RlqsSettings {
            max_buckets_per_stream: stream,
            max_buckets_per_connection: connection,
            max_buckets: daemon,
            max_bucket_id_bytes: 64,
        })
    }

    #[test]
    fn each_budget_refuses_past_its_bound_and_releases() {
        let budget = budget(2, 3, 4);
        let (a, b) = (AtomicUsize::new(0), AtomicUsize::new(0));
        assert_eq!(budget.reserve(0, &a), Ok(()));
        assert_eq!(budget.reserve(1, &a), Ok(()));
        assert_eq!(budget.reserve(2, &a), Err(Refusal::StreamBudget));
        assert_eq!(budget.reserve(0, &a), Ok(()), "a second stream");
        assert_eq!(budget.reserve(1, &a), Err(Refusal::ConnectionBudget));
        assert_eq!(budget.reserve(0, &b), Ok(()), "a second connection");
        assert_eq!(budget.reserve(0, &b), Err(Refusal::DaemonBudget));
        assert_eq!(
            b.load(Ordering::Relaxed),
            1,
            "the refused one is not counted"
        );
        budget.release(3, &a);
        assert_eq!(a.load(Ordering::Relaxed), 0);
        assert_eq!(budget.reserve(1, &b), Ok(()), "room again");
    }

    #[test]
    fn an_id_is_sized_before_it_is_kept() {
        let budget = budget(1, 1, 1);
        let limits = RequestLimits::default();
        let id = |pairs: &[(&str, usize)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, n)| ((*k).to_owned(), "x".repeat(*n)))
                .collect()
        };
        let sized = |entries: &[(String, String)]| {
            budget.oversized(&limits, entries.iter().map(|(k, v)| (k, v)))
        };
        assert_eq!(sized(&id(&[("a", 10), ("b", 50)])), None);
        assert!(sized(&id(&[("a", 60_000)])).is_some_and(|r| r.contains("values 256")));
        assert!(sized(&id(&[("a", 40), ("b", 40)])).is_some_and(|r| r.contains("82 bytes")));
        let many: Vec<(String, String)> =
            (0..32).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert!(sized(&many).is_some_and(|r| r.contains("32 entries")));
    }
}

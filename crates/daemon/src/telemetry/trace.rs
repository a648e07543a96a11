//! OpenTelemetry traces: the [`Tracing`] handle the transports and the Redis batcher are given.
//! Off (the default), it is an empty `Option`: no header is read, no span made, nothing
//! allocated. On, each check gets a span (child of the caller's W3C `traceparent` when it sends
//! one) and each Redis batch call a span of its own, exported over OTLP in batches (see
//! [`super::otlp`] for the bounds).
//!
//! A batch call serves many checks, possibly of many traces. Its span is the child of the first
//! sampled check in it (so a lone check, the usual case at low load, shows its Redis call nested
//! under it) and carries a link to every other sampled check (up to the SDK's 128 links), so a
//! trace viewer can go from any check to the call that decided it and from the call to all of
//! its checks. Calls with no sampled check make no span.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    FutureExt, Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, WithContext,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

use crate::config::TracingSettings;

/// The tracer, or nothing when tracing is off. Cheap to clone (one `Arc`).
#[derive(Clone, Default)]
pub struct Tracing(Option<Arc<Inner>>);

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Tracing(on)"
        } else {
            "Tracing(off)"
        })
    }
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: Tracer,
    propagator: TraceContextPropagator,
    /// Bound on shutdown's flush.
    flush: std::time::Duration,
}

/// Where a check arrived: the `sluice.transport` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanTransport {
    /// HTTP on TCP.
    Tcp,
    /// HTTP on the Unix socket.
    Uds,
    /// Envoy's rate limit service.
    Grpc,
}

impl SpanTransport {
    fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Uds => "uds",
            Self::Grpc => "grpc",
        }
    }
}

/// Anything that holds a request's headers or gRPC metadata.
pub trait Carrier {
    /// The first value of `name` (lowercase), as text.
    fn value(&self, name: &str) -> Option<&str>;
}

impl Carrier for hyper::HeaderMap {
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Carrier for tonic::metadata::MetadataMap {
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `traceparent` and `tracestate` only: the propagator asks for nothing else.
struct Headers<'a, C: Carrier>(&'a C);

impl<C: Carrier> Extractor for Headers<'_, C> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.value(key)
    }

    fn keys(&self) -> Vec<&str> {
        Vec::new()
    }
}

impl Tracing {
    /// Tracing off.
    pub fn off() -> Self {
        Self(None)
    }

    /// Builds the exporter and tracer `settings` ask for (off when they name no endpoint).
    /// Needs a Tokio runtime: exports run on it. The error names the `tracing.*` key.
    pub fn start(settings: &TracingSettings) -> Result<Self, String> {
        let Some(endpoint) = settings.enabled() else {
            return Ok(Self::off());
        };
        let provider = super::otlp::provider(settings, endpoint)?;
        use opentelemetry::trace::TracerProvider as _;
        let tracer = provider.tracer("sluice");
        tracing::info!(
            endpoint = %endpoint.url,
            protocol = settings.protocol.as_str(),
            sampling_ratio = settings.sampling_ratio,
            "exporting traces over OTLP"
        );
        Ok(Self(Some(Arc::new(Inner {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            flush: settings.export_timeout.as_std(),
        }))))
    }

    /// Whether spans are made.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// A span for one check (`name` is a fixed span name such as `"sluice.check"`), child of the
    /// caller's `traceparent` in `carrier` if it sent a valid one; `None` when tracing is off
    /// (and then `carrier` is not read).
    pub fn check_span<C: Carrier>(
        &self,
        name: &'static str,
        transport: SpanTransport,
        carrier: &C,
    ) -> Option<CheckSpan> {
        let inner = self.0.as_ref()?;
        let parent = inner.propagator.extract(&Headers(carrier));
        Some(inner.child(name, transport, &parent))
    }

    /// The sampled check span the current task runs in (set by [`CheckSpan::scope`]), for a
    /// store call to relate to; `None` when tracing is off (and then nothing is read).
    pub fn current(&self) -> Option<SpanContext> {
        self.0.as_ref()?;
        Context::map_current(|cx| {
            let span = cx.span();
            let context = span.span_context();
            context.is_sampled().then(|| context.clone())
        })
    }

    /// A span for one Redis call of `size` checks, starting now: the child of the first of
    /// `checks` (the sampled ones in the call), linked to the others. `None` when tracing is off
    /// (then `checks` is not iterated and the clock not read) or no check of the call is sampled.
    pub fn store_span<'a>(
        &self,
        mut checks: impl Iterator<Item = &'a SpanContext>,
        size: usize,
    ) -> Option<StoreSpan> {
        let inner = self.0.as_ref()?;
        let first = checks.next()?;
        let started = SystemTime::now();
        let links: Vec<Link> = checks
            // Items of one batch request share its span: that one is the parent already.
            .filter(|other| other.span_id() != first.span_id())
            .take(MAX_LINKS)
            .map(|other| Link::with_context(other.clone()))
            .collect();
        let parent = Context::new().with_remote_span_context(first.clone());
        let span = inner
            .tracer
            .span_builder("redis.batch")
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_links(links)
            .with_attributes([
                KeyValue::new("db.system.name", "redis"),
                KeyValue::new("db.operation.name", "EVALSHA"),
                KeyValue::new("sluice.batch.size", size as i64),
            ])
            .start_with_context(&inner.tracer, &parent);
        Some(StoreSpan(parent.with_span(span)))
    }

    /// Exports what is queued and stops, within `tracing.export_timeout` (a dead collector
    /// costs at most that at shutdown).
    pub async fn shutdown(&self) {
        let Some(inner) = self.0.clone() else {
            return;
        };
        let bound = inner.flush;
        // The SDK blocks its caller until the exporter task answers: off the worker threads.
        let flush =
            tokio::task::spawn_blocking(move || inner.provider.shutdown_with_timeout(bound));
        match tokio::time::timeout(bound, flush).await {
            Ok(Ok(Ok(()))) => tracing::debug!("traces flushed"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "flushing traces failed"),
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(
                    ?bound,
                    "flushing traces did not finish within tracing.export_timeout"
                )
            }
        }
    }
}

/// Links a batch span carries besides its parent (the SDK keeps at most 128 per span).
const MAX_LINKS: usize = 127;

impl Inner {
    fn child(&self, name: &'static str, transport: SpanTransport, parent: &Context) -> CheckSpan {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("sluice.transport", transport.as_str())])
            .start_with_context(&self.tracer, parent);
        CheckSpan {
            cx: parent.with_span(span),
            transport,
            items: Tracing(None),
        }
    }
}

/// One check's span; ends when dropped.
pub struct CheckSpan {
    cx: Context,
    transport: SpanTransport,
    /// Set on a batch request's span, for its items' spans.
    items: Tracing,
}

impl CheckSpan {
    /// Runs `future` with this span as the current context, so the store call it makes (the
    /// Redis batcher) relates to it.
    pub fn scope<F: Future>(&self, future: F) -> WithContext<F> {
        future.with_context(self.cx.clone())
    }

    /// Records the answer: the deciding policy (a name from the policy file, `""` when none
    /// applied), the outcome and the mode. Never a descriptor value, key, address or path.
    pub fn answer(&self, policy: &str, outcome: &'static str, mode: Option<&'static str>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("sluice.policy", policy.to_owned()));
        span.set_attribute(KeyValue::new("sluice.outcome", outcome));
        if let Some(mode) = mode {
            span.set_attribute(KeyValue::new("sluice.mode", mode));
        }
        if outcome == "unavailable" {
            span.set_status(Status::error("limiter_unavailable"));
        }
    }

    /// Records a request refused before any check (a 4xx); `error` is a fixed reason code.
    pub fn refused(&self, error: &'static str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("sluice.outcome", "invalid"));
        span.set_attribute(KeyValue::new("sluice.error", error));
    }

    /// A numeric attribute with a fixed name (a batch's item count).
    pub fn count(&self, name: &'static str, value: usize) {
        self.cx.span().set_attribute(KeyValue::new(
            name,
            i64::try_from(value).unwrap_or(i64::MAX),
        ));
    }

    /// Keeps `tracing` for [`CheckSpan::item`].
    pub fn with_items(mut self, tracing: &Tracing) -> Self {
        self.items = tracing.clone();
        self
    }

    /// A child span for item `index` of a batch request (after the fact: the items run
    /// together inside this span); `None` unless made [`CheckSpan::with_items`].
    pub fn item(&self, index: usize) -> Option<CheckSpan> {
        let inner = self.items.0.as_ref()?;
        let item = inner.child("sluice.check", self.transport, &self.cx);
        item.count("sluice.batch.index", index);
        Some(item)
    }
}

impl Drop for CheckSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// One Redis call's span; [`StoreSpan::end`] records how it went.
pub struct StoreSpan(Context);

impl StoreSpan {
    /// Ends the span: `error` is the failure's kind label when the call failed.
    pub fn end(self, error: Option<&'static str>) {
        let span = self.0.span();
        if let Some(kind) = error {
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(kind));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers that fail the test when read.
    struct Untouchable;

    impl Carrier for Untouchable {
        fn value(&self, name: &str) -> Option<&str> {
            panic!("tracing off read header {name}");
        }
    }

    #[test]
    fn off_reads_nothing_and_makes_nothing() {
        let off = Tracing::off();
        assert!(!off.is_on());
        assert!(off
            .check_span("sluice.check", SpanTransport::Tcp, &Untouchable)
            .is_none());
        assert!(off.current().is_none());
        let context = SpanContext::empty_context();
        let none = off.store_span(std::iter::once(&context), 1);
        assert!(none.is_none());
        let settings = TracingSettings::default();
        assert!(!Tracing::start(&settings).expect("off starts").is_on());
    }
}

//! The OTLP exporter behind [`super::Tracing`]: gRPC (tonic) or HTTP/protobuf (hyper), under the
//! SDK's batch processor on the Tokio runtime. Bounded everywhere: a finished span goes onto a
//! queue of `tracing.queue_size` with `try_send` (full: the span is dropped, the check never
//! waits), exports run one at a time, each within `tracing.export_timeout`. A dead or slow
//! collector therefore costs at most the queue's memory and one export task, never a check's
//! time.

use std::time::Duration;

use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::{OtlpEndpoint, OtlpProtocol, TracingSettings};

/// Most spans in one export request.
const MAX_EXPORT_BATCH: usize = 512;
/// How long finished spans wait to be exported with others.
const EXPORT_DELAY: Duration = Duration::from_secs(1);

/// The tracer provider `settings` describe, exporting to `endpoint`.
pub(super) fn provider(
    settings: &TracingSettings,
    endpoint: &OtlpEndpoint,
) -> Result<SdkTracerProvider, String> {
    let timeout = settings.export_timeout.as_std();
    let exporter = match settings.protocol {
        OtlpProtocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.url.clone())
            .with_timeout(timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => {
            // As `OTEL_EXPORTER_OTLP_ENDPOINT`: a base URL gets the traces path.
            let url = if endpoint.has_path {
                endpoint.url.clone()
            } else {
                format!("{}/v1/traces", endpoint.url.trim_end_matches('/'))
            };
            SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(timeout)
                .build()
        }
    }
    .map_err(|error| format!("tracing.endpoint: cannot build the OTLP exporter: {error}"))?;
    let queue = settings.queue_size;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(queue)
        .with_max_export_batch_size(MAX_EXPORT_BATCH.min(queue))
        .with_scheduled_delay(EXPORT_DELAY)
        .with_max_export_timeout(timeout)
        .with_max_concurrent_exports(1)
        .build();
    let processor = BatchSpanProcessor::builder(exporter, Tokio)
        .with_batch_config(batch)
        .build();
    // A caller's sampled flag decides for its trace; the ratio for traces started here.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
        settings.sampling_ratio,
    )));
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build())
}

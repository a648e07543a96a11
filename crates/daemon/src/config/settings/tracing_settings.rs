//! `[tracing]`: OpenTelemetry trace export over OTLP, off unless `tracing.endpoint` is set. The
//! endpoint is parsed into an [`OtlpEndpoint`] as the file is read, the protocol into an enum;
//! [`TracingSettings::validate`] checks the numbers. Every error names its `tracing.*` key.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{HumanDuration, SettingsError};

/// Most spans waiting for export; past it spans are dropped (never waited for).
pub const MAX_QUEUE_SIZE: usize = 65_536;
/// Longest `tracing.export_timeout` accepted.
const MAX_EXPORT_TIMEOUT_US: u64 = 60_000_000;
/// Longest `tracing.service_name` accepted.
const MAX_SERVICE_NAME: usize = 255;

/// Trace export settings; tracing is off (nothing parsed, nothing allocated per check) while
/// `endpoint` is unset.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSettings {
    /// The OTLP collector, `http://host:port`: for `grpc` the server (`:4317` by convention),
    /// for `http-protobuf` the base URL (`:4318`; `/v1/traces` is added when no path is given).
    /// Unset (or empty): tracing is off.
    pub endpoint: Option<OtlpEndpoint>,
    /// `grpc` or `http-protobuf` (also spelt `http/protobuf`, as in `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: OtlpProtocol,
    /// Share of traces started here that are recorded, 0.0 to 1.0. A caller's `traceparent`
    /// decides for its own trace (parent-based sampling).
    pub sampling_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Most finished spans waiting for export; past it new spans are dropped.
    pub queue_size: usize,
    /// Longest one export may take (and shutdown's flush).
    pub export_timeout: HumanDuration,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::Grpc,
            sampling_ratio: 1.0,
            service_name: "sluice".into(),
            queue_size: 2048,
            export_timeout: HumanDuration(2_000_000),
        }
    }
}

impl TracingSettings {
    /// The endpoint when tracing is on.
    pub fn enabled(&self) -> Option<&OtlpEndpoint> {
        self.endpoint.as_ref().filter(|e| !e.url.is_empty())
    }

    /// Checks the numbers (the endpoint and protocol were checked as they were read).
    pub fn validate(&self) -> Result<(), SettingsError> {
        let error = |text: String| Err(SettingsError(text));
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return error(format!(
                "tracing.sampling_ratio: {} is not between 0.0 and 1.0",
                self.sampling_ratio
            ));
        }
        let name = &self.service_name;
        if name.trim().is_empty()
            || name.len() > MAX_SERVICE_NAME
            || name.chars().any(char::is_control)
        {
            return error(format!(
                "tracing.service_name: {name:?} must be 1 to {MAX_SERVICE_NAME} printable characters"
            ));
        }
        if self.queue_size == 0 || self.queue_size > MAX_QUEUE_SIZE {
            return error(format!(
                "tracing.queue_size: {} is not between 1 and {MAX_QUEUE_SIZE}",
                self.queue_size
            ));
        }
        if self.export_timeout.0 == 0 || self.export_timeout.0 > MAX_EXPORT_TIMEOUT_US {
            return error(format!(
                "tracing.export_timeout: {} is not between 1us and 60s",
                self.export_timeout
            ));
        }
        Ok(())
    }
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`POST /v1/traces`).
    #[serde(rename = "http-protobuf", alias = "http/protobuf")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// The name used in settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http-protobuf",
        }
    }
}

/// A collector URL, checked when read: `http://host[:port][/path]`. `https` is refused (the
/// exporter is built without TLS: send to a collector or agent in the pod or on the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// The URL as written (trimmed); empty means off.
    pub url: String,
    /// Whether the URL has a path beyond `/`.
    pub has_path: bool,
}

impl OtlpEndpoint {
    /// Reads `text`; the error names `tracing.endpoint`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let url = text.trim();
        if url.is_empty() {
            return Ok(Self {
                url: String::new(),
                has_path: false,
            });
        }
        let bad = |why: &str| format!("tracing.endpoint: {url:?} {why}");
        let uri: hyper::Uri = url
            .parse()
            .map_err(|_| bad("is not a URL such as \"http://127.0.0.1:4317\""))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "uses https, which this build does not support: send to a collector or agent \
                     in the pod or on the node over http",
                ))
            }
            _ => {
                return Err(bad(
                    "needs the scheme http://, as in \"http://127.0.0.1:4317\"",
                ))
            }
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("names no host"));
        }
        if uri.query().is_some() {
            return Err(bad("must not have a query string"));
        }
        Ok(Self {
            url: url.to_owned(),
            has_path: uri.path().len() > 1,
        })
    }
}

impl<'de> Deserialize<'de> for OtlpEndpoint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for OtlpEndpoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_with_a_host() {
        let ok = OtlpEndpoint::parse("http://127.0.0.1:4317").expect("valid");
        assert!(!ok.has_path);
        assert!(
            OtlpEndpoint::parse("http://collector:4318/v1/traces")
                .expect("valid")
                .has_path
        );
        assert!(OtlpEndpoint::parse("").expect("off").url.is_empty());
        for (bad, says) in [
            ("127.0.0.1:4317", "scheme"),
            ("https://collector:4317", "https"),
            ("ftp://x", "scheme"),
            ("http://", "URL"),
            ("http://x:4318/v1/traces?a=b", "query"),
        ] {
            let error = OtlpEndpoint::parse(bad).expect_err(bad);
            assert!(error.starts_with("tracing.endpoint:"), "{error}");
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn numbers_out_of_range_name_their_key() {
        type Change = fn(&mut TracingSettings);
        let cases: [(&str, Change); 5] = [
            ("tracing.sampling_ratio", |s| s.sampling_ratio = 1.5),
            ("tracing.sampling_ratio", |s| s.sampling_ratio = f64::NAN),
            ("tracing.service_name", |s| s.service_name = " ".into()),
            ("tracing.queue_size", |s| s.queue_size = 0),
            ("tracing.export_timeout", |s| {
                s.export_timeout = HumanDuration(0)
            }),
        ];
        for (key, change) in cases {
            let mut settings = TracingSettings::default();
            change(&mut settings);
            let error = settings.validate().expect_err(key).0;
            assert!(error.starts_with(key), "{error}");
        }
        TracingSettings::default()
            .validate()
            .expect("defaults are valid");
    }
}

//! Per-pod settings: the `sluice.io/*` labels and annotations of a pod (or pod template) that opt
//! it in or out and override the sidecar's defaults where that is safe. `sluice inject` and the
//! injector webhook read them the same way, so a pod gets the same sidecar from either.
//!
//! Every value is validated: a value the API server would refuse in the pod (a malformed
//! quantity, a memory request over its limit, a bad ConfigMap name) is refused here, since the
//! webhook must never turn a valid pod into one that fails admission.

use serde_yaml::Value;

use super::quantity::Quantity;
use super::sidecar::{self, Options, Resources};

/// Opt-in or opt-out (label or annotation): `enabled` or `disabled`.
pub const INJECT: &str = "sluice.io/inject";
/// `local.replicas` of this pod's sidecar: how many pods share each limit.
pub const REPLICAS: &str = "sluice.io/replicas";
/// The ConfigMap holding `policies.yaml` for this pod.
pub const POLICIES_CONFIGMAP: &str = "sluice.io/policies-configmap";
/// `enabled`: the sidecar also serves Envoy's gRPC rate limit service (`--grpc`); `disabled`:
/// it does not, whatever the option says.
pub const GRPC: &str = "sluice.io/grpc";
/// The sidecar's CPU request.
pub const CPU_REQUEST: &str = "sluice.io/cpu-request";
/// The sidecar's memory request.
pub const MEMORY_REQUEST: &str = "sluice.io/memory-request";
/// The sidecar's memory limit.
pub const MEMORY_LIMIT: &str = "sluice.io/memory-limit";

/// Every annotation read here; any other `sluice.io/*` annotation is warned about.
pub const ANNOTATIONS: [&str; 7] = [
    INJECT,
    GRPC,
    REPLICAS,
    POLICIES_CONFIGMAP,
    CPU_REQUEST,
    MEMORY_REQUEST,
    MEMORY_LIMIT,
];
/// The labels sluice knows: the opt-in (what the webhook's `objectSelector` sees) and the mark
/// of an injected pod.
const LABELS: [&str; 2] = [INJECT, sidecar::LABEL];
const PREFIX: &str = "sluice.io/";

/// Largest `sluice.io/replicas`.
pub const MAX_REPLICAS: u64 = 100_000;
/// Bounds on the sidecar's resources: a memory quantity without a suffix is bytes, so "128"
/// (meant as MiB) is refused rather than starving the sidecar.
const CPU_RANGE: (&str, &str) = ("1m", "64");
const MEMORY_RANGE: (&str, &str) = ("16Mi", "64Gi");
/// Unknown keys named in one warning; the rest are counted.
const MAX_NAMED_UNKNOWN: usize = 5;

/// What a pod says about injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opt {
    /// `sluice.io/inject: enabled`.
    Enabled,
    /// `sluice.io/inject: disabled`: never injected, whatever its namespace says.
    Disabled,
}

/// The settings found on one pod.
#[derive(Debug, Default)]
pub struct PodSettings {
    /// The pod's own opt-in or opt-out; `None`: it says nothing (its namespace decides).
    pub opt: Option<Opt>,
    /// `sluice.io/replicas`.
    pub replicas: Option<u64>,
    grpc: Option<bool>,
    policies_configmap: Option<String>,
    cpu_request: Option<Quantity>,
    memory_request: Option<Quantity>,
    memory_limit: Option<Quantity>,
    /// Unknown `sluice.io/*` keys, as one warning.
    pub warning: Option<String>,
}

/// Reads the settings from a pod's `metadata`; an invalid value is an error naming the key.
pub fn read(metadata: &Value) -> Result<PodSettings, String> {
    let annotations = strings(&metadata["annotations"], "annotations")?;
    let labels = strings(&metadata["labels"], "labels")?;
    let annotation = |key: &str| annotations.iter().find(|(k, _)| *k == key).map(|kv| kv.1);
    let label = labels.iter().find(|(k, _)| *k == INJECT).map(|kv| kv.1);
    let mut settings = PodSettings {
        opt: opt(label, annotation(INJECT))?,
        ..PodSettings::default()
    };
    if let Some(text) = annotation(REPLICAS) {
        settings.replicas = Some(
            text.parse::<u64>()
                .ok()
                .filter(|n| (1..=MAX_REPLICAS).contains(n))
                .ok_or_else(|| {
                    format!("{REPLICAS} is {text:?}, not a whole number from 1 to {MAX_REPLICAS}")
                })?,
        );
    }
    settings.grpc = match annotation(GRPC) {
        None => None,
        Some("enabled") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => {
            return Err(format!(
                "{GRPC} is {other:?}, neither \"enabled\" nor \"disabled\""
            ))
        }
    };
    if let Some(name) = annotation(POLICIES_CONFIGMAP) {
        if !is_dns_subdomain(name) {
            return Err(format!(
                "{POLICIES_CONFIGMAP} is {name:?}, not a ConfigMap name (lowercase letters, \
                 digits, '-' and '.', at most 253)"
            ));
        }
        settings.policies_configmap = Some(name.to_owned());
    }
    let quantity = |key: &str, (min, max): (&str, &str)| -> Result<Option<Quantity>, String> {
        let Some(text) = annotation(key) else {
            return Ok(None);
        };
        let quantity = Quantity::parse(text).map_err(|e| format!("{key}: {e}"))?;
        if !quantity.within(min, max) {
            return Err(format!("{key} is {text:?}, outside {min} to {max}"));
        }
        Ok(Some(quantity))
    };
    settings.cpu_request = quantity(CPU_REQUEST, CPU_RANGE)?;
    settings.memory_request = quantity(MEMORY_REQUEST, MEMORY_RANGE)?;
    settings.memory_limit = quantity(MEMORY_LIMIT, MEMORY_RANGE)?;
    let unknown: Vec<&str> = annotations
        .iter()
        .map(|(k, _)| *k)
        .filter(|k| k.starts_with(PREFIX) && !ANNOTATIONS.contains(k))
        .chain(
            labels
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| k.starts_with(PREFIX) && !LABELS.contains(k)),
        )
        .collect();
    if !unknown.is_empty() {
        let mut named = unknown[..unknown.len().min(MAX_NAMED_UNKNOWN)].join(", ");
        if unknown.len() > MAX_NAMED_UNKNOWN {
            named.push_str(&format!(" and {} more", unknown.len() - MAX_NAMED_UNKNOWN));
        }
        settings.warning = Some(format!(
            "unknown sluice.io keys ignored: {named} (known annotations: {})",
            ANNOTATIONS.join(", ")
        ));
    }
    Ok(settings)
}

impl PodSettings {
    /// `defaults` with this pod's overrides; refused when the resulting memory request exceeds
    /// the memory limit (the API server would refuse the pod).
    pub fn apply(&self, defaults: &Options) -> Result<Options, String> {
        let mut options = defaults.clone();
        options.grpc = self.grpc.unwrap_or(options.grpc);
        if let Some(name) = &self.policies_configmap {
            options.policies_configmap = name.clone();
        }
        let resources: &mut Resources = &mut options.resources;
        if let Some(q) = &self.cpu_request {
            resources.cpu_request = q.clone();
        }
        if let Some(q) = &self.memory_request {
            resources.memory_request = q.clone();
        }
        if let Some(q) = &self.memory_limit {
            resources.memory_limit = q.clone();
        }
        if !resources.memory_request.at_most(&resources.memory_limit) {
            return Err(format!(
                "the sidecar's memory request {} would exceed its limit {} (set {MEMORY_LIMIT} \
                 too)",
                resources.memory_request.as_str(),
                resources.memory_limit.as_str()
            ));
        }
        Ok(options)
    }
}

/// The opt-in from the label and the annotation: `disabled` in either wins (opting out is
/// always safe), then `enabled` in either.
fn opt(label: Option<&str>, annotation: Option<&str>) -> Result<Option<Opt>, String> {
    let parse = |value: Option<&str>| match value {
        None => Ok(None),
        Some("enabled") => Ok(Some(Opt::Enabled)),
        Some("disabled") => Ok(Some(Opt::Disabled)),
        Some(other) => Err(format!(
            "{INJECT} is {other:?}, neither \"enabled\" nor \"disabled\""
        )),
    };
    let (label, annotation) = (parse(label)?, parse(annotation)?);
    Ok(
        if label == Some(Opt::Disabled) || annotation == Some(Opt::Disabled) {
            Some(Opt::Disabled)
        } else {
            label.or(annotation)
        },
    )
}

/// The string pairs of a labels or annotations mapping (absent: none).
fn strings<'a>(map: &'a Value, what: &str) -> Result<Vec<(&'a str, &'a str)>, String> {
    let Some(map) = map.as_mapping() else {
        return if map.is_null() {
            Ok(Vec::new())
        } else {
            Err(format!("metadata.{what} is not a mapping"))
        };
    };
    map.iter()
        .filter(|(k, _)| k.as_str().is_some_and(|k| k.starts_with(PREFIX)))
        .map(|(k, v)| match (k.as_str(), v.as_str()) {
            (Some(k), Some(v)) => Ok((k, v)),
            (k, _) => Err(format!(
                "metadata.{what}[{:?}] is not a string (quote it)",
                k.unwrap_or_default()
            )),
        })
        .collect()
}

/// A Kubernetes object name (RFC 1123 subdomain).
fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
        && bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(yaml: &str) -> Value {
        serde_yaml::from_str(yaml).expect("yaml")
    }

    #[test]
    fn opt_out_wins_and_bad_values_are_named() {
        let read_opt = |yaml: &str| read(&metadata(yaml)).map(|s| s.opt);
        assert_eq!(read_opt("{}"), Ok(None));
        assert_eq!(
            read_opt("labels: {sluice.io/inject: enabled}"),
            Ok(Some(Opt::Enabled))
        );
        assert_eq!(
            read_opt(
                "labels: {sluice.io/inject: enabled}\n\
                 annotations: {sluice.io/inject: disabled}"
            ),
            Ok(Some(Opt::Disabled))
        );
        let error = read_opt("annotations: {sluice.io/inject: \"true\"}").expect_err("refused");
        assert!(error.contains("neither"), "{error}");
    }

    #[test]
    fn overrides_apply_and_invalid_ones_are_refused() {
        let settings = read(&metadata(
            "annotations:\n  sluice.io/replicas: \"4\"\n  sluice.io/policies-configmap: team-a\n  \
             sluice.io/cpu-request: 100m\n  sluice.io/memory-request: 64Mi\n  \
             sluice.io/memory-limit: 256Mi\n  other.io/x: y",
        ))
        .expect("valid");
        assert_eq!(settings.replicas, Some(4));
        assert!(settings.warning.is_none());
        let options = settings.apply(&Options::default()).expect("applies");
        assert_eq!(options.policies_configmap, "team-a");
        assert_eq!(options.resources.cpu_request.as_str(), "100m");
        assert_eq!(options.resources.memory_limit.as_str(), "256Mi");
        assert!(!options.grpc);
        let grpc = |value: &str, default: bool| {
            let annotations = format!("annotations: {{sluice.io/grpc: {value}}}");
            let defaults = Options {
                grpc: default,
                ..Options::default()
            };
            read(&metadata(&annotations))
                .expect("valid")
                .apply(&defaults)
                .expect("applies")
                .grpc
        };
        assert!(grpc("enabled", false));
        assert!(!grpc("disabled", true));
        for bad in [
            "sluice.io/replicas: \"0\"",
            "sluice.io/replicas: \"many\"",
            "sluice.io/replicas: \"100001\"",
            "sluice.io/policies-configmap: Team_A",
            "sluice.io/cpu-request: 1e3",
            "sluice.io/cpu-request: 100",
            "sluice.io/memory-request: \"128\"",
            "sluice.io/grpc: \"true\"",
        ] {
            assert!(
                read(&metadata(&format!("annotations: {{{bad}}}"))).is_err(),
                "{bad} accepted"
            );
        }
        let over = read(&metadata("annotations: {sluice.io/memory-request: 1Gi}"))
            .expect("a valid quantity")
            .apply(&Options::default())
            .expect_err("over the default limit");
        assert!(over.contains("exceed"), "{over}");
    }

    #[test]
    fn unknown_keys_are_warned_about() {
        let settings = read(&metadata(
            "labels: {sluice.io/injected: \"true\", sluice.io/team: a}\n\
             annotations: {sluice.io/replica: \"3\"}",
        ))
        .expect("valid");
        let warning = settings.warning.expect("a warning");
        assert!(
            warning.contains("sluice.io/replica,") && warning.contains("sluice.io/team"),
            "{warning}"
        );
        assert!(!warning.contains("sluice.io/injected,"), "{warning}");
    }
}

//! One pod, or one workload's pod template: its `sluice.io/*` settings read, then the sidecar
//! added (or not). The single unit behind both `sluice inject` (once per pod template in the
//! YAML) and the injector webhook (once per pod it is sent), so that the two cannot differ.

use serde_yaml::{Mapping, Value};

use super::pod;
use super::pod_settings::{self, Opt};
use super::sidecar::Options;

/// Why a pod cannot take the sidecar: a bounded set (a metric label in the webhook).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `hostNetwork: true`: every pod's sidecar would bind the node's ports.
    HostNetwork,
    /// Something named like sluice's is already there with other settings, or the pod's shape
    /// cannot take it (no containers, a non-list field).
    Conflict,
    /// A `sluice.io/*` label or annotation with an invalid value.
    InvalidSetting,
}

impl Refusal {
    /// Every refusal, for pre-registered metric labels.
    pub const ALL: [Refusal; 3] = [Self::HostNetwork, Self::Conflict, Self::InvalidSetting];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostNetwork => "host_network",
            Self::Conflict => "conflict",
            Self::InvalidSetting => "invalid_setting",
        }
    }
}

/// A refused pod: which kind of refusal and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The kind.
    pub refusal: Refusal,
    /// For people.
    pub reason: String,
}

/// What happened to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// The sidecar was added (or something of it completed).
    Injected,
    /// It was already there, the same.
    Unchanged,
    /// `sluice.io/inject: disabled`: left alone.
    OptedOut,
}

/// The result for one pod that was not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What happened.
    pub injection: Injection,
    /// `local.replicas` came from no setting at all (no annotation, option or workload count).
    pub replicas_defaulted: bool,
    /// Things the pod's owner should know (unknown `sluice.io/*` keys).
    pub warnings: Vec<String>,
}

/// Injects into `template` (a Pod, or a workload's `template`: `metadata` and `spec`).
/// `local.replicas` is the pod's `sluice.io/replicas`, else `options.replicas`, else
/// `workload_replicas` (a Deployment's `spec.replicas`), else 1. Nothing is changed when refused.
pub fn inject_template(
    template: &mut Mapping,
    options: &Options,
    workload_replicas: Option<u64>,
) -> Result<Outcome, Refused> {
    let refused = |refusal: Refusal| move |reason: String| Refused { refusal, reason };
    let metadata = template.get("metadata").unwrap_or(&Value::Null);
    let settings = pod_settings::read(metadata).map_err(refused(Refusal::InvalidSetting))?;
    let warnings: Vec<String> = settings.warning.iter().cloned().collect();
    if settings.opt == Some(Opt::Disabled) {
        return Ok(Outcome {
            injection: Injection::OptedOut,
            replicas_defaulted: false,
            warnings,
        });
    }
    let options = settings
        .apply(options)
        .map_err(refused(Refusal::InvalidSetting))?;
    let chosen = settings.replicas.or(options.replicas).or(workload_replicas);
    let replicas = chosen.unwrap_or(1).max(1);
    let spec = template
        .get("spec")
        .and_then(Value::as_mapping)
        .ok_or_else(|| refused(Refusal::Conflict)("the pod has no spec".into()))?;
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        return Err(refused(Refusal::HostNetwork)(
            "hostNetwork pods share the node's ports: every pod's sidecar would bind \
             127.0.0.1:7070 and :7071 on the node; run sluice without hostNetwork"
                .into(),
        ));
    }
    // Work on copies, so that a conflict found half-way leaves the pod as it was.
    let mut spec = spec.clone();
    let mut labels = template
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut annotations = template
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut changed = pod::inject(&mut spec, &mut labels, &options, replicas)
        .map_err(refused(Refusal::Conflict))?;
    changed |= pod::exclude_from_mesh(&mut annotations).map_err(refused(Refusal::Conflict))?;
    let metadata = template.entry("metadata".into()).or_insert(Value::Null);
    if metadata.is_null() {
        *metadata = Value::Mapping(Mapping::new());
    }
    let Some(metadata) = metadata.as_mapping_mut() else {
        return Err(refused(Refusal::Conflict)(
            "metadata is not a mapping".into(),
        ));
    };
    // Inserting over an existing key keeps its position.
    metadata.insert("labels".into(), labels);
    metadata.insert("annotations".into(), annotations);
    template.insert("spec".into(), Value::Mapping(spec));
    Ok(Outcome {
        injection: if changed {
            Injection::Injected
        } else {
            Injection::Unchanged
        },
        replicas_defaulted: chosen.is_none(),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(yaml: &str) -> Mapping {
        serde_yaml::from_str(yaml).expect("yaml")
    }

    fn replicas_of(template: &Mapping) -> String {
        let env = template["spec"]["initContainers"][0]["env"]
            .as_sequence()
            .expect("env");
        let var = env
            .iter()
            .find(|e| e["name"] == "SLUICE_LOCAL__REPLICAS")
            .expect("replicas");
        var["value"].as_str().expect("string").to_owned()
    }

    const POD: &str = "spec: {containers: [{name: app, image: a}]}";

    #[test]
    fn replicas_come_from_the_annotation_then_the_option_then_the_workload() {
        let annotated = "metadata: {annotations: {sluice.io/replicas: \"7\"}}\n";
        let with_option = Options {
            replicas: Some(5),
            ..Options::default()
        };
        let cases = [
            (
                format!("{annotated}{POD}"),
                &with_option,
                Some(3),
                "7",
                false,
            ),
            (POD.to_owned(), &with_option, Some(3), "5", false),
            (POD.to_owned(), &Options::default(), Some(3), "3", false),
            (POD.to_owned(), &Options::default(), None, "1", true),
        ];
        for (yaml, options, workload, expected, defaulted) in cases {
            let mut pod = template(&yaml);
            let outcome = inject_template(&mut pod, options, workload).expect("injects");
            assert_eq!(outcome.injection, Injection::Injected);
            assert_eq!(outcome.replicas_defaulted, defaulted, "{yaml}");
            assert_eq!(replicas_of(&pod), expected, "{yaml}");
        }
    }

    #[test]
    fn opted_out_and_refused_pods_are_left_as_they_were() {
        let opted_out = format!("metadata: {{labels: {{sluice.io/inject: disabled}}}}\n{POD}");
        let mut pod = template(&opted_out);
        let outcome = inject_template(&mut pod, &Options::default(), None).expect("ok");
        assert_eq!(outcome.injection, Injection::OptedOut);
        assert_eq!(pod, template(&opted_out));
        // The sidecar would go in before the clashing volume is found: nothing may remain.
        let clash = "spec:\n  containers: [{name: app, image: a}]\n  \
                     volumes: [{name: sluice-socket, hostPath: {path: /tmp}}]";
        let cases = [
            (clash.to_owned(), Refusal::Conflict),
            (
                "spec: {hostNetwork: true, containers: [{name: app, image: a}]}".to_owned(),
                Refusal::HostNetwork,
            ),
            (
                format!("metadata: {{annotations: {{sluice.io/replicas: \"0\"}}}}\n{POD}"),
                Refusal::InvalidSetting,
            ),
        ];
        for (yaml, refusal) in cases {
            let mut pod = template(&yaml);
            let refused =
                inject_template(&mut pod, &Options::default(), None).expect_err("refused");
            assert_eq!(refused.refusal, refusal, "{}", refused.reason);
            assert_eq!(pod, template(&yaml), "unchanged after {refusal:?}");
        }
    }

    #[test]
    fn the_sidecars_ports_are_kept_out_of_istios_capture_merged_with_the_pods_own() {
        let key = "traffic.sidecar.istio.io/excludeInboundPorts";
        let cases = [
            (POD.to_owned(), "7070,7071,8081"),
            (
                format!("metadata: {{annotations: {{{key}: \"9000, 7071\"}}}}\n{POD}"),
                "9000,7071,7070,8081",
            ),
        ];
        for (yaml, expected) in cases {
            let mut pod = template(&yaml);
            inject_template(&mut pod, &Options::default(), None).expect("injects");
            assert_eq!(pod["metadata"]["annotations"][key], expected, "{yaml}");
            let again = inject_template(&mut pod, &Options::default(), None).expect("again");
            assert_eq!(again.injection, Injection::Unchanged, "{yaml}");
        }
        let mut odd = template(&format!("metadata: {{annotations: {{{key}: [1]}}}}\n{POD}"));
        let refused = inject_template(&mut odd, &Options::default(), None).expect_err("refused");
        assert!(refused.reason.contains(key), "{}", refused.reason);
    }
}

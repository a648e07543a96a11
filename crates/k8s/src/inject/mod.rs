//! `sluice inject`: adds the sluice native sidecar to Kubernetes manifests, like `linkerd inject`.
//!
//! Reads a YAML stream (one or many documents, `List`s included), finds every pod template
//! (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob) and
//! adds the sidecar, its volumes, and the socket mount and client variables of the application
//! containers. Everything else is copied as parsed: field order and unknown fields survive;
//! comments, anchors and quoting styles do not (the YAML is re-emitted from its values, quoting
//! every string that a YAML 1.1 reader such as kubectl could take for another type).
//! Injecting an injected manifest changes nothing; any refusal writes nothing. Each pod template
//! goes through [`template::inject_template`], as each pod sent to the injector webhook does.

mod command;
pub mod emit;
mod error;
mod pod;
pub mod pod_settings;
pub mod quantity;
pub mod sidecar;
pub mod template;

pub use command::{run, InjectArgs, SidecarArgs};
pub use error::InjectError;
pub use sidecar::Options;
pub use template::{inject_template, Injection, Refusal, Refused};

use serde::Deserialize;
use serde_yaml::Value;

/// Kinds copied unchanged: they have no pod template.
const PASSIVE_KINDS: [&str; 24] = [
    "Namespace",
    "Service",
    "ServiceAccount",
    "ConfigMap",
    "Secret",
    "Ingress",
    "IngressClass",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "LimitRange",
    "ResourceQuota",
    "Endpoints",
    "PodMonitor",
    "ServiceMonitor",
    "PrometheusRule",
];

/// The result of injecting a stream.
#[derive(Debug)]
pub struct Injected {
    /// The documents, re-emitted.
    pub yaml: String,
    /// `kind/name` of every pod template that changed.
    pub changed: Vec<String>,
    /// `kind/name` of every pod template that already had the same sidecar.
    pub unchanged: Vec<String>,
    /// `kind/name` of every pod template that says `sluice.io/inject: disabled`.
    pub opted_out: Vec<String>,
    /// `kind/name: warning` for what the pod templates' owners should know.
    pub warnings: Vec<String>,
}

/// Injects every pod template in `input` (a YAML stream). Empty documents are dropped.
pub fn inject_str(input: &str, options: &Options) -> Result<Injected, InjectError> {
    sluice::config::check_expansion(input).map_err(|e| InjectError::NotYaml(e.to_string()))?;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(input) {
        let value =
            Value::deserialize(document).map_err(|e| InjectError::NotYaml(e.to_string()))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let mut injected = Injected {
        yaml: String::new(),
        changed: Vec::new(),
        unchanged: Vec::new(),
        opted_out: Vec::new(),
        warnings: Vec::new(),
    };
    for (index, document) in documents.iter_mut().enumerate() {
        let at = format!("document {}", index + 1);
        inject_object(document, &at, options, &mut injected)?;
    }
    let texts: Vec<String> = documents.iter().map(emit::document).collect();
    injected.yaml = texts.join("---\n");
    Ok(injected)
}

fn inject_object(
    object: &mut Value,
    at: &str,
    options: &Options,
    out: &mut Injected,
) -> Result<(), InjectError> {
    let not_object = || InjectError::NotAnObject { at: at.to_owned() };
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(not_object)?
        .to_owned();
    if object.get("apiVersion").and_then(Value::as_str).is_none() {
        return Err(not_object());
    }
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_owned();
    let id = format!("{}/{name}", kind.to_lowercase());
    let conflict = |reason: String| InjectError::Conflict {
        at: format!("{at} ({kind} {name})"),
        reason,
    };
    if kind.ends_with("List") {
        let Some(items) = object.get_mut("items").and_then(Value::as_sequence_mut) else {
            return Err(conflict("a List without an items sequence".into()));
        };
        for (i, item) in items.iter_mut().enumerate() {
            inject_object(item, &format!("{at}, items[{i}]"), options, out)?;
        }
        return Ok(());
    }
    let workload_replicas = match kind.as_str() {
        "Deployment" | "StatefulSet" | "ReplicaSet" | "ReplicationController" => {
            object["spec"]["replicas"].as_u64()
        }
        _ => None,
    };
    let template = match kind.as_str() {
        "Pod" => Some(&mut *object),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => object.get_mut("spec").and_then(|s| s.get_mut("template")),
        "CronJob" => object
            .get_mut("spec")
            .and_then(|s| s.get_mut("jobTemplate"))
            .and_then(|j| j.get_mut("spec"))
            .and_then(|s| s.get_mut("template")),
        _ if PASSIVE_KINDS.contains(&kind.as_str()) || options.skip_unknown => return Ok(()),
        _ => {
            return Err(InjectError::UnknownKind {
                at: at.to_owned(),
                kind,
            })
        }
    };
    let template = template
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| conflict("no pod template (a mapping) found".into()))?;
    let outcome = inject_template(template, options, workload_replicas)
        .map_err(|refused| conflict(refused.reason))?;
    out.warnings
        .extend(outcome.warnings.iter().map(|w| format!("{id}: {w}")));
    match outcome.injection {
        Injection::Injected => out.changed.push(id),
        Injection::Unchanged => out.unchanged.push(id),
        Injection::OptedOut => out.opted_out.push(id),
    }
    Ok(())
}

//! One pod's admission: the pod the API server sent goes through the same
//! [`inject_template`] as every pod template of `sluice inject`, and the difference between the
//! two becomes the JSONPatch. Pure: no I/O, no state, so a dry run has nothing to skip.

use serde_json::Value;

use super::patch::{self, Operation};
use crate::inject::{inject_template, Injection, Options, Refusal};

/// What an admission came to: a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The sidecar was added.
    Injected,
    /// Already injected: allowed with no patch.
    Unchanged,
    /// Opted out (`sluice.io/inject: disabled`), or an operation other than `CREATE`.
    Skipped,
    /// A pod that cannot take the sidecar: allowed unchanged, with a warning.
    Refused,
    /// Not a review the injector can answer: a 4xx.
    BadRequest,
}

impl Outcome {
    /// Every outcome, for pre-registered metric labels.
    pub const ALL: [Outcome; 5] = [
        Self::Injected,
        Self::Unchanged,
        Self::Skipped,
        Self::Refused,
        Self::BadRequest,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::Unchanged => "unchanged",
            Self::Skipped => "skipped",
            Self::Refused => "refused",
            Self::BadRequest => "bad_request",
        }
    }
}

/// The answer for one pod.
#[derive(Debug)]
pub struct Mutation {
    /// What happened.
    pub outcome: Outcome,
    /// Why it was refused, when it was.
    pub refusal: Option<Refusal>,
    /// Empty unless injected.
    pub patch: Vec<Operation>,
    /// For the pod's creator (`kubectl` prints them).
    pub warnings: Vec<String>,
}

/// Injects into `pod` (a JSON object) and answers with the patch. A pod that cannot take the
/// sidecar is refused (allowed unchanged), never failed.
pub fn mutate(pod: &Value, options: &Options) -> Mutation {
    let refused = |refusal: Refusal, reason: &str| Mutation {
        outcome: Outcome::Refused,
        refusal: Some(refusal),
        patch: Vec::new(),
        warnings: vec![format!("sluice: not injected: {reason}")],
    };
    let mut yaml = match serde_yaml::to_value(pod) {
        Ok(yaml) if yaml.is_mapping() => yaml,
        _ => return refused(Refusal::Conflict, "the pod is not a JSON object"),
    };
    let Some(template) = yaml.as_mapping_mut() else {
        return refused(Refusal::Conflict, "the pod is not a JSON object");
    };
    let outcome = match inject_template(template, options, None) {
        Ok(outcome) => outcome,
        Err(refusal) => return refused(refusal.refusal, &refusal.reason),
    };
    let mut warnings: Vec<String> = outcome
        .warnings
        .iter()
        .map(|w| format!("sluice: {w}"))
        .collect();
    let (answer, patch) = match outcome.injection {
        Injection::OptedOut => (Outcome::Skipped, Vec::new()),
        Injection::Unchanged => (Outcome::Unchanged, Vec::new()),
        Injection::Injected => {
            // Every key of a pod that came as JSON is a string, so this converts back.
            let Ok(after) = serde_json::to_value(&yaml) else {
                return refused(Refusal::Conflict, "the injected pod is not JSON");
            };
            if outcome.replicas_defaulted && has_controller(pod) {
                warnings.push(
                    "sluice: local.replicas is 1 (no sluice.io/replicas on the pod template): \
                     in a Redis outage, policies failing over to `local` let this pod alone use \
                     the whole limit; set sluice.io/replicas to the replica count"
                        .into(),
                );
            }
            (Outcome::Injected, patch::diff(pod, &after))
        }
    };
    Mutation {
        outcome: answer,
        refusal: None,
        patch,
        warnings,
    }
}

/// Whether a controller (ReplicaSet, StatefulSet, Job, ...) made the pod: then it has siblings
/// whose number admission cannot see.
fn has_controller(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|owners| owners.iter().any(|o| o["controller"] == true))
}

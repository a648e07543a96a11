//! Why `sluice inject` refused its input: every refusal names the document and what to do.

/// The input cannot be injected; nothing is written.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The input is not YAML at all.
    #[error("input is not YAML: {0}")]
    NotYaml(String),
    /// A document is YAML but not a Kubernetes object.
    #[error("{at}: not a Kubernetes object (a mapping with apiVersion and kind)")]
    NotAnObject {
        /// Which document (and list item).
        at: String,
    },
    /// A kind `sluice inject` does not know (it might carry a pod template it would miss).
    #[error(
        "{at}: unknown kind {kind:?}; sluice inject handles Pod, Deployment, StatefulSet, \
         DaemonSet, ReplicaSet, ReplicationController, Job, CronJob and List (pass --skip-unknown \
         to copy other kinds unchanged)"
    )]
    UnknownKind {
        /// Which document.
        at: String,
        /// Its kind.
        kind: String,
    },
    /// A workload whose pod cannot take the sidecar, or that already has a different one.
    #[error("{at}: {reason}")]
    Conflict {
        /// Which document and object.
        at: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

//! `AdmissionReview` (`admission.k8s.io/v1`): the part of the request the injector reads, and the
//! response it sends. Unknown fields are ignored (unlike the check API): the API server adds
//! fields across Kubernetes versions (`requestKind`, `userInfo`, `options`, ...), and refusing
//! them would turn an upgrade into pods created without their sidecar.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::patch::Operation;

/// The only review version served (`admissionReviewVersions: ["v1"]` in the webhook).
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The review's kind.
pub const KIND: &str = "AdmissionReview";
/// Longest request `uid` echoed back (the API server sends a UUID).
const MAX_UID_BYTES: usize = 128;
/// Longest warning: Kubernetes may truncate warnings over 256 characters.
const MAX_WARNING_CHARS: usize = 250;
/// Most warnings in one response.
const MAX_WARNINGS: usize = 8;

/// The review the API server posts.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    api_version: String,
    kind: String,
    request: Option<AdmissionRequest>,
}

/// The request inside a review.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// The object's kind.
    pub kind: GroupVersionKind,
    /// The namespace of the object (pods are namespaced), for logs.
    #[serde(default)]
    pub namespace: String,
    /// The operation; the webhook is registered for `CREATE` only.
    pub operation: AdmissionOperation,
    /// The pod being created.
    pub object: Option<Value>,
    /// A dry run (`kubectl apply --dry-run=server`): answered the same, since the injector has
    /// no side effects to skip.
    #[serde(default)]
    pub dry_run: bool,
}

/// `group`/`version`/`kind` of the object.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    /// `""` for core objects.
    #[serde(default)]
    pub group: String,
    /// `v1`.
    pub version: String,
    /// `Pod`.
    pub kind: String,
}

/// The admission operation.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum AdmissionOperation {
    /// An object is created.
    Create,
    /// An object is updated.
    Update,
    /// An object is deleted.
    Delete,
    /// `exec`, `attach`, `port-forward`.
    Connect,
}

/// Why a review is not one the injector can answer (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// Not `admission.k8s.io/v1` `AdmissionReview`.
    #[error("expected apiVersion {API_VERSION} and kind {KIND}, got {0:?} {1:?}")]
    Version(String, String),
    /// No `request`.
    #[error("the review has no request")]
    NoRequest,
    /// A missing or oversized `uid`.
    #[error("request.uid must be 1 to {MAX_UID_BYTES} bytes")]
    Uid,
    /// Not a core v1 Pod.
    #[error("the injector mutates core v1 Pods only, got {0}; check the webhook's rules")]
    NotAPod(String),
    /// No pod object, or not a JSON object.
    #[error("request.object is missing or not a JSON object")]
    NoObject,
}

impl ReviewError {
    /// The stable error code of the 400 body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Version(..) => "unsupported_review",
            Self::NoRequest | Self::Uid | Self::NoObject => "bad_review",
            Self::NotAPod(_) => "not_a_pod",
        }
    }
}

impl AdmissionReview {
    /// The request, checked: a v1 review of a core v1 Pod, with a usable uid. The object is
    /// checked only for `CREATE` (other operations are answered without looking at it).
    pub fn into_request(self) -> Result<AdmissionRequest, ReviewError> {
        if self.api_version != API_VERSION || self.kind != KIND {
            return Err(ReviewError::Version(self.api_version, self.kind));
        }
        let request = self.request.ok_or(ReviewError::NoRequest)?;
        if request.uid.is_empty() || request.uid.len() > MAX_UID_BYTES {
            return Err(ReviewError::Uid);
        }
        let kind = &request.kind;
        if !(kind.group.is_empty() && kind.version == "v1" && kind.kind == "Pod") {
            let shown = format!("{}/{} {}", kind.group, kind.version, kind.kind);
            return Err(ReviewError::NotAPod(shown.chars().take(100).collect()));
        }
        let is_object = request.object.as_ref().is_some_and(Value::is_object);
        if request.operation == AdmissionOperation::Create && !is_object {
            return Err(ReviewError::NoObject);
        }
        Ok(request)
    }
}

/// The review sent back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    api_version: &'static str,
    kind: &'static str,
    response: AdmissionResponse,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionResponse {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// The JSONPatch, base64 (Go's encoding of `[]byte`).
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

impl ReviewResponse {
    /// Always allowed (the injector never fails a pod): with the patch when there is one, and
    /// the warnings (bounded in number and length).
    pub fn allowed(uid: String, patch: &[Operation], warnings: Vec<String>) -> Self {
        let patch = (!patch.is_empty()).then(|| {
            let json = serde_json::to_vec(patch).unwrap_or_default();
            base64::engine::general_purpose::STANDARD.encode(json)
        });
        let warnings = warnings
            .into_iter()
            .take(MAX_WARNINGS)
            .map(|w| {
                if w.chars().count() <= MAX_WARNING_CHARS {
                    w
                } else {
                    let mut short: String = w.chars().take(MAX_WARNING_CHARS - 1).collect();
                    short.push('…');
                    short
                }
            })
            .collect();
        Self {
            api_version: API_VERSION,
            kind: KIND,
            response: AdmissionResponse {
                uid,
                allowed: true,
                patch_type: patch.as_ref().map(|_| "JSONPatch"),
                patch,
                warnings,
            },
        }
    }
}

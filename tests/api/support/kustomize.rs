//! `deploy/k8s` rendered as Kubernetes renders it: `kubectl kustomize` (CI installs kubectl; a
//! machine without it skips these tests with a reason, CI fails them).

use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

use crate::tools;

/// Every document of a YAML file (empty documents dropped).
pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The kustomization in `dir`, rendered by `kubectl kustomize`; `None` (skipped) where kubectl
/// is missing outside CI. A kustomization kubectl refuses fails the test.
pub fn render(dir: &Path) -> Option<Vec<Value>> {
    if !tools::required("kubectl") {
        return None;
    }
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(documents(&String::from_utf8_lossy(&output.stdout)))
}

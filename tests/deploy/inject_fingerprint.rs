//! `sluice inject --fingerprint-secret NAME[:KEY]`: the sidecar reads `shadow.fingerprint_key`
//! from that Secret (a required `secretKeyRef`), so every pod names a partition by the same
//! fingerprint; a bad Secret name is refused with exit 64 before anything is written.

use std::io::Write;

use crate::helpers::{repo_root, run_async, sluice_command};

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - {name: web, image: \"nginx:1\"}
";

/// The `SLUICE_SHADOW__FINGERPRINT_KEY` entry of the sidecar in `sluice inject ARGS`'s output.
async fn fingerprint_env(args: &[&str]) -> Option<serde_yaml::Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("deployment.yaml");
    std::fs::File::create(&input)
        .and_then(|mut f| f.write_all(DEPLOYMENT.as_bytes()))
        .expect("write");
    let input = input.display().to_string();
    let all: Vec<&str> = ["inject"]
        .into_iter()
        .chain(args.iter().copied())
        .chain([input.as_str()])
        .collect();
    let out = run_async(sluice_command(&repo_root(), &all)).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let doc: serde_yaml::Value = serde_yaml::from_str(&out.stdout).expect("YAML");
    let sidecar = doc["spec"]["template"]["spec"]["initContainers"]
        .as_sequence()
        .and_then(|c| c.iter().find(|c| c["name"] == "sluice"))
        .expect("the sidecar")
        .clone();
    sidecar["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "SLUICE_SHADOW__FINGERPRINT_KEY")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_takes_the_fingerprint_key_from_a_secret() {
    assert_eq!(fingerprint_env(&[]).await, None, "only when asked");
    for (flag, name, key) in [
        ("sluice-fleet", "sluice-fleet", "fingerprint-key"),
        ("sluice-fleet:shadow_key", "sluice-fleet", "shadow_key"),
    ] {
        let var = fingerprint_env(&["--fingerprint-secret", flag])
            .await
            .expect("the variable");
        let reference = &var["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"].as_str(), Some(name), "{var:?}");
        assert_eq!(reference["key"].as_str(), Some(key), "{var:?}");
        assert_eq!(reference["optional"].as_bool(), Some(false), "{var:?}");
    }
    for bad in ["Fleet", "a b", ":key", "fleet:", "-fleet"] {
        let flag = format!("--fingerprint-secret={bad}");
        let out = run_async(sluice_command(&repo_root(), &["inject", &flag, "-"])).await;
        assert_eq!(out.code, Some(64), "{bad}: {out:?}");
        assert!(
            out.stdout.is_empty() && out.stderr.contains("fingerprint-secret"),
            "{out:?}"
        );
    }
}

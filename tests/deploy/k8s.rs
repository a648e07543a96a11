//! `deploy/k8s`: the kustomize base, overlays and monitoring, rendered by `kubectl kustomize` and
//! checked: the sidecar is what `sluice inject`
//! makes, the daemon accepts its settings, replicas agree, and every manifest (with the inject
//! outputs of tests/k8s/*.yaml) validates against the Kubernetes schemas offline.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;
use sluice_k8s::inject::{inject_str, Options};

use crate::helpers::{repo_root, run, sluice_command, Outcome};
use crate::kustomize::{documents, render};
use crate::tools;

/// Kubernetes versions the manifests must validate against: 1.29 is the first with native
/// sidecars on by default; the other is the newest kubernetes-validate ships.
const SCHEMA_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

/// Every kustomization of deploy/k8s (`injector` includes `injector/core`).
const KUSTOMIZATIONS: [&str; 6] = [
    "base",
    "overlays/redis",
    "overlays/sentinel",
    "monitoring",
    "injector",
    "ratelimit",
];

pub fn k8s_dir() -> PathBuf {
    repo_root().join("deploy/k8s")
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

pub fn sidecar(deployment: &Value) -> &Value {
    deployment["spec"]["template"]["spec"]["initContainers"]
        .as_sequence()
        .and_then(|s| s.iter().find(|c| c["name"] == "sluice"))
        .expect("a sluice init container")
}

pub fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

#[test]
fn base_policies_configmap_is_the_shipped_policy_file() {
    let Some(objects) = render(&k8s_dir().join("base")) else {
        return;
    };
    let configmap = find(&objects, "ConfigMap", "sluice-policies");
    let shipped = std::fs::read_to_string(repo_root().join("config/policies.yaml")).expect("read");
    assert_eq!(
        configmap["data"]["policies.yaml"].as_str(),
        Some(shipped.as_str()),
        "deploy/k8s/base/policies.yaml must carry config/policies.yaml verbatim"
    );
}

#[test]
fn base_example_app_is_what_inject_makes() {
    let text = std::fs::read_to_string(k8s_dir().join("base/example-app.yaml")).expect("read");
    let options = Options {
        replicas: Some(1),
        ..Options::default()
    };
    let injected = inject_str(&text, &options).expect("injects");
    assert_eq!(
        injected.changed,
        Vec::<String>::new(),
        "the base is already injected"
    );
    assert_eq!(injected.unchanged, ["deployment/example-app"]);
    assert_eq!(documents(&injected.yaml), documents(&text));
}

#[test]
fn overlays_keep_local_replicas_equal_to_replicas() {
    for overlay in ["base", "overlays/redis", "overlays/sentinel"] {
        let Some(objects) = render(&k8s_dir().join(overlay)) else {
            return;
        };
        let app = find(&objects, "Deployment", "example-app");
        let replicas = app["spec"]["replicas"]
            .as_u64()
            .expect("replicas")
            .to_string();
        assert_eq!(
            env_value(sidecar(app), "SLUICE_LOCAL__REPLICAS"),
            Some(replicas.as_str()),
            "{overlay}"
        );
    }
}

/// `sluice config check` of an empty settings file with `container`'s literal environment,
/// `SLUICE_POLICIES` replaced by `policies` (a path on this machine), plus `extra`.
pub fn config_check_env(container: &Value, policies: &str, extra: &[(String, String)]) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = dir.path().join("empty.toml");
    std::fs::write(&settings, "").expect("write");
    let mut command = sluice_command(
        &repo_root(),
        &["config", "check", settings.to_str().expect("utf-8")],
    );
    for var in container["env"].as_sequence().expect("env") {
        let name = var["name"].as_str().expect("name");
        let value = var["value"].as_str().expect("literal value");
        command.env(
            name,
            if name == "SLUICE_POLICIES" {
                policies
            } else {
                value
            },
        );
    }
    command.envs(extra.iter().map(|(k, v)| (k, v)));
    run(command)
}

/// The sidecar's environment plus the overlay's `sluice-redis` Secret, with paths moved into
/// this machine's repository: `sluice config check` must accept them (exit 0).
#[test]
fn daemon_accepts_the_rendered_sidecar_settings() {
    let shipped = repo_root()
        .join("config/policies.yaml")
        .display()
        .to_string();
    for overlay in ["base", "overlays/redis", "overlays/sentinel"] {
        let Some(objects) = render(&k8s_dir().join(overlay)) else {
            return;
        };
        let container = sidecar(find(&objects, "Deployment", "example-app"));
        let secret = container["envFrom"][0]["secretRef"]["name"]
            .as_str()
            .expect("secret");
        let mut from_secret = Vec::new();
        if let Some(found) = objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret)
        {
            for (name, value) in found["stringData"].as_mapping().expect("stringData") {
                let name = name.as_str().expect("key").to_owned();
                from_secret.push((name, value.as_str().expect("string").to_owned()));
            }
        }
        assert_eq!(
            !from_secret.is_empty(),
            overlay != "base",
            "{overlay}: Redis settings from the Secret"
        );
        let outcome = config_check_env(container, &shipped, &from_secret);
        assert_eq!(outcome.code, Some(0), "{overlay}: {outcome:?}");
    }
}

#[test]
fn podmonitor_scrapes_the_injected_pods_admin_port() {
    let Some(monitoring) = render(&k8s_dir().join("monitoring")) else {
        return;
    };
    let monitor = find(&monitoring, "PodMonitor", "sluice");
    let Some(objects) = render(&k8s_dir().join("base")) else {
        return;
    };
    let app = find(&objects, "Deployment", "example-app");
    let labels = app["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .expect("labels");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("selector")
    {
        assert_eq!(labels.get(key), Some(value), "pod label {key:?}");
    }
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = endpoint["port"].as_str().expect("port name");
    let ports = sidecar(app)["ports"].as_sequence().expect("ports");
    assert!(
        ports.iter().any(|p| p["name"] == port),
        "sidecar has port {port}"
    );
}

/// Writes `objects` one per file (List items unpacked: the schemas have no List).
fn write_objects(dir: &Path, prefix: &str, objects: &[Value], files: &mut Vec<PathBuf>) {
    for (i, object) in objects.iter().enumerate() {
        if object["kind"] == "List" {
            let items = object["items"].as_sequence().expect("items").clone();
            write_objects(dir, &format!("{prefix}-{i}"), &items, files);
            continue;
        }
        let path = dir.join(format!("{prefix}-{i}.yaml"));
        std::fs::write(&path, sluice_k8s::inject::emit::document(object)).expect("write");
        files.push(path);
    }
}

/// Writes raw YAML text (as emitted) as one file, so that how it is quoted is validated too.
fn write_text(dir: &Path, name: &str, text: &str, files: &mut Vec<PathBuf>) {
    let objects = documents(text);
    if objects.iter().any(|o| o["kind"] == "List") {
        write_objects(dir, name, &objects, files);
    } else {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, text).expect("write");
        files.push(path);
    }
}

/// `kubernetes-validate --strict` of `files` against every [`SCHEMA_VERSIONS`] schema (skipped
/// with a reason outside CI when it is not installed).
pub fn validate(files: &[PathBuf]) {
    if !tools::required_python_module("kubernetes_validate") {
        return;
    }
    for version in SCHEMA_VERSIONS {
        let mut command = Command::new("python3");
        command
            .args([
                "-m",
                "kubernetes_validate",
                "--strict",
                "--quiet",
                "-k",
                version,
            ])
            .args(files);
        let outcome = run(command);
        assert_eq!(
            outcome.code,
            Some(0),
            "kubernetes-validate --strict -k {version}:\n{}{}",
            outcome.stdout,
            outcome.stderr
        );
        assert!(!outcome.stdout.contains("WARN"), "{}", outcome.stdout);
    }
}

#[test]
fn manifests_validate_against_kubernetes_schemas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    for name in KUSTOMIZATIONS {
        let Some(objects) = render(&k8s_dir().join(name)) else {
            return;
        };
        // CRDs (PodMonitor, cert-manager's Certificate and Issuer) have no schema there;
        // podmonitor_scrapes_... and injector_manifests.rs check them.
        let core: Vec<Value> = objects
            .into_iter()
            .filter(|o| {
                let api = o["apiVersion"].as_str().unwrap_or("");
                !api.contains("monitoring.coreos.com") && !api.contains("cert-manager.io")
            })
            .collect();
        write_objects(dir.path(), &name.replace('/', "-"), &core, &mut files);
    }
    let samples = repo_root().join("tests/k8s");
    let mut entries: Vec<_> = std::fs::read_dir(&samples)
        .expect("tests/k8s")
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".yaml")
            .to_owned();
        let text = std::fs::read_to_string(entry.path()).expect("read");
        write_text(dir.path(), &format!("sample-{name}"), &text, &mut files);
        let injected = inject_str(&text, &Options::default()).expect("injects");
        write_text(
            dir.path(),
            &format!("injected-{name}"),
            &injected.yaml,
            &mut files,
        );
    }
    assert!(files.len() >= 20, "{} manifests", files.len());
    validate(&files);
}

const PROMETHEUS_RULE_HEADER: &str = "\
# Generated from deploy/prometheus/alerts.yaml (the source: edit that file, then run
#   UPDATE_PROMETHEUSRULE=1 cargo test --test deploy k8s::prometheusrule
# to refresh this copy; a test fails while the two differ).
";

/// deploy/prometheus/alerts.yaml wrapped in a PrometheusRule, for the Prometheus Operator.
fn expected_prometheus_rule() -> String {
    let alerts = std::fs::read_to_string(repo_root().join("deploy/prometheus/alerts.yaml"))
        .expect("deploy/prometheus/alerts.yaml");
    let alerts: Value = serde_yaml::from_str(&alerts).expect("alert rules are YAML");
    let rule: Value = serde_yaml::from_str(
        "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: sluice\n  \
         labels:\n    app.kubernetes.io/name: sluice\nspec: {}\n",
    )
    .expect("template");
    let mut rule = rule;
    rule["spec"]["groups"] = alerts["groups"].clone();
    format!(
        "{PROMETHEUS_RULE_HEADER}{}",
        sluice_k8s::inject::emit::document(&rule)
    )
}

#[test]
fn prometheusrule_carries_the_alert_rules() {
    let path = k8s_dir().join("monitoring/prometheusrule.yaml");
    let expected = expected_prometheus_rule();
    if std::env::var_os("UPDATE_PROMETHEUSRULE").is_some() {
        std::fs::write(&path, &expected).expect("write");
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        documents(&actual) == documents(&expected),
        "{} differs from deploy/prometheus/alerts.yaml; regenerate with \
         UPDATE_PROMETHEUSRULE=1 cargo test --test deploy k8s::prometheusrule",
        path.display()
    );
    let Some(monitoring) = render(&k8s_dir().join("monitoring")) else {
        return;
    };
    assert!(
        monitoring.iter().any(|o| o["kind"] == "PrometheusRule"),
        "listed in monitoring/"
    );
}

/// The offline check docs/kubernetes.md gives adopters ("Check manifests offline"), run as
/// written (with this build's `sluice` first on `PATH`): it passes an injected Deployment and
/// fails one with a misspelt field, which `sluice inject` carries through unchanged.
#[test]
fn the_documented_offline_check_passes_injected_manifests_and_fails_a_broken_one() {
    const RECIPE: &str = "sluice inject deploy.yaml > injected.yaml && python3 -m kubernetes_validate --strict -k 1.29.0 injected.yaml";
    let docs = std::fs::read_to_string(repo_root().join("docs/kubernetes.md")).expect("docs");
    assert!(docs.contains(RECIPE), "docs/kubernetes.md gives: {RECIPE}");
    if !tools::required_python_module("kubernetes_validate") {
        return;
    }
    let sample =
        std::fs::read_to_string(repo_root().join("tests/k8s/deployment.yaml")).expect("sample");
    let broken = sample.replacen("\n  replicas:", "\n  replica:", 1);
    assert_ne!(broken, sample);
    let bin_dir = Path::new(crate::helpers::sluice_bin())
        .parent()
        .expect("bin dir")
        .to_owned();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    for (manifest, valid) in [(&sample, true), (&broken, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("deploy.yaml"), manifest).expect("write");
        let mut command = Command::new("sh");
        command
            .args(["-c", RECIPE])
            .current_dir(dir.path())
            .env("PATH", &path);
        let outcome = run(command);
        assert_eq!(
            outcome.code == Some(0),
            valid,
            "{:?}\n{}{}",
            outcome.code,
            outcome.stdout,
            outcome.stderr
        );
        if !valid {
            assert!(
                outcome.stdout.contains("'replica' was unexpected"),
                "{}",
                outcome.stdout
            );
        }
    }
}

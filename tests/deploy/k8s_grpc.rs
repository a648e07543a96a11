//! Envoy and Istio in Kubernetes: `sluice inject --grpc` (and the `sluice.io/grpc` annotation)
//! adds the gRPC rate limit service to the sidecar, and `deploy/k8s/ratelimit` runs it as one
//! central Deployment + Service + PodDisruptionBudget. The daemon accepts both containers'
//! settings (the central one with its ConfigMap laid out as the kubelet mounts it), and the
//! injected manifests validate against the Kubernetes schemas (`k8s.rs` validates
//! `deploy/k8s/ratelimit` with the other kustomizations).

use sluice_k8s::inject::sidecar::{GRPC_ADDR, GRPC_SOCKET_PATH};
use sluice_k8s::inject::{inject_str, Options};

use crate::helpers::repo_root;
use crate::k8s::{config_check_env as config_check, env_value, find, k8s_dir, sidecar};
use crate::kustomize::{documents, render};

#[test]
fn inject_grpc_serves_envoys_api_on_loopback_and_the_socket_volume() {
    let text =
        std::fs::read_to_string(repo_root().join("tests/k8s/deployment.yaml")).expect("read");
    let shipped = repo_root()
        .join("config/policies.yaml")
        .display()
        .to_string();
    for (options, annotation, expected) in [
        (
            Options {
                grpc: true,
                ..Options::default()
            },
            None,
            true,
        ),
        (Options::default(), Some("enabled"), true),
        (
            Options {
                grpc: true,
                ..Options::default()
            },
            Some("disabled"),
            false,
        ),
        (Options::default(), None, false),
    ] {
        let mut objects = documents(&text);
        let deployment = objects
            .iter_mut()
            .find(|o| o["kind"] == "Deployment")
            .expect("deployment");
        if let Some(value) = annotation {
            let yaml = format!("{{sluice.io/grpc: {value}}}");
            deployment["spec"]["template"]["metadata"]["annotations"] =
                serde_yaml::from_str(&yaml).expect("yaml");
        }
        let input = serde_yaml::to_string(deployment).expect("yaml");
        let injected = inject_str(&input, &options).expect("injects");
        let objects = documents(&injected.yaml);
        let container = sidecar(&objects[0]);
        let case = format!("--grpc {} with annotation {annotation:?}", options.grpc);
        assert_eq!(
            env_value(container, "SLUICE_LISTEN__GRPC"),
            expected.then_some(GRPC_ADDR),
            "{case}"
        );
        assert_eq!(
            env_value(container, "SLUICE_LISTEN__GRPC_SOCKET"),
            expected.then_some(GRPC_SOCKET_PATH),
            "{case}"
        );
        let outcome = config_check(container, &shipped, &[]);
        assert_eq!(outcome.code, Some(0), "{case}: {outcome:?}");
    }
    assert!(
        GRPC_SOCKET_PATH.starts_with(sluice_k8s::inject::sidecar::SOCKET_DIR),
        "on the shared volume"
    );
    assert!(GRPC_ADDR.starts_with("127.0.0.1:"), "loopback only");
}

#[test]
fn the_central_service_is_a_deployment_a_service_and_a_pdb_that_agree() {
    let Some(objects) = render(&k8s_dir().join("ratelimit")) else {
        return;
    };
    let deployment = find(&objects, "Deployment", "sluice-ratelimit");
    let service = find(&objects, "Service", "sluice-ratelimit");
    let pdb = find(&objects, "PodDisruptionBudget", "sluice-ratelimit");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&service["spec"]["selector"], labels);
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    let replicas = deployment["spec"]["replicas"].as_u64().expect("replicas");
    assert!(replicas >= 2, "a PDB with minAvailable 1 needs 2 replicas");
    assert!(pdb["spec"]["minAvailable"].as_u64() < Some(replicas));
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"].as_str(),
        Some(sluice_k8s::inject::sidecar::default_image().as_str())
    );
    assert_eq!(
        env_value(container, "SLUICE_LOCAL__REPLICAS"),
        Some(replicas.to_string().as_str())
    );
    let port = &service["spec"]["ports"][0];
    let grpc = container["ports"]
        .as_sequence()
        .and_then(|ports| ports.iter().find(|p| p["name"] == port["targetPort"]))
        .expect("the Service's targetPort is a named container port");
    let bind = env_value(container, "SLUICE_LISTEN__GRPC").expect("gRPC listener");
    assert_eq!(
        bind,
        format!("0.0.0.0:{}", grpc["containerPort"].as_u64().expect("port"))
    );
    assert_eq!(
        container["envFrom"][0]["secretRef"]["optional"].as_bool(),
        None,
        "Redis is required: replicas on the embedded store would each allow the whole limit"
    );
    // The policies ConfigMap laid out as the kubelet mounts it, loaded as a directory.
    let configmap = find(&objects, "ConfigMap", "sluice-ratelimit-policies");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("..2026_01_01_00_00_00.1");
    std::fs::create_dir(&data).expect("mkdir");
    std::os::unix::fs::symlink(&data, dir.path().join("..data")).expect("..data");
    let keys = configmap["data"].as_mapping().expect("data");
    assert!(keys.len() >= 2, "policies split by owner");
    for (key, text) in keys {
        let key = key.as_str().expect("key");
        std::fs::write(data.join(key), text.as_str().expect("text")).expect("write");
        std::os::unix::fs::symlink(format!("..data/{key}"), dir.path().join(key))
            .expect("key link");
    }
    let redis = [("SLUICE_REDIS__URL".into(), "redis://127.0.0.1:1".into())];
    let outcome = config_check(container, &dir.path().display().to_string(), &redis);
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert!(
        outcome
            .stdout
            .contains("edge_api_key, rls-override-edge, login"),
        "{}",
        outcome.stdout
    );
}

#[test]
fn grpc_injected_manifests_validate_against_kubernetes_schemas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    for sample in ["deployment", "pod", "cronjob"] {
        let text = std::fs::read_to_string(repo_root().join(format!("tests/k8s/{sample}.yaml")))
            .expect("read");
        let options = Options {
            grpc: true,
            ..Options::default()
        };
        let injected = inject_str(&text, &options).expect("injects");
        let path = dir.path().join(format!("{sample}.yaml"));
        std::fs::write(&path, &injected.yaml).expect("write");
        files.push(path);
    }
    crate::k8s::validate(&files);
}

//! deploy/k8s/injector without a cluster: the two webhooks' selectors evaluated as the API server
//! does for every combination of namespace and pod labels (exactly the opted-in pods reach the
//! injector, once, and never in its own namespace); the webhook settings the issue requires;
//! Service, Deployment, PodDisruptionBudget, Secret and cert-manager objects naming each other
//! consistently, with the same DNS names `sluice injector certs` uses. Schemas: k8s.rs validates
//! every object (cert-manager's CRDs excepted) with kubernetes-validate.

use std::collections::BTreeMap;

use serde_yaml::Value;

use crate::helpers::repo_root;
use crate::kustomize::render;

fn objects() -> Option<Vec<Value>> {
    render(&repo_root().join("deploy/k8s/injector"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_sequence()
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A label selector (`matchLabels` and `matchExpressions`) as Kubernetes evaluates it.
fn selects(selector: &Value, labels: &BTreeMap<&str, &str>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_mapping()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k.as_str().unwrap_or_default()).copied() == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_sequence()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels.get(e["key"].as_str().unwrap_or_default()).copied();
            let values = strings(&e["values"]);
            match e["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                other => panic!("unknown operator {other:?}"),
            }
        });
    by_labels && by_expressions
}

#[test]
fn webhooks_select_exactly_the_opted_in_pods_once() {
    let Some(objects) = objects() else {
        return;
    };
    let config = find(&objects, "MutatingWebhookConfiguration", "sluice-injector");
    let webhooks = config["webhooks"].as_sequence().expect("webhooks");
    assert_eq!(webhooks.len(), 2);
    let own = find(&objects, "Deployment", "sluice-injector")["metadata"]["namespace"]
        .as_str()
        .expect("namespace");
    let settings = [None, Some("enabled"), Some("disabled")];
    for namespace in ["shop", own, "kube-system"] {
        for namespace_label in settings {
            for pod_label in settings {
                let mut ns_labels = BTreeMap::from([("kubernetes.io/metadata.name", namespace)]);
                ns_labels.extend(namespace_label.map(|v| ("sluice.io/inject", v)));
                let mut pod_labels = BTreeMap::from([("app", "web")]);
                pod_labels.extend(pod_label.map(|v| ("sluice.io/inject", v)));
                let matched = webhooks
                    .iter()
                    .filter(|w| {
                        selects(&w["namespaceSelector"], &ns_labels)
                            && selects(&w["objectSelector"], &pod_labels)
                    })
                    .count();
                let wanted = namespace == "shop"
                    && match pod_label {
                        Some(setting) => setting == "enabled",
                        None => namespace_label == Some("enabled"),
                    };
                assert_eq!(
                    matched,
                    usize::from(wanted),
                    "namespace {namespace} {namespace_label:?}, pod {pod_label:?}"
                );
            }
        }
    }
}

#[test]
fn webhooks_fail_open_and_reach_the_service_with_a_cert_manager_ca() {
    let Some(objects) = objects() else {
        return;
    };
    let config = find(&objects, "MutatingWebhookConfiguration", "sluice-injector");
    let service = find(&objects, "Service", "sluice-injector");
    let deployment = find(&objects, "Deployment", "sluice-injector");
    let namespace = deployment["metadata"]["namespace"].as_str().expect("ns");
    for webhook in config["webhooks"].as_sequence().expect("webhooks") {
        let name = webhook["name"].as_str().expect("name");
        assert_eq!(webhook["failurePolicy"], "Ignore", "{name}");
        assert_eq!(webhook["sideEffects"], "None", "{name}");
        assert_eq!(webhook["reinvocationPolicy"], "IfNeeded", "{name}");
        assert_eq!(strings(&webhook["admissionReviewVersions"]), ["v1"]);
        let rule = &webhook["rules"][0];
        assert_eq!(strings(&rule["operations"]), ["CREATE"]);
        assert_eq!(strings(&rule["resources"]), ["pods"]);
        assert_eq!(strings(&rule["apiGroups"]), [""]);
        let target = &webhook["clientConfig"]["service"];
        assert_eq!(target["name"], service["metadata"]["name"]);
        assert_eq!(target["namespace"], namespace);
        assert_eq!(target["path"], "/mutate");
        let port = service["spec"]["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["port"] == target["port"])
            .unwrap_or_else(|| panic!("{name}: the Service has port {:?}", target["port"]));
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let container_port = container["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == port["targetPort"])
            .expect("the targetPort names a container port");
        let listen = format!(
            "--listen=0.0.0.0:{}",
            container_port["containerPort"].as_u64().expect("port")
        );
        assert!(strings(&container["args"]).contains(&listen.as_str()));
    }
    // cert-manager: the caBundle comes from the serving Certificate, whose Secret the
    // Deployment mounts and whose names are the ones `sluice injector certs` writes.
    let from = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        .as_str()
        .expect("inject-ca-from");
    let (cert_namespace, cert_name) = from.split_once('/').expect("namespace/name");
    assert_eq!(cert_namespace, namespace);
    let certificate = find(&objects, "Certificate", cert_name);
    let service_name = service["metadata"]["name"].as_str().expect("name");
    let names =
        sluice_k8s::injector::certs::service_names(service_name, namespace, "cluster.local");
    assert_eq!(strings(&certificate["spec"]["dnsNames"]), names);
    let pod = &deployment["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["secret"]["secretName"] == certificate["spec"]["secretName"])
        .expect("the Deployment mounts the Certificate's Secret");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("mounted");
    assert!(
        mount.get("subPath").is_none(),
        "a directory mount sees renewals"
    );
    let dir = mount["mountPath"].as_str().expect("path");
    let args = strings(&pod["containers"][0]["args"]);
    assert!(
        args.contains(&format!("--tls-cert={dir}/tls.crt").as_str()),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--tls-key={dir}/tls.key").as_str()),
        "{args:?}"
    );
    // The serving certificate comes from a CA issuer (renewals keep the caBundle), whose CA
    // comes from the self-signed issuer.
    let issuer = find(
        &objects,
        "Issuer",
        certificate["spec"]["issuerRef"]["name"]
            .as_str()
            .expect("issuer"),
    );
    let ca_secret = &issuer["spec"]["ca"]["secretName"];
    let ca = objects
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == *ca_secret)
        .expect("the CA Certificate");
    assert_eq!(ca["spec"]["isCA"], true);
    let root = find(
        &objects,
        "Issuer",
        ca["spec"]["issuerRef"]["name"].as_str().expect("issuer"),
    );
    assert!(root["spec"]["selfSigned"].is_mapping());
}

#[test]
fn the_injector_runs_twice_non_root_on_a_read_only_root() {
    let Some(objects) = objects() else {
        return;
    };
    let deployment = find(&objects, "Deployment", "sluice-injector");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let template = &deployment["spec"]["template"];
    let labels = template["metadata"]["labels"].as_mapping().expect("labels");
    let budget = find(&objects, "PodDisruptionBudget", "sluice-injector");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    for (key, value) in budget["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("selector")
    {
        assert_eq!(
            labels.get(key),
            Some(value),
            "the budget selects the injector's pods"
        );
    }
    let pod = &template["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "no API access needed"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    let admin = container["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == container["readinessProbe"]["httpGet"]["port"])
        .expect("the probes use a named port");
    let admin_arg = format!(
        "--admin=0.0.0.0:{}",
        admin["containerPort"].as_u64().expect("port")
    );
    assert!(strings(&container["args"]).contains(&admin_arg.as_str()));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
}

//! `sluice injector`, the mutating admission webhook, over real HTTPS with certificates from
//! `sluice injector certs`: the patch it returns, applied by an independent JSONPatch
//! implementation, gives exactly what `sluice inject` gives for the same pod (a Deployment's, a
//! Job's, a bare pod); already injected pods get no patch; opted-out, refused and invalid pods
//! are allowed unchanged with warnings; bad reviews get a JSON 4xx; every outcome is counted; a
//! certificate rotated on disk is served without a restart.
//!
//! There is no Kubernetes cluster here: the API server's part (calling the webhook through the
//! Service, the selectors, the caBundle, timeouts and failurePolicy, reinvocation) is checked
//! against the manifests in injector_manifests.rs, not exercised.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::client::Target;
use sluice_k8s::inject::Options;

use crate::helpers::{metric_value, repo_root, sluice_command, ChildGuard};
use crate::injector_support::{
    created_pod, https, patched, review, sluice_inject, write_certs, TestInjector,
};
use crate::kustomize::{documents, render};
use crate::redis_server::free_port;

/// Longest a bounded polling loop waits.
const POLL_LIMIT: Duration = Duration::from_secs(15);

fn sample_json(name: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join("tests/k8s").join(name)).expect("read");
    serde_json::to_value(&documents(&text)[0]).expect("JSON-compatible")
}

/// Sends `body` to `/mutate` and expects a 200 review response for `uid`.
async fn admit(addr: std::net::SocketAddr, ca: &Path, uid: &str, pod: &Value) -> Value {
    let body = review(uid, pod, false).to_string().into_bytes();
    let reply = https(addr, ca, "POST", "/mutate", body)
        .await
        .expect("exchange");
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    let response = &reply.json["response"];
    assert_eq!(reply.json["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(reply.json["kind"], "AdmissionReview");
    assert_eq!(response["uid"], uid);
    assert_eq!(response["allowed"], true, "the injector never fails a pod");
    reply.json
}

fn warnings(reply: &Value) -> Vec<String> {
    reply["response"]["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_ready(admin: std::net::SocketAddr, child: &mut ChildGuard) {
    let admin = Target::Tcp(admin);
    let log = || "(the injector's output is not kept)".to_owned();
    crate::wait::wait_answering(&admin, "/readyz", child, POLL_LIMIT, log).await;
}

/// The real binary, with the Deployment's own arguments from deploy/k8s/injector (addresses and
/// certificate paths moved here, another image): every pod's patched form equals `sluice inject`
/// with the same sidecar flags.
#[tokio::test]
async fn pods_get_exactly_what_sluice_inject_gives() {
    let certs = tempfile::tempdir().expect("tempdir");
    write_certs(certs.path()).await;
    let ca = certs.path().join("ca.crt");
    let Some(objects) = render(&repo_root().join("deploy/k8s/injector/core")) else {
        return;
    };
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the injector's Deployment");
    let manifest_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("args");
    let (webhook_port, admin_port) = (free_port(), free_port());
    let dir = certs.path().display();
    let mut args = Vec::new();
    let mut sidecar_flags = Vec::new();
    for arg in manifest_args.iter().map(|a| a.as_str().expect("string")) {
        let flag = arg.split('=').next().unwrap_or(arg);
        let arg = match flag {
            "--listen" => format!("--listen=127.0.0.1:{webhook_port}"),
            "--admin" => format!("--admin=127.0.0.1:{admin_port}"),
            "--tls-cert" => format!("--tls-cert={dir}/tls.crt"),
            "--tls-key" => format!("--tls-key={dir}/tls.key"),
            "--image" => "--image=registry.example/sluice:9.9".to_owned(),
            _ => arg.to_owned(),
        };
        if [
            "--image",
            "--policies-configmap",
            "--redis-secret",
            "--replicas",
        ]
        .contains(&flag)
        {
            sidecar_flags.push(arg.clone());
        }
        args.push(arg);
    }
    assert_eq!(sidecar_flags.len(), 3, "{args:?}");
    args.push("--log-format=text".into());
    let logs = tempfile::tempdir().expect("tempdir");
    let mut command = sluice_command(&repo_root(), &[]);
    command
        .args(&args)
        .stdout(std::fs::File::create(logs.path().join("out")).expect("file"))
        .stderr(std::fs::File::create(logs.path().join("err")).expect("file"));
    let mut child = ChildGuard(Some(command.spawn().expect("spawn sluice injector")));
    let admin = format!("127.0.0.1:{admin_port}").parse().expect("addr");
    wait_ready(admin, &mut child).await;
    let webhook = format!("127.0.0.1:{webhook_port}").parse().expect("addr");

    let mut web = sample_json("deployment.yaml");
    web["spec"]["template"]["metadata"]["annotations"] = json!({"sluice.io/replicas": "4"});
    let mut job = sample_json("job.yaml")["spec"]["template"].clone();
    job["metadata"] = json!({"labels": {"sluice.io/inject": "enabled"}});
    let bare = sample_json("pod.yaml");
    let pods = [
        (
            "deployment",
            created_pod(
                &web["spec"]["template"],
                "shop",
                "web-7d9f8b6c5",
                Some(("apps/v1", "ReplicaSet", "web-7d9f8b6c5")),
            ),
            0,
        ),
        (
            "job",
            created_pod(
                &job,
                "batch",
                "backfill",
                Some(("batch/v1", "Job", "backfill")),
            ),
            1,
        ),
        ("pod", created_pod(&bare, "default", "worker", None), 0),
    ];
    let mut injected_web = Value::Null;
    for (what, pod, expected_warnings) in &pods {
        let reply = admit(webhook, &ca, &format!("uid-{what}"), pod).await;
        let after = patched(pod, &reply);
        assert_ne!(&after, pod, "{what}: injected");
        assert_eq!(
            after,
            sluice_inject(pod, &sidecar_flags).await,
            "{what}: the patched pod is what sluice inject makes of it"
        );
        let sidecar = &after["spec"]["initContainers"][0];
        assert_eq!(sidecar["image"], "registry.example/sluice:9.9", "{what}");
        let found = warnings(&reply);
        assert_eq!(found.len(), *expected_warnings, "{what}: {found:?}");
        if *expected_warnings > 0 {
            assert!(found[0].contains("sluice.io/replicas"), "{found:?}");
        }
        let again = admit(webhook, &ca, &format!("again-{what}"), &after).await;
        assert!(
            again["response"].get("patch").is_none(),
            "{what}: already injected, no patch: {again}"
        );
        if *what == "deployment" {
            injected_web = after;
        }
    }
    // The Deployment itself through `sluice inject`: the same sidecar and volumes as its pod got.
    let web_injected = sluice_inject(&web, &sidecar_flags).await;
    let template = &web_injected["spec"]["template"]["spec"];
    assert_eq!(
        template["initContainers"][0], injected_web["spec"]["initContainers"][0],
        "the Deployment's template and its pod get the same sidecar"
    );
    let sluice_volumes = |spec: &Value| -> Vec<Value> {
        spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter(|v| v["name"].as_str().is_some_and(|n| n.starts_with("sluice-")))
            .cloned()
            .collect()
    };
    assert_eq!(
        sluice_volumes(template),
        sluice_volumes(&injected_web["spec"])
    );
    // A dry run is answered the same (there are no side effects to skip).
    let (_, job_pod, _) = &pods[1];
    let body = |dry_run| review("dry", job_pod, dry_run).to_string().into_bytes();
    let dry = https(webhook, &ca, "POST", "/mutate", body(true))
        .await
        .expect("dry");
    let wet = https(webhook, &ca, "POST", "/mutate", body(false))
        .await
        .expect("wet");
    assert_eq!(dry.json, wet.json);
    let metrics = sluice::client::request(
        &Target::Tcp(admin),
        axum::http::Method::GET,
        "/metrics",
        None,
    )
    .await
    .expect("metrics");
    let metrics = String::from_utf8_lossy(&metrics.body);
    let count = |outcome| {
        metric_value(
            &metrics,
            "sluice_injector_admissions_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(count("injected"), 5.0, "{metrics}");
    assert_eq!(count("unchanged"), 3.0);
    assert_eq!(count("bad_request"), 0.0);
}

/// Opted out, refused (hostNetwork, a `sluice` app container, invalid settings): allowed with
/// no patch, a warning for the refused ones, each counted by reason. Valid per-pod overrides
/// are applied, an unknown `sluice.io/*` annotation is warned about.
#[tokio::test]
async fn pods_that_opt_out_or_cannot_take_the_sidecar_are_allowed_unchanged() {
    let certs = tempfile::tempdir().expect("tempdir");
    write_certs(certs.path()).await;
    let ca = certs.path().join("ca.crt");
    let injector = TestInjector::start(certs.path(), Options::default()).await;
    let base = sample_json("pod.yaml");
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut template = base.clone();
        edit(&mut template);
        created_pod(&template, "shop", "worker", None)
    };
    let annotate = |key: &'static str, value: &'static str| {
        move |t: &mut Value| {
            t["metadata"]["annotations"][key] = json!(value);
        }
    };
    let refused: [(&str, Value, &str); 5] = [
        (
            "host-network",
            with(&|t| t["spec"]["hostNetwork"] = json!(true)),
            "hostNetwork",
        ),
        (
            "sluice-app",
            with(&|t| t["spec"]["containers"][0]["name"] = json!("sluice")),
            "\"sluice\"",
        ),
        (
            "bad-cpu",
            with(&annotate("sluice.io/cpu-request", "lots")),
            "sluice.io/cpu-request",
        ),
        (
            "memory-over-limit",
            with(&annotate("sluice.io/memory-request", "1Gi")),
            "exceed",
        ),
        (
            "bad-opt",
            with(&annotate("sluice.io/inject", "yes")),
            "sluice.io/inject",
        ),
    ];
    for (uid, pod, needle) in &refused {
        let reply = admit(injector.webhook, &ca, uid, pod).await;
        assert!(reply["response"].get("patch").is_none(), "{uid}: {reply}");
        let found = warnings(&reply);
        assert!(
            found.len() == 1
                && found[0].starts_with("sluice: not injected")
                && found[0].contains(needle),
            "{uid}: {found:?}"
        );
    }
    let opted_out = with(&annotate("sluice.io/inject", "disabled"));
    let reply = admit(injector.webhook, &ca, "opted-out", &opted_out).await;
    assert!(reply["response"].get("patch").is_none(), "{reply}");
    assert!(warnings(&reply).is_empty(), "{reply}");

    let overridden = with(&|t| {
        t["metadata"]["annotations"] = json!({
            "sluice.io/replicas": "6",
            "sluice.io/policies-configmap": "team-policies",
            "sluice.io/cpu-request": "100m",
            "sluice.io/memory-request": "64Mi",
            "sluice.io/memory-limit": "256Mi",
            "sluice.io/replica": "6",
        });
    });
    let reply = admit(injector.webhook, &ca, "overrides", &overridden).await;
    let after = patched(&overridden, &reply);
    assert_eq!(after, sluice_inject(&overridden, &[]).await);
    let sidecar = &after["spec"]["initContainers"][0];
    assert_eq!(
        sidecar["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    let replicas = sidecar["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "SLUICE_LOCAL__REPLICAS")
        .expect("replicas");
    assert_eq!(replicas["value"], "6");
    let policies = after["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "sluice-policies")
        .expect("policies volume");
    assert_eq!(policies["configMap"]["name"], "team-policies");
    let found = warnings(&reply);
    assert!(
        found.len() == 1 && found[0].contains("ignored: sluice.io/replica ("),
        "{found:?}"
    );

    let metrics = injector.metrics().await;
    let value = |name, labels: &[(&str, &str)]| metric_value(&metrics, name, labels);
    let admissions = "sluice_injector_admissions_total";
    assert_eq!(
        value(admissions, &[("outcome", "refused")]),
        5.0,
        "{metrics}"
    );
    assert_eq!(value(admissions, &[("outcome", "skipped")]), 1.0);
    assert_eq!(value(admissions, &[("outcome", "injected")]), 1.0);
    let refusals = "sluice_injector_refusals_total";
    assert_eq!(value(refusals, &[("reason", "host_network")]), 1.0);
    assert_eq!(value(refusals, &[("reason", "conflict")]), 1.0);
    assert_eq!(value(refusals, &[("reason", "invalid_setting")]), 3.0);
    injector.stop().await;
}

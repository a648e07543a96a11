//! `sluice inject`: every supported kind, idempotence, multi-document streams and Lists, other
//! documents and fields untouched, conflicts and bad input refused (exit 64, nothing written).

use std::io::Write;
use std::process::Stdio;

use serde_yaml::Value;
use sluice_k8s::inject::{inject_str, InjectError, Options};

use crate::helpers::{repo_root, sluice_command, ChildGuard, Outcome, STOP_TIMEOUT};
use crate::kustomize::documents;

fn sample(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/k8s").join(name)).expect("sample")
}

fn inject(text: &str) -> String {
    inject_str(text, &Options::default())
        .unwrap_or_else(|e| panic!("inject: {e}"))
        .yaml
}

/// Runs `sluice inject ARGS` with `stdin` piped in (bounded by STOP_TIMEOUT).
fn inject_cli(args: &[&str], stdin: &str) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut command = sluice_command(&repo_root(), &[&["inject"], args].concat());
    command
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).expect("file"))
        .stderr(std::fs::File::create(&err).expect("file"));
    let mut guard = ChildGuard(Some(command.spawn().expect("spawn sluice inject")));
    if let Some(mut input) = guard.0.as_mut().and_then(|c| c.stdin.take()) {
        input.write_all(stdin.as_bytes()).expect("write stdin");
    }
    let status = guard
        .wait_timeout(STOP_TIMEOUT)
        .expect("sluice inject finishes");
    Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// The pod spec of a workload document.
fn pod_spec(object: &Value) -> &Value {
    match object["kind"].as_str() {
        Some("Pod") => &object["spec"],
        Some("CronJob") => &object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &object["spec"]["template"]["spec"],
    }
}

fn assert_injected(object: &Value, replicas: &str) {
    let spec = pod_spec(object);
    let init = spec["initContainers"]
        .as_sequence()
        .expect("initContainers");
    let sidecar = &init[0];
    assert_eq!(sidecar["name"], "sluice", "the sidecar comes first");
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(sidecar["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(sidecar["securityContext"]["runAsNonRoot"], true);
    let env = sidecar["env"].as_sequence().expect("env");
    let local = env
        .iter()
        .find(|e| e["name"] == "SLUICE_LOCAL__REPLICAS")
        .expect("replicas");
    assert_eq!(local["value"], replicas, "{:?}", object["kind"]);
    let volumes = spec["volumes"].as_sequence().expect("volumes");
    assert!(volumes
        .iter()
        .any(|v| v["name"] == "sluice-socket" && v["emptyDir"].is_mapping()));
    assert!(volumes.iter().any(|v| v["name"] == "sluice-policies"));
    for app in spec["containers"].as_sequence().expect("containers") {
        let mounts = app["volumeMounts"].as_sequence().expect("mounts");
        assert!(mounts
            .iter()
            .any(|m| m["name"] == "sluice-socket" && m["mountPath"] == "/var/run/sluice"));
        let env = app["env"].as_sequence().expect("env");
        assert!(env
            .iter()
            .any(|e| e["name"] == "SLUICE_SOCKET" && e["value"] == "/var/run/sluice/sluice.sock"));
    }
    let metadata = if object["kind"] == "Pod" {
        &object["metadata"]
    } else if object["kind"] == "CronJob" {
        &object["spec"]["jobTemplate"]["spec"]["template"]["metadata"]
    } else {
        &object["spec"]["template"]["metadata"]
    };
    assert_eq!(metadata["labels"]["sluice.io/injected"], "true");
    // A mesh (Istio) must not capture the check, admin and gRPC ports: captured, a mesh peer
    // reaches them from 127.0.0.6.
    let excluded = metadata["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"]
        .as_str()
        .unwrap_or_default();
    for port in ["7070", "7071", "8081"] {
        assert!(
            excluded.split(',').any(|p| p == port),
            "{port} not in excludeInboundPorts {excluded:?} ({:?})",
            object["kind"]
        );
    }
}

#[test]
fn every_supported_kind_gets_the_sidecar() {
    for (file, kind, replicas) in [
        ("pod.yaml", "Pod", "1"),
        ("deployment.yaml", "Deployment", "4"),
        ("statefulset.yaml", "StatefulSet", "3"),
        ("daemonset.yaml", "DaemonSet", "1"),
        ("job.yaml", "Job", "1"),
        ("cronjob.yaml", "CronJob", "1"),
    ] {
        let out = documents(&inject(&sample(file)));
        let object = out.iter().find(|o| o["kind"] == kind).expect(kind);
        assert_injected(object, replicas);
    }
    let list = documents(&inject(&sample("list.yaml")));
    assert_eq!(list.len(), 1, "a List stays one document");
    assert_eq!(list[0]["kind"], "List");
    assert_injected(&list[0]["items"][0], "2");
    let service = &list[0]["items"][1];
    assert_eq!(
        *service,
        documents(&sample("list.yaml"))[0]["items"][1],
        "Service untouched"
    );
}

#[test]
fn injecting_twice_changes_nothing() {
    for file in [
        "pod.yaml",
        "deployment.yaml",
        "statefulset.yaml",
        "daemonset.yaml",
        "job.yaml",
        "cronjob.yaml",
        "list.yaml",
    ] {
        let once = inject(&sample(file));
        let twice = inject_str(&once, &Options::default()).expect("injects again");
        assert_eq!(twice.yaml, once, "{file}: byte for byte");
        assert!(twice.changed.is_empty(), "{file}: {:?}", twice.changed);
    }
}

#[test]
fn other_documents_and_fields_are_untouched() {
    let input = sample("deployment.yaml");
    let before = documents(&input);
    let after = documents(&inject(&input));
    assert_eq!(after.len(), 3, "every document kept, in order");
    assert_eq!(after[1], before[1], "the Service");
    assert_eq!(after[2], before[2], "the ConfigMap");
    assert_eq!(
        after[2]["data"]["greeting"], "yes",
        "still a string, not a YAML 1.1 boolean"
    );
    // The Deployment: the same apart from what injection adds, in the same order.
    let (b, a) = (&before[0], &after[0]);
    let keys = |v: &Value| {
        v.as_mapping()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
    };
    assert_eq!(keys(a), keys(b));
    assert_eq!(keys(&a["metadata"]), keys(&b["metadata"]));
    assert_eq!(a["spec"]["selector"], b["spec"]["selector"]);
    let spec = pod_spec(a);
    let init = spec["initContainers"].as_sequence().expect("init");
    assert_eq!(
        init[1],
        pod_spec(b)["initContainers"][0],
        "the app's own init container follows"
    );
    let web = &spec["containers"][0];
    assert_eq!(
        web["env"][0],
        pod_spec(b)["containers"][0]["env"][0],
        "own variables first"
    );
    assert_eq!(
        web["volumeMounts"][0],
        pod_spec(b)["containers"][0]["volumeMounts"][0]
    );
    assert_eq!(
        spec["volumes"][0],
        pod_spec(b)["volumes"][0],
        "own volumes first"
    );
}

#[test]
fn unknown_fields_survive() {
    let input = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, x-extra: {keep: [1, 2]}}\nspec:\n  containers: [{name: c, image: i, x-future: 'on'}]\n  x-pod-field: 2024-01-01\n";
    let out = documents(&inject(input));
    assert_eq!(out[0]["metadata"]["x-extra"]["keep"][1], 2);
    assert_eq!(out[0]["spec"]["containers"][0]["x-future"], "on");
    assert_eq!(out[0]["spec"]["x-pod-field"], "2024-01-01");
}

#[test]
fn replicas_come_from_the_flag_or_the_workload() {
    let input = sample("statefulset.yaml");
    let options = Options {
        replicas: Some(7),
        ..Options::default()
    };
    let out = documents(&inject_str(&input, &options).expect("injects").yaml);
    assert_injected(&out[0], "7");
}

#[test]
fn a_different_sluice_container_is_refused_unless_overwritten() {
    let injected = inject(&sample("deployment.yaml"));
    let options = Options {
        image: "registry.example/sluice:9.9".into(),
        ..Options::default()
    };
    let error = inject_str(&injected, &options).expect_err("refused");
    let message = error.to_string();
    assert!(matches!(error, InjectError::Conflict { .. }), "{message}");
    assert!(message.contains("document 1 (Deployment web)"), "{message}");
    assert!(
        message.contains("(image)") && message.contains("--overwrite"),
        "{message}"
    );
    let options = Options {
        overwrite: true,
        ..options
    };
    let replaced = inject_str(&injected, &options).expect("overwrites");
    let out = documents(&replaced.yaml);
    let init = pod_spec(&out[0])["initContainers"]
        .as_sequence()
        .expect("init");
    assert_eq!(init.iter().filter(|c| c["name"] == "sluice").count(), 1);
    assert_eq!(init[0]["image"], "registry.example/sluice:9.9");
}

#[test]
fn a_sluice_app_container_is_refused() {
    let input = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: app, image: a}, {name: sluice, image: sluice:old}]\n";
    let message = inject_str(input, &Options::default())
        .expect_err("refused")
        .to_string();
    assert!(message.contains("not a native sidecar"), "{message}");
    let options = Options {
        overwrite: true,
        ..Options::default()
    };
    let out = documents(&inject_str(input, &options).expect("moves it").yaml);
    assert_eq!(
        out[0]["spec"]["containers"].as_sequence().map(Vec::len),
        Some(1)
    );
    assert_injected(&out[0], "1");
}

#[test]
fn conflicting_volume_env_and_host_network_are_refused() {
    let volume = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: app, image: a}]\n  volumes: [{name: sluice-socket, hostPath: {path: /tmp}}]\n";
    let env = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: app, image: a, env: [{name: SLUICE_SOCKET, value: /elsewhere}]}]\n";
    let host = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  hostNetwork: true\n  containers: [{name: app, image: a}]\n";
    let none = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n";
    for (input, expected) in [
        (volume, "volume named \"sluice-socket\""),
        (env, "variable named \"SLUICE_SOCKET\""),
        (host, "hostNetwork"),
        (none, "no containers"),
    ] {
        let message = inject_str(input, &Options::default())
            .expect_err("refused")
            .to_string();
        assert!(message.contains(expected), "{message}");
    }
}

/// Tells whether an error is the expected kind of refusal.
type ErrorMatcher = fn(&InjectError) -> bool;

#[test]
fn bad_input_is_refused_by_kind() {
    let cases: [(&str, ErrorMatcher); 5] = [
        ("key: [unclosed\n", |e| matches!(e, InjectError::NotYaml(_))),
        ("just some text\n", |e| {
            matches!(e, InjectError::NotAnObject { .. })
        }),
        ("- a\n- b\n", |e| {
            matches!(e, InjectError::NotAnObject { .. })
        }),
        ("kind: Deployment\nmetadata: {name: x}\n", |e| {
            matches!(e, InjectError::NotAnObject { .. })
        }),
        (
            "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {name: r}\n",
            |e| matches!(e, InjectError::UnknownKind { .. }),
        ),
    ];
    for (input, expected) in cases {
        let error = inject_str(input, &Options::default()).expect_err(input);
        assert!(expected(&error), "{input:?}: {error}");
    }
    let rollout = "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {name: r}\n";
    let options = Options {
        skip_unknown: true,
        ..Options::default()
    };
    let out = inject_str(rollout, &options).expect("copied");
    assert_eq!(documents(&out.yaml), documents(rollout));
}

#[test]
fn cli_reads_stdin_and_files_and_refuses_with_64_writing_nothing() {
    let input = sample("deployment.yaml");
    let piped = inject_cli(&[], &input);
    assert_eq!(piped.code, Some(0), "{piped:?}");
    assert!(
        piped.stderr.contains("deployment/web injected"),
        "{}",
        piped.stderr
    );
    assert_eq!(piped.stdout, inject(&input));
    let dash = inject_cli(&["-"], &input);
    assert_eq!(dash.stdout, piped.stdout);
    let file = repo_root().join("tests/k8s/deployment.yaml");
    let from_file = inject_cli(&[file.to_str().expect("utf-8")], "");
    assert_eq!(from_file.stdout, piped.stdout);
    let again = inject_cli(&[], &piped.stdout);
    assert_eq!(again.stdout, piped.stdout, "idempotent through the CLI");
    assert!(
        again.stderr.contains("already injected"),
        "{}",
        again.stderr
    );

    // A good document followed by a bad one: refused whole.
    let mixed =
        format!("{input}---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w}}\n");
    for (stdin, needle) in [
        ("{not: yaml", "not YAML"),
        (mixed.as_str(), "document 4: unknown kind \"Widget\""),
        ("plain text\n", "not a Kubernetes object"),
    ] {
        let refused = inject_cli(&[], stdin);
        assert_eq!(refused.code, Some(64), "{refused:?}");
        assert!(
            refused.stdout.is_empty(),
            "nothing written: {}",
            refused.stdout
        );
        assert!(refused.stderr.contains(needle), "{}", refused.stderr);
    }
    let conflict = inject_cli(&["--image", "other:1"], &piped.stdout);
    assert_eq!(conflict.code, Some(64), "{conflict:?}");
    assert!(
        conflict.stderr.contains("--overwrite"),
        "{}",
        conflict.stderr
    );
    let missing = inject_cli(&["/nonexistent/sluice.yaml"], "");
    assert_eq!(missing.code, Some(66), "{missing:?}");
    let zero = inject_cli(&["--replicas", "0"], &input);
    assert_ne!(zero.code, Some(0), "--replicas 0 is rejected");
}

#[test]
fn input_without_workloads_is_copied_with_a_note() {
    let input = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n";
    let outcome = inject_cli(&[], input);
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(documents(&outcome.stdout), documents(input));
    assert!(
        outcome.stderr.contains("no pod template"),
        "{}",
        outcome.stderr
    );
}

/// `kubectl kustomize` moves patched env items first; the sidecar is still the same one.
#[test]
fn reordered_sidecar_lists_are_still_the_same_sidecar() {
    let base = std::fs::read_to_string(repo_root().join("deploy/k8s/base/example-app.yaml"))
        .expect("read");
    let mut objects = documents(&base);
    let env = objects[0]["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_sequence_mut()
        .expect("env");
    env.reverse();
    let reordered = sluice_k8s::inject::emit::document(&objects[0]);
    let options = Options {
        replicas: Some(1),
        ..Options::default()
    };
    let out = inject_str(&reordered, &options).expect("same sidecar");
    assert!(out.changed.is_empty(), "{:?}", out.changed);
}

/// The pod template's own `sluice.io/*` annotations, read as the injector webhook reads a pod's:
/// an opt-out is copied unchanged, `sluice.io/replicas` beats `--replicas` and the workload's
/// count, an unknown key is a warning, an invalid value a refusal.
#[test]
fn cli_honours_the_pod_templates_sluice_annotations() {
    let with_annotations = |annotations: &str| {
        let mut objects = documents(&sample("deployment.yaml"));
        objects[0]["spec"]["template"]["metadata"]["annotations"] =
            serde_yaml::from_str(annotations).expect("annotations");
        sluice_k8s::inject::emit::document(&objects[0])
    };
    let opted_out = with_annotations("{sluice.io/inject: disabled}");
    let outcome = inject_cli(&[], &opted_out);
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(documents(&outcome.stdout), documents(&opted_out));
    assert!(
        outcome
            .stderr
            .contains("deployment/web says sluice.io/inject: disabled"),
        "{}",
        outcome.stderr
    );
    let annotated = with_annotations("{sluice.io/replicas: \"9\", sluice.io/colour: blue}");
    let outcome = inject_cli(&["--replicas", "2"], &annotated);
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_injected(&documents(&outcome.stdout)[0], "9");
    assert!(
        outcome
            .stderr
            .contains("warning: deployment/web: unknown sluice.io keys ignored: sluice.io/colour"),
        "{}",
        outcome.stderr
    );
    for (annotations, needle) in [
        (
            "{sluice.io/memory-limit: \"128\"}",
            "sluice.io/memory-limit is \"128\", outside",
        ),
        (
            "{sluice.io/memory-limit: 128}",
            "[\"sluice.io/memory-limit\"] is not a string",
        ),
    ] {
        let outcome = inject_cli(&[], &with_annotations(annotations));
        assert_eq!(outcome.code, Some(64), "{outcome:?}");
        assert!(outcome.stdout.is_empty());
        assert!(outcome.stderr.contains(needle), "{}", outcome.stderr);
    }
}

/// `--require-redis-secret`: the sidecar's Secret is required (`optional: false`), so a pod whose
/// Secret is missing does not start alone on the embedded store; without it, optional as before.
#[test]
fn require_redis_secret_makes_the_secret_required() {
    let secret_ref = |stdout: &str| {
        let objects = documents(stdout);
        let init = pod_spec(&objects[0])["initContainers"][0].clone();
        init["envFrom"][0]["secretRef"].clone()
    };
    let deployment = sample("deployment.yaml");
    let required = inject_cli(&["--require-redis-secret"], &deployment);
    assert_eq!(required.code, Some(0), "{required:?}");
    let reference = secret_ref(&required.stdout);
    assert_eq!(reference["name"], "sluice-redis");
    assert_eq!(reference["optional"], false, "{reference:?}");
    let plain = inject_cli(&[], &deployment);
    assert_eq!(secret_ref(&plain.stdout)["optional"], true);
}

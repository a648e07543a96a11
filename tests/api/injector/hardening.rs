//! `sluice injector` against what is not a pod review (a JSON 4xx each, counted, never a patch,
//! and the next good review still answered), a serving certificate rotated on disk (picked up
//! without a restart; a half-written or mismatched pair is refused and the last good one kept),
//! and `sluice injector certs` refusing bad names and existing files.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_k8s::inject::Options;

use crate::helpers::{metric_value, repo_root, run_async, sluice_command};
use crate::injector_support::{
    created_pod, https, leaf_der, patched, review, write_certs, TestInjector,
};
use crate::wait::eventually_within;

/// Longest a bounded polling loop waits for the injector to notice a change.
const POLL_LIMIT: Duration = Duration::from_secs(15);

fn small_pod() -> Value {
    let template = json!({
        "metadata": {"labels": {"app": "a"}},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]}
    });
    created_pod(&template, "shop", "a", None)
}

#[tokio::test]
async fn bad_reviews_get_a_json_4xx_and_the_next_review_is_served() {
    let certs = tempfile::tempdir().expect("tempdir");
    write_certs(certs.path()).await;
    let ca = certs.path().join("ca.crt");
    let injector = TestInjector::start(certs.path(), Options::default()).await;
    let pod = small_pod();
    let good = review("good", &pod, false);
    let edited = |edit: &dyn Fn(&mut Value)| {
        let mut review = good.clone();
        edit(&mut review);
        review.to_string().into_bytes()
    };
    let mut huge = pod.clone();
    huge["metadata"]["annotations"] = json!({"big": "x".repeat(3 * 1024 * 1024)});
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "not JSON",
            b"{\"apiVersion\": ".to_vec(),
            400,
            "bad_request",
        ),
        ("an array", b"[1, 2]".to_vec(), 400, "bad_request"),
        (
            "v1beta1",
            edited(&|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            400,
            "unsupported_review",
        ),
        (
            "no request",
            edited(&|r| r["request"] = Value::Null),
            400,
            "bad_review",
        ),
        (
            "a Deployment",
            edited(&|r| {
                r["request"]["kind"] =
                    json!({"group": "apps", "version": "v1", "kind": "Deployment"})
            }),
            400,
            "not_a_pod",
        ),
        (
            "no object",
            edited(&|r| r["request"]["object"] = Value::Null),
            400,
            "bad_review",
        ),
        (
            "an object that is a string",
            edited(&|r| r["request"]["object"] = json!("pod")),
            400,
            "bad_review",
        ),
        (
            "no uid",
            edited(&|r| r["request"]["uid"] = json!("")),
            400,
            "bad_review",
        ),
        (
            "over 3 MiB",
            review("huge", &huge, false).to_string().into_bytes(),
            413,
            "payload_too_large",
        ),
    ];
    let count = cases.len();
    for (what, body, status, code) in cases {
        let reply = https(injector.webhook, &ca, "POST", "/mutate", body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(reply.status, status, "{what}: {:?}", reply.json);
        assert_eq!(reply.json["error"], code, "{what}: {:?}", reply.json);
        assert!(
            reply.json["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{what}"
        );
    }
    let wrong_method = https(injector.webhook, &ca, "GET", "/mutate", Vec::new())
        .await
        .expect("GET");
    assert_eq!(wrong_method.status, 405);
    let elsewhere = https(injector.webhook, &ca, "POST", "/validate", Vec::new())
        .await
        .expect("POST");
    assert_eq!(elsewhere.status, 404);
    assert_eq!(elsewhere.json["error"], "not_found");
    // An UPDATE (the webhook registers CREATE only) is allowed as it is.
    let update = edited(&|r| r["request"]["operation"] = json!("UPDATE"));
    let reply = https(injector.webhook, &ca, "POST", "/mutate", update)
        .await
        .expect("UPDATE");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json["response"]["allowed"], true);
    assert!(reply.json["response"].get("patch").is_none());
    // Still serving.
    let reply = https(
        injector.webhook,
        &ca,
        "POST",
        "/mutate",
        good.to_string().into_bytes(),
    )
    .await
    .expect("good review");
    assert_eq!(reply.status, 200);
    assert_ne!(patched(&pod, &reply.json), pod);
    let metrics = injector.metrics().await;
    let outcome = |o| {
        metric_value(
            &metrics,
            "sluice_injector_admissions_total",
            &[("outcome", o)],
        )
    };
    assert_eq!(outcome("bad_request"), count as f64, "{metrics}");
    assert_eq!(outcome("skipped"), 1.0);
    assert_eq!(outcome("injected"), 1.0);
    injector.stop().await;
}

/// The kubelet's layout of a mounted Secret: `tls.crt -> ..data/tls.crt`, `..data -> <dir>`,
/// switched by renaming a new `..data` symlink over the old one.
fn point_data_at(mount: &Path, target: &str) {
    let staged = mount.join("..data_tmp");
    std::os::unix::fs::symlink(target, &staged).expect("symlink");
    std::fs::rename(&staged, mount.join("..data")).expect("atomic swap");
}

async fn reloads(injector: &TestInjector, result: &str) -> f64 {
    metric_value(
        &injector.metrics().await,
        "sluice_injector_certificate_reloads_total",
        &[("result", result)],
    )
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let mount = tempfile::tempdir().expect("tempdir");
    let (first, second) = (
        mount.path().join("..2024_01"),
        mount.path().join("..2024_02"),
    );
    write_certs(&first).await;
    write_certs(&second).await;
    point_data_at(mount.path(), "..2024_01");
    for file in ["ca.crt", "tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), mount.path().join(file))
            .expect("symlink");
    }
    let injector = TestInjector::start(mount.path(), Options::default()).await;
    let (old_ca, new_ca) = (first.join("ca.crt"), second.join("ca.crt"));
    let body = || review("r", &small_pod(), false).to_string().into_bytes();
    let served = https(injector.webhook, &old_ca, "POST", "/mutate", body())
        .await
        .expect("the first certificate");
    assert_eq!(served.peer, leaf_der(&first.join("tls.crt")));

    // Written in place, half a file: refused, the loaded pair keeps serving.
    let new_cert = std::fs::read_to_string(second.join("tls.crt")).expect("read");
    std::fs::write(first.join("tls.crt"), &new_cert[..new_cert.len() / 2]).expect("write");
    eventually_within(
        "a half-written certificate is rejected",
        POLL_LIMIT,
        || async { reloads(&injector, "rejected").await >= 1.0 },
    )
    .await;
    // The whole new certificate next to the old key: a mismatched pair, refused too.
    std::fs::write(first.join("tls.crt"), &new_cert).expect("write");
    eventually_within("a mismatched pair is rejected", POLL_LIMIT, || async {
        reloads(&injector, "rejected").await >= 2.0
    })
    .await;
    let still = https(injector.webhook, &old_ca, "POST", "/mutate", body())
        .await
        .expect("the last good pair is still served");
    assert_eq!(still.peer, served.peer);
    assert_eq!(reloads(&injector, "loaded").await, 0.0);

    // The kubelet's atomic swap to the renewed Secret: served without a restart.
    point_data_at(mount.path(), "..2024_02");
    eventually_within("the renewed certificate is served", POLL_LIMIT, || async {
        https(injector.webhook, &new_ca, "POST", "/mutate", body())
            .await
            .is_ok_and(|reply| reply.peer == leaf_der(&second.join("tls.crt")))
    })
    .await;
    assert_eq!(reloads(&injector, "loaded").await, 1.0);
    let old = https(injector.webhook, &old_ca, "POST", "/mutate", body()).await;
    assert!(
        old.as_ref().is_err_and(|e| e.starts_with("TLS")),
        "a client trusting only the old CA is refused now: {old:?}"
    );
    injector.stop().await;
}

#[tokio::test]
async fn certs_refuses_bad_names_and_never_overwrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("certs");
    let out_arg = out.display().to_string();
    let bad = [
        "injector",
        "certs",
        "--service",
        "Bad_Name",
        "--out",
        &out_arg,
    ];
    let outcome = run_async(sluice_command(&repo_root(), &bad)).await;
    assert_eq!(outcome.code, Some(64), "{outcome:?}");
    assert!(outcome.stderr.contains("--service"), "{}", outcome.stderr);
    assert!(!out.exists(), "nothing written");
    write_certs(&out).await;
    let before = std::fs::read(out.join("tls.key")).expect("key");
    let again = ["injector", "certs", "--out", &out_arg];
    let outcome = run_async(sluice_command(&repo_root(), &again)).await;
    assert_eq!(outcome.code, Some(73), "{outcome:?}");
    assert!(outcome.stderr.contains("exists"), "{}", outcome.stderr);
    assert!(outcome.stdout.is_empty());
    assert_eq!(std::fs::read(out.join("tls.key")).expect("key"), before);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("tls.key"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the key is readable by its owner only");
}

//! What the injector tests share: certificates from the real `sluice injector certs`, an
//! in-process injector on free ports, an HTTPS client that trusts only a given CA, pods shaped
//! as the API server sends them (defaults, the service-account token volume, owners) and the
//! AdmissionReview around them, and `sluice inject` run on the same pod.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use sluice_k8s::inject::Options;
use sluice_k8s::injector::{CertFiles, Injector, InjectorConfig};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::helpers::{repo_root, run_async, sluice_command};

/// The name the API server uses for the injector's Service.
pub const SERVICE_DNS: &str = "sluice-injector.sluice-system.svc";
/// Longest one HTTPS exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `sluice injector certs --out DIR` (the real binary): the caBundle it prints.
pub async fn write_certs(dir: &Path) -> String {
    let out = dir.to_str().expect("utf-8 path");
    let args = [
        "injector",
        "certs",
        "--service",
        "sluice-injector",
        "--namespace",
        "sluice-system",
        "--out",
        out,
    ];
    let outcome = run_async(sluice_command(&repo_root(), &args)).await;
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let bundle = outcome.stdout.trim().to_owned();
    let ca = std::fs::read(dir.join("ca.crt")).expect("ca.crt");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&bundle)
        .expect("the caBundle is base64");
    assert_eq!(decoded, ca, "the caBundle is ca.crt");
    bundle
}

/// An injector served by this test's runtime, stopped on drop.
pub struct TestInjector {
    /// The webhook (HTTPS).
    pub webhook: SocketAddr,
    /// The admin listener (HTTP).
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestInjector {
    /// Starts on free loopback ports with the certificate in `dir`, checked every 50 ms.
    pub async fn start(dir: &Path, options: Options) -> Self {
        let config = InjectorConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            admin: "127.0.0.1:0".parse().expect("addr"),
            tls: CertFiles {
                cert: dir.join("tls.crt"),
                key: dir.join("tls.key"),
            },
            reload_interval: Duration::from_millis(50),
            options,
            max_connections: 16,
            shutdown_grace: Duration::from_secs(1),
        };
        let injector = Injector::build(config).await.expect("injector starts");
        let (webhook, admin) = (injector.webhook_addr(), injector.admin_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(injector.run(async {
            let _ = stopped.await;
        }));
        Self {
            webhook,
            admin,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The admin listener's `/metrics`.
    pub async fn metrics(&self) -> String {
        let target = sluice::client::Target::Tcp(self.admin);
        let reply = crate::helpers::get(&target, "/metrics").await;
        String::from_utf8_lossy(&reply.body).into_owned()
    }

    /// Stops it and waits for the drain.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(EXCHANGE_TIMEOUT, task)
                .await
                .expect("the injector stops")
                .expect("the injector task did not panic");
        }
    }
}

impl Drop for TestInjector {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One HTTPS exchange.
#[derive(Debug)]
pub struct HttpsReply {
    /// Status code.
    pub status: u16,
    /// The body as JSON (`Null` when it is not JSON).
    pub json: Value,
    /// The DER of the certificate the server presented.
    pub peer: Vec<u8>,
}

/// Sends `body` as `METHOD path` over TLS to `addr`, trusting only the CA in `ca` and expecting
/// the Service's DNS name; an error when the handshake (or anything after) fails.
pub async fn https(
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<HttpsReply, String> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(addr, ca, method, path, body))
        .await
        .map_err(|_| "timed out".to_owned())?
}

async fn exchange(
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<HttpsReply, String> {
    sluice::store::redis::access::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(SERVICE_DNS).map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.to_vec())
        .unwrap_or_default();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", SERVICE_DNS)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(HttpsReply {
        status,
        json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        peer,
    })
}

/// The leaf certificate of a PEM file, as DER.
pub fn leaf_der(path: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(path)
        .expect("pem")
        .next()
        .expect("a certificate")
        .expect("parses")
        .to_vec()
}

/// What created a pod: its controller's kind and name.
pub type Owner<'a> = Option<(&'a str, &'a str, &'a str)>;

/// A pod as the API server sends it to mutating webhooks: the template's metadata and spec, the
/// owner a controller sets, the defaults the API server fills in and the service-account token
/// volume its admission plugin adds (both run before webhooks).
pub fn created_pod(template: &Value, namespace: &str, name: &str, owner: Owner<'_>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"].clone(),
        "spec": template["spec"].clone(),
        "status": {"phase": "Pending", "qosClass": "BestEffort"}
    });
    let metadata = pod["metadata"].as_object_mut().expect("metadata");
    metadata.insert("namespace".into(), json!(namespace));
    metadata.insert("creationTimestamp".into(), Value::Null);
    match owner {
        Some((api_version, kind, owner_name)) => {
            metadata.insert("generateName".into(), json!(format!("{name}-")));
            metadata.insert(
                "ownerReferences".into(),
                json!([{
                    "apiVersion": api_version, "kind": kind, "name": owner_name,
                    "uid": "6c1d2f5e-3b1a-4c8e-9d7f-2a4b6c8d0e1f",
                    "controller": true, "blockOwnerDeletion": true
                }]),
            );
        }
        None => {
            metadata.insert("name".into(), json!(name));
        }
    }
    let spec = pod["spec"].as_object_mut().expect("spec");
    let defaults = json!({
        "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "enableServiceLinks": true,
        "schedulerName": "default-scheduler", "securityContext": {},
        "serviceAccountName": "default", "serviceAccount": "default",
        "terminationGracePeriodSeconds": 30, "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}
        ]
    });
    for (key, value) in defaults.as_object().expect("defaults") {
        spec.entry(key.clone()).or_insert_with(|| value.clone());
    }
    let token = "kube-api-access-x7k2p";
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    volumes.as_array_mut().expect("volumes").push(json!({
        "name": token,
        "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
        ]}
    }));
    for list in ["initContainers", "containers"] {
        for container in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let container = container.as_object_mut().expect("container");
            for (key, value) in [
                ("imagePullPolicy", json!("IfNotPresent")),
                ("resources", json!({})),
                ("terminationMessagePath", json!("/dev/termination-log")),
                ("terminationMessagePolicy", json!("File")),
            ] {
                container.entry(key).or_insert(value);
            }
            let mounts = container.entry("volumeMounts").or_insert_with(|| json!([]));
            mounts.as_array_mut().expect("mounts").push(json!({
                "name": token, "readOnly": true,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
            }));
        }
    }
    pod
}

/// The AdmissionReview v1 the API server posts for creating `pod`.
pub fn review(uid: &str, pod: &Value, dry_run: bool) -> Value {
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "1f0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                           "system:authenticated"]
            },
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// `pod` with the response's JSONPatch applied by json-patch (an independent RFC 6902
/// implementation); `pod` itself when the response has no patch.
pub fn patched(pod: &Value, reply: &Value) -> Value {
    let response = &reply["response"];
    let Some(encoded) = response["patch"].as_str() else {
        return pod.clone();
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("the patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("an RFC 6902 patch");
    let mut document = pod.clone();
    json_patch::patch(&mut document, &patch).expect("the patch applies to the pod");
    document
}

/// What `sluice inject FLAGS` (the real binary) prints for `pod` (given as JSON, which is YAML),
/// back as JSON.
pub async fn sluice_inject(pod: &Value, flags: &[String]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("pod.json");
    std::fs::write(&input, pod.to_string()).expect("write");
    let mut args = vec!["inject".to_owned()];
    args.extend(flags.iter().cloned());
    args.push(input.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = run_async(sluice_command(&repo_root(), &args)).await;
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&outcome.stdout).expect("YAML out");
    serde_json::to_value(yaml).expect("JSON-compatible")
}

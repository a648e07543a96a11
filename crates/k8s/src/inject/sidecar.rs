//! What `sluice inject` adds to a pod: the native sidecar container, its volumes, and the socket
//! mount and environment of the application containers. The same shape as `deploy/k8s/base`.

use serde_yaml::Value;

use super::quantity::Quantity;

/// Name of the sidecar container (an init container with `restartPolicy: Always`).
pub const CONTAINER: &str = "sluice";
/// The `emptyDir` volume shared by the sidecar and the application containers.
pub const SOCKET_VOLUME: &str = "sluice-socket";
/// The ConfigMap volume holding `policies.yaml`.
pub const POLICIES_VOLUME: &str = "sluice-policies";
/// Where the socket directory is mounted in every container.
pub const SOCKET_DIR: &str = "/var/run/sluice";
/// The socket the application containers call (`SLUICE_SOCKET`).
pub const SOCKET_PATH: &str = "/var/run/sluice/sluice.sock";
/// The TCP check API, loopback only (`SLUICE_URL`).
pub const CHECK_URL: &str = "http://127.0.0.1:7070";
/// The gRPC rate limit service (`envoy.service.ratelimit.v3`) on TCP, loopback only, with
/// `--grpc` or `sluice.io/grpc: enabled`: where Envoy, Istio's sidecar or Envoy Gateway point
/// their rate limit filter.
pub const GRPC_ADDR: &str = "127.0.0.1:8081";
/// The same service on the shared socket volume, for an Envoy container of the pod.
pub const GRPC_SOCKET_PATH: &str = "/var/run/sluice/rls.sock";
/// The admin port: probes and Prometheus reach it on the pod IP.
pub const ADMIN_PORT: u16 = 7071;
/// The pod annotation that keeps inbound ports out of Istio's traffic capture.
pub const ISTIO_EXCLUDE_INBOUND: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
/// The sidecar's ports that must stay pod-local under a mesh: the check API, the admin port and
/// the gRPC service. Captured, a mesh peer's connection reaches them from the mesh proxy's
/// `127.0.0.6` (Istio REDIRECT mode); excluded, it arrives from the peer's own address, which
/// the 127.0.0.1-bound listeners never see and the admin listener treats as remote.
pub const MESH_EXCLUDED_PORTS: [u16; 3] = [7070, ADMIN_PORT, 8081];
/// Pod label that marks injected pods (the PodMonitor selects it).
pub const LABEL: &str = "sluice.io/injected";

/// Knobs of the injected sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Container image of the daemon.
    pub image: String,
    /// ConfigMap with a `policies.yaml` key.
    pub policies_configmap: String,
    /// Secret whose keys are `SLUICE_*` variables (the Redis address); optional at run time
    /// unless [`Options::require_redis_secret`].
    pub redis_secret: String,
    /// The pod does not start without its Secret (`optional: false`): a pod of several replicas
    /// that ran on the embedded store would enforce the whole limit alone.
    pub require_redis_secret: bool,
    /// `local.replicas`; `None`: the workload's `spec.replicas`, else 1. A pod's
    /// `sluice.io/replicas` annotation overrides it.
    pub replicas: Option<u64>,
    /// The sidecar's requests and memory limit (a pod's annotations may override them).
    pub resources: Resources,
    /// Serve the gRPC rate limit service too ([`GRPC_ADDR`], [`GRPC_SOCKET_PATH`]).
    pub grpc: bool,
    /// A Secret and its key holding `shadow.fingerprint_key` (the same on every pod, so a fleet
    /// names a partition by one fingerprint): `SLUICE_SHADOW__FINGERPRINT_KEY` from a
    /// `secretKeyRef`, required (a pod without it would key fingerprints at random).
    pub fingerprint_secret: Option<SecretKey>,
    /// Replace a `sluice` container, volume, mount or variable whose settings differ.
    pub overwrite: bool,
    /// Copy documents of unknown kinds unchanged instead of refusing them.
    pub skip_unknown: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            image: default_image(),
            policies_configmap: "sluice-policies".into(),
            redis_secret: "sluice-redis".into(),
            require_redis_secret: false,
            replicas: None,
            resources: Resources::default(),
            grpc: false,
            fingerprint_secret: None,
            overwrite: false,
            skip_unknown: false,
        }
    }
}

/// One key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretKey {
    /// The Secret's name.
    pub name: String,
    /// The key in it.
    pub key: String,
}

/// The key [`Options::fingerprint_secret`] reads when none is named.
pub const DEFAULT_FINGERPRINT_KEY: &str = "fingerprint-key";

/// The sidecar's resources. No CPU limit: CFS throttling would add milliseconds to a
/// sub-millisecond check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// `requests.cpu`.
    pub cpu_request: Quantity,
    /// `requests.memory`.
    pub memory_request: Quantity,
    /// `limits.memory`.
    pub memory_limit: Quantity,
}

impl Default for Resources {
    fn default() -> Self {
        let quantity = |text| Quantity::parse(text).expect("a valid default quantity");
        Self {
            cpu_request: quantity(DEFAULT_CPU_REQUEST),
            memory_request: quantity(DEFAULT_MEMORY_REQUEST),
            memory_limit: quantity(DEFAULT_MEMORY_LIMIT),
        }
    }
}

/// Default `requests.cpu` of the sidecar.
pub const DEFAULT_CPU_REQUEST: &str = "50m";
/// Default `requests.memory` of the sidecar.
pub const DEFAULT_MEMORY_REQUEST: &str = "32Mi";
/// Default `limits.memory` of the sidecar.
pub const DEFAULT_MEMORY_LIMIT: &str = "128Mi";

/// Where the release workflow (`.github/workflows/release.yml`) pushes the image: the one place
/// that names it. The manifests and docs/kubernetes.md carry `<this>:<version>`
/// (tests/deploy/image_name.rs keeps them equal).
pub const IMAGE_REPOSITORY: &str = "ghcr.io/sluice-rs/sluice";

/// `<IMAGE_REPOSITORY>:<version of this binary>`: the image a tag `v<version>` publishes.
pub fn default_image() -> String {
    format!("{IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// A YAML scalar for `text`: JSON strings are valid YAML double-quoted scalars.
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn parse(text: &str) -> Value {
    // The templates below are fixed text with JSON-quoted values: they always parse.
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("sidecar template: {e}\n{text}"))
}

/// The sidecar container for a pod whose limit is shared by `replicas` pods.
pub fn container(options: &Options, replicas: u64) -> Value {
    parse(&format!(
        r#"
name: {CONTAINER}
image: {image}
imagePullPolicy: IfNotPresent
restartPolicy: Always
args: [serve]
env:
  - {{name: SLUICE_LISTEN__HTTP, value: "127.0.0.1:7070"}}
  - {{name: SLUICE_LISTEN__SOCKET, value: "{SOCKET_PATH}"}}
  - {{name: SLUICE_LISTEN__SOCKET_MODE, value: "0666"}}
  - {{name: SLUICE_LISTEN__TRUST_SOCKET_DIR, value: "true"}}
  - {{name: SLUICE_LISTEN__ADMIN, value: "0.0.0.0:{ADMIN_PORT}"}}
  - {{name: SLUICE_POLICIES, value: /etc/sluice/policies}}
  - {{name: SLUICE_LOCAL__REPLICAS, value: "{replicas}"}}
  - {{name: SLUICE_LOG__FORMAT, value: json}}
{grpc}{fingerprint}envFrom:
  - secretRef: {{name: {secret}, optional: {optional}}}
ports:
  - {{name: sluice-admin, containerPort: {ADMIN_PORT}, protocol: TCP}}
startupProbe:
  httpGet: {{path: /readyz, port: sluice-admin}}
  periodSeconds: 1
  failureThreshold: 30
livenessProbe:
  httpGet: {{path: /livez, port: sluice-admin}}
  periodSeconds: 10
  timeoutSeconds: 1
  failureThreshold: 3
readinessProbe:
  httpGet: {{path: /readyz, port: sluice-admin}}
  periodSeconds: 5
  timeoutSeconds: 1
  failureThreshold: 2
resources:
  requests: {{cpu: {cpu}, memory: {memory}}}
  limits: {{memory: {memory_limit}}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities: {{drop: [ALL]}}
  seccompProfile: {{type: RuntimeDefault}}
volumeMounts:
  - {{name: {SOCKET_VOLUME}, mountPath: {SOCKET_DIR}}}
  - {{name: {POLICIES_VOLUME}, mountPath: /etc/sluice/policies, readOnly: true}}
"#,
        image = quoted(&options.image),
        grpc = if options.grpc {
            format!(
                "  - {{name: SLUICE_LISTEN__GRPC, value: \"{GRPC_ADDR}\"}}\n  \
                 - {{name: SLUICE_LISTEN__GRPC_SOCKET, value: \"{GRPC_SOCKET_PATH}\"}}\n"
            )
        } else {
            String::new()
        },
        fingerprint = options
            .fingerprint_secret
            .as_ref()
            .map_or(String::new(), |secret| {
                format!(
                    "  - {{name: SLUICE_SHADOW__FINGERPRINT_KEY, valueFrom: {{secretKeyRef: \
                 {{name: {}, key: {}, optional: false}}}}}}\n",
                    quoted(&secret.name),
                    quoted(&secret.key)
                )
            }),
        secret = quoted(&options.redis_secret),
        optional = !options.require_redis_secret,
        cpu = quoted(options.resources.cpu_request.as_str()),
        memory = quoted(options.resources.memory_request.as_str()),
        memory_limit = quoted(options.resources.memory_limit.as_str()),
    ))
}

/// The pod volumes the sidecar needs, in the order they are added.
pub fn volumes(options: &Options) -> Vec<Value> {
    vec![
        parse(&format!(
            "{{name: {SOCKET_VOLUME}, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}"
        )),
        parse(&format!(
            "{{name: {POLICIES_VOLUME}, configMap: {{name: {}}}}}",
            quoted(&options.policies_configmap)
        )),
    ]
}

/// The mount every application container gets.
pub fn app_mount() -> Value {
    parse(&format!(
        "{{name: {SOCKET_VOLUME}, mountPath: {SOCKET_DIR}}}"
    ))
}

/// The variables every application container gets, telling clients where the daemon is.
pub fn app_env() -> Vec<Value> {
    vec![
        parse(&format!("{{name: SLUICE_SOCKET, value: {SOCKET_PATH}}}")),
        parse(&format!("{{name: SLUICE_URL, value: \"{CHECK_URL}\"}}")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_quote_hostile_values() {
        let options = Options {
            image: "reg.example/sluice:1\"\n: x".into(),
            redis_secret: "a: b".into(),
            ..Options::default()
        };
        let c = container(&options, 3);
        assert_eq!(c["image"].as_str(), Some("reg.example/sluice:1\"\n: x"));
        assert_eq!(c["envFrom"][0]["secretRef"]["name"].as_str(), Some("a: b"));
        assert_eq!(c["restartPolicy"].as_str(), Some("Always"));
        let replicas = c["env"]
            .as_sequence()
            .and_then(|env| env.iter().find(|e| e["name"] == "SLUICE_LOCAL__REPLICAS"))
            .expect("replicas variable");
        assert_eq!(replicas["value"].as_str(), Some("3"));
        assert_eq!(volumes(&options).len(), 2);
        let grpc = container(
            &Options {
                grpc: true,
                ..options.clone()
            },
            1,
        );
        let names: Vec<&str> = grpc["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(names.contains(&"SLUICE_LISTEN__GRPC_SOCKET"), "{names:?}");
        assert!(!c["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "SLUICE_LISTEN__GRPC"));
        assert_eq!(app_env()[1]["value"].as_str(), Some(CHECK_URL));
        assert_eq!(app_mount()["mountPath"].as_str(), Some(SOCKET_DIR));
    }

    #[test]
    fn the_fingerprint_key_comes_from_its_secret_only_when_named() {
        let fingerprint = |c: &Value| {
            c["env"]
                .as_sequence()
                .expect("env")
                .iter()
                .find(|e| e["name"] == "SLUICE_SHADOW__FINGERPRINT_KEY")
                .cloned()
        };
        assert_eq!(fingerprint(&container(&Options::default(), 1)), None);
        let options = Options {
            fingerprint_secret: Some(SecretKey {
                name: "fleet: fp".into(),
                key: DEFAULT_FINGERPRINT_KEY.into(),
            }),
            ..Options::default()
        };
        let var = fingerprint(&container(&options, 1)).expect("the variable");
        let reference = &var["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"].as_str(), Some("fleet: fp"));
        assert_eq!(reference["key"].as_str(), Some("fingerprint-key"));
        assert_eq!(reference["optional"].as_bool(), Some(false));
        assert!(var.get("value").is_none(), "{var:?}");
    }
}

//! Checks of what ships beside the daemon: the Dockerfile and the image built from it (podman),
//! the Kubernetes manifests and kustomize overlays (`kubectl kustomize`, kubernetes-validate), the
//! injector's manifests, the client examples, the client libraries (their suites, and as packages
//! installed into a fresh app), the nginx example, the dashboards and alerts
//! against a real Prometheus, and a short run of the bench's through-Envoy rows.

// The API tests' support modules (each resolves its siblings as `crate::NAME`); this binary uses
// some of them.
#[allow(unused)]
#[path = "../api/support/mod.rs"]
mod support;
#[allow(unused_imports)]
use support::{
    grpc_client, helpers, injector_support, kustomize, otlp_receiver, redis_server, store_binaries,
    stores, tls_pki, tools, wait,
};

mod bench;
mod client_packages;
mod clients;
mod dockerfile;
mod examples;
mod fingerprint_recipe;
mod image;
mod image_name;
mod inject_fingerprint;
mod injector_manifests;
mod k8s;
mod k8s_grpc;
mod nginx;
mod observability;

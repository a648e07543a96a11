//! Integration tests of the public API: real daemons on loopback and temporary Unix sockets (with a
//! manual clock), and the real `sluice` binary.

mod admin;
mod authz;
mod bad_input;
mod batch;
mod check;
mod cli;
mod examples;
mod grpc;
mod grpc_client;
mod grpc_envoy_config;
mod grpc_envoy_example;
mod grpc_redis;
mod grpc_stock_client;
mod helpers;
mod inject;
mod k8s;
mod kustomize;
mod observability;
mod policies;
mod policy_layer;
mod redis_acl;
mod redis_batch;
mod redis_differential;
mod redis_exactness;
mod redis_failures;
mod redis_policies;
mod redis_server;
mod redis_store;
mod redis_tls;
mod redis_tls_topologies;
mod reload_signal;
mod shutdown;
mod tls_pki;
mod tools;
mod transports;

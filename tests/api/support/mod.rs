//! What the scenarios share: a daemon to test ([`helpers`]), bounded waits ([`wait`]), every store
//! ([`stores`], [`redis_server`], [`store_binaries`], [`tls_pki`]), clients of the other
//! protocols ([`grpc_client`], [`otlp_receiver`], [`injector_support`]) and the external programs
//! some tests need ([`tools`]).
//! The `deploy` test binary includes this folder too.

pub mod grpc_client;
pub mod helpers;
pub mod injector_support;
pub mod kustomize;
pub mod otlp_receiver;
pub mod redis_server;
pub mod store_binaries;
pub mod stores;
pub mod tls_pki;
pub mod tools;
pub mod wait;

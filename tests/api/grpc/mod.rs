//! Envoy's rate limit service (gRPC): the check itself, the Envoy configurations it is used with,
//! hostile and stock clients, and the Unix socket's `:authority`.

mod check;
mod concurrency;
mod envoy_config;
mod envoy_example;
mod envoy_stand_in;
mod fd_limit;
mod hardening;
mod raw_frames;
mod redis;
mod rlqs;
mod rlqs_budget;
mod rlqs_flow;
pub mod stock_client;
mod uds_authority;

//! sluice: a rate-limit sidecar daemon.
//!
//! Dependencies point one way: [`limit`] (pure math) <- [`store`] (where state lives) <-
//! [`check`] (the one decision path) <- [`transport`] (HTTP on TCP and a Unix socket, admin) <-
//! [`app`] (binds and runs everything) <- `main`. [`config`], [`clock`] and [`telemetry`] are
//! leaves that the others may use; [`tenants`] (the tenant tier table) sits beside `store`.

pub mod app;
pub mod check;
pub mod client;
pub mod clock;
pub mod config;
pub mod limit;
pub mod logging;
pub mod process_cpu;
pub mod reload;
pub mod store;
pub mod telemetry;
pub mod tenants;
pub mod transport;

//! sluice's daemon: the library the `sluice` binary, the bench and the Kubernetes tools build on.
//!
//! Modules point one way (ARCHITECTURE.md; `tests/arrows.rs` keeps it): [`limit`] (pure math) <-
//! [`clock`], [`config`], [`client`] <- [`store`] (where state lives) <- [`tenants`] <- [`check`]
//! (the one decision path) <- [`transport`] (HTTP on TCP and a Unix socket, gRPC, admin) and
//! [`reload`] <- [`app`] (binds and runs everything). [`telemetry`] (with [`logging`] and
//! [`process_cpu`]) may be used from `store` up.

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

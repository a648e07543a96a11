//! The Redis store: the scripts against their Rust twins, batches, exactness across daemons,
//! failures and failover, ACL users, TLS, and the settings that pick a topology.

pub mod acl;
pub mod batch;
mod calendar;
pub mod differential;
pub(crate) mod exactness;
mod failures;
mod generation;
mod lease_changes;
mod lease_epoch;
mod lease_fleet;
mod lease_ledger;
mod lease_ops;
mod lease_over_limit;
mod lease_twins;
mod leases;
mod log_runs;
mod lowered_limit;
mod permit_twins;
mod permits_fleet;
mod policies;
mod reservations_fleet;
mod reshard;
pub mod serve_env;
mod single;
mod starved;
mod store;
pub mod tls;
mod tls_topologies;

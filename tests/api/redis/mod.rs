//! The Redis store: the scripts against their Rust twins, batches, exactness across daemons,
//! failures and failover, ACL users, TLS, and the settings that pick a topology.

pub mod acl;
pub mod batch;
mod calendar;
pub mod differential;
pub(crate) mod exactness;
mod failures;
mod generation;
mod lease_beneath;
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

use std::time::Duration;

use tempfile::TempDir;

use crate::helpers::ChildGuard;
use crate::redis_server::{spawn_sentinel, wait_until, RedisServer};

/// One Sentinel (quorum 1) watching `primary` as `mymaster`, answering for it once started:
/// the Sentinel process (killed on drop), its port, and its directory.
pub(crate) fn sentinel_of(primary: &RedisServer) -> (ChildGuard, u16, TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = RedisServer::free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\n",
            dir.path().display(),
            primary.port
        ),
    )
    .expect("sentinel conf");
    let sentinel = ChildGuard(Some(spawn_sentinel(&conf)));
    wait_until("sentinel", || {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg("mymaster")
                    .query::<Vec<String>>(&mut c)
            })
            .is_ok_and(|addr| addr.len() == 2)
    });
    (sentinel, port, dir)
}

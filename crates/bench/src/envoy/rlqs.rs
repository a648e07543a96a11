//! The RLQS rows of `--systems envoy`: Envoy's `rate_limit_quota` filter reporting usage to
//! sluice's Rate Limit Quota Service on one stream and admitting from the token-bucket
//! assignments it gets back, so no call to sluice sits on the request path.
//!
//! - The measured rows (`envoy + rlqs tcp`, `envoy + rlqs uds`) put every request in one bucket
//!   per listener, limited by a fixed window that is never reached, on Redis: each assignment is
//!   backed by a lease taken there, as in production. Envoy 1.40 reports every ~5 s whatever
//!   `reporting_interval` says, and an assignment is sized by the demand of the last report
//!   (docs/envoy.md), so a bucket whose load just began is denied until a report has seen it. A
//!   row is measured right after its warm-up sees an assignment sized for its load ([`warm_up`]);
//!   it counts the 429s apart (`denied`) and times only the admitted requests.
//! - The fleet run: [`FLEET_ENVOYS`] Envoys (over TCP and the socket in turn) share
//!   one fixed window of [`FLEET_LIMIT`] that the load reaches; admitted must never pass it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use super::{cluster, http2, listener, tcp, Envoy, PATH};
use crate::load::{self, CallFuture, Client, Factory, KeyMix};
use crate::procs::{free_addr, Daemon};
use sluice::client::{Connection, Target};

/// The bucket key of the measured rows (its value names the listener's transport).
pub const MEASURED: &str = "rlqs";
/// The bucket key of the fleet run.
const FLEET: &str = "rlqs_fleet";

/// Envoys in the fleet run.
pub const FLEET_ENVOYS: usize = 3;
/// The fleet's shared limit (a fixed window of an hour: the run stays in one window, or its
/// bound counts two).
pub const FLEET_LIMIT: u64 = 1_000;
const FLEET_PERIOD_S: u64 = 3_600;

/// The policies of the RLQS buckets (a policy applies where its key descriptor is present, so
/// each bucket meets exactly one): the measured rows' limit is never reached, the fleet's is.
pub const POLICIES: &str = "
  - {name: envoy_rlqs, key: [rlqs], algorithm: fixed_window, limit: 1000000000, period: 1h, failure_mode: closed}
  - {name: envoy_rlqs_fleet, key: [rlqs_fleet], algorithm: fixed_window, limit: 1000, period: 1h, failure_mode: closed}
";

/// The `rate_limit_quota` filter asking sluice through `cluster`, every request in the bucket
/// `{key: value}`. As docs/envoy.md says to configure it: no assignment, no admission.
pub fn filter(cluster: &str, key: &str, value: &str) -> Value {
    json!({
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "rlqs_server": { "envoy_grpc": { "cluster_name": cluster } },
            "domain": "bench",
            "bucket_matchers": { "on_no_match": { "action": {
                "name": "rate_limit_quota",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                    "bucket_id_builder": { "bucket_id_builder": {
                        key: { "string_value": value }
                    }},
                    "reporting_interval": "1s",
                    "no_assignment_behavior": {
                        "fallback_rate_limit": { "blanket_rule": "DENY_ALL" }
                    }
                }
            }}}
        }
    })
}

/// Envoy 1.40's report interval (its source hard-codes it, whatever `reporting_interval` says).
const REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// One warm-up round: load at the row's own connections, every answer a 200 to pass.
const WARM_UP_ROUND: Duration = Duration::from_millis(500);
/// Warm-up rounds at most, and the longest warm-up.
const WARM_UP_ROUNDS: usize = 60;
const WARM_UP_LIMIT: Duration = Duration::from_secs(30);

/// Loads the RLQS listener at `addr` with `clients` connections, in rounds of
/// [`WARM_UP_ROUND`], until a round in which every request passed, once the load has run for
/// more than two report intervals: by then a report of a whole interval under this load has
/// sized (or replaced) the assignment that holds. After one interval only, the report that sized
/// it could cover the load's first moments and an idle rest, so that the assignment could run
/// out within the measurement. At most [`WARM_UP_ROUNDS`] rounds
/// and [`WARM_UP_LIMIT`]. `Ok(None)` when it passed, else why not. The measurement follows at
/// once, with no warm-up of its own: the assignment lasts until the next report and is renewed
/// there.
pub async fn warm_up(addr: SocketAddr, clients: usize) -> Result<Option<String>> {
    let started = Instant::now();
    let factory = self::clients(addr, Arc::new(AtomicU64::new(0)));
    for round in 1..=WARM_UP_ROUNDS {
        let run = load::closed(
            &factory,
            clients,
            &KeyMix::Hot,
            Duration::ZERO,
            WARM_UP_ROUND,
        )
        .await?;
        let loaded = started.elapsed() > 2 * REPORT_INTERVAL + WARM_UP_ROUND;
        if loaded && run.checks > 0 && run.errors == 0 {
            return Ok(None);
        }
        if started.elapsed() > WARM_UP_LIMIT {
            return Ok(Some(format!(
                "no {} ms round with every request admitted within {:.0} s ({round} rounds)",
                WARM_UP_ROUND.as_millis(),
                WARM_UP_LIMIT.as_secs_f64()
            )));
        }
    }
    Ok(Some(format!(
        "no {} ms round with every request admitted in {WARM_UP_ROUNDS} rounds",
        WARM_UP_ROUND.as_millis()
    )))
}

/// One request through `addr` on `conn` (opened first if need be); its status. Envoy closes the
/// connection after a 429 of the quota filter (`connection: close`): `conn` is then dropped, to
/// be opened again by the next request.
async fn send(addr: SocketAddr, conn: &mut Option<Connection>) -> Result<u16> {
    let open = match conn {
        Some(open) => open,
        None => conn.insert(Connection::open(&Target::Tcp(addr)).await?),
    };
    let reply = match open.post_bytes(PATH, Bytes::from_static(b"{}")).await {
        Ok(reply) => reply,
        Err(error) => {
            *conn = None;
            return Err(error.into());
        }
    };
    if reply.header("connection") == Some("close") {
        *conn = None;
    }
    Ok(reply.status.as_u16())
}

struct Quota {
    addr: SocketAddr,
    conn: Option<Connection>,
    denied: Arc<AtomicU64>,
}

impl Client for Quota {
    fn call(&mut self, _key: usize) -> CallFuture<'_> {
        Box::pin(async move {
            let status = send(self.addr, &mut self.conn).await?;
            if status == 429 {
                self.denied.fetch_add(1, Ordering::Relaxed);
            }
            Ok(status == 200)
        })
    }
}

/// Keep-alive clients of the RLQS listener at `addr`: a 200 is a right answer (timed), a 429
/// (Envoy held no assignment) is counted in `denied`, and, like any other outcome, not timed.
pub fn clients(addr: SocketAddr, denied: Arc<AtomicU64>) -> Factory {
    Arc::new(move || {
        let denied = Arc::clone(&denied);
        Box::pin(async move {
            let conn = Connection::open(&Target::Tcp(addr)).await?;
            Ok(Box::new(Quota {
                addr,
                conn: Some(conn),
                denied,
            }) as Box<dyn Client>)
        })
    })
}

/// The fleet run's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    /// Envoys sharing the limit.
    pub envoys: usize,
    /// The policy's limit per window.
    pub limit: u64,
    /// What may be admitted: the limit times the windows the run touched.
    pub bound: u64,
    /// Requests answered.
    pub requests: u64,
    /// 200s.
    pub admitted: u64,
    /// 429s.
    pub denied: u64,
    /// Transport errors and other statuses.
    pub failed: u64,
    /// Seconds from the first request until 95% of the limit was admitted (`None`: never).
    pub reached_s: Option<f64>,
    /// Seconds the load ran.
    pub seconds: f64,
}

impl Fleet {
    /// Whether the fleet admitted no more than the limit allows.
    pub fn exact(&self) -> bool {
        self.admitted <= self.bound
    }
}

/// Connections per fleet Envoy, and the pause between one's requests (the load need not spin:
/// it only has to exceed the limit).
const FLEET_CONNECTIONS: usize = 4;
const FLEET_PAUSE: Duration = Duration::from_millis(1);
/// Load after the limit is (nearly) reached, to catch any admission past it: longer than one
/// of Envoy 1.40's 5 s report intervals, so every Envoy asks again after the counter ran out.
/// And the longest run.
const FLEET_AFTER: Duration = Duration::from_secs(6);
const FLEET_LONGEST: Duration = Duration::from_secs(25);

/// Admitted/limit at which the limit counts as reached: the last units of a window may stay
/// in the store for later takes, or in a lease an Envoy did not spend.
fn reached(admitted: u64) -> bool {
    admitted * 100 >= FLEET_LIMIT * 95
}

/// Starts [`FLEET_ENVOYS`] Envoys in front of `upstream`, each asking `daemon` (TCP and socket
/// in turn) for the one shared bucket, loads them until 95% of the limit is admitted and
/// [`FLEET_AFTER`] more (at most [`FLEET_LONGEST`]), and counts what they answered.
pub async fn fleet(
    binary: &std::path::Path,
    upstream: SocketAddr,
    daemon: &Daemon,
) -> Result<Fleet> {
    let mut envoys = Vec::with_capacity(FLEET_ENVOYS);
    for n in 0..FLEET_ENVOYS {
        let address = match n % 2 {
            0 => tcp(daemon.grpc),
            _ => json!({ "pipe": { "path": daemon.grpc_socket.display().to_string() } }),
        };
        let (addr, admin) = (free_addr()?, free_addr()?);
        let config = json!({
            "admin": { "address": tcp(admin) },
            "static_resources": {
                "listeners": [listener(n, addr, vec![filter("sluice_rlqs", FLEET, "shared")])],
                "clusters": [
                    cluster("upstream", tcp(upstream), None),
                    cluster("sluice_rlqs", address, Some(http2())),
                ]
            }
        });
        let mut envoy = Envoy::spawn(binary, &config, vec![addr], admin)?;
        envoy.wait_live().await?;
        envoys.push(envoy);
    }
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let windows_from = window_now();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for addr in envoys.iter().flat_map(|e| e.listeners.clone()) {
        for _ in 0..FLEET_CONNECTIONS {
            let (tally, stop) = (Arc::clone(&tally), Arc::clone(&stop));
            tasks.spawn(async move { load(addr, &tally, &stop).await });
        }
    }
    let mut reached = None;
    while started.elapsed() < FLEET_LONGEST {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if reached.is_none() && self::reached(tally.admitted.load(Ordering::Relaxed)) {
            reached = Some(started.elapsed());
        }
        if reached.is_some_and(|at| started.elapsed() >= at + FLEET_AFTER) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let windows = window_now() - windows_from + 1;
    let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let (admitted, denied, failed) = (get(&tally.admitted), get(&tally.denied), get(&tally.failed));
    Ok(Fleet {
        envoys: FLEET_ENVOYS,
        limit: FLEET_LIMIT,
        bound: FLEET_LIMIT * windows,
        requests: admitted + denied + failed,
        admitted,
        denied,
        failed,
        reached_s: reached.map(|at| at.as_secs_f64()),
        seconds,
    })
}

#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    denied: AtomicU64,
    failed: AtomicU64,
}

/// One connection's requests until `stop`, each answer counted in `tally` (a lost connection is
/// opened again).
async fn load(addr: SocketAddr, tally: &Tally, stop: &AtomicBool) {
    let mut conn = None;
    while !stop.load(Ordering::Relaxed) {
        let status = send(addr, &mut conn).await.unwrap_or(0);
        let counter = match status {
            200 => &tally.admitted,
            429 => &tally.denied,
            _ => &tally.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(FLEET_PAUSE).await;
    }
}

/// The number of the fleet policy's window now (windows start at multiples of the period since
/// the epoch, on this machine's clock, which Redis on loopback shares).
fn window_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / FLEET_PERIOD_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_policy_is_the_fleet_limit_and_each_bucket_meets_one_policy() {
        let line = POLICIES
            .lines()
            .find(|l| l.contains("[rlqs_fleet]"))
            .expect("fleet policy");
        assert!(line.contains(&format!("limit: {FLEET_LIMIT},")), "{line}");
        assert!(line.contains("period: 1h") && FLEET_PERIOD_S == 3_600);
        assert_eq!(POLICIES.matches("key: [rlqs]").count(), 1);
        let bucket = filter("c", MEASURED, "tcp");
        let settings =
            &bucket["typed_config"]["bucket_matchers"]["on_no_match"]["action"]["typed_config"];
        assert_eq!(
            settings["bucket_id_builder"]["bucket_id_builder"][MEASURED]["string_value"],
            "tcp"
        );
        assert_eq!(
            settings["no_assignment_behavior"]["fallback_rate_limit"]["blanket_rule"],
            "DENY_ALL"
        );
    }

    #[test]
    fn a_fleet_is_exact_up_to_its_bound() {
        let fleet = |admitted| Fleet {
            envoys: 3,
            limit: 10,
            bound: 10,
            requests: 50,
            admitted,
            denied: 50 - admitted,
            failed: 0,
            reached_s: None,
            seconds: 1.0,
        };
        assert!(fleet(10).exact());
        assert!(!fleet(11).exact());
    }
}

//! Overload is not an outage: a daemon with its default settings (the Redis deadline included),
//! driven past saturation on one hot key with a real limit (token bucket 1000/min, burst 150,
//! failing open), must keep every answer enforced by Redis (no failure-mode answers while Redis is
//! healthy) and admit no more than the limit allows over the run: burst + rate x elapsed time.
//! Run twice: as is, and with a `local_limit` equal to the limit in front of Redis, counting the
//! Redis script calls per check each time (what the local limit keeps off Redis). A third run,
//! `wide`, asks about a fresh key every time (nothing is denied, so every check reaches Redis):
//! on a healthy Redis it must give no failure-mode answer, however busy the host (`--hog`).

use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use serde::Serialize;

use super::procs::{Daemon, Redis};
use sluice::client::{Connection, Target};

const POLICY: &str = "
policies:
  - {name: hot, key: [k], algorithm: token_bucket, limit: 1000, period: 1m, burst: 150, failure_mode: open}
  - {name: hot_local, key: [k], algorithm: token_bucket, limit: 1000, period: 1m, burst: 150, failure_mode: open, local_limit: {limit: 1000, period: 1m, burst: 150}}
  - {name: wide, key: [k], algorithm: token_bucket, limit: 1000, period: 1m, burst: 150, failure_mode: open}
";

/// Which overload run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storm {
    /// Every client on one key (`hot`).
    Hot,
    /// The same behind a local limit (`hot_local`).
    HotLocal,
    /// Every check on a key of its own (`wide`): all reach Redis, none is denied.
    Wide,
}

impl Storm {
    fn policy(self) -> &'static str {
        match self {
            Self::Hot => "hot",
            Self::HotLocal => "hot_local",
            Self::Wide => "wide",
        }
    }
}

/// What an overload run found.
#[derive(Debug, Clone, Serialize)]
pub struct Overload {
    /// `hot`, `hot_local` (the same with a `local_limit` of 1000/min, burst 150), or `wide` (a
    /// fresh key per check).
    pub policy: &'static str,
    /// Concurrent clients on the one key.
    pub clients: usize,
    /// Length of the run, seconds.
    pub seconds: f64,
    /// Answers per second.
    pub rate: f64,
    /// Answers by Redis (`mode: enforced`).
    pub enforced: u64,
    /// Failure-mode answers (`fail_open`): should be 0 with a healthy Redis.
    pub fail_open: u64,
    /// Admitted requests.
    pub admitted: u64,
    /// The most the limit allows over the run: burst + 1000/min x elapsed.
    pub bound: u64,
    /// Failed requests (transport errors).
    pub errors: u64,
    /// The daemon's Redis errors by kind during the run (`sluice_redis_errors_total`, non-zero).
    pub redis_errors: Vec<String>,
    /// Redis script calls (`EVALSHA` and `EVAL`, `INFO commandstats`) during the run.
    pub redis_calls: f64,
    /// Redis script calls per answer.
    pub calls_per_check: f64,
    /// Answers by the local layer of remembered denials (`sluice_local_layer_hits_total`).
    pub local_layer_hits: f64,
    /// Answers by the local limit (`outcome="local_limit_denied"`).
    pub local_limit_denied: f64,
    /// Checks that reached Redis: answers less those of the local layer and the local limit.
    pub reached_redis: f64,
}

/// Drives `clients` closed-loop clients at a fresh daemon for `duration`, in the `storm` run.
pub async fn measure(
    redis: &Redis,
    clients: usize,
    threads: usize,
    duration: Duration,
    storm: Storm,
) -> Result<Overload> {
    // The daemon's own defaults: its Redis deadline, the local layer on.
    let daemon = Daemon::start_with(Some(&redis.url()), POLICY, threads, "", false)?;
    let policy = storm.policy();
    let body = Bytes::from(format!(
        r#"{{"policy":"{policy}","descriptors":{{"k":"storm"}}}}"#
    ));
    let calls_before = super::report::script_stats(&redis.url())?;
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let target = Target::Tcp(daemon.http);
        let body = body.clone();
        tasks.spawn(async move {
            let mut sent = 0u64;
            let mut body_of = move || match storm {
                Storm::Wide => {
                    sent += 1;
                    Bytes::from(format!(
                        r#"{{"policy":"wide","descriptors":{{"k":"c{client}-{sent}"}}}}"#
                    ))
                }
                _ => body.clone(),
            };
            let mut counts = [0u64; 4]; // enforced, fail_open, admitted, errors
            let Ok(mut conn) = Connection::open(&target).await else {
                counts[3] += 1;
                return counts;
            };
            while Instant::now() < end {
                match conn.post_bytes("/v1/check", body_of()).await {
                    Ok(reply) => {
                        let text = String::from_utf8_lossy(&reply.body);
                        if text.contains(r#""mode":"fail_open""#) {
                            counts[1] += 1;
                        } else {
                            counts[0] += 1;
                        }
                        counts[2] += u64::from(reply.status.as_u16() == 200);
                    }
                    Err(_) => counts[3] += 1,
                }
            }
            counts
        });
    }
    let mut totals = [0u64; 4];
    while let Some(done) = tasks.join_next().await {
        let counts = done.unwrap_or([0, 0, 0, 1]);
        for (total, count) in totals.iter_mut().zip(counts) {
            *total += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let redis_calls = super::report::script_stats(&redis.url())?.calls_since(&calls_before);
    let answers = totals[0] + totals[1];
    let metrics =
        sluice::client::request(&Target::Tcp(daemon.admin), Method::GET, "/metrics", None)
            .await
            .map(|reply| String::from_utf8_lossy(&reply.body).into_owned())
            .unwrap_or_default();
    let redis_errors = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_redis_errors_total{") && !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect();
    // Label order in the text is the registry's: match each label on its own.
    let sum_of = |prefix: &str, labels: &[&str]| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix) && labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |sum, value| sum + value)
    };
    let policy_label = format!("policy=\"{policy}\"");
    let local_layer_hits = sum_of("sluice_local_layer_hits_total{", &[&policy_label]);
    let local_limit_denied = sum_of(
        "sluice_decisions_total{",
        &[&policy_label, "outcome=\"local_limit_denied\""],
    );
    drop(daemon);
    Ok(Overload {
        policy,
        clients,
        seconds: elapsed,
        rate: answers as f64 / elapsed,
        enforced: totals[0],
        fail_open: totals[1],
        admitted: totals[2],
        bound: match storm {
            Storm::Wide => answers,
            _ => 150 + (1000.0 * elapsed / 60.0).ceil() as u64,
        },
        errors: totals[3],
        redis_errors,
        redis_calls,
        calls_per_check: redis_calls / (answers as f64).max(1.0),
        local_layer_hits,
        local_limit_denied,
        reached_redis: (answers as f64 - local_layer_hits - local_limit_denied).max(0.0),
    })
}

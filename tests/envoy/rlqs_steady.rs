//! Steady clients on RLQS assignments through the real Envoy 1.40: one client at 30%, 60%, 90%
//! and 150% of a token bucket's and of a fixed window's rate, two Envoys at 40% of one limit
//! each, six at 13.3% each (80% together). Requests are sent at a fixed rate (open loop), the
//! daemon's clock follows real time, Envoy reports every second; what each client got is
//! printed (the figures docs/envoy.md gives) and held to: at least 95% admitted once the first
//! report interval and the ramp-up are over (90% for each of several Envoys), and over the
//! rate never more than the policy allows, nor 5% less for a window (a drained token bucket:
//! about three quarters of its rate, see docs/envoy.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::grpc_client::{spawn_grpc, GrpcApp};
use crate::helpers::START_US;
use crate::proxy::Envoy;
use crate::rlqs::rlqs_envoy_config;
use crate::rls::Via;

/// 100 a second each: a token bucket with 10 s of burst, an hour's window, a 30 s window.
const POLICIES: &str = "
policies:
  - {name: bucket, match: {bucket: bucket}, key: [bucket], algorithm: token_bucket, limit: 100, period: 1s, burst: 1000}
  - {name: window, match: {bucket: window}, key: [bucket], algorithm: fixed_window, limit: 360000, period: 1h}
  - {name: short, match: {bucket: short}, key: [bucket], algorithm: fixed_window, limit: 3000, period: 30s}
";
/// The policies' rate, a second.
const RATE: f64 = 100.0;
/// How long each client sends.
const RUN: Duration = Duration::from_secs(14);
/// What is not counted: the first report interval (Envoy 1.40 reports every 5 s, whatever
/// `reporting_interval` says) and the report that sizes the assignment by the demand.
const SETTLE: Duration = Duration::from_secs(6);

/// Keeps the daemon's manual clock on real time (from `START_US`) until dropped.
struct RealTime(tokio::task::JoinHandle<()>);

impl RealTime {
    fn follow(daemon: &GrpcApp) -> (Self, Instant) {
        let clock = Arc::clone(&daemon.app.clock);
        let base = Instant::now();
        clock.set(START_US);
        let task = tokio::spawn(async move {
            loop {
                let elapsed = u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX);
                clock.set(START_US + elapsed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        (Self(task), base)
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Requests sent at `per_s` a second for `run` through `envoy`: when each was sent (from
/// `from`) and its status (0: no answer).
async fn steady(envoy: &Envoy, per_s: f64, from: Instant, run: Duration) -> Vec<(Duration, u16)> {
    let started = Instant::now();
    let count = (per_s * run.as_secs_f64()) as u32;
    let mut sends = Vec::with_capacity(count as usize);
    for k in 0..count {
        let due = started + Duration::from_secs_f64(f64::from(k) / per_s);
        tokio::time::sleep_until(due.into()).await;
        let port = envoy.port;
        let at = Instant::now().duration_since(from);
        sends.push(tokio::spawn(async move {
            let answer = crate::proxy::request(port, "GET", "/", &[]).await;
            (at, answer.map_or(0, |a| a.status))
        }));
    }
    let mut out = Vec::with_capacity(sends.len());
    for send in sends {
        out.push(send.await.expect("a request task"));
    }
    out
}

/// Requests admitted in each second of `codes`.
fn per_second(codes: &[(Duration, u16)]) -> Vec<usize> {
    let mut seconds = Vec::new();
    for (at, code) in codes {
        let s = at.as_secs() as usize;
        if seconds.len() <= s {
            seconds.resize(s + 1, 0);
        }
        seconds[s] += usize::from(*code == 200);
    }
    seconds
}

/// Admitted and sent among `codes` sent from `after` on (and before `before`).
fn share(codes: &[(Duration, u16)], after: Duration, before: Duration) -> (usize, usize) {
    let counted: Vec<_> = codes
        .iter()
        .filter(|(at, _)| *at >= after && *at < before)
        .collect();
    let admitted = counted.iter().filter(|(_, code)| *code == 200).count();
    (admitted, counted.len())
}

fn assert_answered(codes: &[(Duration, u16)]) {
    let bad: Vec<_> = codes
        .iter()
        .filter(|(_, c)| *c != 200 && *c != 429)
        .collect();
    assert!(bad.is_empty(), "answers other than 200 and 429: {bad:?}");
}

/// One client at `percent` of the rate of policy `bucket`: the share admitted once settled.
async fn one_client(bucket: &'static str, percent: f64) -> Option<(usize, usize)> {
    let daemon = spawn_grpc(POLICIES).await;
    let (_time, _) = RealTime::follow(&daemon);
    let envoy = Envoy::start(rlqs_envoy_config(&daemon, Via::Socket, bucket)).await?;
    let codes = steady(&envoy, RATE * percent / 100.0, Instant::now(), RUN).await;
    assert_answered(&codes);
    eprintln!(
        "{bucket} at {percent}%: admitted per second {:?}",
        per_second(&codes)
    );
    let (admitted, sent) = share(&codes, SETTLE, Duration::MAX);
    let (all, total) = share(&codes, Duration::ZERO, Duration::MAX);
    eprintln!(
        "{bucket} at {percent}%: {admitted} of {sent} admitted once settled ({all} of {total} in all)"
    );
    if admitted * 100 < sent * 95 {
        eprintln!("{}", envoy.log());
    }
    Some((admitted, sent))
}

async fn below_the_rate(bucket: &'static str) {
    let runs = [30.0, 60.0, 90.0].map(|percent| one_client(bucket, percent));
    for (percent, result) in [30, 60, 90]
        .iter()
        .zip(futures_util::future::join_all(runs).await)
    {
        let Some((admitted, sent)) = result else {
            return;
        };
        assert!(
            admitted * 100 >= sent * 95,
            "{bucket} at {percent}%: {admitted} of {sent} admitted once settled"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_client_below_a_token_buckets_rate_is_admitted() {
    below_the_rate("bucket").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_client_below_a_fixed_windows_rate_is_admitted() {
    below_the_rate("window").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_a_token_buckets_rate_gets_most_of_the_rate_and_no_more() {
    let daemon = spawn_grpc(POLICIES).await;
    let (_time, _) = RealTime::follow(&daemon);
    let Some(envoy) = Envoy::start(rlqs_envoy_config(&daemon, Via::Tcp, "bucket")).await else {
        return;
    };
    // The burst spent first: from here the bucket admits its rate and nothing more.
    let drained = Instant::now();
    let spent = daemon
        .app
        .check_tcp(&json!({"descriptors": {"bucket": "bucket"}, "cost": 1000}))
        .await;
    assert_eq!(spent.status, 200, "{spent:?}");
    let codes = steady(&envoy, RATE * 1.5, Instant::now(), RUN).await;
    let elapsed = drained.elapsed();
    assert_answered(&codes);
    eprintln!(
        "bucket at 150%: admitted per second {:?}",
        per_second(&codes)
    );
    let (all, total) = share(&codes, Duration::ZERO, Duration::MAX);
    let (admitted, sent) = share(&codes, SETTLE, Duration::MAX);
    let most = (RATE * elapsed.as_secs_f64()).ceil() as usize + 1;
    let settled = RATE * (RUN - SETTLE).as_secs_f64();
    eprintln!(
        "bucket at 150%: {all} of {total} admitted (at most {most}); once settled {admitted} of \
         {sent}, the rate allows {settled}"
    );
    assert!(all <= most, "{all} admitted > {most}");
    // A drained bucket's rate is held 6.5 s ahead for a 6 s assignment while 5 s of it refill
    // between two reports (docs/envoy.md): measured about three quarters of the rate.
    assert!(
        admitted as f64 >= settled * 0.65,
        "{admitted} admitted once settled, the rate allows {settled}\n{}",
        envoy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_a_fixed_windows_rate_gets_the_limit_of_each_window_and_no_more() {
    const PERIOD: Duration = Duration::from_secs(30);
    const LIMIT: usize = 3_000;
    let daemon = spawn_grpc(POLICIES).await;
    let (_time, base) = RealTime::follow(&daemon);
    let Some(envoy) = Envoy::start(rlqs_envoy_config(&daemon, Via::Tcp, "short")).await else {
        return;
    };
    // Windows are whole multiples of 30 s of the daemon's clock: start 4 s before one begins
    // and count the next whole window.
    let period_us = PERIOD.as_micros() as u64;
    let now_us = START_US + base.elapsed().as_micros() as u64;
    let mut next = now_us.div_ceil(period_us) * period_us;
    if next - now_us < 4_000_000 {
        next += period_us;
    }
    let start = Duration::from_micros(next - START_US) - Duration::from_secs(4);
    tokio::time::sleep_until((base + start).into()).await;
    let window = Duration::from_micros(next - START_US);
    let codes = steady(&envoy, RATE * 1.5, base, PERIOD + Duration::from_secs(4)).await;
    assert_answered(&codes);
    eprintln!(
        "short window at 150% (from {window:?}): admitted per second {:?}",
        per_second(&codes)
    );
    let (admitted, sent) = share(&codes, window, window + PERIOD);
    eprintln!("short window at 150%: {admitted} of {sent} admitted in one window of {LIMIT}");
    assert!(admitted <= LIMIT, "{admitted} > {LIMIT}");
    assert!(
        admitted * 100 >= LIMIT * 95,
        "{admitted} admitted of {LIMIT}\n{}",
        envoy.log()
    );
}

/// `n` Envoys on one daemon and one bucket of `policy`, each at `percent` of its rate: the
/// share each had admitted once settled.
async fn envoys_sharing(
    bucket: &'static str,
    n: usize,
    percent: f64,
) -> Option<Vec<(usize, usize)>> {
    let daemon = spawn_grpc(POLICIES).await;
    let (_time, _) = RealTime::follow(&daemon);
    let mut envoys = Vec::with_capacity(n);
    for i in 0..n {
        let via = if i % 2 == 0 { Via::Tcp } else { Via::Socket };
        envoys.push(Envoy::start(rlqs_envoy_config(&daemon, via, bucket)).await?);
    }
    let from = Instant::now();
    let runs = envoys
        .iter()
        .map(|envoy| steady(envoy, RATE * percent / 100.0, from, RUN));
    let mut shares = Vec::with_capacity(n);
    for codes in futures_util::future::join_all(runs).await {
        assert_answered(&codes);
        shares.push(share(&codes, SETTLE, Duration::MAX));
    }
    eprintln!("{n} Envoys at {percent}% each of {bucket}: admitted, sent once settled: {shares:?}");
    Some(shares)
}

async fn each_gets_most(bucket: &'static str, n: usize, percent: f64) {
    let Some(shares) = envoys_sharing(bucket, n, percent).await else {
        return;
    };
    for (admitted, sent) in shares {
        assert!(
            admitted * 100 >= sent * 90,
            "{n} Envoys at {percent}% of {bucket}: one had {admitted} of {sent} admitted"
        );
    }
}

/// Each Envoy at 40% of the limit. On the fixed window each is admitted; on the token bucket the
/// figures are printed (docs/envoy.md gives them) and only the bound is held: the Envoy whose
/// leases hold the rate ahead first may leave the other less than its demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_at_40_percent_each_of_one_limit_are_each_admitted_on_a_window() {
    each_gets_most("window", 2, 40.0).await;
    within_the_bucket(2, 40.0).await;
}

/// `n` Envoys at `percent` each of the token bucket: never more than its rate and burst.
async fn within_the_bucket(n: usize, percent: f64) {
    let Some(shares) = envoys_sharing("bucket", n, percent).await else {
        return;
    };
    let admitted: usize = shares.iter().map(|(a, _)| a).sum();
    // Counted over RUN - SETTLE: the rate, and the burst at most.
    let most = (RATE * (RUN - SETTLE).as_secs_f64()) as usize + 1000;
    assert!(admitted <= most, "{admitted} > {most}");
}

/// Six at 40% each would be 240% of the limit; six at 13.3% each are 80% of it. On the fixed
/// window each is admitted; on the token bucket the figures are printed (docs/envoy.md gives
/// them) and only the bound is held: the first Envoys' leases hold most of the burst ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_envoys_at_80_percent_together_are_each_admitted_on_a_window() {
    each_gets_most("window", 6, 80.0 / 6.0).await;
    within_the_bucket(6, 80.0 / 6.0).await;
}

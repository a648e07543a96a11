//! Load generation: N concurrent keep-alive clients as fast as they can (closed loop), or a fixed
//! offered rate served by N clients where latency counts from when a request is handed over, so
//! time spent queued behind slow answers is measured (open loop, no coordinated omission). Keys come from a hot key or a Zipf-distributed set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use tokio::sync::{mpsc, Mutex};

/// One request to the system under test for key number `key`; `Ok(false)` is a wrong answer
/// (counted, not timed).
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<bool>> + Send + 'a>>;

/// A connected client.
pub trait Client: Send {
    /// Sends one request for key `key` and waits for its answer.
    fn call(&mut self, key: usize) -> CallFuture<'_>;
}

/// Makes connected clients.
pub type Factory =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Box<dyn Client>>> + Send>> + Send + Sync>;

/// Which keys requests use.
#[derive(Clone)]
pub enum KeyMix {
    /// Always key 0.
    Hot,
    /// Zipf over many keys: a few are hot, most are cold.
    Zipf(Arc<Vec<f64>>),
}

impl KeyMix {
    /// Zipf with exponent 1 over `n` keys (the cumulative distribution, for sampling).
    pub fn zipf(n: usize) -> Self {
        let weights: Vec<f64> = (1..=n).map(|k| 1.0 / k as f64).collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                cumulative += w / total;
                cumulative
            })
            .collect();
        Self::Zipf(Arc::new(cdf))
    }

    /// A name for reports.
    pub fn name(&self) -> String {
        match self {
            Self::Hot => "hot key".into(),
            Self::Zipf(cdf) => format!("zipf {}", cdf.len()),
        }
    }

    fn sample(&self, rng: &mut u64) -> usize {
        match self {
            Self::Hot => 0,
            Self::Zipf(cdf) => {
                // xorshift64*: plenty for picking keys.
                *rng ^= *rng >> 12;
                *rng ^= *rng << 25;
                *rng ^= *rng >> 27;
                let u =
                    (rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
                cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
            }
        }
    }
}

/// What one run measured.
pub struct Run {
    /// Answers counted (after warm-up).
    pub checks: u64,
    /// Failed or wrong answers.
    pub errors: u64,
    /// Measured time.
    pub elapsed: Duration,
    /// Latency of the right answers in microseconds (a failed or wrong answer is counted in
    /// `errors`, not timed: a refused connection or a fast local denial is no latency of the
    /// system's work).
    pub latency: Histogram<u64>,
}

impl Run {
    /// Answers per second.
    pub fn rate(&self) -> f64 {
        self.checks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds")
}

/// `clients` clients, each sending its next request as soon as the last is answered.
pub async fn closed(
    factory: &Factory,
    clients: usize,
    mix: &KeyMix,
    warmup: Duration,
    duration: Duration,
) -> Result<Run> {
    let start = Instant::now();
    let (record_from, end) = (start + warmup, start + warmup + duration);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let mut client = factory().await?;
        let mix = mix.clone();
        tasks.spawn(async move {
            let mut rng =
                0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let (mut latency, mut checks, mut errors) = (histogram(), 0u64, 0u64);
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let ok = client.call(mix.sample(&mut rng)).await.unwrap_or(false);
                if sent >= record_from {
                    if ok {
                        let _ = latency.record(micros(sent.elapsed()));
                    }
                    checks += 1;
                    errors += u64::from(!ok);
                }
            }
            (latency, checks, errors)
        });
    }
    collect(tasks, duration).await
}

/// `rate` requests per second, scheduled evenly, served by `clients` clients. Latency counts
/// from when a request is handed over, or with `from_due` from when it was due (the pacer's own
/// lateness counted too: `sluice bench --rate`, where the generator has a core of its own).
pub async fn open(
    factory: &Factory,
    clients: usize,
    rate: f64,
    mix: &KeyMix,
    (warmup, duration): (Duration, Duration),
    from_due: bool,
) -> Result<Run> {
    let (tx, rx) = mpsc::channel::<Instant>(1_000_000);
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now() + Duration::from_millis(50);
    let record_from = start + warmup;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let mut client = factory().await?;
        let (mix, rx) = (mix.clone(), Arc::clone(&rx));
        tasks.spawn(async move {
            let mut rng =
                0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let (mut latency, mut checks, mut errors) = (histogram(), 0u64, 0u64);
            loop {
                let Some(scheduled) = rx.lock().await.recv().await else {
                    break;
                };
                let ok = client.call(mix.sample(&mut rng)).await.unwrap_or(false);
                if scheduled >= record_from {
                    if ok {
                        let _ = latency.record(micros(scheduled.elapsed()));
                    }
                    checks += 1;
                    errors += u64::from(!ok);
                }
            }
            (latency, checks, errors)
        });
    }
    let total = ((warmup + duration).as_secs_f64() * rate) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    // Paced by a thread of its own: tokio's timer wakes at most once a millisecond, which hands
    // requests over in bursts of a millisecond's worth (26 at once at 26,000/s), and the burst's
    // last request then waits for all the others: that measured the generator, not the daemon.
    // A thread's sleep wakes within tens of microseconds.
    let pacer = tokio::task::spawn_blocking(move || {
        for i in 0..total {
            let scheduled = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
            if let Some(early) = scheduled.checked_duration_since(Instant::now()) {
                std::thread::sleep(early);
            }
            // Latency counts from the moment the request is handed over: time spent waiting for
            // a free client is the system's (no coordinated omission), while the pacer's own
            // lateness is the generator's and is not counted; with `from_due`, from when it was
            // due, whatever made it late.
            let from = if from_due {
                scheduled
            } else {
                Instant::now().max(scheduled)
            };
            if tx.blocking_send(from).is_err() {
                break;
            }
        }
    });
    pacer.await?;
    collect(tasks, duration).await
}

async fn collect(
    mut tasks: tokio::task::JoinSet<(Histogram<u64>, u64, u64)>,
    elapsed: Duration,
) -> Result<Run> {
    let mut run = Run {
        checks: 0,
        errors: 0,
        elapsed,
        latency: histogram(),
    };
    while let Some(result) = tasks.join_next().await {
        let (latency, checks, errors) = result?;
        run.latency.add(&latency)?;
        run.checks += checks;
        run.errors += errors;
    }
    Ok(run)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

//! A simulated Envoy's rate limit quota filter (1.40, as docs/envoy.md reads it in its source):
//! a real RLQS stream (tonic, the vendored protos) to a daemon's gRPC listener, a bucket per
//! partition of the leased lane (`bucket_id` `{lane: q, user: u<part>}`, domain `sim`), and the
//! local decisions Envoy makes on what the daemon assigns:
//! - no assignment, an expired one: `DENY_ALL` (docs/envoy.md's `no_assignment_behavior`);
//! - a token bucket of `max_tokens`, refilled continuously at `tokens_per_fill` per whole
//!   second of `fill_interval` (none under a second: no bound at all), one token a request;
//! - the same `max_tokens`, `tokens_per_fill` and `fill_interval` nanos again: a renewal (the
//!   running bucket kept, a fresh time to live); other settings: a replacement, started at the
//!   old bucket's remaining fraction of the new `max_tokens`; after a blanket rule or an expiry
//!   a new bucket starts full;
//! - the whole seconds of `assignment_time_to_live`; an abandon action drops the bucket;
//! - a bucket's first request reported at once; every report carries every bucket's requests
//!   allowed and denied since the last one.
//!
//! Each token-bucket assignment remembers the ledger's break count of its partition when it
//! started ([`super::lane::Ledger::breaks`]): its tokens may be the old counter's units.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice::transport::grpc::proto::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy,
};
use sluice::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::bucket_action::BucketAction as Action,
    rate_limit_quota_service_client::RateLimitQuotaServiceClient,
    rate_limit_quota_usage_reports::BucketQuotaUsage, BucketId, RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tonic::Streaming;

/// Longest the simulator waits for the answer to a periodic report (one that changes nothing
/// is not answered), and to a bucket's first report (not answered either when its lease backs
/// nothing: a window about to end).
const ANSWER: Duration = Duration::from_millis(300);
const FIRST_ANSWER: Duration = Duration::from_secs(1);

/// The token bucket settings Envoy compares for a renewal: `max_tokens`, `tokens_per_fill`,
/// `fill_interval` nanos.
type Settings = (u32, u32, i32);

/// What one bucket of the filter does with a request.
#[derive(Clone, Debug)]
enum Rule {
    /// No assignment (or it expired): `no_assignment_behavior`, `DENY_ALL`.
    None,
    /// A blanket rule until its time to live ends.
    Blanket { allow: bool, until: Instant },
    /// A token bucket.
    Tokens {
        settings: Settings,
        /// Tokens a second (`None`: a `fill_interval` under a second, no bound).
        rate: Option<f64>,
        tokens: f64,
        refilled: Instant,
        until: Instant,
        /// The ledger's break count of the partition when this bucket started.
        since: u64,
    },
}

#[derive(Clone, Debug)]
struct Bucket {
    rule: Rule,
    allowed: u64,
    denied: u64,
    /// When its requests were last reported.
    reported: Instant,
}

impl Bucket {
    /// The rule at `now` (an expired assignment falls back to no assignment).
    fn rule(&mut self, now: Instant) -> &mut Rule {
        let expired = match &self.rule {
            Rule::Blanket { until, .. } | Rule::Tokens { until, .. } => now >= *until,
            Rule::None => false,
        };
        if expired {
            self.rule = Rule::None;
        }
        &mut self.rule
    }
}

/// One request decided: allowed, and the break count of the token bucket that allowed it.
pub struct Decided {
    pub allowed: bool,
    pub since: Option<u64>,
    /// Allowed by `ALLOW_ALL` (nothing backs it).
    pub blanket: bool,
}

/// One live stream.
struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

/// One simulated Envoy: its stream (opened on the first report after none) and its buckets.
pub struct Envoy {
    addr: SocketAddr,
    stream: Option<Stream>,
    buckets: BTreeMap<u8, Bucket>,
    /// Assignments received, by kind, for the tally.
    pub received: BTreeMap<&'static str, u64>,
    /// The ledger's break count per partition, as the world last set it.
    pub breaks: Vec<u64>,
}

fn bucket_id(part: u8) -> BucketId {
    BucketId {
        bucket: [
            ("lane".to_owned(), "q".to_owned()),
            ("user".to_owned(), format!("u{part}")),
        ]
        .into(),
    }
}

fn part_of(id: &BucketId) -> Option<u8> {
    id.bucket.get("user")?.strip_prefix('u')?.parse().ok()
}

impl Envoy {
    /// An Envoy whose RLQS cluster is the daemon's gRPC listener at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            stream: None,
            buckets: BTreeMap::new(),
            received: BTreeMap::new(),
            breaks: Vec::new(),
        }
    }

    /// `n` requests of partition `part` at `now`, decided by its bucket; a new bucket's first
    /// request is decided without an assignment and reported at once (and its answer awaited).
    pub async fn requests(&mut self, part: u8, n: u64) -> Result<Vec<Decided>, String> {
        self.drain().await?;
        let mut decided = Vec::new();
        let mut first = false;
        for _ in 0..n {
            let now = Instant::now();
            let bucket = self.buckets.entry(part).or_insert_with(|| {
                first = true;
                Bucket {
                    rule: Rule::None,
                    allowed: 0,
                    denied: 0,
                    reported: now,
                }
            });
            let one = decide(bucket.rule(now), now);
            if one.allowed {
                bucket.allowed += 1;
            } else {
                bucket.denied += 1;
            }
            decided.push(one);
            if std::mem::take(&mut first) {
                // createBucketImpl: the first request's usage goes out at once.
                self.report(&[part], FIRST_ANSWER).await?;
            }
        }
        Ok(decided)
    }

    /// The periodic report: every bucket's usage since its last report.
    pub async fn report_all(&mut self) -> Result<(), String> {
        let parts: Vec<u8> = self.buckets.keys().copied().collect();
        self.report(&parts, ANSWER).await
    }

    /// The stream ends (the client goes: `max_connection_age`, a restart of the sidecar's
    /// peer): the buckets keep their assignments until they expire, as Envoy's do.
    pub fn end_stream(&mut self) {
        self.stream = None;
    }

    async fn open(&mut self) -> Result<&mut Stream, String> {
        if self.stream.is_none() {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_secs(2))
                .connect()
                .await
                .map_err(|e| format!("RLQS connect: {e}"))?;
            let (tx, rx) = mpsc::channel(16);
            let outgoing = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            });
            let mut client = RateLimitQuotaServiceClient::new(channel);
            // The first message goes out before the stream's answer head comes back.
            let (reports, answers) = (tx.clone(), async move {
                client.stream_rate_limit_quotas(outgoing).await
            });
            let pending = tokio::spawn(answers);
            self.stream = Some(Stream {
                reports,
                answers: match tokio::time::timeout(Duration::from_secs(5), async {
                    // tonic sends the head once the first message is queued: send an empty
                    // report with the domain now.
                    let _ = tx
                        .send(RateLimitQuotaUsageReports {
                            domain: "sim".into(),
                            bucket_quota_usages: Vec::new(),
                        })
                        .await;
                    pending.await
                })
                .await
                {
                    Ok(Ok(Ok(answers))) => answers.into_inner(),
                    Ok(Ok(Err(status))) => return Err(format!("RLQS stream refused: {status:?}")),
                    Ok(Err(e)) => return Err(format!("RLQS stream task: {e}")),
                    Err(_) => return Err("RLQS stream: no answer head within 5 s".into()),
                },
            });
        }
        Ok(self.stream.as_mut().expect("opened"))
    }

    async fn report(&mut self, parts: &[u8], wait: Duration) -> Result<(), String> {
        let now = Instant::now();
        let mut usages = Vec::new();
        for part in parts {
            if let Some(bucket) = self.buckets.get_mut(part) {
                usages.push(BucketQuotaUsage {
                    bucket_id: Some(bucket_id(*part)),
                    // The daemon measures the interval itself.
                    time_elapsed: None,
                    num_requests_allowed: std::mem::take(&mut bucket.allowed),
                    num_requests_denied: std::mem::take(&mut bucket.denied),
                    last_report: None,
                });
                bucket.reported = now;
            }
        }
        if usages.is_empty() {
            return Ok(());
        }
        let report = RateLimitQuotaUsageReports {
            domain: "sim".into(),
            bucket_quota_usages: usages,
        };
        let sent = {
            let stream = self.open().await?;
            stream.reports.send(report.clone()).await.is_ok()
        };
        if !sent {
            // The daemon ended the stream: Envoy opens another on its next report.
            self.stream = None;
            let stream = self.open().await?;
            let _ = stream.reports.send(report).await;
        }
        self.await_answer(wait).await
    }

    /// Applies the answers that have arrived (without waiting).
    pub async fn drain(&mut self) -> Result<(), String> {
        self.await_answer(Duration::from_millis(1)).await
    }

    /// Applies the answers arriving within `wait`, then any already there.
    async fn await_answer(&mut self, wait: Duration) -> Result<(), String> {
        let mut wait = wait;
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return Ok(());
            };
            match tokio::time::timeout(wait, stream.answers.message()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(answer))) => self.apply(answer),
                // Ended (OK) or failed: Envoy keeps its buckets and opens another stream later.
                Ok(Ok(None)) | Ok(Err(_)) => {
                    self.stream = None;
                    return Ok(());
                }
            }
            wait = Duration::from_millis(1);
        }
    }

    fn apply(&mut self, answer: RateLimitQuotaResponse) {
        let now = Instant::now();
        for action in answer.bucket_action {
            let Some(part) = action.bucket_id.as_ref().and_then(part_of) else {
                continue;
            };
            if !self.buckets.contains_key(&part) {
                continue;
            }
            match action.bucket_action {
                Some(Action::AbandonAction(_)) => {
                    *self.received.entry("abandon").or_default() += 1;
                    self.buckets.remove(&part);
                }
                Some(Action::QuotaAssignmentAction(assignment)) => {
                    let ttl = assignment
                        .assignment_time_to_live
                        .map_or(0, |d| d.seconds.max(0) as u64);
                    let until = now + Duration::from_secs(ttl);
                    let strategy = assignment.rate_limit_strategy.and_then(|s| s.strategy);
                    let since = self.since(part);
                    let bucket = self.buckets.get_mut(&part).expect("present");
                    let kind = assign(bucket, strategy, now, until, since);
                    *self.received.entry(kind).or_default() += 1;
                }
                None => {}
            }
        }
    }

    /// The partition's break count now.
    fn since(&self, part: u8) -> u64 {
        self.breaks.get(part as usize).copied().unwrap_or(0)
    }
}

fn decide(rule: &mut Rule, now: Instant) -> Decided {
    match rule {
        Rule::None => Decided {
            allowed: false,
            since: None,
            blanket: false,
        },
        Rule::Blanket { allow, .. } => Decided {
            allowed: *allow,
            since: None,
            blanket: *allow,
        },
        Rule::Tokens {
            settings,
            rate,
            tokens,
            refilled,
            since,
            ..
        } => {
            let max = f64::from(settings.0);
            *tokens = match rate {
                Some(rate) => {
                    (*tokens + now.duration_since(*refilled).as_secs_f64() * *rate).min(max)
                }
                None => max,
            };
            *refilled = now;
            let allowed = *tokens >= 1.0 || rate.is_none();
            if allowed && rate.is_some() {
                *tokens -= 1.0;
            }
            Decided {
                allowed,
                since: Some(*since),
                blanket: false,
            }
        }
    }
}

/// Applies one assignment to `bucket`; the kind, for the tally.
fn assign(
    bucket: &mut Bucket,
    strategy: Option<Strategy>,
    now: Instant,
    until: Instant,
    since: u64,
) -> &'static str {
    match strategy {
        Some(Strategy::BlanketRule(rule)) => {
            let allow = rule == BlanketRule::AllowAll as i32;
            bucket.rule = Rule::Blanket { allow, until };
            if allow {
                "allow_all"
            } else {
                "deny_all"
            }
        }
        Some(Strategy::TokenBucket(tb)) => {
            let fill = tb.fill_interval.unwrap_or_default();
            let per_fill = tb.tokens_per_fill.unwrap_or(1).max(1);
            let settings: Settings = (tb.max_tokens, per_fill, fill.nanos);
            let rate = (fill.seconds > 0).then(|| f64::from(per_fill) / fill.seconds as f64);
            let max = f64::from(tb.max_tokens);
            // The running bucket's level now (an expired one is gone).
            let running = match bucket.rule(now) {
                Rule::Tokens {
                    settings: old,
                    rate: old_rate,
                    tokens,
                    refilled,
                    since: since_old,
                    ..
                } => {
                    let old_max = f64::from(old.0);
                    let level = match old_rate {
                        Some(r) => (*tokens + now.duration_since(*refilled).as_secs_f64() * *r)
                            .min(old_max),
                        None => old_max,
                    };
                    Some((*old, level, old_max, *since_old))
                }
                _ => None,
            };
            match running {
                Some((old, _, _, _)) if old == settings => {
                    if let Rule::Tokens { until: end, .. } = &mut bucket.rule {
                        *end = until;
                    }
                    "renewal"
                }
                // Its tokens are the running bucket's: the lineage keeps its start.
                Some((_, level, old_max, since_old)) => {
                    let start = if old_max > 0.0 {
                        max * level / old_max
                    } else {
                        max
                    };
                    bucket.rule = Rule::Tokens {
                        settings,
                        rate,
                        tokens: start,
                        refilled: now,
                        until,
                        since: since_old,
                    };
                    "replacement"
                }
                None => {
                    bucket.rule = Rule::Tokens {
                        settings,
                        rate,
                        tokens: max,
                        refilled: now,
                        until,
                        since,
                    };
                    "token_bucket"
                }
            }
        }
        // RequestsPerTimeUnit: skipped by Envoy 1.40.
        Some(_) | None => "skipped",
    }
}

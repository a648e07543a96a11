//! Coalesces concurrent script calls into pipelines. One dispatcher takes a pipeline slot, waits
//! for the first queued call, drains whatever else is queued (up to `max_batch`) and sends it at
//! once: no timer, so a lone call goes out immediately, and under load calls pile up while the
//! slots are busy and leave together. The queue is bounded; a full queue makes callers wait, and
//! their deadline turns the wait into the failure mode.
//!
//! `NOSCRIPT` (Redis restarted, failed over, `SCRIPT FLUSH`, a Cluster node that never saw the
//! script) means the script did not run, so exactly those calls are resent once with `EVAL`, which
//! also caches the script. A timeout or a broken connection is never retried: the write may have
//! happened.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use prometheus::{Histogram, IntCounterVec};
use redis::{Pipeline, RedisError, Value};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use super::conn::Conn;
use super::scripts::ScriptCall;
use crate::store::StoreError;

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Most calls in one pipeline.
    pub max_batch: usize,
    /// Pipelines in flight at once.
    pub in_flight: usize,
    /// Calls waiting to be sent, at most.
    pub queue: usize,
}

/// Metrics the batcher keeps.
#[derive(Clone)]
pub struct BatchMetrics {
    /// Calls per pipeline.
    pub batch_size: Histogram,
    /// Time from sending a pipeline to its last reply.
    pub pipeline_duration: Histogram,
    /// Errors by kind.
    pub errors: IntCounterVec,
}

type Reply = Result<Value, StoreError>;

struct Job {
    call: ScriptCall,
    reply: oneshot::Sender<Reply>,
}

/// The handle callers submit script calls to.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the dispatcher over the connection published by `conn`.
    pub fn spawn(
        conn: watch::Receiver<Option<Conn>>,
        config: BatchConfig,
        metrics: BatchMetrics,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        tokio::spawn(dispatch(rx, conn, config, metrics));
        Self { tx }
    }

    /// Queues a call; the receiver yields its reply. Waits while the queue is full.
    pub async fn submit(&self, call: ScriptCall) -> Result<oneshot::Receiver<Reply>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { call, reply })
            .await
            .map_err(|_| StoreError::failed("internal", "Redis dispatcher stopped"))?;
        Ok(rx)
    }
}

async fn dispatch(
    mut rx: mpsc::Receiver<Job>,
    conn: watch::Receiver<Option<Conn>>,
    config: BatchConfig,
    metrics: BatchMetrics,
) {
    let slots = Arc::new(Semaphore::new(config.in_flight.max(1)));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut jobs = vec![first];
        while jobs.len() < config.max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        metrics.batch_size.observe(jobs.len() as f64);
        let current = conn.borrow().clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match current {
                None => {
                    metrics.errors.with_label_values(&["not_connected"]).inc();
                    for job in jobs {
                        let _ = job.reply.send(Err(StoreError::failed(
                            "connection",
                            "not connected to Redis",
                        )));
                    }
                }
                Some(conn) if conn.is_cluster() => {
                    // Cluster pipelines must stay in one slot: one pipeline per (first) key; a
                    // call's keys share one slot already.
                    let mut by_key: HashMap<String, Vec<Job>> = HashMap::new();
                    for job in jobs {
                        let key = job.call.keys.first().cloned().unwrap_or_default();
                        by_key.entry(key).or_default().push(job);
                    }
                    let mut tasks = tokio::task::JoinSet::new();
                    for group in by_key.into_values() {
                        let conn = conn.clone();
                        let metrics = metrics.clone();
                        tasks.spawn(async move { run_pipeline(conn, group, &metrics).await });
                    }
                    while tasks.join_next().await.is_some() {}
                }
                Some(conn) => run_pipeline(conn, jobs, &metrics).await,
            }
        });
    }
}

/// How a pipeline names its scripts.
#[derive(Clone, Copy)]
enum Send {
    /// `EVALSHA sha`: the normal, small form.
    Sha,
    /// `EVAL source`: after `NOSCRIPT`; runs and caches the script.
    Source,
}

fn pipeline(jobs: &[Job], send: Send) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for job in jobs {
        let call = &job.call;
        let cmd = match send {
            Send::Sha => pipe.cmd("EVALSHA").arg(&*call.script.sha),
            Send::Source => pipe.cmd("EVAL").arg(&*call.script.source),
        };
        cmd.arg(call.keys.len()).arg(&call.keys).arg(&call.args);
    }
    pipe
}

async fn run_pipeline(mut conn: Conn, jobs: Vec<Job>, metrics: &BatchMetrics) {
    let started = Instant::now();
    let replies = conn.run(&pipeline(&jobs, Send::Sha)).await;
    metrics
        .pipeline_duration
        .observe(started.elapsed().as_secs_f64());
    let values = match checked(replies, jobs.len(), metrics) {
        Ok(values) => values,
        Err(error) => return fail_all(jobs, &error),
    };
    let mut retry = Vec::new();
    for (job, value) in jobs.into_iter().zip(values) {
        if is_noscript(&value) {
            retry.push(job);
        } else {
            answer(job, value, metrics);
        }
    }
    if retry.is_empty() {
        return;
    }
    metrics.errors.with_label_values(&["noscript"]).inc();
    tracing::debug!(calls = retry.len(), "NOSCRIPT: resending with EVAL");
    let replies = conn.run(&pipeline(&retry, Send::Source)).await;
    match checked(replies, retry.len(), metrics) {
        Ok(values) => {
            for (job, value) in retry.into_iter().zip(values) {
                answer(job, value, metrics);
            }
        }
        Err(error) => fail_all(retry, &error),
    }
}

fn checked(
    replies: Result<Vec<Value>, RedisError>,
    expected: usize,
    metrics: &BatchMetrics,
) -> Result<Vec<Value>, StoreError> {
    match replies {
        Ok(values) if values.len() == expected => Ok(values),
        Ok(values) => {
            metrics.errors.with_label_values(&["protocol"]).inc();
            Err(StoreError::failed(
                "protocol",
                format!("pipeline of {expected} calls got {} replies", values.len()),
            ))
        }
        Err(error) => {
            let kind = error_kind(&error);
            metrics.errors.with_label_values(&[kind]).inc();
            Err(if kind == "timeout" {
                StoreError::Timeout
            } else {
                StoreError::failed(kind, error.to_string())
            })
        }
    }
}

fn fail_all(jobs: Vec<Job>, error: &StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

fn answer(job: Job, value: Value, metrics: &BatchMetrics) {
    let reply = match value {
        Value::ServerError(error) => {
            let code = error.code().to_owned();
            let kind = server_kind(&code);
            metrics.errors.with_label_values(&[kind]).inc();
            Err(StoreError::failed(kind, format!("Redis replied {code}")))
        }
        value => Ok(value),
    };
    let _ = job.reply.send(reply);
}

fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(error) if error.code() == "NOSCRIPT")
}

/// A bounded label for a Redis error (never the message: it may hold a key).
pub fn error_kind(error: &RedisError) -> &'static str {
    if error.is_timeout() {
        "timeout"
    } else if error.kind() == redis::ErrorKind::AuthenticationFailed {
        "auth"
    } else if error.is_connection_dropped() || error.is_connection_refusal() || error.is_io_error()
    {
        "connection"
    } else {
        server_kind(error.code().unwrap_or(""))
    }
}

fn server_kind(code: &str) -> &'static str {
    match code {
        "NOSCRIPT" => "noscript",
        "READONLY" => "readonly",
        "LOADING" => "loading",
        "BUSY" => "busy",
        "OOM" => "oom",
        "NOAUTH" | "WRONGPASS" => "auth",
        "MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "CROSSSLOT" => "cluster",
        _ => "other",
    }
}

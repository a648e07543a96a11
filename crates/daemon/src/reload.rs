//! Policy hot reload: the policy source (a file, or a directory of files: see
//! [`crate::config::policy_dir`]) is checked every `policies_poll` and on SIGHUP. Reading follows
//! symlinks, so a Kubernetes ConfigMap update (kubelet swaps the `..data` symlink) is seen like any
//! edit, and so is a file added to or removed from a directory. A changed source is validated
//! whole and swapped in atomically; an invalid one is logged (once per distinct content) and
//! counted, and the old set keeps serving.
//!
//! The file is a run-time input like a request: its metadata is looked at first (an unchanged
//! file is not read again; a device, FIFO or oversized file is refused unread), it is read within
//! `files.max_bytes` and `files.read_timeout` and parsed off the worker threads, so checks never
//! wait for it. A file with no policies is refused unless `policies_allow_empty` is set.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::check::CheckService;
use crate::config::policy_dir::{self, SourceStamp};
use crate::config::FileLimits;
use crate::telemetry::Metrics;

/// Watches one policy source (file or directory) for one service.
pub struct Reloader {
    path: PathBuf,
    service: Arc<CheckService>,
    metrics: Metrics,
    /// Version of the content last seen (loaded or rejected), so each change is handled once.
    seen: Option<u32>,
    /// The files' metadata when last read: while it matches, nothing is read again.
    stamp: Option<SourceStamp>,
    limits: FileLimits,
    allow_empty: bool,
    /// Why the file could not be read last time, so each distinct failure is logged once.
    unreadable: Option<String>,
}

impl Reloader {
    /// `loaded` is the version of the content the service started with; `limits` bound every
    /// read; `allow_empty` lets a file with no policies replace the set in force.
    pub fn new(
        path: PathBuf,
        service: Arc<CheckService>,
        metrics: Metrics,
        loaded: u32,
        limits: FileLimits,
        allow_empty: bool,
    ) -> Self {
        metrics.policies_version.set(i64::from(loaded));
        for result in ["ok", "unchanged", "invalid"] {
            metrics.policy_reloads.with_label_values(&[result]);
        }
        Self {
            path,
            service,
            metrics,
            seen: Some(loaded),
            stamp: None,
            limits,
            allow_empty,
            unreadable: None,
        }
    }

    /// Polls every `poll` and reloads on SIGHUP, until `stop` resolves.
    pub async fn run(mut self, poll: Duration, stop: impl Future<Output = ()>) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = signal(SignalKind::hangup())
            .map_err(|error| tracing::warn!(%error, "no SIGHUP handler; reloading by polling only"))
            .ok();
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            let signalled = async {
                match hangup.as_mut() {
                    Some(hangup) => hangup.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = ticker.tick() => self.reload(false).await,
                _ = signalled => {
                    tracing::info!("SIGHUP received: reloading policies");
                    self.reload(true).await;
                }
            }
        }
    }

    /// Reloads if the content changed (or always, when `forced`).
    pub async fn reload(&mut self, forced: bool) {
        self.metrics.policy_file_polls.inc();
        if !forced && self.stamp.is_some() {
            let now = policy_dir::stamp_async(self.path.clone(), self.limits).await;
            if now.as_ref().ok() == self.stamp.as_ref() {
                return;
            }
        }
        let read = policy_dir::read_async(self.path.clone(), self.limits).await;
        let text = match read {
            Ok((text, stamp)) => {
                self.stamp = Some(stamp);
                self.unreadable = None;
                text
            }
            Err(error) => {
                self.stamp = None;
                let reason = error.to_string();
                if forced || self.unreadable.as_ref() != Some(&reason) {
                    tracing::warn!(%error, "policy file unreadable; keeping the policies in force");
                    self.metrics
                        .policy_reloads
                        .with_label_values(&["invalid"])
                        .inc();
                }
                self.unreadable = Some(reason);
                self.seen = None;
                return;
            }
        };
        let version = text.version();
        if self.seen == Some(version) {
            if forced {
                self.metrics
                    .policy_reloads
                    .with_label_values(&["unchanged"])
                    .inc();
            }
            return;
        }
        self.seen = Some(version);
        let parsed = tokio::task::spawn_blocking(move || text.parse()).await;
        let Ok(parsed) = parsed else {
            tracing::warn!("policy file parser failed; the policies in force keep serving");
            return;
        };
        match parsed {
            Ok(policies) if policies.is_empty() && !self.allow_empty => {
                self.metrics
                    .policy_reloads
                    .with_label_values(&["invalid"])
                    .inc();
                tracing::error!(
                    version,
                    "policy file has no policies: refused, the policies in force keep serving \
                     (set policies_allow_empty to allow removing every limit)"
                );
            }
            Ok(policies) => {
                if policies.is_empty() {
                    tracing::warn!(
                        version,
                        "policy file has no policies: every limit is removed \
                         (policies_allow_empty is set)"
                    );
                }
                let count = policies.len();
                self.service.replace_policies(policies);
                self.metrics.policies_version.set(i64::from(version));
                self.metrics.policy_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(version, policies = count, "policies reloaded");
            }
            Err(error) => {
                self.metrics
                    .policy_reloads
                    .with_label_values(&["invalid"])
                    .inc();
                tracing::warn!(version, %error, "policy file rejected; the policies in force keep serving");
            }
        }
    }
}

//! Policy hot reload: the policy file is checked every `policies_poll` and on SIGHUP. Reading
//! follows symlinks, so a Kubernetes ConfigMap update (kubelet swaps the `..data` symlink) is seen
//! like any edit. A changed file is validated whole and swapped in atomically; an invalid one is
//! logged (once per distinct content) and counted, and the old set keeps serving.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::check::CheckService;
use crate::config::{parse_policies, policy_file_version};
use crate::telemetry::Metrics;

/// Watches one policy file for one service.
pub struct Reloader {
    path: PathBuf,
    service: Arc<CheckService>,
    metrics: Metrics,
    /// Version of the content last seen (loaded or rejected), so each change is handled once.
    seen: Option<u32>,
}

impl Reloader {
    /// `loaded` is the version of the content the service started with.
    pub fn new(path: PathBuf, service: Arc<CheckService>, metrics: Metrics, loaded: u32) -> Self {
        metrics.policies_version.set(i64::from(loaded));
        for result in ["ok", "unchanged", "invalid"] {
            metrics.policy_reloads.with_label_values(&[result]);
        }
        Self {
            path,
            service,
            metrics,
            seen: Some(loaded),
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
                _ = ticker.tick() => self.reload(false),
                _ = signalled => {
                    tracing::info!("SIGHUP received: reloading policies");
                    self.reload(true);
                }
            }
        }
    }

    /// Reloads if the content changed (or always, when `forced`).
    pub fn reload(&mut self, forced: bool) {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) => {
                if forced || self.seen.is_some() {
                    tracing::warn!(path = %self.path.display(), %error, "policy file unreadable; keeping the policies in force");
                    self.metrics
                        .policy_reloads
                        .with_label_values(&["invalid"])
                        .inc();
                }
                self.seen = None;
                return;
            }
        };
        let version = policy_file_version(&text);
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
        match parse_policies(&self.path, &text) {
            Ok(policies) => {
                let count = policies.len();
                self.service.replace_policies(policies);
                self.metrics.policies_version.set(i64::from(version));
                self.metrics.policy_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(
                    version = format_args!("{version:08x}"),
                    policies = count,
                    "policies reloaded"
                );
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

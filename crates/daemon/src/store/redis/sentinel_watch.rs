//! Listens to the Sentinels' `+switch-master` announcements, so a failover is acted on when it
//! happens rather than when the next check hits the demoted primary: an announcement for our
//! primary opens the circuit, and the prober reconnects to the primary the Sentinels name now.
//! One Sentinel at a time; on a lost connection the next one is tried after a pause.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::access::Access;
use super::conn::{mask_password, node_client};
use super::health::{CircuitReason, Health};
use crate::config::SentinelTarget;

/// Watches until the store is dropped (`alive`: see `RedisStore`).
pub async fn watch(
    target: SentinelTarget,
    access: Access,
    health: Arc<Health>,
    alive: CancellationToken,
) {
    let mut next = 0usize;
    loop {
        let Some(url) = target.nodes.get(next % target.nodes.len().max(1)) else {
            return;
        };
        next += 1;
        let listened = tokio::select! {
            listened = listen(url, &access, &target.master, &health) => listened,
            () = alive.cancelled() => return,
        };
        if let Err(error) = listened {
            tracing::debug!(sentinel = %mask_password(url), %error, "Sentinel announcements lost; trying another");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = alive.cancelled() => return,
        }
    }
}

async fn listen(
    url: &str,
    access: &Access,
    master: &str,
    health: &Health,
) -> redis::RedisResult<()> {
    // The Sentinel's own credentials come from its URL; TLS as for every `rediss://` URL.
    let client = node_client(url, None, access)?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("+switch-master").await?;
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        // "<master name> <old ip> <old port> <new ip> <new port>"
        if payload.split_whitespace().next() == Some(master) {
            tracing::warn!(announcement = %payload, "Sentinel switched the primary; reconnecting");
            health.open(CircuitReason::Failover);
        }
    }
    Ok(())
}

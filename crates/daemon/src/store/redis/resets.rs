//! The fleet's reset channel. Each pod's local layer remembers partitions Redis denied until their
//! retry instant; after an operator resets a counter on one pod, the others would keep denying
//! from that memory. So a reset is published on `<prefix>:resets` (`PUBLISH`; a Cluster delivers
//! it to the subscribers of every node), and every daemon subscribes and forgets the counter.
//!
//! Pub/sub is fire and forget: a message sent while a pod is not subscribed (its connection
//! dropped, Redis restarting) never reaches it. So every (re)subscription also tells the pod to
//! forget everything it remembers ([`ResetEvent::All`]): a pod can then miss a reset only for as
//! long as it is not subscribed, and a remembered denial never outlives its retry instant anyway.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::access::Access;
use super::conn::{self, Timeouts};
use super::prober::jittered;
use crate::config::RedisTarget;
use crate::limit::Key;

/// Longest message read from the channel (a policy name and a partition are far shorter); longer
/// ones are ignored.
const MAX_MESSAGE_BYTES: usize = 4 * 1024;
/// First pause after a lost or refused subscription.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
/// Longest pause between subscription attempts.
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(5);
/// A refused subscription is logged at warn level at most this often (debug otherwise).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The channel resets are announced on.
pub fn channel(prefix: &str) -> String {
    format!("{prefix}:resets")
}

/// What travels on the channel: the counter's identity as the local layer keys it (the partition
/// escaped, so it is one line of JSON whatever the descriptor values were).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message<'a> {
    policy: Cow<'a, str>,
    partition: Cow<'a, str>,
    /// The window's period in µs, for a counter of a policy of several windows (`window_us` in
    /// the message, which other pods read).
    #[serde(rename = "window_us", default, skip_serializing_if = "Option::is_none")]
    period_us: Option<u64>,
}

/// The message announcing that `key` was reset.
pub fn encode(key: &Key) -> String {
    let message = Message {
        policy: Cow::Borrowed(key.policy()),
        partition: Cow::Borrowed(key.partition()),
        period_us: key.period_us(),
    };
    serde_json::to_string(&message).unwrap_or_default()
}

/// The key a message names; `None` for anything else (too long, not ours).
pub fn decode(payload: &[u8]) -> Option<Key> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let message: Message = serde_json::from_slice(payload).ok()?;
    let key = Key::from_partition(
        Arc::from(message.policy.as_ref()),
        message.partition.into_owned(),
    );
    Some(match message.period_us {
        Some(period_us) => key.for_window(period_us),
        None => key,
    })
}

/// What a subscriber tells the local layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetEvent {
    /// This counter was reset (on any pod).
    Key(Key),
    /// Subscribed (again): resets sent before were not seen, forget everything.
    All,
}

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct Follower {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Credentials and TLS.
    pub access: Access,
    /// Connect timeout (per attempt).
    pub timeouts: Timeouts,
    /// The channel.
    pub channel: String,
}

impl Follower {
    /// Subscribes and hands every event to `on_reset` until `alive`'s sender is dropped (the
    /// store is gone); resubscribes after a lost connection with a jittered, doubling pause.
    pub async fn run(
        self,
        on_reset: impl Fn(ResetEvent) + Send + Sync + 'static,
        alive: CancellationToken,
    ) {
        let jitter = RandomState::new();
        let mut delay = Duration::ZERO;
        let mut attempt: usize = 0;
        let mut last_warning: Option<std::time::Instant> = None;
        loop {
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(jittered(delay, attempt as u64, &jitter)) => {}
                    () = alive.cancelled() => return,
                }
            }
            let subscribed = tokio::select! {
                subscribed = self.subscribe(attempt) => subscribed,
                () = alive.cancelled() => return,
            };
            attempt += 1;
            let pubsub = match subscribed {
                Ok(pubsub) => pubsub,
                Err(error) => {
                    if last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                        last_warning = Some(std::time::Instant::now());
                        tracing::warn!(channel = %self.channel, %error, "cannot subscribe to counter resets; other pods' resets reach this pod's local layer only at each denial's retry instant");
                    } else {
                        tracing::debug!(%error, "reset subscription failed");
                    }
                    delay = (delay * 2).clamp(RESUBSCRIBE_MIN, RESUBSCRIBE_MAX);
                    continue;
                }
            };
            last_warning = None;
            tracing::debug!(channel = %self.channel, "following counter resets");
            on_reset(ResetEvent::All);
            let mut messages = pubsub.into_on_message();
            loop {
                let message = tokio::select! {
                    message = messages.next() => message,
                    () = alive.cancelled() => return,
                };
                let Some(message) = message else { break };
                match decode(message.get_payload_bytes()) {
                    Some(key) => on_reset(ResetEvent::Key(key)),
                    None => tracing::debug!("ignored a message on the reset channel"),
                }
            }
            tracing::info!(channel = %self.channel, "reset subscription lost; subscribing again");
            delay = RESUBSCRIBE_MIN;
        }
    }

    async fn subscribe(&self, attempt: usize) -> redis::RedisResult<redis::aio::PubSub> {
        let mut pubsub =
            conn::subscriber(&self.target, &self.access, self.timeouts, attempt).await?;
        tokio::time::timeout(self.timeouts.connect, pubsub.subscribe(&self.channel))
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "timed out subscribing",
                ))
            })??;
        Ok(pubsub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_the_key_whatever_its_values() {
        let key = Key::new(Arc::from("login"), ["1.2.3.4", "a:b{c}\"\n"]);
        let message = encode(&key);
        assert!(!message.contains('\n'), "{message}");
        assert_eq!(decode(message.as_bytes()), Some(key.clone()));
        let hour = key.for_window(3_600_000_000);
        assert_eq!(decode(encode(&hour).as_bytes()), Some(hour));
        assert!(
            !message.contains("window"),
            "one window: the message of before"
        );
    }

    #[test]
    fn foreign_or_oversized_messages_are_ignored() {
        assert_eq!(decode(b"hello"), None);
        assert_eq!(decode(br#"{"policy":"p","partition":"x","more":1}"#), None);
        let long = format!(
            r#"{{"policy":"p","partition":"{}"}}"#,
            "x".repeat(MAX_MESSAGE_BYTES)
        );
        assert_eq!(decode(long.as_bytes()), None);
    }
}

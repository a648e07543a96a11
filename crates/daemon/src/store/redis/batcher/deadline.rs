//! The wait for one call's reply, and what a missed deadline means: Redis silent, or this daemon
//! not scheduled.
//!
//! A deadline's timer firing says only that the call's task ran after the deadline, not that
//! Redis was silent for it. On a CPU-starved node (a throttled pod, a host whose cores are all
//! busy) the process may not run for part of the deadline while the reply already waits in the
//! socket; the runtime then wakes the connection's reader (I/O) and the call's timer in the same
//! turn, and polls the call first (tokio runs the last task woken first). So a missed deadline is
//! judged on three facts, never on the timer alone:
//!
//! 1. **Was the reply already readable?** The call gives the connection's reader its turns
//!    ([`SETTLE_TURNS`] yields: tokio runs the tasks the I/O driver woke before a yielded task)
//!    and takes the reply if it came.
//! 2. **Did the timer fire on time?** Later than [`slack`] past when it was due, this daemon was
//!    not running for part of the deadline: it did not watch Redis for a whole one.
//! 3. **Did Redis answer any other call** since this one was written (the dispatcher's
//!    `progress`)? Then Redis is alive and this reply is slow or read late.
//!
//! A reply is a reply. A late timer or an answering Redis excuses the miss: the call waits one
//! more deadline from now (each counted in `sluice_redis_deadlines_excused_total{reason}`), up
//! to [`OVERDUE_BACKSTOP`] past its first deadline. Only a timer on time, no reply readable and
//! no reply to any call is Redis's silence for a whole deadline watched by a running daemon: the
//! circuit opens at once (a hung Redis found within one deadline, once the daemon runs).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use prometheus::IntCounterVec;

/// Longest a call keeps waiting past its first deadline while each miss is excused (and longest
/// a call refused by a resharding is resent).
pub(super) const OVERDUE_BACKSTOP: Duration = Duration::from_secs(1);

/// Yields a call whose timer fired makes before it looks for its reply: one lets every task the
/// I/O driver woke run first; the others cover a reader another worker had queued.
const SETTLE_TURNS: usize = 3;

/// How late a deadline's timer may fire and still count as on time: a tenth of the deadline,
/// at least 2 ms (tokio's timers tick in milliseconds; a busy but running runtime is a little
/// late). Erring small only costs a true outage met during a late turn one more deadline.
pub(super) fn slack(deadline: Duration) -> Duration {
    (deadline / 10).max(Duration::from_millis(2))
}

/// Why a missed deadline was not Redis's silence (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Excuse {
    /// The reply was readable when the timer was acted on.
    ReplyReady,
    /// The timer fired more than [`slack`] late: the daemon was not scheduled.
    TimerLate,
    /// Redis answered other calls since this one was written.
    RedisAnswering,
}

impl Excuse {
    /// Every label value, for pre-set series.
    pub(crate) const ALL: [Self; 3] = [Self::ReplyReady, Self::TimerLate, Self::RedisAnswering];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::ReplyReady => "reply_ready",
            Self::TimerLate => "timer_late",
            Self::RedisAnswering => "redis_answering",
        }
    }
}

/// How a wait for a reply ended.
pub(super) enum Waited<T> {
    /// The reply (or the connection's error).
    Reply(T),
    /// No reply to any call for a whole deadline, watched on time: Redis is out.
    Silent,
    /// Every miss excused until the backstop: a timeout, not proof of an outage.
    Overdue,
}

/// Judges a missed deadline without a readable reply: the excuse, if any.
pub(super) fn judge(late: Duration, deadline: Duration, others_answered: bool) -> Option<Excuse> {
    if late > slack(deadline) {
        Some(Excuse::TimerLate)
    } else if others_answered {
        Some(Excuse::RedisAnswering)
    } else {
        None
    }
}

/// Waits for `query`'s output, written at `written`, with `deadline`. `seen` is `progress` as it
/// was before the write; `excused` counts excused misses by reason.
pub(super) async fn wait<F: Future>(
    mut query: Pin<&mut F>,
    written: Instant,
    deadline: Duration,
    progress: &AtomicU64,
    mut seen: u64,
    excused: &IntCounterVec,
) -> Waited<F::Output> {
    let limit = written + deadline + OVERDUE_BACKSTOP;
    let mut due = written + deadline;
    loop {
        if let Ok(reply) = tokio::time::timeout_at(due.into(), query.as_mut()).await {
            return Waited::Reply(reply);
        }
        // Acted on now: how late against when it was due.
        let late = Instant::now().saturating_duration_since(due);
        for _ in 0..SETTLE_TURNS {
            tokio::task::yield_now().await;
            if let Poll::Ready(reply) =
                std::future::poll_fn(|cx| Poll::Ready(query.as_mut().poll(cx))).await
            {
                count(excused, Excuse::ReplyReady, late);
                return Waited::Reply(reply);
            }
        }
        let now = progress.load(Ordering::Relaxed);
        let Some(excuse) = judge(late, deadline, now != seen) else {
            return Waited::Silent;
        };
        count(excused, excuse, late);
        let next = Instant::now();
        if next >= limit {
            return Waited::Overdue;
        }
        seen = now;
        due = (next + deadline).min(limit);
    }
}

fn count(excused: &IntCounterVec, excuse: Excuse, late: Duration) {
    excused.with_label_values(&[excuse.as_str()]).inc();
    tracing::debug!(
        reason = excuse.as_str(),
        late_us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
        "Redis call past its deadline, not Redis's silence: waiting on"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_timer_on_time_with_redis_silent_is_an_outage() {
        let deadline = Duration::from_millis(100);
        assert_eq!(slack(deadline), Duration::from_millis(10));
        assert_eq!(slack(Duration::from_millis(5)), Duration::from_millis(2));
        assert_eq!(judge(Duration::from_millis(3), deadline, false), None);
        assert_eq!(judge(slack(deadline), deadline, false), None);
        assert_eq!(
            judge(Duration::from_millis(11), deadline, false),
            Some(Excuse::TimerLate)
        );
        assert_eq!(
            judge(Duration::from_millis(50), deadline, true),
            Some(Excuse::TimerLate)
        );
        assert_eq!(
            judge(Duration::ZERO, deadline, true),
            Some(Excuse::RedisAnswering)
        );
    }

    #[test]
    fn silence_watched_on_time_is_an_outage() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let progress = AtomicU64::new(0);
            let excused =
                IntCounterVec::new(prometheus::Opts::new("e", "e"), &["reason"]).expect("metric");
            // Long enough that a busy machine's late timer (past a tenth of it) is rare; one
            // would only cost another deadline, still `Silent`.
            let deadline = Duration::from_millis(200);
            let query = std::pin::pin!(std::future::pending::<()>());
            let started = Instant::now();
            let waited = wait(query, started, deadline, &progress, 0, &excused).await;
            assert!(matches!(waited, Waited::Silent));
            assert!(started.elapsed() >= deadline);
        });
    }
}

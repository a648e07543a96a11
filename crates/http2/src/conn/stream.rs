//! What a connection keeps per stream.

use super::*;

/// A hasher for stream ids (odd integers the client picks in order; no attacker-chosen
/// collisions beyond a bounded map).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type Streams<O> = HashMap<u32, Stream<O>, BuildHasherDefault<IdHasher>>;

/// One stream the server still has work for.
pub(super) struct Stream<O> {
    /// Where it is in RFC 9113 section 5.1: whether the client may still send, whether the
    /// answer's end is written (or the stream reset).
    pub(super) state: State,
    /// What the client may still send before a WINDOW_UPDATE.
    pub(super) recv_window: i64,
    /// Received and not yet given back as stream window.
    pub(super) recv_unreleased: u32,
    /// Received bytes still held here or by the stream's call (a unary body until its answer, a
    /// task's body until the task takes it): the connection window they took is given back
    /// only when they go, so what a connection holds stays within its window.
    pub(super) held: u32,
    /// Body bytes received (for `content-length`).
    pub(super) received: u64,
    /// The request's `content-length`, if it sent one.
    pub(super) content_length: Option<u64>,
    /// Waits in the queue of streams blocked on the connection's send window.
    pub(super) conn_blocked: bool,
    /// What we may still send.
    pub(super) send_window: i64,
    pub(super) kind: Kind,
    /// Waiting for the client's window, in order.
    pub(super) out: VecDeque<Out>,
    pub(super) out_bytes: usize,
    /// The stream's work, counted as open until the stream goes.
    pub(super) _open: O,
}

impl<O> Stream<O> {
    /// Whether the body received so far agrees with its `content-length`: never more, and all
    /// of it once the stream has `ended`.
    pub(super) fn length_agrees(&self, ended: bool) -> bool {
        self.content_length.is_none_or(|declared| {
            self.received <= declared && (!ended || self.received == declared)
        })
    }
}

pub(super) enum Kind {
    /// A unary call whose body is arriving.
    Gathering {
        body: BytesMut,
        kept: Kept,
        by: Instant,
        /// Answered with this refusal instead of a call once the body is in.
        refused: Option<Refused>,
    },
    /// A unary call being answered on the connection's task.
    Answering,
    /// A unary call answered (its answer may wait for the client's window).
    Answered,
    /// A call served on its own task.
    Task {
        body: Option<mpsc::UnboundedSender<Result<Bytes, Broken>>>,
        /// Body bytes sent to the task and not yet taken by it.
        queued: Arc<AtomicUsize>,
        cancel: CancellationToken,
    },
}

pub(super) enum Out {
    Data(Bytes),
    /// An encoded header block ending the stream (trailers).
    Trailers(Bytes),
    /// The end of the stream without trailers (an empty DATA with END_STREAM).
    End,
}

/// How a unary call ended.
pub(super) enum Outcome {
    Answer(Answer),
    /// The client reset the stream: nobody reads an answer.
    Cancelled,
    /// The call panicked.
    Panicked,
}

/// A unary call's answer being worked out, tagged with its stream.
pub(super) struct Answering {
    pub(super) id: u32,
    /// `None` once the client reset the stream.
    pub(super) future: Option<UnaryFuture>,
    /// The waker of the task polling it, so that a client's reset can drop the call at once.
    pub(super) waker: Option<std::task::Waker>,
}

impl Answering {
    pub(super) fn new(id: u32, future: UnaryFuture) -> Self {
        Self {
            id,
            future: Some(future),
            waker: None,
        }
    }

    /// The client reset the stream: the call is dropped (a call not yet past its first await
    /// goes no further), and the stream goes once the connection polls this.
    pub(super) fn cancel(&mut self) {
        self.future = None;
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

impl Future for Answering {
    type Output = (u32, Outcome);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        if self
            .waker
            .as_ref()
            .is_none_or(|waker| !waker.will_wake(cx.waker()))
        {
            self.waker = Some(cx.waker().clone());
        }
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready((id, Outcome::Cancelled));
        };
        // A panic in one call answers that call (the service's refusal), not the connection's
        // other calls.
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(answer)) => Poll::Ready((id, Outcome::Answer(answer))),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready((id, Outcome::Panicked)),
        }
    }
}

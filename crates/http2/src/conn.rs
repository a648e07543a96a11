//! One HTTP/2 connection (RFC 9113, server side), served on one task: frames read and written
//! in batches, unary calls polled on the connection's own task (no task, channel or body per
//! stream), everything else (streamed calls) handed to a task per stream with its request body
//! fed through a channel the stream's window bounds.
//!
//! Bounds (the table is in the crate's doc): SETTINGS_MAX_CONCURRENT_STREAMS counts every
//! stream whose work is not done (a stream the client reset goes when its call is dropped, at
//! once); a header block's encoded size, frames and decoded list; each unary request body
//! ([`Config::max_body_bytes`], and [`Config::body_read_timeout`] to arrive whole); flow-control
//! windows both ways, the connection's given back only as calls take their bodies; what the
//! streams may have queued for a client that does not open its window; resets and refused
//! streams, and frames that make no progress, per 10 s (GOAWAY `ENHANCE_YOUR_CALM` past them);
//! the write buffer (reading stops while a client does not read what it is sent); and what the
//! connection holds in all, charged to its [`crate::Budget`]. A client that does not ACK a
//! keepalive PING in time is closed.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::budget::{Charge, Refusal};
use crate::frame::{self, Code, Head};
use crate::hpack::{self, Decoder};
use crate::state::{Closed, FrameError, Recv, State};

mod headers;
mod recv;
mod send;
mod stream;
mod task;
#[cfg(test)]
mod tests;

use self::headers::Continuing;
pub use self::headers::Kept;
use self::stream::{Answering, Kind, Out, Outcome, Stream, Streams};
use self::task::{drive, Event, Taken};
pub use self::task::{Broken, Gone, RecvBody, Responder, Sending};

/// Read at most this much per read call.
const READ_BYTES: usize = 16 * 1024;
/// Stop reading while this much waits to be written (a client that does not read).
const WRITE_HIGH: usize = 64 * 1024;
/// What a connection's streams may have queued to send, waiting for the client's window.
const MAX_QUEUED_OUT: usize = 256 * 1024;
/// Resets (the client's, and ours for its errors) and refused streams allowed per
/// [`RESET_PERIOD`].
const MAX_RESETS: u32 = 2_000;
const RESET_PERIOD: Duration = Duration::from_secs(10);
/// Frames that make no progress allowed per [`IDLE_PERIOD`].
const MAX_IDLE_FRAMES: u32 = 10_000;
const IDLE_PERIOD: Duration = Duration::from_secs(10);
/// CONTINUATION frames allowed in one header block (a block within the header list bound
/// needs two at the smallest frame size).
const MAX_CONTINUATIONS: u32 = 16;
/// After a connection error, what the client still sends is read and dropped for this long, or
/// this much, before the socket closes ([`Connection::poll_linger`]).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1024 * 1024;
/// Turns of the poll loop before the task yields to the runtime's other tasks.
const MAX_TURNS: u32 = 16;
/// What a stream and a call in progress hold besides their buffers (counted in the budget).
const STREAM_BYTES: usize = 512;
const CALL_BYTES: usize = 2 * 1024;
/// What a stream with a call in progress is counted for, besides its body.
pub const PER_STREAM_BYTES: usize = STREAM_BYTES + CALL_BYTES;
/// Events queued from a connection's stream tasks.
const EVENTS: usize = 64;
/// The payloads of the keepalive PING and of the PING that ends a drain's first step.
const KEEPALIVE_PING: [u8; 8] = *b"sluice\0\0";
const DRAIN_PING: [u8; 8] = *b"drain\0\0\0";
/// Streams reset by us remembered, for the frames a client sent before it knew.
const RESET_MEMORY: usize = 256;

/// What a connection allows.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams whose work is not done.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request's decoded header list.
    pub max_header_list: usize,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what the client may send on a stream before we read it.
    pub stream_window: u32,
    /// What the client may send on the connection before its calls take it: what all its
    /// streams' bodies hold together.
    pub connection_window: u32,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Longest a unary call's request body may take to arrive whole.
    pub body_read_timeout: Duration,
    /// Largest unary request body.
    pub max_body_bytes: usize,
}

/// A header block of an answer.
#[derive(Debug, Clone)]
pub enum Block {
    /// Encoded already (a constant): HPACK of static-table references and literals without
    /// indexing only, since the server keeps no dynamic table; `:status` first in a head.
    Encoded(&'static [u8]),
    /// Fields, encoded as literals without indexing (boxed: an answer is moved through the
    /// call's future and the connection, and most answers are constants).
    Fields(Box<HeaderMap>),
}

/// A unary call's answer.
#[derive(Debug)]
pub enum Answer {
    /// A head, a body (one DATA frame when the client's windows allow), and trailers that end
    /// the stream.
    Whole {
        head: Block,
        body: BytesMut,
        trailers: Block,
    },
    /// No body: the head and the trailers in one header block that ends the stream (gRPC's
    /// trailers-only answer).
    Bodiless { head: Block, trailers: Block },
}

/// Why the connection refuses a stream before any call of the service answers it; the service
/// says how ([`Service::refuse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its request header list went over [`Config::max_header_list`], decoded.
    HeadersTooLarge,
    /// Its unary request body went over [`Config::max_body_bytes`].
    BodyTooLarge,
    /// Its unary request body did not arrive whole within [`Config::body_read_timeout`].
    BodyTimeout,
    /// Its unary call panicked (the connection's other calls go on).
    Panicked,
    /// Its `:method` is not one of [`Service::METHODS`] (the answer is RFC 9110's 405).
    Method,
}

/// A unary call's answer, worked out on the connection's task.
pub type UnaryFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;
/// A streamed call, served on a task of its own: it answers through its [`Responder`].
pub type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a connection serves.
pub trait Service: Send + Sync + 'static {
    /// The request methods served; a request with any other token is refused
    /// ([`Refused::Method`]), one with a method that is no token is malformed (`RST_STREAM`
    /// `PROTOCOL_ERROR`).
    const METHODS: &'static [&'static [u8]];
    /// The request fields a unary call keeps ([`Kept`], by their index here), lower case; the
    /// others are checked and dropped.
    const KEPT: &'static [&'static [u8]] = &[];
    /// Whether calls to `path` are unary: answered whole, from the whole request body, on the
    /// connection's task.
    fn is_unary(&self, path: &[u8]) -> bool;
    /// Answers one unary call: `body` is the request body as it came (the connection checked
    /// only its size).
    fn unary(self: &Arc<Self>, kept: Kept, body: Bytes) -> UnaryFuture;
    /// Serves any other call on its own task, answering through `responder`.
    fn stream(
        self: &Arc<Self>,
        request: http::Request<RecvBody>,
        responder: Responder,
    ) -> StreamFuture;
    /// The answer to a stream the connection refuses (counted by the service as it likes).
    fn refuse(&self, why: Refused) -> Answer;
    /// The handshake is in (the client's preface and first SETTINGS).
    fn shaken(&self) {}
    /// Held while a stream's work lasts (it counts the stream as open).
    type Open: Send + Unpin + 'static;
    /// A stream's work starts.
    fn opened(&self) -> Self::Open;
}

/// Why a connection ends.
#[derive(Debug)]
enum Fail {
    /// A connection error: GOAWAY with this code, then close.
    Goaway(Code, &'static str),
    /// The peer is gone or the socket failed: close.
    Gone,
}

type Result<T, E = Fail> = std::result::Result<T, E>;

fn protocol(reason: &'static str) -> Fail {
    Fail::Goaway(Code::Protocol, reason)
}

/// Events counted in periods (resets, frames that make no progress).
struct Tally {
    count: u32,
    since: Instant,
}

impl Tally {
    fn new(now: Instant) -> Self {
        Self {
            count: 0,
            since: now,
        }
    }

    /// Counts one at `now`: whether more than `max` came in this `period`.
    fn over(&mut self, now: Instant, period: Duration, max: u32) -> bool {
        if now.duration_since(self.since) > period {
            self.since = now;
            self.count = 0;
        }
        self.count += 1;
        self.count > max
    }
}

/// One connection, served when awaited.
pub struct Connection<IO, S: Service> {
    io: IO,
    service: Arc<S>,
    config: Config,
    rbuf: BytesMut,
    wbuf: BytesMut,
    read_closed: bool,
    preface: bool,
    settings_seen: bool,
    decoder: Decoder,
    continuing: Option<Continuing>,
    streams: Streams<S::Open>,
    /// The highest stream id the client opened.
    last_stream: u32,
    /// The highest stream id taken on (answered, or reset by us): what a GOAWAY names. Streams
    /// opened after the last GOAWAY are ignored and never named, so the client retries them.
    taken: u32,
    /// The client's SETTINGS.
    peer_initial_window: i64,
    peer_max_frame: usize,
    send_window: i64,
    recv_window: i64,
    /// Taken by the calls (or never held) and not yet given back as connection window.
    recv_unreleased: u32,
    /// What every stream has queued to send.
    out_total: usize,
    /// Streams with something to send, blocked on the connection's send window, in order.
    blocked: VecDeque<u32>,
    /// Set by stream tasks as they take their bodies.
    task_takes: Arc<Taken>,
    /// This connection's share of the listeners' memory budget.
    charge: Charge,
    answering: FuturesUnordered<Answering>,
    events: mpsc::Sender<Event>,
    event_rx: mpsc::Receiver<Event>,
    /// Cancels every stream task when the connection ends.
    ended: CancellationToken,
    timer: Pin<Box<Sleep>>,
    timer_at: Instant,
    last_read: Instant,
    ping_sent: Option<Instant>,
    resets: Tally,
    idle_frames: Tally,
    /// A unary call's body is still on its way: its deadline is to be armed.
    partial: bool,
    /// The last streams reset by us, whose late frames are ignored.
    reset_by_us: VecDeque<u32>,
    /// Asked to go: the first GOAWAY and the drain PING sent.
    draining: bool,
    /// The last GOAWAY sent (on a drain's PING ACK, or answering the client's): no new streams.
    going: bool,
    shutdown_asked: bool,
    failed: bool,
    /// After a connection error, with the GOAWAY written: what may still be read and dropped.
    lingering: Option<usize>,
}

impl<IO, S> Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    pub fn new(io: IO, service: Arc<S>, config: Config, charge: Charge) -> Self {
        let now = Instant::now();
        let (events, event_rx) = mpsc::channel(EVENTS);
        let mut wbuf = BytesMut::with_capacity(READ_BYTES);
        frame::settings(
            &mut wbuf,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (
                    frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                    config.max_concurrent_streams,
                ),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, config.stream_window),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    u32::try_from(config.max_header_list).unwrap_or(u32::MAX),
                ),
            ],
        );
        let connection_window = i64::from(config.connection_window).max(frame::DEFAULT_WINDOW);
        if connection_window > frame::DEFAULT_WINDOW {
            let more = u32::try_from(connection_window - frame::DEFAULT_WINDOW).unwrap_or(0);
            frame::window_update(&mut wbuf, 0, more);
        }
        let first = later(now, config.keepalive_interval);
        Self {
            io,
            service,
            config,
            rbuf: BytesMut::with_capacity(READ_BYTES),
            wbuf,
            read_closed: false,
            preface: false,
            settings_seen: false,
            decoder: Decoder::new(4096),
            continuing: None,
            streams: Streams::default(),
            last_stream: 0,
            taken: 0,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::MAX_FRAME_BYTES,
            send_window: frame::DEFAULT_WINDOW,
            recv_window: connection_window,
            recv_unreleased: 0,
            out_total: 0,
            blocked: VecDeque::new(),
            task_takes: Arc::default(),
            charge,
            answering: FuturesUnordered::new(),
            events,
            event_rx,
            ended: CancellationToken::new(),
            timer: Box::pin(tokio::time::sleep_until(first)),
            timer_at: first,
            last_read: now,
            ping_sent: None,
            resets: Tally::new(now),
            idle_frames: Tally::new(now),
            partial: false,
            reset_by_us: VecDeque::new(),
            draining: false,
            going: false,
            shutdown_asked: false,
            failed: false,
            lingering: None,
        }
    }

    /// Asks the connection to go: GOAWAY now, the streams already open served to their end.
    pub fn graceful_shutdown(&mut self) {
        self.shutdown_asked = true;
    }

    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.task_takes.waker.register(cx.waker());
        let mut turns = 0;
        loop {
            if self.shutdown_asked && !self.draining {
                // Two steps, so that no stream is lost on the way: a GOAWAY that still takes
                // every stream, and a PING; once the PING's ACK is back, every stream the
                // client opened before it is known, and the last GOAWAY names the last one.
                self.draining = true;
                frame::goaway(&mut self.wbuf, frame::MAX_STREAM, Code::NoError, "");
                frame::ping(&mut self.wbuf, 0, DRAIN_PING);
            }
            let mut progress = false;
            if !self.failed {
                if !self.read_closed && self.wbuf.len() < WRITE_HIGH {
                    match self.poll_read(cx) {
                        Poll::Ready(Ok(())) => progress = true,
                        Poll::Ready(Err(Fail::Gone)) => return Poll::Ready(()),
                        Poll::Ready(Err(fail)) => self.fail(fail),
                        Poll::Pending => {}
                    }
                }
                if !self.failed {
                    if let Err(fail) = self.process() {
                        self.fail(fail);
                    }
                }
                while let Poll::Ready(Some((id, answer))) = self.answering.poll_next_unpin(cx) {
                    self.answer(id, answer);
                    progress = true;
                }
                while let Poll::Ready(Some(event)) = self.event_rx.poll_recv(cx) {
                    self.event(event);
                    progress = true;
                }
                self.taken_by_tasks();
                self.release_connection_window();
                if self.timer.as_mut().poll(cx).is_ready() {
                    if let Err(fail) = self.on_timer() {
                        self.fail(fail);
                    }
                    progress = true;
                }
            }
            match self.poll_write(cx) {
                Poll::Ready(Ok(wrote)) => progress |= wrote,
                Poll::Ready(Err(())) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            let finished = self.failed
                || (self.read_closed && self.answering.is_empty())
                || (self.going && self.streams.is_empty());
            if finished && self.wbuf.is_empty() {
                if self.failed {
                    return self.poll_linger(cx);
                }
                let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                return Poll::Ready(());
            }
            if !progress {
                self.charge.set(self.held());
                return Poll::Pending;
            }
            turns += 1;
            if turns == MAX_TURNS {
                // A client that keeps the socket full does not keep the runtime's worker.
                self.charge.set(self.held());
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }

    /// After a connection error, once its GOAWAY is written: the write side is shut and what
    /// the client still sends is read and dropped until it closes, for at most [`LINGER`] or
    /// [`LINGER_BYTES`]. Closing with its bytes unread would reset the connection, and the
    /// client (a flooding one above all) would lose the GOAWAY and its reason.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut left = match self.lingering {
            Some(left) => left,
            None => {
                let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                let by = later(Instant::now(), LINGER);
                self.timer_at = by;
                self.timer.as_mut().reset(by);
                LINGER_BYTES
            }
        };
        let done = loop {
            if self.timer.as_mut().poll(cx).is_ready() || left == 0 {
                break true;
            }
            self.rbuf.clear();
            self.rbuf.reserve(READ_BYTES);
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf) {
                Poll::Ready(Ok(0) | Err(_)) => break true,
                Poll::Ready(Ok(n)) => left = left.saturating_sub(n),
                Poll::Pending => break false,
            }
        };
        self.lingering = Some(left);
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// What the connection holds: its buffers, the bodies its streams and calls hold (what the
    /// client sent and the connection window has not had back), what waits to be sent, a
    /// header block being joined, its streams and calls.
    pub(crate) fn held(&self) -> usize {
        let bodies = i64::from(self.config.connection_window).max(frame::DEFAULT_WINDOW)
            - self.recv_window
            - i64::from(self.recv_unreleased);
        self.rbuf.capacity()
            + self.wbuf.capacity()
            + usize::try_from(bodies).unwrap_or(0)
            + self.out_total
            + self.continuing.as_ref().map_or(0, |c| c.block.capacity())
            + self.streams.len() * STREAM_BYTES
            + self.answering.len() * CALL_BYTES
    }

    /// Reads once: `Ok` when bytes came (or the peer closed its side).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.rbuf.reserve(READ_BYTES);
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.rbuf
        ))
        .map_err(|_| Fail::Gone)?;
        if n == 0 {
            self.read_closed = true;
            return Poll::Ready(Ok(()));
        }
        self.last_read = Instant::now();
        Poll::Ready(Ok(()))
    }

    /// Writes what is buffered: `Ok(true)` when something was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, ()>> {
        let mut wrote = false;
        while !self.wbuf.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.wbuf) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Err(())),
                Poll::Ready(Ok(n)) => {
                    self.wbuf.advance(n);
                    wrote = true;
                }
                Poll::Pending if wrote => return Poll::Ready(Ok(true)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if wrote {
            // The buffer keeps its allocation when emptied.
            self.wbuf.clear();
        }
        Poll::Ready(Ok(wrote))
    }

    /// The last GOAWAY (once): no new streams; the open ones are served to their end.
    fn go(&mut self) {
        if !self.going {
            self.going = true;
            frame::goaway(&mut self.wbuf, self.taken, Code::NoError, "");
        }
    }

    /// `GOAWAY(ENHANCE_YOUR_CALM)` for `reason`, counted.
    fn calm(&self, reason: &'static str) -> Fail {
        self.charge.budget().refuse(Refusal::Calm);
        Fail::Goaway(Code::EnhanceYourCalm, reason)
    }

    /// A connection error: GOAWAY, every stream's work dropped, then close once written.
    fn fail(&mut self, fail: Fail) {
        if let Fail::Goaway(code, reason) = fail {
            tracing::debug!(?code, reason, "gRPC connection error; GOAWAY");
            frame::goaway(&mut self.wbuf, self.taken, code, reason);
        }
        self.failed = true;
        self.streams.clear();
        self.ended.cancel();
    }

    /// Handles every whole frame read so far.
    fn process(&mut self) -> Result<()> {
        let mut rbuf = std::mem::take(&mut self.rbuf);
        let handled = self.frames(&rbuf);
        let used = match handled {
            Ok(used) => used,
            Err(fail) => {
                self.rbuf = rbuf;
                return Err(fail);
            }
        };
        rbuf.advance(used);
        self.rbuf = rbuf;
        self.release_connection_window();
        if std::mem::take(&mut self.partial) {
            self.arm_stream_deadlines();
        }
        Ok(())
    }

    /// Handles whole frames at the start of `bytes`; how many bytes they took.
    fn frames(&mut self, bytes: &[u8]) -> Result<usize> {
        let mut at = 0;
        if !self.preface {
            if bytes.len() < frame::PREFACE.len() {
                return if frame::PREFACE.starts_with(bytes) {
                    Ok(0)
                } else {
                    Err(Fail::Gone)
                };
            }
            if &bytes[..frame::PREFACE.len()] != frame::PREFACE {
                return Err(Fail::Gone);
            }
            self.preface = true;
            at = frame::PREFACE.len();
        }
        while let Some(header) = bytes.get(at..at + frame::HEADER_BYTES) {
            let head = Head::parse(header.try_into().map_err(|_| Fail::Gone)?);
            if head.len > frame::MAX_FRAME_BYTES {
                return Err(Fail::Goaway(Code::FrameSize, "a frame over 16384 bytes"));
            }
            let start = at + frame::HEADER_BYTES;
            let Some(payload) = bytes.get(start..start + head.len) else {
                break;
            };
            at = start + head.len;
            if !self.settings_seen && head.kind != frame::SETTINGS {
                return Err(protocol("the first frame is not SETTINGS"));
            }
            self.frame(head, payload)?;
            if self.failed {
                break;
            }
        }
        Ok(at)
    }

    fn frame(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if let Some(continuing) = &self.continuing {
            if head.kind != frame::CONTINUATION || head.stream != continuing.stream {
                return Err(protocol("a header block interrupted"));
            }
        }
        match head.kind {
            frame::DATA => self.data(head, payload),
            frame::HEADERS => self.headers(head, payload),
            frame::CONTINUATION => self.continuation(head, payload),
            frame::PRIORITY => {
                if head.stream == 0 {
                    return Err(protocol("PRIORITY on stream 0"));
                }
                if payload.len() != 5 {
                    if head.stream > self.last_stream {
                        // No RST_STREAM may name an idle stream: the stream error becomes
                        // the connection's.
                        return Err(Fail::Goaway(Code::FrameSize, "PRIORITY not 5 bytes"));
                    }
                    self.send_rst(head.stream, Code::FrameSize);
                    self.close(head.stream, Closed::ResetByUs);
                    self.count_reset()?;
                } else if headers::dependency(payload) == head.stream {
                    // A stream that depends on itself: a stream error (RFC 9113 section
                    // 5.3.1), which an idle stream cannot be sent.
                    if head.stream > self.last_stream {
                        return Err(protocol("PRIORITY of a stream on itself"));
                    }
                    if !self.state(head.stream).sent_end() {
                        self.reset(head.stream, Code::Protocol)?;
                    }
                }
                self.idle_frame()
            }
            frame::RST_STREAM => self.rst_stream(head, payload),
            frame::SETTINGS => self.settings(head, payload),
            frame::PUSH_PROMISE => Err(protocol("PUSH_PROMISE from a client")),
            frame::PING => {
                if head.stream != 0 {
                    return Err(protocol("PING on a stream"));
                }
                let payload: [u8; 8] = payload
                    .try_into()
                    .map_err(|_| Fail::Goaway(Code::FrameSize, "PING not 8 bytes"))?;
                if head.flags & frame::ACK != 0 {
                    if payload == DRAIN_PING && self.draining {
                        self.go();
                        return Ok(());
                    }
                    if self.ping_sent.take().is_some() && payload == KEEPALIVE_PING {
                        return Ok(());
                    }
                } else {
                    frame::ping(&mut self.wbuf, frame::ACK, payload);
                }
                self.idle_frame()
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(protocol("GOAWAY on a stream"));
                }
                // The client goes: the open streams are answered, and the last GOAWAY tells
                // it which of its streams were taken.
                let first = !self.going;
                self.go();
                if first {
                    Ok(())
                } else {
                    self.idle_frame()
                }
            }
            frame::WINDOW_UPDATE => self.window_update(head, payload),
            // Unknown frame types are ignored (RFC 9113 section 4.1), and counted.
            _ => self.idle_frame(),
        }
    }
}

impl<IO, S> Future for Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let polled = this.poll_run(cx);
        if polled.is_ready() {
            this.ended.cancel();
        }
        polled
    }
}

impl<IO, S: Service> Drop for Connection<IO, S> {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

/// `at` plus `duration`, or a day after `at` for durations past `Instant`'s range.
fn later(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .unwrap_or_else(|| at + Duration::from_secs(86_400))
}

//! One HTTP/2 connection (RFC 9113, server side), served on one task: frames read and written
//! in batches, unary calls polled on the connection's own task (no task, channel or body per
//! stream), everything else (streaming calls, health) handed to a task per stream with its
//! request body fed through a bounded queue.
//!
//! Bounds: SETTINGS_MAX_CONCURRENT_STREAMS counts every stream whose work is not done (a stream
//! the client reset keeps its place until its check ends, so resets cannot pile up work); a
//! header block's encoded size and decoded list; each stream's request body
//! (`limits.max_body_bytes`, and `limits.body_read_timeout` to arrive whole); flow-control
//! windows both ways; what a stream may have queued for a client that does not open its window;
//! client resets and refused streams per 10 s (GOAWAY `ENHANCE_YOUR_CALM` past it); and the
//! write buffer (reading stops while a client does not read what it is sent). A client that
//! does not ACK a keepalive PING in time is closed.

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
use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::frame::{self, Code, Head};
use super::hpack::{self, Decoder};
use crate::telemetry::Carrier;

/// Read at most this much per read call.
const READ_BYTES: usize = 16 * 1024;
/// Stop reading while this much waits to be written (a client that does not read).
const WRITE_HIGH: usize = 256 * 1024;
/// What one stream may have queued to send, waiting for the client's window.
const MAX_QUEUED_OUT: usize = 1024 * 1024;
/// Client resets and refused streams allowed per [`RESET_PERIOD`].
const MAX_RESETS: u32 = 2_000;
const RESET_PERIOD: Duration = Duration::from_secs(10);
/// Events queued from a connection's stream tasks.
const EVENTS: usize = 64;
/// The payloads of the keepalive PING and of the PING that ends a drain's first step.
const KEEPALIVE_PING: [u8; 8] = *b"sluice\0\0";
const DRAIN_PING: [u8; 8] = *b"drain\0\0\0";
/// Streams reset by us remembered, for the frames a client sent before it knew.
const RESET_MEMORY: usize = 256;
static EMPTY: Bytes = Bytes::from_static(b"");
/// `:status` (RFC 7541 Appendix A: static-table entry 8, `200` is entry 8 whole).
const STATUS_200: u8 = 0x88;
const STATUS_NAME: usize = 8;
/// A gRPC answer's head: `:status: 200` (indexed) and `content-type: application/grpc` (a
/// literal without indexing whose name is static-table entry 31, prefix 15 + 16).
const GRPC_HEAD: &[u8] = b"\x88\x0f\x10\x10application/grpc";
/// `grpc-status: 0`, a literal without indexing with a literal name.
const GRPC_OK: &[u8] = b"\x00\x0bgrpc-status\x010";

/// What a connection allows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub(crate) max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request's decoded header list.
    pub(crate) max_header_list: usize,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what the client may send on a stream before we read it.
    pub(crate) stream_window: u32,
    /// What the client may send on the connection before we read it.
    pub(crate) connection_window: u32,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    /// Longest a request body may take to arrive whole.
    pub(crate) body_read_timeout: Duration,
    /// Largest request message (without its 5-byte prefix).
    pub(crate) max_message_bytes: usize,
}

/// A unary call's answer: the framed message, or the status refusing it.
pub(crate) type UnaryFuture = Pin<Box<dyn Future<Output = Result<BytesMut, Status>> + Send>>;
/// A streaming call's answer.
pub(crate) type StreamFuture =
    Pin<Box<dyn Future<Output = hyper::Response<tonic::body::Body>> + Send>>;

/// What a connection serves.
pub(crate) trait Service: Send + Sync + 'static {
    /// Whether calls to `path` are unary: answered whole, from the whole request body, on the
    /// connection's task.
    fn is_unary(&self, path: &[u8]) -> bool;
    /// Answers one unary call: `body` is the request body as it came (the connection checked
    /// only its size).
    fn unary(self: &Arc<Self>, trace: Trace, body: Bytes) -> UnaryFuture;
    /// Serves any other call on its own task.
    fn stream(self: &Arc<Self>, request: hyper::Request<RecvBody>) -> StreamFuture;
    /// Counts a call the connection refused before any service saw it.
    fn refused(&self, status: &Status);
    /// The handshake is in (the client's preface and first SETTINGS).
    fn shaken(&self) {}
    /// Held while a stream's work lasts (it counts the stream as open).
    type Open: Send + Unpin + 'static;
    /// A stream's work starts.
    fn opened(&self) -> Self::Open;
}

/// A request's trace context, the only headers a unary call reads.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    parent: Option<String>,
    state: Option<String>,
}

impl Carrier for Trace {
    fn value(&self, name: &str) -> Option<&str> {
        match name {
            "traceparent" => self.parent.as_deref(),
            "tracestate" => self.state.as_deref(),
            _ => None,
        }
    }
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

/// A hasher for stream ids (odd integers the client picks in order; no attacker-chosen
/// collisions beyond a bounded map).
#[derive(Default)]
struct IdHasher(u64);

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

type Streams<O> = HashMap<u32, Stream<O>, BuildHasherDefault<IdHasher>>;

/// One stream the server still has work for.
struct Stream<O> {
    /// The client may still send (no END_STREAM or reset yet).
    recv_open: bool,
    /// What the client may still send before a WINDOW_UPDATE.
    recv_window: i64,
    /// Received and not yet given back as window.
    recv_unreleased: u32,
    /// What we may still send.
    send_window: i64,
    kind: Kind,
    /// Waiting for the client's window, in order.
    out: VecDeque<Out>,
    out_bytes: usize,
    /// The answer's end has been written (or the stream reset).
    done: bool,
    /// The stream's work, counted as open until the stream goes.
    _open: O,
}

enum Kind {
    /// A unary call whose body is arriving.
    Gathering {
        body: BytesMut,
        trace: Trace,
        by: Instant,
    },
    /// A unary call being answered on the connection's task.
    Answering,
    /// A unary call answered (its answer may wait for the client's window).
    Answered,
    /// A call served on its own task.
    Task {
        body: Option<mpsc::UnboundedSender<Result<Bytes, Broken>>>,
        queued: Arc<AtomicUsize>,
        cancel: CancellationToken,
    },
}

enum Out {
    Data(Bytes),
    /// An encoded header block ending the stream (trailers).
    Trailers(Bytes),
    /// The end of the stream without trailers (an empty DATA with END_STREAM).
    End,
}

/// What a stream's task tells the connection.
enum Event {
    Head(u32, StatusCode, HeaderMap),
    Data(u32, Bytes),
    Trailers(u32, HeaderMap),
    End(u32),
}

/// A unary call's answer being worked out, tagged with its stream.
struct Answering {
    id: u32,
    future: UnaryFuture,
}

impl Future for Answering {
    type Output = (u32, Result<BytesMut, Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        // A panic in one call answers that call INTERNAL, not the connection's other calls.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.future.as_mut().poll(cx))) {
            Ok(Poll::Ready(answer)) => Poll::Ready((id, answer)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready((id, Err(Status::internal("the check failed")))),
        }
    }
}

/// A request's head as decoded. A unary call's pseudo-headers are checked, not kept.
#[derive(Default)]
struct RequestHead {
    method: Option<Bytes>,
    /// Kept only for calls served on a task.
    path: Option<Bytes>,
    scheme: bool,
    authority: Option<Bytes>,
    /// Decided by `:path`.
    unary: Option<bool>,
    regular: bool,
    /// Kept only for calls served on a task.
    headers: Vec<(Bytes, Bytes)>,
    trace: Trace,
    malformed: Option<&'static str>,
}

impl RequestHead {
    fn field(&mut self, name: &[u8], value: &[u8], service: &dyn IsUnary) {
        if self.malformed.is_some() {
            return;
        }
        if name.iter().any(u8::is_ascii_uppercase) {
            self.malformed = Some("an upper-case header name");
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.regular {
                self.malformed = Some("a pseudo-header after a regular header");
                return;
            }
            let repeated = match pseudo {
                b"method" => {
                    let method = if value == b"POST" {
                        Bytes::from_static(b"POST")
                    } else {
                        Bytes::copy_from_slice(value)
                    };
                    self.method.replace(method).is_some()
                }
                b"path" => {
                    let unary = service.is_unary(value);
                    if !unary {
                        self.path = Some(Bytes::copy_from_slice(value));
                    }
                    self.unary.replace(unary).is_some()
                }
                // Any authority is taken (an Istio cluster name, a socket path).
                b"authority" => {
                    let copy = (self.unary != Some(true)).then(|| Bytes::copy_from_slice(value));
                    std::mem::replace(&mut self.authority, copy.or(Some(Bytes::new()))).is_some()
                }
                b"scheme" => std::mem::replace(&mut self.scheme, true),
                _ => {
                    self.malformed = Some("an unknown pseudo-header");
                    return;
                }
            };
            if repeated {
                self.malformed = Some("a repeated pseudo-header");
            }
            return;
        }
        self.regular = true;
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => {
                self.malformed = Some("a connection-specific header");
                return;
            }
            b"te" if value != b"trailers" => {
                self.malformed = Some("te other than trailers");
                return;
            }
            b"traceparent" => {
                self.trace.parent = std::str::from_utf8(value).ok().map(str::to_owned)
            }
            b"tracestate" => self.trace.state = std::str::from_utf8(value).ok().map(str::to_owned),
            _ => {}
        }
        if self.unary != Some(true) {
            self.headers
                .push((Bytes::copy_from_slice(name), Bytes::copy_from_slice(value)));
        }
    }
}

/// The part of a [`Service`] header decoding asks (object safe).
trait IsUnary {
    fn is_unary(&self, path: &[u8]) -> bool;
}

impl<S: Service> IsUnary for S {
    fn is_unary(&self, path: &[u8]) -> bool {
        Service::is_unary(self, path)
    }
}

/// A header block arriving in HEADERS and CONTINUATION frames.
struct Continuing {
    stream: u32,
    end_stream: bool,
    block: BytesMut,
}

/// One connection, served when awaited.
pub(crate) struct Connection<IO, S: Service> {
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
    /// The client's SETTINGS.
    peer_initial_window: i64,
    peer_max_frame: usize,
    send_window: i64,
    recv_window: i64,
    recv_unreleased: u32,
    answering: FuturesUnordered<Answering>,
    events: mpsc::Sender<Event>,
    event_rx: mpsc::Receiver<Event>,
    /// Cancels every stream task when the connection ends.
    ended: CancellationToken,
    timer: Pin<Box<Sleep>>,
    timer_at: Instant,
    last_read: Instant,
    ping_sent: Option<Instant>,
    resets: u32,
    resets_since: Instant,
    /// A unary call's body is still on its way: its deadline is to be armed.
    partial: bool,
    /// The last streams reset by us, whose late frames are ignored.
    reset_by_us: VecDeque<u32>,
    /// Asked to go: the first GOAWAY and the drain PING sent.
    draining: bool,
    /// The last GOAWAY sent (or the client's received): no new streams.
    going: bool,
    shutdown_asked: bool,
    failed: bool,
}

impl<IO, S> Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    pub(crate) fn new(io: IO, service: Arc<S>, config: Config) -> Self {
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
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::MAX_FRAME_BYTES,
            send_window: frame::DEFAULT_WINDOW,
            recv_window: connection_window,
            recv_unreleased: 0,
            answering: FuturesUnordered::new(),
            events,
            event_rx,
            ended: CancellationToken::new(),
            timer: Box::pin(tokio::time::sleep_until(first)),
            timer_at: first,
            last_read: now,
            ping_sent: None,
            resets: 0,
            resets_since: now,
            partial: false,
            reset_by_us: VecDeque::new(),
            draining: false,
            going: false,
            shutdown_asked: false,
            failed: false,
        }
    }

    /// Asks the connection to go: GOAWAY now, the streams already open served to their end.
    pub(crate) fn graceful_shutdown(&mut self) {
        self.shutdown_asked = true;
    }

    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<()> {
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
                let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
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

    /// A connection error: GOAWAY, every stream's work dropped, then close once written.
    fn fail(&mut self, fail: Fail) {
        if let Fail::Goaway(code, reason) = fail {
            tracing::debug!(?code, reason, "gRPC connection error; GOAWAY");
            frame::goaway(&mut self.wbuf, self.last_stream, code, reason);
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
                    self.reset(head.stream, Code::FrameSize)?;
                }
                Ok(())
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
                    if payload == DRAIN_PING && self.draining && !self.going {
                        self.going = true;
                        frame::goaway(&mut self.wbuf, self.last_stream, Code::NoError, "");
                    } else {
                        self.ping_sent = None;
                    }
                } else {
                    frame::ping(&mut self.wbuf, frame::ACK, payload);
                }
                Ok(())
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(protocol("GOAWAY on a stream"));
                }
                // The client goes: no new streams; the open ones are answered.
                self.going = true;
                Ok(())
            }
            frame::WINDOW_UPDATE => self.window_update(head, payload),
            // Unknown frame types are ignored (RFC 9113 section 4.1).
            _ => Ok(()),
        }
    }

    fn settings(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream != 0 {
            return Err(protocol("SETTINGS on a stream"));
        }
        if head.flags & frame::ACK != 0 {
            if !payload.is_empty() {
                return Err(Fail::Goaway(
                    Code::FrameSize,
                    "a SETTINGS ACK with a payload",
                ));
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Fail::Goaway(
                Code::FrameSize,
                "SETTINGS not a multiple of 6",
            ));
        }
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(protocol("SETTINGS_ENABLE_PUSH above 1"));
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > frame::MAX_WINDOW {
                        return Err(Fail::Goaway(
                            Code::FlowControl,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for stream in self.streams.values_mut() {
                        stream.send_window += delta;
                        if stream.send_window > frame::MAX_WINDOW {
                            return Err(Fail::Goaway(
                                Code::FlowControl,
                                "a stream window above 2^31-1",
                            ));
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err(protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                    }
                    self.peer_max_frame = value as usize;
                }
                // The server never indexes what it sends, so the client's table size and
                // header list size do not bind it; unknown settings are ignored.
                _ => {}
            }
        }
        frame::settings_ack(&mut self.wbuf);
        if !self.settings_seen {
            self.settings_seen = true;
            self.service.shaken();
        }
        self.flush_all();
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let bytes: [u8; 4] = payload
            .try_into()
            .map_err(|_| Fail::Goaway(Code::FrameSize, "WINDOW_UPDATE not 4 bytes"))?;
        let increment = i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff);
        if head.stream == 0 {
            if increment == 0 {
                return Err(protocol("a connection WINDOW_UPDATE of 0"));
            }
            self.send_window += increment;
            if self.send_window > frame::MAX_WINDOW {
                return Err(Fail::Goaway(
                    Code::FlowControl,
                    "the connection window above 2^31-1",
                ));
            }
            self.flush_all();
            return Ok(());
        }
        self.idle_check(head.stream)?;
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if increment == 0 {
            return self.reset(head.stream, Code::Protocol);
        }
        stream.send_window += increment;
        if stream.send_window > frame::MAX_WINDOW {
            return self.reset(head.stream, Code::FlowControl);
        }
        self.flush(head.stream);
        Ok(())
    }

    /// A frame on a stream the client has not opened yet is a connection error.
    fn idle_check(&self, stream: u32) -> Result<()> {
        if stream > self.last_stream {
            return Err(protocol("a frame on a stream not opened"));
        }
        Ok(())
    }

    fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream == 0 {
            return Err(protocol("RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(Fail::Goaway(Code::FrameSize, "RST_STREAM not 4 bytes"));
        }
        self.idle_check(head.stream)?;
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        stream.recv_open = false;
        stream.done = true;
        stream.out.clear();
        let answering = matches!(stream.kind, Kind::Answering);
        if let Kind::Task { body, cancel, .. } = &mut stream.kind {
            if let Some(body) = body.take() {
                let _ = body.send(Err(Broken));
            }
            cancel.cancel();
        }
        // A call being answered keeps its place until its check ends.
        if !answering {
            self.streams.remove(&head.stream);
        }
        self.count_reset()
    }

    /// Counts a client reset or a refused stream; past the bound, the connection goes.
    fn count_reset(&mut self) -> Result<()> {
        let now = Instant::now();
        if now.duration_since(self.resets_since) > RESET_PERIOD {
            self.resets_since = now;
            self.resets = 0;
        }
        self.resets += 1;
        if self.resets > MAX_RESETS {
            return Err(Fail::Goaway(
                Code::EnhanceYourCalm,
                "too many streams reset or refused",
            ));
        }
        Ok(())
    }

    /// Writes RST_STREAM for a stream the client may still send on; what it sends there
    /// next is ignored.
    fn send_rst(&mut self, id: u32, code: Code) {
        frame::rst_stream(&mut self.wbuf, id, code);
        if self.reset_by_us.len() == RESET_MEMORY {
            self.reset_by_us.pop_front();
        }
        self.reset_by_us.push_back(id);
    }

    /// Resets one stream (a stream error).
    fn reset(&mut self, id: u32, code: Code) -> Result<()> {
        self.send_rst(id, code);
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.recv_open = false;
            stream.done = true;
            stream.out.clear();
            match &mut stream.kind {
                Kind::Answering => return Ok(()),
                Kind::Task { cancel, body, .. } => {
                    if let Some(body) = body.take() {
                        let _ = body.send(Err(Broken));
                    }
                    cancel.cancel();
                }
                Kind::Gathering { .. } | Kind::Answered => {}
            }
            self.streams.remove(&id);
        }
        Ok(())
    }

    fn data(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let id = head.stream;
        if id == 0 {
            return Err(protocol("DATA on stream 0"));
        }
        self.idle_check(id)?;
        // Flow control counts the whole payload, padding included.
        let len = payload.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return Err(Fail::Goaway(
                Code::FlowControl,
                "DATA past the connection window",
            ));
        }
        self.recv_unreleased += len;
        let data = frame::unpad(payload, head.flags)
            .ok_or_else(|| protocol("padding longer than the frame"))?;
        let end = head.flags & frame::END_STREAM != 0;
        let max_body = self.config.max_message_bytes.saturating_add(5);
        let window = self.config.stream_window;
        let Some(stream) = self.streams.get_mut(&id) else {
            // A stream already closed (reset, refused, answered): the client may not know yet.
            return Ok(());
        };
        if !stream.recv_open {
            return self.reset(id, Code::StreamClosed);
        }
        stream.recv_window -= i64::from(len);
        if stream.recv_window < 0 {
            return self.reset(id, Code::FlowControl);
        }
        stream.recv_unreleased += len;
        if end {
            stream.recv_open = false;
        }
        let mut over = None;
        let mut release = false;
        match &mut stream.kind {
            Kind::Gathering { body, .. } => {
                if body.len() + data.len() > max_body {
                    over = Some(Code::NoError);
                } else {
                    body.extend_from_slice(data);
                    release = !end;
                }
            }
            Kind::Task { body, queued, .. } => {
                let total = queued.fetch_add(data.len(), Ordering::AcqRel) + data.len();
                if total > max_body.saturating_add(window as usize) {
                    // The task does not take its body as fast as it comes.
                    over = Some(Code::EnhanceYourCalm);
                } else {
                    if let Some(sender) = body.as_ref().filter(|_| !data.is_empty()) {
                        let _ = sender.send(Ok(Bytes::copy_from_slice(data)));
                    }
                    if end {
                        body.take();
                    }
                    release = !end;
                }
            }
            Kind::Answering | Kind::Answered => {}
        }
        // The window is given back as the body is taken (it is bounded above).
        if release && stream.recv_unreleased >= window / 2 {
            let more = std::mem::take(&mut stream.recv_unreleased);
            stream.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, id, more);
        }
        match over {
            Some(Code::NoError) => {
                let status = Status::resource_exhausted(format!(
                    "request message over limits.max_body_bytes ({} bytes)",
                    self.config.max_message_bytes
                ));
                return self.refuse(id, status);
            }
            Some(code) => return self.reset(id, code),
            None => {}
        }
        if end {
            self.start_unary(id);
        }
        self.finish_if_done(id);
        Ok(())
    }

    /// Gives the connection's window back once half of it has been read.
    fn release_connection_window(&mut self) {
        if self.recv_unreleased >= self.config.connection_window / 2 {
            let more = std::mem::take(&mut self.recv_unreleased);
            self.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, 0, more);
        }
    }

    fn headers(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream == 0 {
            return Err(protocol("HEADERS on stream 0"));
        }
        let mut fragment = frame::unpad(payload, head.flags)
            .ok_or_else(|| protocol("padding longer than the frame"))?;
        if head.flags & frame::PRIORITY_FLAG != 0 {
            fragment = fragment
                .get(5..)
                .ok_or_else(|| protocol("HEADERS too short for its priority"))?;
        }
        let end_stream = head.flags & frame::END_STREAM != 0;
        if head.flags & frame::END_HEADERS != 0 {
            return self.header_block(head.stream, end_stream, fragment);
        }
        self.check_block_size(fragment.len())?;
        self.continuing = Some(Continuing {
            stream: head.stream,
            end_stream,
            block: BytesMut::from(fragment),
        });
        Ok(())
    }

    fn continuation(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let Some(mut continuing) = self.continuing.take() else {
            return Err(protocol("CONTINUATION without HEADERS"));
        };
        self.check_block_size(continuing.block.len() + payload.len())?;
        continuing.block.extend_from_slice(payload);
        if head.flags & frame::END_HEADERS != 0 {
            return self.header_block(continuing.stream, continuing.end_stream, &continuing.block);
        }
        self.continuing = Some(continuing);
        Ok(())
    }

    /// A header block's encoded size is bounded before it is decoded: past the list's bound
    /// (and a margin for HPACK's framing), the connection goes (its HPACK state could not be
    /// kept without decoding the whole block).
    fn check_block_size(&self, len: usize) -> Result<()> {
        if len > self.config.max_header_list + 1024 {
            return Err(Fail::Goaway(
                Code::EnhanceYourCalm,
                "a header block over the header list size",
            ));
        }
        Ok(())
    }

    fn header_block(&mut self, id: u32, end_stream: bool, block: &[u8]) -> Result<()> {
        let mut request = RequestHead::default();
        let service = Arc::clone(&self.service);
        let decoded = self
            .decoder
            .decode(block, self.config.max_header_list, |name, value| {
                request.field(name, value, service.as_ref());
            })
            .map_err(|error| Fail::Goaway(Code::Compression, error.0))?;
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers: they must end the stream; their content is not used.
            if !stream.recv_open || !end_stream {
                return self.reset(id, Code::Protocol);
            }
            stream.recv_open = false;
            if let Kind::Gathering { .. } = stream.kind {
                self.start_unary(id);
            } else if let Kind::Task { body, .. } = &mut stream.kind {
                body.take();
            }
            self.finish_if_done(id);
            return Ok(());
        }
        if id <= self.last_stream {
            // Trailers on a stream we reset: the client may not know yet. Anything else opens
            // a stream below one already opened.
            if self.reset_by_us.contains(&id) {
                return Ok(());
            }
            return Err(protocol("a new stream id not above the last one"));
        }
        if id.is_multiple_of(2) {
            return Err(protocol("a client stream with an even id"));
        }
        self.last_stream = id;
        if self.going {
            // Not processed: the GOAWAY's last stream id tells the client to retry it; what
            // it sends there meanwhile is ignored.
            self.reset_by_us.push_back(id);
            if self.reset_by_us.len() > RESET_MEMORY {
                self.reset_by_us.pop_front();
            }
            return Ok(());
        }
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            self.send_rst(id, Code::RefusedStream);
            return self.count_reset();
        }
        if let Some(reason) = request.malformed {
            tracing::debug!(reason, "malformed gRPC request headers; stream reset");
            self.send_rst(id, Code::Protocol);
            return self.count_reset();
        }
        let (Some(method), Some(unary), true) = (&request.method, request.unary, request.scheme)
        else {
            self.send_rst(id, Code::Protocol);
            return self.count_reset();
        };
        let mut stream = Stream {
            recv_open: !end_stream,
            recv_window: i64::from(self.config.stream_window),
            recv_unreleased: 0,
            send_window: self.peer_initial_window,
            kind: Kind::Answering,
            out: VecDeque::new(),
            out_bytes: 0,
            done: false,
            _open: self.service.opened(),
        };
        if decoded.oversized {
            self.streams.insert(id, stream);
            let status = Status::resource_exhausted(format!(
                "request headers over {} bytes",
                self.config.max_header_list
            ));
            return self.refuse(id, status);
        }
        if unary {
            stream.kind = Kind::Gathering {
                body: BytesMut::new(),
                trace: std::mem::take(&mut request.trace),
                by: later(Instant::now(), self.config.body_read_timeout),
            };
            self.streams.insert(id, stream);
            if end_stream {
                self.start_unary(id);
            } else {
                self.partial = true;
            }
            return Ok(());
        }
        let path = request.path.as_ref().unwrap_or(&EMPTY);
        let http = match http_request(method, path, request.authority.as_ref(), &request.headers) {
            Ok(http) => http,
            Err(()) => {
                drop(stream);
                self.send_rst(id, Code::Protocol);
                return self.count_reset();
            }
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let cancel = self.ended.child_token();
        let body = RecvBody {
            receiver,
            queued: Arc::clone(&queued),
        };
        stream.kind = Kind::Task {
            body: (!end_stream).then_some(sender),
            queued,
            cancel: cancel.clone(),
        };
        self.streams.insert(id, stream);
        let future = self.service.stream(http.map(|()| body));
        tokio::spawn(drive(id, future, self.events.clone(), cancel));
        Ok(())
    }

    /// Refuses a stream with a gRPC status (trailers only), counted.
    fn refuse(&mut self, id: u32, status: Status) -> Result<()> {
        self.service.refused(&status);
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.kind = Kind::Answering;
        }
        self.answer(id, Err(status));
        Ok(())
    }

    /// The whole body is in: the call starts on the connection's task.
    fn start_unary(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let Kind::Gathering { body, trace, .. } =
            std::mem::replace(&mut stream.kind, Kind::Answering)
        else {
            return;
        };
        let future = self.service.unary(trace, body.freeze());
        self.answering.push(Answering { id, future });
    }

    /// A unary call's answer, written (or queued for the client's window).
    fn answer(&mut self, id: u32, answer: Result<BytesMut, Status>) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.kind = Kind::Answered;
        if stream.done {
            // Reset while it was being answered: its place is free now.
            self.streams.remove(&id);
            return;
        }
        match answer {
            Ok(message) => {
                write_block(&mut self.wbuf, id, GRPC_HEAD, false, self.peer_max_frame);
                let room = self.send_window.min(stream.send_window);
                if stream.out.is_empty()
                    && message.len() <= self.peer_max_frame
                    && i64::try_from(message.len()).is_ok_and(|len| len <= room)
                {
                    // The usual case, written at once: nothing queued, nothing allocated.
                    let len = message.len();
                    frame::head(&mut self.wbuf, len, frame::DATA, 0, id);
                    self.wbuf.put_slice(&message);
                    self.send_window -= len as i64;
                    stream.send_window -= len as i64;
                    write_block(&mut self.wbuf, id, GRPC_OK, true, self.peer_max_frame);
                    stream.done = true;
                } else {
                    let message = message.freeze();
                    stream.out_bytes += message.len();
                    stream.out.push_back(Out::Data(message));
                    stream
                        .out
                        .push_back(Out::Trailers(Bytes::from_static(GRPC_OK)));
                }
            }
            Err(status) => {
                let mut block = BytesMut::with_capacity(64);
                block.put_slice(GRPC_HEAD);
                grpc_status(&mut block, status.code() as i32, status.message());
                write_block(&mut self.wbuf, id, &block, true, self.peer_max_frame);
                stream.done = true;
            }
        }
        self.flush(id);
    }

    fn event(&mut self, event: Event) {
        let id = match &event {
            Event::Head(id, ..) | Event::Data(id, _) | Event::Trailers(id, _) | Event::End(id) => {
                *id
            }
        };
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.done {
            return;
        }
        match event {
            Event::Head(_, status, headers) => {
                let mut block = BytesMut::with_capacity(64);
                if status == StatusCode::OK {
                    block.put_u8(STATUS_200);
                } else {
                    hpack::encode_literal_indexed_name(
                        STATUS_NAME,
                        status.as_str().as_bytes(),
                        &mut block,
                    );
                }
                encode_headers(&headers, &mut block);
                write_block(&mut self.wbuf, id, &block, false, self.peer_max_frame);
            }
            Event::Data(_, data) => {
                stream.out_bytes += data.len();
                stream.out.push_back(Out::Data(data));
                if stream.out_bytes > MAX_QUEUED_OUT {
                    tracing::debug!(
                        "a gRPC client left its window closed with 1 MiB queued; stream reset"
                    );
                    let _ = self.reset(id, Code::Cancel);
                    return;
                }
            }
            Event::Trailers(_, trailers) => {
                let mut block = BytesMut::with_capacity(64);
                encode_headers(&trailers, &mut block);
                stream.out.push_back(Out::Trailers(block.freeze()));
            }
            Event::End(_) => stream.out.push_back(Out::End),
        }
        self.flush(id);
    }

    /// Writes what every stream has queued, as far as the windows allow.
    fn flush_all(&mut self) {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.out.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.flush(id);
        }
    }

    /// Writes what one stream has queued, as far as the windows allow.
    fn flush(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        while let Some(out) = stream.out.front_mut() {
            match out {
                Out::Data(data) => {
                    let room = self
                        .send_window
                        .min(stream.send_window)
                        .min(self.peer_max_frame as i64);
                    if room <= 0 && !data.is_empty() {
                        return;
                    }
                    let n = data.len().min(usize::try_from(room).unwrap_or(0));
                    frame::head(&mut self.wbuf, n, frame::DATA, 0, id);
                    self.wbuf.put_slice(&data[..n]);
                    data.advance(n);
                    self.send_window -= n as i64;
                    stream.send_window -= n as i64;
                    stream.out_bytes -= n;
                    if data.is_empty() {
                        stream.out.pop_front();
                    }
                }
                Out::Trailers(block) => {
                    write_block(&mut self.wbuf, id, &block[..], true, self.peer_max_frame);
                    stream.out.pop_front();
                    stream.done = true;
                }
                Out::End => {
                    frame::head(&mut self.wbuf, 0, frame::DATA, frame::END_STREAM, id);
                    stream.out.pop_front();
                    stream.done = true;
                }
            }
        }
        self.finish_if_done(id);
    }

    /// Drops a stream both sides are done with; tells a client still sending that its
    /// answer is complete.
    fn finish_if_done(&mut self, id: u32) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        // A call still being answered keeps its place, reset or not.
        if !stream.done || matches!(stream.kind, Kind::Answering) {
            return;
        }
        if stream.recv_open {
            // The client is still sending: tell it the answer is complete.
            self.send_rst(id, Code::NoError);
        }
        if let Some(Stream {
            kind: Kind::Task { cancel, .. },
            ..
        }) = self.streams.remove(&id)
        {
            cancel.cancel();
        }
    }

    /// Arms the timer for the earliest body deadline of a stream still gathering its body.
    fn arm_stream_deadlines(&mut self) {
        let earliest = self
            .streams
            .values()
            .filter_map(|stream| match &stream.kind {
                Kind::Gathering { by, .. } => Some(*by),
                _ => None,
            })
            .min();
        if let Some(by) = earliest {
            self.arm(by);
        }
    }

    fn arm(&mut self, at: Instant) {
        if at < self.timer_at {
            self.timer_at = at;
            self.timer.as_mut().reset(at);
        }
    }

    fn on_timer(&mut self) -> Result<()> {
        let now = Instant::now();
        let stalled: Vec<u32> = self
            .streams
            .iter()
            .filter_map(|(&id, stream)| match &stream.kind {
                Kind::Gathering { by, .. } if *by <= now => Some(id),
                _ => None,
            })
            .collect();
        for id in stalled {
            let status = Status::deadline_exceeded(format!(
                "the request message did not arrive within limits.body_read_timeout ({})",
                crate::config::HumanDuration(
                    u64::try_from(self.config.body_read_timeout.as_micros()).unwrap_or(u64::MAX)
                )
            ));
            // Answered, then reset (the client is still sending).
            self.refuse(id, status)?;
        }
        if let Some(sent) = self.ping_sent {
            if now.duration_since(sent) >= self.config.keepalive_timeout {
                tracing::debug!("gRPC client did not answer a keepalive PING; closed");
                return Err(Fail::Gone);
            }
        } else if now.duration_since(self.last_read) >= self.config.keepalive_interval {
            frame::ping(&mut self.wbuf, 0, KEEPALIVE_PING);
            self.ping_sent = Some(now);
        }
        let next = match self.ping_sent {
            Some(sent) => later(sent, self.config.keepalive_timeout),
            None => later(self.last_read, self.config.keepalive_interval),
        };
        let next = next.max(now + Duration::from_millis(1));
        self.timer_at = next;
        self.timer.as_mut().reset(next);
        self.arm_stream_deadlines();
        Ok(())
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

/// Serves one call on its own task: the service's answer sent to the connection as events.
async fn drive(
    id: u32,
    answer: StreamFuture,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,
) {
    let run = async {
        let answer = answer.await;
        let (parts, mut body) = answer.into_parts();
        if events
            .send(Event::Head(id, parts.status, parts.headers))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let event = match body.frame().await {
                None => Event::End(id),
                Some(Err(status)) => Event::Trailers(id, status_trailers(&status)),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if events.send(Event::Data(id, data)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => Event::Trailers(id, trailers),
                        Err(_) => continue,
                    },
                },
            };
            let _ = events.send(event).await;
            return;
        }
    };
    tokio::select! {
        () = run => {}
        () = cancel.cancelled() => {}
    }
}

fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
    if let Ok(message) = HeaderValue::from_bytes(percent_encode(status.message()).as_bytes()) {
        if !status.message().is_empty() {
            trailers.insert("grpc-message", message);
        }
    }
    trailers
}

/// The request a task's service sees.
fn http_request(
    method: &Bytes,
    path: &Bytes,
    authority: Option<&Bytes>,
    headers: &[(Bytes, Bytes)],
) -> std::result::Result<hyper::Request<()>, ()> {
    let uri = match authority {
        Some(authority) => hyper::Uri::builder()
            .scheme("http")
            .authority(authority.as_ref())
            .path_and_query(path.as_ref())
            .build(),
        None => hyper::Uri::builder().path_and_query(path.as_ref()).build(),
    }
    // An authority `http::Uri` does not take (an Istio cluster name) is not needed here.
    .or_else(|_| hyper::Uri::builder().path_and_query(path.as_ref()).build())
    .map_err(|_| ())?;
    let mut request = hyper::Request::builder()
        .method(hyper::Method::from_bytes(method).map_err(|_| ())?)
        .uri(uri)
        .version(hyper::Version::HTTP_2)
        .body(())
        .map_err(|_| ())?;
    let map = request.headers_mut();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name).map_err(|_| ())?;
        let value = HeaderValue::from_maybe_shared(value.clone()).map_err(|_| ())?;
        map.append(name, value);
    }
    Ok(request)
}

/// `grpc-status` and, when there is one, `grpc-message` (percent-encoded as gRPC asks).
fn grpc_status(block: &mut BytesMut, code: i32, message: &str) {
    hpack::encode_literal(b"grpc-status", code.to_string().as_bytes(), block);
    if !message.is_empty() {
        hpack::encode_literal(b"grpc-message", percent_encode(message).as_bytes(), block);
    }
}

/// gRPC's percent-encoding of `grpc-message`: bytes outside printable ASCII, and `%`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn encode_headers(headers: &HeaderMap, block: &mut BytesMut) {
    for (name, value) in headers {
        hpack::encode_literal(name.as_str().as_bytes(), value.as_bytes(), block);
    }
}

/// Writes a header block as HEADERS and, past the client's frame size, CONTINUATION frames.
fn write_block(out: &mut BytesMut, id: u32, block: &[u8], end_stream: bool, max_frame: usize) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let rest = chunks.len();
    let mut flags = if end_stream { frame::END_STREAM } else { 0 };
    if rest == 0 {
        flags |= frame::END_HEADERS;
    }
    frame::head(out, first.len(), frame::HEADERS, flags, id);
    out.put_slice(first);
    for (i, chunk) in chunks.enumerate() {
        let flags = if i + 1 == rest { frame::END_HEADERS } else { 0 };
        frame::head(out, chunk.len(), frame::CONTINUATION, flags, id);
        out.put_slice(chunk);
    }
}

/// A request body broke off (the stream was reset).
#[derive(Debug)]
pub(crate) struct Broken;

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request stream broke off")
    }
}

impl std::error::Error for Broken {}

/// The request body of a call served on its own task, as its DATA frames arrive.
pub(crate) struct RecvBody {
    receiver: mpsc::UnboundedReceiver<Result<Bytes, Broken>>,
    queued: Arc<AtomicUsize>,
}

impl hyper::body::Body for RecvBody {
    type Data = Bytes;
    type Error = Broken;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Broken>>> {
        match ready!(self.receiver.poll_recv(cx)) {
            Some(Ok(data)) => {
                self.queued.fetch_sub(data.len(), Ordering::AcqRel);
                Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
            }
            Some(Err(broken)) => Poll::Ready(Some(Err(broken))),
            None => Poll::Ready(None),
        }
    }
}

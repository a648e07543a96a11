//! The gRPC listener held to HTTP/2 (RFC 9113) and to its bounds from the outside, with frames
//! written by hand over TCP: whatever HTTP/2 server sits behind the listener (hyper/h2 today, a
//! narrower one of sluice's own later) must answer conforming requests, refuse protocol errors
//! with the error code the RFC names, and bound abusive clients (rapid reset, CONTINUATION and
//! PING floods, HPACK bombs) while a well-behaved connection keeps being answered. Requests are
//! HPACK-encoded as static-table references and literals without indexing or Huffman; answers
//! are judged by frame types, flags, error codes and the DATA payload (a `RateLimitResponse`),
//! never by the server's HPACK, whose encoding choices are its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use prost::Message;
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice::transport::grpc::SERVICE_NAME;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpSocket;

use crate::grpc_client::{descriptor, grpc_settings, request, spawn_grpc_in, GrpcApp, OK};
use crate::helpers::SHIPPED_POLICIES;

/// Longest any single wait here may take (every read is bounded by it).
const WAIT: Duration = Duration::from_secs(20);
/// Silence this long is taken as "nothing more is coming" where a frame must *not* come.
const QUIET: Duration = Duration::from_millis(500);

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const FRAME_SIZE_ERROR: u32 = 0x6;
const STREAM_CLOSED: u32 = 0x5;
const REFUSED_STREAM: u32 = 0x7;
const CANCEL: u32 = 0x8;
const COMPRESSION_ERROR: u32 = 0x9;

const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// The default SETTINGS_MAX_FRAME_SIZE, which a server may not exceed unless told.
const MAX_FRAME: usize = 16_384;

async fn daemon(tune: impl FnOnce(&mut sluice::config::Settings)) -> GrpcApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = grpc_settings(&dir);
    tune(&mut settings);
    spawn_grpc_in(dir, settings, SHIPPED_POLICIES).await
}

fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("small");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_frame(&mut out, kind, flags, stream, payload);
    out
}

/// An HPACK integer (RFC 7541 5.1) with `prefix` bits in a first byte that starts as `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A string literal, not Huffman-coded.
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// A literal field without indexing, with a literal name (`0x00`); with incremental indexing
/// (`0x40`, the field enters the dynamic table) when `indexed`.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8], indexed: bool) {
    out.push(if indexed { 0x40 } else { 0x00 });
    hpack_string(out, name);
    hpack_string(out, value);
}

/// A `ShouldRateLimit` request's header block; `:authority` as given, or none.
fn request_block(authority: Option<&[u8]>) -> Vec<u8> {
    // Static entries 3 (`:method: POST`) and 6 (`:scheme: http`).
    let mut block = vec![0x83, 0x86];
    let path = format!("/{SERVICE_NAME}/ShouldRateLimit");
    literal(&mut block, b":path", path.as_bytes(), false);
    if let Some(authority) = authority {
        literal(&mut block, b":authority", authority, false);
    }
    literal(&mut block, b"content-type", b"application/grpc", false);
    literal(&mut block, b"te", b"trailers", false);
    block
}

fn block() -> Vec<u8> {
    request_block(Some(b"localhost"))
}

/// A request message with the gRPC prefix, each for an `api_key` of its own (no test runs out
/// of a burst).
fn message() -> Vec<u8> {
    static KEY: AtomicUsize = AtomicUsize::new(0);
    let key = format!("k{}", KEY.fetch_add(1, Ordering::Relaxed));
    let body = request(
        "edge",
        vec![descriptor(&[("tenant", "t"), ("api_key", &key)])],
    )
    .encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A whole request on `stream`: HEADERS, then the message in one DATA ending the stream.
fn request_frames(stream: u32) -> Vec<u8> {
    let mut out = frame(HEADERS, END_HEADERS, stream, &block());
    push_frame(&mut out, DATA, END_STREAM, stream, &message());
    out
}

/// A frame as read: type, flags, stream id, payload.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM (its payload) or GOAWAY (after the last stream id).
    fn code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        let bytes = self.payload.get(at..at + 4).expect("an error code");
        u32::from_be_bytes(bytes.try_into().expect("4 bytes"))
    }
}

/// What a read gave.
#[derive(Debug)]
enum Next {
    Frame(Frame),
    /// End of stream, or a reset.
    Closed,
    /// Nothing within the wait.
    Quiet,
}

/// How a stream ended, as the client saw it.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Ended with a message: its `overall_code`.
    Code(i32),
    /// Ended (END_STREAM) without a message: a gRPC error, or an HTTP one.
    NoMessage,
    /// RST_STREAM with this code.
    Reset(u32),
    /// GOAWAY with this code before the stream ended.
    GoAway(u32),
    /// The connection closed before the stream ended.
    Closed,
}

/// The read side of a connection: whole frames out of the byte stream.
struct Reader {
    io: OwnedReadHalf,
    buf: BytesMut,
}

impl Reader {
    async fn next(&mut self, wait: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 9 {
                let len = usize::from(self.buf[0]) << 16
                    | usize::from(self.buf[1]) << 8
                    | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let head = self.buf.split_to(9);
                    let payload = self.buf.split_to(len).to_vec();
                    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                    return Next::Frame(Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: stream & 0x7fff_ffff,
                        payload,
                    });
                }
            }
            self.buf.reserve(32 * 1024);
            match tokio::time::timeout_at(deadline, self.io.read_buf(&mut self.buf)).await {
                Err(_) => return Next::Quiet,
                Ok(Ok(0) | Err(_)) => return Next::Closed,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next frame within [`WAIT`], `None` once the connection closed.
    async fn frame(&mut self) -> Option<Frame> {
        match self.next(WAIT).await {
            Next::Frame(frame) => Some(frame),
            Next::Closed => None,
            Next::Quiet => panic!("nothing from the server within {WAIT:?}"),
        }
    }

    /// Reads until every one of `streams` has ended (frames of other streams and of the
    /// connection are skipped), at most 100,000 frames.
    async fn outcomes(&mut self, streams: &[u32]) -> HashMap<u32, Outcome> {
        let mut bodies: HashMap<u32, Vec<u8>> = streams.iter().map(|&s| (s, vec![])).collect();
        let mut ended = HashMap::new();
        for _ in 0..100_000 {
            if bodies.is_empty() {
                return ended;
            }
            let Some(frame) = self.frame().await else {
                ended.extend(bodies.drain().map(|(s, _)| (s, Outcome::Closed)));
                return ended;
            };
            if frame.kind == GOAWAY {
                let code = frame.code();
                ended.extend(bodies.drain().map(|(s, _)| (s, Outcome::GoAway(code))));
                return ended;
            }
            let Some(body) = bodies.get_mut(&frame.stream) else {
                continue;
            };
            match frame.kind {
                RST_STREAM => {
                    bodies.remove(&frame.stream);
                    ended.insert(frame.stream, Outcome::Reset(frame.code()));
                    continue;
                }
                DATA => body.extend_from_slice(unpadded(&frame)),
                _ => {}
            }
            if (frame.kind == DATA || frame.kind == HEADERS) && frame.flags & END_STREAM != 0 {
                let body = bodies.remove(&frame.stream).expect("present");
                ended.insert(frame.stream, decoded(&body));
            }
        }
        panic!("streams {streams:?} not ended within 100,000 frames");
    }

    async fn outcome(&mut self, stream: u32) -> Outcome {
        self.outcomes(&[stream])
            .await
            .remove(&stream)
            .expect("ended")
    }

    /// Reads until GOAWAY (its code), then until the connection closes; `None` when it closed
    /// without one.
    async fn goaway(&mut self) -> Option<u32> {
        let mut code = None;
        for _ in 0..100_000 {
            match self.frame().await {
                None => return code,
                Some(frame) if frame.kind == GOAWAY && code.is_none() => code = Some(frame.code()),
                Some(_) => {}
            }
        }
        panic!("not closed within 100,000 frames");
    }
}

/// A DATA frame's data, padding removed.
fn unpadded(frame: &Frame) -> &[u8] {
    if frame.flags & PADDED == 0 {
        return &frame.payload;
    }
    let pad = usize::from(frame.payload[0]);
    &frame.payload[1..frame.payload.len() - pad]
}

/// A stream's whole DATA as an outcome: the answer's `overall_code`, or no message.
fn decoded(body: &[u8]) -> Outcome {
    if body.is_empty() {
        return Outcome::NoMessage;
    }
    assert_eq!(body[0], 0, "an uncompressed message");
    let len = u32::from_be_bytes(body[1..5].try_into().expect("a gRPC prefix")) as usize;
    assert_eq!(body.len(), 5 + len, "one whole message");
    let answer = RateLimitResponse::decode(&body[5..]).expect("a RateLimitResponse");
    Outcome::Code(answer.overall_code)
}

/// A raw client connection, past the handshake.
struct Conn {
    reader: Reader,
    writer: OwnedWriteHalf,
    /// The server's SETTINGS.
    settings: Vec<(u16, u32)>,
    /// The next stream id this client opens.
    next: u32,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Self {
        Self::open_with(addr, &[]).await
    }

    /// Sends the preface, `settings`, and a connection WINDOW_UPDATE far above what any test
    /// reads (no test needs to grant the connection more); reads the server's SETTINGS and ACKs
    /// them.
    async fn open_with(addr: SocketAddr, settings: &[(u16, u32)]) -> Self {
        let socket = TcpSocket::new_v4().expect("socket");
        // A small send buffer (no autotuning to megabytes): what an abuse test counts as
        // written is then close to what the server took in.
        socket.set_send_buffer_size(64 * 1024).expect("SO_SNDBUF");
        let tcp = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("connected in time")
            .expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let (io, writer) = tcp.into_split();
        let mut conn = Self {
            reader: Reader {
                io,
                buf: BytesMut::new(),
            },
            writer,
            settings: Vec::new(),
            next: 1,
        };
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let ours: Vec<u8> = settings
            .iter()
            .flat_map(|(id, value)| [&id.to_be_bytes()[..], &value.to_be_bytes()].concat())
            .collect();
        push_frame(&mut hello, SETTINGS, 0, 0, &ours);
        push_frame(&mut hello, WINDOW_UPDATE, 0, 0, &(1u32 << 30).to_be_bytes());
        conn.send(&hello).await;
        for _ in 0..100 {
            let first = conn.reader.frame().await.expect("the server's SETTINGS");
            if first.kind == SETTINGS && first.flags & ACK == 0 {
                conn.settings = first
                    .payload
                    .chunks(6)
                    .map(|s| {
                        let id = u16::from_be_bytes([s[0], s[1]]);
                        (id, u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
                    })
                    .collect();
                conn.send(&frame(SETTINGS, ACK, 0, &[])).await;
                return conn;
            }
        }
        panic!("no SETTINGS from the server");
    }

    async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(WAIT, self.writer.write_all(bytes))
            .await
            .expect("written in time")
            .expect("written");
    }

    /// Sends, ignoring an error: for frames after which the server may already have closed.
    async fn send_any(&mut self, bytes: &[u8]) {
        let _ = tokio::time::timeout(WAIT, self.writer.write_all(bytes)).await;
    }

    /// A new stream id.
    fn stream(&mut self) -> u32 {
        let id = self.next;
        self.next += 2;
        id
    }

    /// A whole request on a new stream, and how it ended.
    async fn check(&mut self) -> Outcome {
        let stream = self.stream();
        self.send(&request_frames(stream)).await;
        self.reader.outcome(stream).await
    }
}

// Conformance: what any HTTP/2 server answers.

/// HEADERS and two CONTINUATIONs make one header block.
#[tokio::test]
async fn headers_split_over_continuations_are_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let block = block();
    let (a, rest) = block.split_at(7);
    let (b, c) = rest.split_at(rest.len() / 2);
    let mut out = frame(HEADERS, 0, 1, a);
    push_frame(&mut out, CONTINUATION, 0, 1, b);
    push_frame(&mut out, CONTINUATION, END_HEADERS, 1, c);
    push_frame(&mut out, DATA, END_STREAM, 1, &message());
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(1).await, Outcome::Code(OK));
}

/// Padding and priority fields in HEADERS, padding in DATA.
#[tokio::test]
async fn padded_headers_with_priority_and_padded_data_are_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    // Pad length, then the priority fields (depends on stream 0, weight 16), the block, padding.
    let mut headers = vec![10, 0, 0, 0, 0, 15];
    headers.extend_from_slice(&block());
    headers.extend_from_slice(&[0; 10]);
    let mut data = vec![7];
    data.extend_from_slice(&message());
    data.extend_from_slice(&[0; 7]);
    let mut out = frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, &headers);
    push_frame(&mut out, DATA, END_STREAM | PADDED, 1, &data);
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(1).await, Outcome::Code(OK));
}

/// A message in 7 DATA frames (1-byte ones among them), and END_STREAM on an empty DATA frame
/// after a whole message.
#[tokio::test]
async fn a_message_over_many_data_frames_is_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let whole = message();
    let mut out = frame(HEADERS, END_HEADERS, 1, &block());
    let mut at = 0;
    for (i, len) in [1, 1, 3, 1, 5, 2].into_iter().enumerate() {
        push_frame(&mut out, DATA, 0, 1, &whole[at..at + len]);
        at += len;
        assert!(at < whole.len(), "piece {i} leaves some for the last");
    }
    push_frame(&mut out, DATA, END_STREAM, 1, &whole[at..]);
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(1).await, Outcome::Code(OK));

    let mut out = frame(HEADERS, END_HEADERS, 3, &block());
    push_frame(&mut out, DATA, 0, 3, &message());
    push_frame(&mut out, DATA, END_STREAM, 3, &[]);
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(3).await, Outcome::Code(OK));
}

/// Trailers from the client (HEADERS ending the stream after the DATA).
#[tokio::test]
async fn client_trailers_are_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let mut trailers = Vec::new();
    literal(&mut trailers, b"x-trailer", b"1", false);
    let mut out = frame(HEADERS, END_HEADERS, 1, &block());
    push_frame(&mut out, DATA, 0, 1, &message());
    push_frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &trailers);
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(1).await, Outcome::Code(OK));
}

/// Frames of unknown types (on the connection and on an open stream) and PRIORITY frames (on
/// an idle stream, and on one about to open) are ignored.
#[tokio::test]
async fn unknown_frames_and_priority_are_ignored() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    assert_eq!(conn.check().await, Outcome::Code(OK));
    let mut out = frame(0xfa, 0xff, 0, b"whatever");
    // Stream 3 depends on stream 1 (closed), stream 9 on stream 0: both idle, both allowed.
    push_frame(&mut out, PRIORITY, 0, 3, &[0, 0, 0, 1, 200]);
    push_frame(&mut out, PRIORITY, 0, 9, &[0, 0, 0, 0, 16]);
    push_frame(&mut out, HEADERS, END_HEADERS, 3, &block());
    push_frame(&mut out, 0xfa, 0, 3, b"on a stream");
    push_frame(&mut out, DATA, END_STREAM, 3, &message());
    conn.send(&out).await;
    assert_eq!(conn.reader.outcome(3).await, Outcome::Code(OK));
    conn.next = 11;
    assert_eq!(conn.check().await, Outcome::Code(OK));
}

/// A PING is ACKed with its own 8 bytes.
#[tokio::test]
async fn a_ping_is_acked_with_its_payload() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    conn.send(&frame(PING, 0, 0, b"sluice!?")).await;
    for _ in 0..100 {
        let frame = conn.reader.frame().await.expect("open");
        if frame.kind == PING && frame.flags & ACK != 0 {
            assert_eq!(frame.payload, b"sluice!?");
            assert_eq!(frame.stream, 0);
            return;
        }
    }
    panic!("no PING ACK");
}

/// A stream window of 0 holds the answer's DATA back until the client grants some; a window of
/// 3 bytes gets it in pieces of at most 3 bytes.
#[tokio::test]
async fn the_clients_stream_window_is_respected() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open_with(daemon.addr, &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]).await;
    conn.send(&request_frames(1)).await;
    // The answer's HEADERS may come (not flow-controlled), its DATA may not.
    for _ in 0..100 {
        match conn.reader.next(QUIET).await {
            Next::Quiet => break,
            Next::Closed => panic!("closed"),
            Next::Frame(frame) => {
                assert!(
                    frame.kind != DATA,
                    "DATA sent into a window of 0: {frame:?}"
                );
                assert!(
                    frame.stream != 1 || frame.flags & END_STREAM == 0,
                    "the stream ended without its message: {frame:?}"
                );
            }
        }
    }
    conn.send(&frame(WINDOW_UPDATE, 0, 1, &65_535u32.to_be_bytes()))
        .await;
    assert_eq!(conn.reader.outcome(1).await, Outcome::Code(OK));

    let mut conn = Conn::open_with(daemon.addr, &[(SETTINGS_INITIAL_WINDOW_SIZE, 3)]).await;
    conn.send(&request_frames(1)).await;
    let (mut body, mut pieces) = (Vec::new(), 0);
    for _ in 0..10_000 {
        let frame = conn.reader.frame().await.expect("open");
        if frame.stream != 1 {
            continue;
        }
        if frame.kind == DATA {
            let data = unpadded(&frame);
            assert!(
                data.len() <= 3,
                "{} bytes of DATA in a 3-byte window",
                data.len()
            );
            body.extend_from_slice(data);
            pieces += 1;
            if !frame.payload.is_empty() {
                let granted = u32::try_from(frame.payload.len()).expect("small");
                conn.send(&window_update(1, granted)).await;
            }
        }
        assert!(frame.kind != RST_STREAM, "reset: {frame:?}");
        if frame.flags & END_STREAM != 0 && (frame.kind == DATA || frame.kind == HEADERS) {
            assert!(pieces > 1, "an answer of {} bytes in pieces", body.len());
            assert_eq!(decoded(&body), Outcome::Code(OK));
            return;
        }
    }
    panic!("the stream did not end");
}

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// 100 requests on one connection, the last 50 pipelined 10 at a time: each answered on its
/// own stream.
#[tokio::test]
async fn a_hundred_requests_on_one_connection_are_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    for _ in 0..50 {
        assert_eq!(conn.check().await, Outcome::Code(OK));
    }
    for _ in 0..5 {
        let streams: Vec<u32> = (0..10).map(|_| conn.stream()).collect();
        let out: Vec<u8> = streams.iter().flat_map(|&s| request_frames(s)).collect();
        conn.send(&out).await;
        let outcomes = conn.reader.outcomes(&streams).await;
        for stream in streams {
            assert_eq!(outcomes[&stream], Outcome::Code(OK), "stream {stream}");
        }
    }
}

/// Streams past SETTINGS_MAX_CONCURRENT_STREAMS while the first ones stay open are refused
/// (REFUSED_STREAM), or (a server may instead hold them) answered only once earlier ones end;
/// the connection stays usable.
#[tokio::test]
async fn streams_past_the_concurrency_limit_are_refused() {
    const MAX: u32 = 4;
    let daemon = daemon(|s| s.envoy.max_concurrent_streams = MAX).await;
    let mut conn = Conn::open(daemon.addr).await;
    let advertised = conn
        .settings
        .iter()
        .find(|(id, _)| *id == SETTINGS_MAX_CONCURRENT_STREAMS);
    assert_eq!(advertised.map(|s| s.1), Some(MAX), "{:?}", conn.settings);
    // MAX streams opened and held (no END_STREAM), then 6 whole requests.
    let held: Vec<u32> = (0..MAX).map(|_| conn.stream()).collect();
    let excess: Vec<u32> = (0..6).map(|_| conn.stream()).collect();
    let mut out = Vec::new();
    for &s in &held {
        push_frame(&mut out, HEADERS, END_HEADERS, s, &block());
    }
    for &s in &excess {
        out.extend_from_slice(&request_frames(s));
    }
    conn.send(&out).await;
    let mut refused = Vec::new();
    for _ in 0..1_000 {
        match conn.reader.next(QUIET).await {
            Next::Quiet => break,
            Next::Closed => panic!("closed"),
            Next::Frame(frame) if frame.kind == GOAWAY => panic!("GOAWAY {}", frame.code()),
            Next::Frame(frame) if frame.kind == RST_STREAM => {
                assert!(excess.contains(&frame.stream), "{frame:?}");
                if refused.contains(&frame.stream) {
                    // The refused stream's DATA arrived after the refusal. RFC 9113 5.1 has
                    // frames on a stream the server reset ignored, 6.1 answers DATA on a closed
                    // stream STREAM_CLOSED; h2 does the latter, which is harmless. Tolerated.
                    assert_eq!(frame.code(), STREAM_CLOSED, "{frame:?}");
                } else {
                    assert_eq!(frame.code(), REFUSED_STREAM, "{frame:?}");
                    refused.push(frame.stream);
                }
            }
            // SETTINGS ACK, WINDOW_UPDATE and the like on stream 0 are no answer.
            Next::Frame(frame) => assert!(
                frame.stream == 0
                    || !excess.contains(&frame.stream) && frame.flags & END_STREAM == 0,
                "an answer while {MAX} streams are held: {frame:?}"
            ),
        }
    }
    let mut out = Vec::new();
    for &s in &held {
        push_frame(&mut out, DATA, END_STREAM, s, &message());
    }
    conn.send(&out).await;
    let waiting: Vec<u32> = held
        .iter()
        .chain(excess.iter().filter(|s| !refused.contains(s)))
        .copied()
        .collect();
    let outcomes = conn.reader.outcomes(&waiting).await;
    for stream in waiting {
        assert_eq!(outcomes[&stream], Outcome::Code(OK), "stream {stream}");
    }
    assert_eq!(conn.check().await, Outcome::Code(OK), "still usable");
    eprintln!(
        "{} of {} excess streams refused",
        refused.len(),
        excess.len()
    );
}

/// `:authority` as Istio and socket clients send it, and none at all.
#[tokio::test]
async fn any_authority_is_answered() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    for authority in [
        Some(&b"outbound|8081||sluice.default.svc.cluster.local"[..]),
        Some(b"/tmp/sluice.sock"),
        None,
    ] {
        let stream = conn.stream();
        let mut out = frame(HEADERS, END_HEADERS, stream, &request_block(authority));
        push_frame(&mut out, DATA, END_STREAM, stream, &message());
        conn.send(&out).await;
        let shown = authority.map(String::from_utf8_lossy);
        assert_eq!(
            conn.reader.outcome(stream).await,
            Outcome::Code(OK),
            "{shown:?}"
        );
    }
}

// Protocol errors (RFC 9113): GOAWAY with the code the RFC names, then the connection closes.

/// Sends `bytes` on a new connection and returns the GOAWAY's code.
async fn goaway_after(addr: SocketAddr, bytes: &[u8]) -> Option<u32> {
    let mut conn = Conn::open(addr).await;
    conn.send_any(bytes).await;
    conn.reader.goaway().await
}

/// A stream id the client may not open (even, or lower than one it opened).
#[tokio::test]
async fn unexpected_stream_ids_are_protocol_errors() {
    let daemon = daemon(|_| {}).await;
    let even = frame(HEADERS, END_HEADERS, 2, &block());
    assert_eq!(
        goaway_after(daemon.addr, &even).await,
        Some(PROTOCOL_ERROR),
        "even"
    );
    let mut conn = Conn::open(daemon.addr).await;
    conn.next = 5;
    assert_eq!(conn.check().await, Outcome::Code(OK));
    conn.send_any(&request_frames(3)).await;
    assert_eq!(conn.reader.goaway().await, Some(PROTOCOL_ERROR), "lower");
}

/// CONTINUATION without HEADERS before it; HEADERS without END_HEADERS followed by another
/// frame.
#[tokio::test]
async fn broken_header_block_sequences_are_protocol_errors() {
    let daemon = daemon(|_| {}).await;
    let alone = frame(CONTINUATION, END_HEADERS, 1, &block());
    assert_eq!(
        goaway_after(daemon.addr, &alone).await,
        Some(PROTOCOL_ERROR),
        "alone"
    );
    let mut cut = frame(HEADERS, 0, 1, &block());
    push_frame(&mut cut, PING, 0, 0, &[0; 8]);
    assert_eq!(
        goaway_after(daemon.addr, &cut).await,
        Some(PROTOCOL_ERROR),
        "cut"
    );
}

/// A HEADERS frame one byte over the default SETTINGS_MAX_FRAME_SIZE (a frame with a field
/// block: a connection error).
#[tokio::test]
async fn a_frame_over_the_maximum_size_is_a_frame_size_error() {
    let daemon = daemon(|_| {}).await;
    let mut payload = block();
    payload.push(0x00);
    hpack_string(&mut payload, b"x-big");
    // The value's length takes 3 bytes (the 7-bit prefix, then two).
    let value = MAX_FRAME + 1 - payload.len() - 3;
    hpack_int(&mut payload, 0, 7, value);
    payload.resize(MAX_FRAME + 1, b'a');
    let big = frame(HEADERS, END_HEADERS, 1, &payload);
    assert_eq!(
        goaway_after(daemon.addr, &big).await,
        Some(FRAME_SIZE_ERROR)
    );
}

/// A connection WINDOW_UPDATE past 2^31-1.
#[tokio::test]
async fn a_connection_window_past_the_maximum_is_a_flow_control_error() {
    let daemon = daemon(|_| {}).await;
    let update = window_update(0, 0x7fff_ffff);
    assert_eq!(
        goaway_after(daemon.addr, &update).await,
        Some(FLOW_CONTROL_ERROR)
    );
}

/// A header block that is not HPACK (an indexed field of index 0): RFC 9113 4.3 names
/// COMPRESSION_ERROR. h2 0.4 answers PROTOCOL_ERROR, against the RFC: kept strict.
#[tokio::test]
async fn invalid_hpack_is_a_compression_error() {
    let daemon = daemon(|_| {}).await;
    let mut bad = block();
    bad.push(0x80);
    let headers = frame(HEADERS, END_HEADERS | END_STREAM, 1, &bad);
    assert_eq!(
        goaway_after(daemon.addr, &headers).await,
        Some(COMPRESSION_ERROR)
    );
}

/// PUSH_PROMISE from a client.
#[tokio::test]
async fn push_promise_from_the_client_is_a_protocol_error() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    conn.send(&frame(HEADERS, END_HEADERS, 1, &block())).await;
    let mut promise = 2u32.to_be_bytes().to_vec();
    promise.extend_from_slice(&block());
    conn.send_any(&frame(PUSH_PROMISE, END_HEADERS, 1, &promise))
        .await;
    assert_eq!(conn.reader.goaway().await, Some(PROTOCOL_ERROR));
}

/// A WINDOW_UPDATE of 0 on a stream: a stream error (RST_STREAM) or, as RFC 9113 allows for
/// any stream error, a connection error; PROTOCOL_ERROR either way.
#[tokio::test]
async fn a_stream_window_update_of_zero_is_a_protocol_error() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let mut out = frame(HEADERS, END_HEADERS, 1, &block());
    out.extend_from_slice(&window_update(1, 0));
    conn.send(&out).await;
    let outcome = conn.reader.outcome(1).await;
    assert!(
        matches!(
            outcome,
            Outcome::Reset(PROTOCOL_ERROR) | Outcome::GoAway(PROTOCOL_ERROR)
        ),
        "{outcome:?}"
    );
}

// Abuse: the bound is what matters, and a well-behaved connection is answered throughout.

/// Runs `abuse` while a second connection asks every 20 ms (at most 10,000 times), each check
/// answered OK within [`WAIT`], and once more after; `abuse`'s result.
async fn with_monitor<T: Send + 'static>(
    addr: SocketAddr,
    abuse: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let abuse = tokio::spawn(abuse);
    let mut conn = Conn::open(addr).await;
    let mut checks = 0;
    while !abuse.is_finished() && checks < 10_000 {
        assert_eq!(conn.check().await, Outcome::Code(OK), "check {checks}");
        checks += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = tokio::time::timeout(3 * WAIT, abuse)
        .await
        .expect("the abuse ends in time")
        .expect("joined");
    assert_eq!(conn.check().await, Outcome::Code(OK), "after");
    assert_eq!(
        Conn::open(addr).await.check().await,
        Outcome::Code(OK),
        "new"
    );
    eprintln!("{checks} checks answered meanwhile");
    result
}

/// How an abusive connection ended, as its reader saw it.
#[derive(Debug, PartialEq)]
enum End {
    GoAway(u32),
    Closed,
    /// The marker PING written after the abuse was ACKed: everything before it was read.
    Processed,
}

const MARKER: &[u8; 8] = b"markpin!";

/// Reads `reader` until GOAWAY, the close or the marker PING's ACK, counting frames of `kind`
/// with `flags` on the way; at most 1,000,000 frames, none more than [`WAIT`] apart.
async fn read_to_end(reader: &mut Reader, kind: u8, flags: u8) -> (End, usize) {
    let mut counted = 0;
    for _ in 0..1_000_000 {
        let Some(frame) = reader.frame().await else {
            return (End::Closed, counted);
        };
        if frame.kind == GOAWAY {
            return (End::GoAway(frame.code()), counted);
        }
        if frame.kind == PING && frame.flags & ACK != 0 && frame.payload == MARKER {
            return (End::Processed, counted);
        }
        counted += usize::from(frame.kind == kind && frame.flags & flags == flags);
    }
    panic!("1,000,000 frames");
}

/// Writes `bytes` in 64 KiB pieces on `conn` while reading it (so that the client's own
/// back-pressure never stalls the server), stopping when the reader ends or a write fails,
/// then the marker PING; how the connection ended, the bytes written by then, frames counted
/// as [`read_to_end`] does, and the connection when it is still open.
async fn abuse(
    mut conn: Conn,
    bytes: Vec<u8>,
    kind: u8,
    flags: u8,
) -> (End, usize, usize, Option<Conn>) {
    let Conn {
        mut reader,
        mut writer,
        settings,
        next,
    } = conn;
    let reading = tokio::spawn(async move {
        let ended = read_to_end(&mut reader, kind, flags).await;
        (ended, reader)
    });
    let mut written = 0;
    for piece in bytes.chunks(64 * 1024) {
        if reading.is_finished() {
            break;
        }
        match tokio::time::timeout(WAIT, writer.write_all(piece)).await {
            Ok(Ok(())) => written += piece.len(),
            Ok(Err(_)) => break,
            Err(_) => panic!("the server neither read {written} bytes on nor closed"),
        }
        // The reader's turn to see a GOAWAY.
        tokio::task::yield_now().await;
    }
    let _ = writer.write_all(&frame(PING, 0, 0, MARKER)).await;
    let ((end, counted), reader) = tokio::time::timeout(WAIT, reading)
        .await
        .expect("read to the end in time")
        .expect("joined");
    conn = Conn {
        reader,
        writer,
        settings,
        next,
    };
    let open = (end == End::Processed).then_some(conn);
    (end, written, counted, open)
}

/// Rapid reset (CVE-2023-44487): 20,000 streams opened and cancelled at once. Either the
/// connection is closed before all are processed (GOAWAY, ENHANCE_YOUR_CALM preferred), or all
/// are processed; in both cases the monitor is answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_is_bounded() {
    const STREAMS: u32 = 20_000;
    let daemon = daemon(|_| {}).await;
    let conn = Conn::open(daemon.addr).await;
    let block = block();
    let mut bytes = Vec::new();
    for i in 0..STREAMS {
        push_frame(&mut bytes, HEADERS, END_HEADERS, 2 * i + 1, &block);
        push_frame(&mut bytes, RST_STREAM, 0, 2 * i + 1, &CANCEL.to_be_bytes());
    }
    let total = bytes.len();
    let (end, written, answers, _) =
        with_monitor(daemon.addr, abuse(conn, bytes, HEADERS, 0)).await;
    eprintln!("rapid reset: {end:?} after {written} of {total} bytes, {answers} HEADERS back");
    assert!(
        matches!(end, End::GoAway(_) | End::Closed | End::Processed),
        "{end:?}"
    );
}

/// A header block that never ends: HEADERS, then CONTINUATIONs of 16 KiB (a value announced as
/// 16 MiB): closed long before 4 MiB are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_is_cut_short() {
    const FRAMES: usize = 1_000;
    let daemon = daemon(|_| {}).await;
    let conn = Conn::open(daemon.addr).await;
    let mut block = block();
    block.push(0x00);
    hpack_string(&mut block, b"x-flood");
    hpack_int(&mut block, 0, 7, FRAMES * MAX_FRAME);
    let mut bytes = frame(HEADERS, 0, 1, &block);
    let filler = vec![b'a'; MAX_FRAME];
    for i in 0..FRAMES {
        let flags = if i + 1 == FRAMES { END_HEADERS } else { 0 };
        push_frame(&mut bytes, CONTINUATION, flags, 1, &filler);
    }
    let (end, written, _, _) = with_monitor(daemon.addr, abuse(conn, bytes, 0, 0)).await;
    eprintln!("CONTINUATION flood: {end:?} after {written} bytes");
    assert!(matches!(end, End::GoAway(_) | End::Closed), "{end:?}");
    assert!(
        written < 4 << 20,
        "{written} bytes written before the close"
    );
}

/// How a stream that must not be answered OK ended: refused, ended without an OK answer, or
/// the connection closed; a fresh connection is answered.
async fn refused(daemon: &GrpcApp, conn: &mut Conn, stream: u32) -> Outcome {
    let outcome = conn.reader.outcome(stream).await;
    assert!(outcome != Outcome::Code(OK), "answered OK");
    let fresh = Conn::open(daemon.addr).await.check().await;
    assert_eq!(fresh, Outcome::Code(OK), "a fresh connection");
    outcome
}

/// A header list over the daemon's limit (a 64 KiB value over CONTINUATIONs).
#[tokio::test]
async fn a_header_list_over_the_limit_is_refused() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let mut block = block();
    literal(&mut block, b"x-big", &vec![b'a'; 64 * 1024], false);
    let mut pieces = block.chunks(MAX_FRAME).peekable();
    let mut out = frame(HEADERS, 0, 1, pieces.next().expect("one"));
    while let Some(piece) = pieces.next() {
        let flags = if pieces.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        push_frame(&mut out, CONTINUATION, flags, 1, piece);
    }
    push_frame(&mut out, DATA, END_STREAM, 1, &message());
    conn.send_any(&out).await;
    let outcome = refused(&daemon, &mut conn, 1).await;
    eprintln!("64 KiB header list: {outcome:?}");
}

/// HPACK bomb: a 4,000-byte field entered in the dynamic table, then a block of 5,000
/// references to it (20 MB decoded).
#[tokio::test]
async fn an_hpack_bomb_is_refused() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let mut first = block();
    literal(&mut first, b"x-bomb", &[b'a'; 4_000], true);
    let mut out = frame(HEADERS, END_HEADERS, 1, &first);
    push_frame(&mut out, DATA, END_STREAM, 1, &message());
    conn.send(&out).await;
    // A 4 KB header is within bounds; however the first stream ends, the entry is in the table.
    let first = conn.reader.outcome(1).await;
    let mut bomb = block();
    // Index 62: the first dynamic entry.
    bomb.extend(std::iter::repeat_n(0x80 | 62, 5_000));
    let mut out = frame(HEADERS, END_HEADERS, 3, &bomb);
    push_frame(&mut out, DATA, END_STREAM, 3, &message());
    conn.send_any(&out).await;
    let outcome = refused(&daemon, &mut conn, 3).await;
    eprintln!("HPACK bomb: first stream {first:?}, the bomb {outcome:?}");
}

/// 10,000 `unit` frames written without waiting for an ACK, on a fresh connection: closed, or
/// every frame read (the marker PING after them ACKed) and a request then answered.
async fn flood(daemon: &GrpcApp, unit: &[u8], kind: u8, flags: u8) -> String {
    let conn = Conn::open(daemon.addr).await;
    let bytes = unit.repeat(10_000);
    let (end, written, acks, open) =
        with_monitor(daemon.addr, abuse(conn, bytes, kind, flags)).await;
    if let Some(mut conn) = open {
        assert_eq!(conn.check().await, Outcome::Code(OK), "after the flood");
    }
    format!("{end:?} after {written} bytes, {acks} ACKs")
}

/// Floods of PINGs and of SETTINGS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_settings_floods_are_bounded() {
    let daemon = daemon(|_| {}).await;
    let ping = frame(PING, 0, 0, b"flooding");
    let pings = flood(&daemon, &ping, PING, ACK).await;
    let window = [
        &SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes()[..],
        &65_535u32.to_be_bytes(),
    ]
    .concat();
    let settings = frame(SETTINGS, 0, 0, &window);
    let settings = flood(&daemon, &settings, SETTINGS, ACK).await;
    eprintln!("PING flood: {pings}; SETTINGS flood: {settings}");
}

/// 10,000 empty DATA frames on an open stream, then the message: the stream answered or the
/// connection closed, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_data_frames_are_bounded() {
    let daemon = daemon(|_| {}).await;
    let conn = Conn::open(daemon.addr).await;
    let mut bytes = frame(HEADERS, END_HEADERS, 1, &block());
    for _ in 0..10_000 {
        push_frame(&mut bytes, DATA, 0, 1, &[]);
    }
    push_frame(&mut bytes, DATA, END_STREAM, 1, &message());
    let (end, written, ended, open) =
        with_monitor(daemon.addr, abuse(conn, bytes, HEADERS, END_STREAM)).await;
    let outcome = match open {
        // Everything read; the answer came before the marker's ACK (trailers seen), or after.
        Some(_) if ended > 0 => "answered".to_owned(),
        Some(mut conn) => format!("{:?}", conn.reader.outcome(1).await),
        None => format!("{end:?}"),
    };
    eprintln!("empty DATA: {outcome} after {written} bytes");
}

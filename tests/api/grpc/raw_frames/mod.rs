//! The gRPC listener held to HTTP/2 (RFC 9113) and to its bounds from the outside, with frames
//! written by hand over TCP: the listener's HTTP/2 server (sluice's own; these tests were first
//! written against hyper/h2) must answer conforming requests (`conformance`), refuse protocol
//! errors with the error code the RFC names (`errors`), and bound abusive clients (rapid reset,
//! CONTINUATION and PING floods, HPACK bombs) while a well-behaved connection keeps being
//! answered (`abuse`). Requests are
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

const NO_ERROR: u32 = 0x0;
const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const FRAME_SIZE_ERROR: u32 = 0x6;
const STREAM_CLOSED: u32 = 0x5;
const REFUSED_STREAM: u32 = 0x7;
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

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
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

    /// Reads until a GOAWAY: its last stream id and code; `None` when the connection closed
    /// first.
    async fn next_goaway(&mut self) -> Option<(u32, u32)> {
        for _ in 0..100_000 {
            let frame = self.frame().await?;
            if frame.kind == GOAWAY {
                let last = u32::from_be_bytes(frame.payload[..4].try_into().expect("4 bytes"));
                return Some((last & 0x7fff_ffff, frame.code()));
            }
        }
        panic!("no GOAWAY within 100,000 frames");
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

    /// `frames`, a whole request on the next stream (`self.next`), and how it ended.
    async fn check_with(&mut self, frames: &[u8]) -> Outcome {
        let stream = self.stream();
        self.send(frames).await;
        self.reader.outcome(stream).await
    }
}

mod conformance;
mod errors;
mod malformed;
mod reset_before_store;

//! HTTP/2 from the client's side, frames written by hand: a well-behaved connection that asks
//! `ShouldRateLimit` and reads its answer, and an attacker's connection whose reader runs on a
//! task of its own (so the server's writes never stall on it) and records how the server
//! answered: its GOAWAY, its resets, the window it gave.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use prost::Message;
use sluice::transport::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use sluice::transport::grpc::proto::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
};
use sluice::transport::grpc::SERVICE_NAME;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Longest any single read or write here waits.
pub const WAIT: Duration = Duration::from_secs(20);

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// `OK` as `RateLimitResponse.overall_code`.
pub const OK: i32 = 1;
/// The protocol's initial window.
pub const DEFAULT_WINDOW: i64 = 65_535;

pub fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("small");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_frame(&mut out, kind, flags, stream, payload);
    out
}

fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    // Lengths here stay below 127: one byte.
    out.push(u8::try_from(s.len()).expect("short"));
    out.extend_from_slice(s);
}

/// A literal field without indexing, with a literal name.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_string(out, name);
    hpack_string(out, value);
}

/// A gRPC request's header block for `path`.
pub fn block_for(path: &str) -> Vec<u8> {
    // Static entries 3 (`:method: POST`) and 6 (`:scheme: http`).
    let mut block = vec![0x83, 0x86];
    literal(&mut block, b":path", path.as_bytes());
    literal(&mut block, b":authority", b"localhost");
    literal(&mut block, b"content-type", b"application/grpc");
    literal(&mut block, b"te", b"trailers");
    block
}

/// A `ShouldRateLimit` header block.
pub fn block() -> Vec<u8> {
    block_for(&format!("/{SERVICE_NAME}/ShouldRateLimit"))
}

/// A framed `ShouldRateLimit` request for an `api_key` of its own.
pub fn message() -> Vec<u8> {
    static KEY: AtomicUsize = AtomicUsize::new(0);
    let key = format!("k{}", KEY.fetch_add(1, Ordering::Relaxed));
    let body = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "tenant".into(),
                    value: "t".into(),
                },
                Entry {
                    key: "api_key".into(),
                    value: key,
                },
            ],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
    .encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A whole request on `stream`.
pub fn request_frames(stream: u32) -> Vec<u8> {
    let mut out = frame(HEADERS, END_HEADERS, stream, &block());
    push_frame(&mut out, DATA, END_STREAM, stream, &message());
    out
}

/// A frame as read.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    pub fn code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        self.payload
            .get(at..at + 4)
            .map_or(u32::MAX, |b| u32::from_be_bytes(b.try_into().expect("4")))
    }
}

/// How a stream ended.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Code(i32),
    NoMessage,
    Reset(u32),
    GoAway(u32),
    Closed,
}

pub struct Reader {
    io: OwnedReadHalf,
    buf: BytesMut,
}

impl Reader {
    /// The next frame, `None` once closed or after [`WAIT`] of silence.
    pub async fn frame(&mut self) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if self.buf.len() >= 9 {
                let len = usize::from(self.buf[0]) << 16
                    | usize::from(self.buf[1]) << 8
                    | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let head = self.buf.split_to(9);
                    let payload = self.buf.split_to(len).to_vec();
                    return Some(Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                            & 0x7fff_ffff,
                        payload,
                    });
                }
            }
            self.buf.reserve(32 * 1024);
            match tokio::time::timeout_at(deadline, self.io.read_buf(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// Reads until `stream` ends, at most 100,000 frames.
    pub async fn outcome(&mut self, stream: u32) -> Outcome {
        let mut body = Vec::new();
        for _ in 0..100_000 {
            let Some(frame) = self.frame().await else {
                return Outcome::Closed;
            };
            if frame.kind == GOAWAY {
                return Outcome::GoAway(frame.code());
            }
            if frame.stream != stream {
                continue;
            }
            match frame.kind {
                RST_STREAM => return Outcome::Reset(frame.code()),
                DATA => body.extend_from_slice(&frame.payload),
                _ => {}
            }
            if (frame.kind == DATA || frame.kind == HEADERS) && frame.flags & END_STREAM != 0 {
                if body.len() < 5 {
                    return Outcome::NoMessage;
                }
                let answer = RateLimitResponse::decode(&body[5..]).expect("a RateLimitResponse");
                return Outcome::Code(answer.overall_code);
            }
        }
        panic!("stream {stream} not ended within 100,000 frames");
    }
}

async fn handshake(
    addr: SocketAddr,
    settings: &[(u16, u32)],
    window: u32,
) -> (Reader, OwnedWriteHalf) {
    let tcp = tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connected in time")
        .expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let (io, mut writer) = tcp.into_split();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let ours: Vec<u8> = settings
        .iter()
        .flat_map(|(id, value)| [&id.to_be_bytes()[..], &value.to_be_bytes()].concat())
        .collect();
    push_frame(&mut hello, SETTINGS, 0, 0, &ours);
    if window > 0 {
        push_frame(&mut hello, WINDOW_UPDATE, 0, 0, &window.to_be_bytes());
    }
    push_frame(&mut hello, SETTINGS, ACK, 0, &[]);
    // A refused connection may be closed already: the reader sees it.
    let _ = tokio::time::timeout(WAIT, writer.write_all(&hello)).await;
    (
        Reader {
            io,
            buf: BytesMut::new(),
        },
        writer,
    )
}

/// A well-behaved connection.
pub struct Conn {
    pub reader: Reader,
    pub writer: OwnedWriteHalf,
    next: u32,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Self {
        let (reader, writer) = handshake(addr, &[], 1 << 30).await;
        Self {
            reader,
            writer,
            next: 1,
        }
    }

    pub fn stream(&mut self) -> u32 {
        let id = self.next;
        self.next += 2;
        id
    }

    /// A whole request on a new stream, and how it ended.
    pub async fn check(&mut self) -> Outcome {
        let stream = self.stream();
        if tokio::time::timeout(WAIT, self.writer.write_all(&request_frames(stream)))
            .await
            .map_or(true, |written| written.is_err())
        {
            return Outcome::Closed;
        }
        self.reader.outcome(stream).await
    }
}

/// What an attacker's reader saw.
#[derive(Default)]
pub struct Heard {
    /// The GOAWAY's code (`u32::MAX`: none).
    goaway: AtomicU32,
    /// Connection window the server gave beyond the initial one.
    pub window: AtomicI64,
    /// The connection closed.
    pub closed: std::sync::atomic::AtomicBool,
}

impl Heard {
    pub fn goaway(&self) -> Option<u32> {
        Some(self.goaway.load(Ordering::Acquire)).filter(|&code| code != u32::MAX)
    }
}

/// An attacker's connection: writes what it is told, its reader on a task of its own.
pub struct Attacker {
    pub writer: OwnedWriteHalf,
    pub heard: Arc<Heard>,
    reading: tokio::task::JoinHandle<()>,
    pub next: u32,
}

impl Attacker {
    /// Connects with `settings`; `window`: a connection WINDOW_UPDATE sent with them (0: none).
    pub async fn open(addr: SocketAddr, settings: &[(u16, u32)], window: u32) -> Self {
        let (mut reader, writer) = handshake(addr, settings, window).await;
        let heard = Arc::new(Heard {
            goaway: AtomicU32::new(u32::MAX),
            ..Heard::default()
        });
        let seen = heard.clone();
        let reading = tokio::spawn(async move {
            // Bounded: every read waits at most WAIT, and the connection ends with the test.
            for _ in 0..10_000_000 {
                let Some(frame) = reader.frame().await else {
                    break;
                };
                match frame.kind {
                    GOAWAY => {
                        let _ = seen.goaway.compare_exchange(
                            u32::MAX,
                            frame.code(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                    }
                    WINDOW_UPDATE if frame.stream == 0 => {
                        let more = u32::from_be_bytes(frame.payload[..4].try_into().expect("4"));
                        seen.window.fetch_add(i64::from(more), Ordering::AcqRel);
                    }
                    _ => {}
                }
            }
            seen.closed.store(true, Ordering::Release);
        });
        Self {
            writer,
            heard,
            reading,
            next: 1,
        }
    }

    pub fn stream(&mut self) -> u32 {
        let id = self.next;
        self.next += 2;
        id
    }

    /// Writes `bytes`; `false` once the server closed or stopped reading for [`WAIT`].
    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        matches!(
            tokio::time::timeout(WAIT, self.writer.write_all(bytes)).await,
            Ok(Ok(()))
        )
    }

    /// Whether the server has ended the connection (GOAWAY seen or closed).
    pub fn ended(&self) -> bool {
        self.heard.goaway().is_some() || self.heard.closed.load(Ordering::Acquire)
    }

    /// Waits up to `wait` for the server to end the connection; its GOAWAY code, if any.
    pub async fn end(self, wait: Duration) -> Option<u32> {
        let _ = tokio::time::timeout(wait, async {
            while !self.ended() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let code = self.heard.goaway();
        self.reading.abort();
        code
    }
}

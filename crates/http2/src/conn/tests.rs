//! One connection over `tokio::io::duplex` with a stub service: what a client's frames make
//! it do, each attack of the attack suite alone ([`attacks`]), and a property test that feeds
//! it arbitrary frame sequences (valid and broken, with any of the attacks among them):
//! nothing panics, what it holds stays within its base, its charge is returned, and every
//! connection ends once the client closes.

use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::budget::{connection_base, Budget};

mod attacks;
mod closed;

const UNARY: &[u8] = b"/s/Unary";
const TASK: &[u8] = b"/s/Task";

/// Answers a unary call with its own body (after [`SLOW_FOR`] when the body is [`SLOW`]); a
/// task call, once it has its whole body, with an empty answer.
struct Stub;

/// A unary request message the stub answers only after [`SLOW_FOR`]: its call is still being
/// worked out while the frames after it arrive.
const SLOW: &[u8] = b"\0\0\0\0\x04slow";
const SLOW_FOR: Duration = Duration::from_millis(200);

impl Service for Stub {
    const METHODS: &'static [&'static [u8]] = &[b"POST"];
    fn is_unary(&self, path: &[u8]) -> bool {
        path == UNARY
    }
    fn unary(self: &Arc<Self>, _kept: Kept, body: Bytes) -> UnaryFuture {
        Box::pin(async move {
            if body == SLOW {
                tokio::time::sleep(SLOW_FOR).await;
            }
            Answer::Whole {
                head: Block::Encoded(b"\x88"),
                body: BytesMut::from(&body[..]),
                trailers: Block::Fields(Box::default()),
            }
        })
    }
    fn stream(
        self: &Arc<Self>,
        request: http::Request<RecvBody>,
        responder: Responder,
    ) -> StreamFuture {
        Box::pin(async move {
            let mut body = request.into_body();
            while let Some(Ok(_)) = body.next().await {}
            if let Ok(sending) = responder.head(StatusCode::OK, HeaderMap::new()).await {
                let _ = sending.end().await;
            }
        })
    }
    fn refuse(&self, why: Refused) -> Answer {
        Answer::Bodiless {
            head: Block::Encoded(if why == Refused::Method {
                b"\x08\x03405"
            } else {
                b"\x88"
            }),
            trailers: Block::Fields(Box::default()),
        }
    }
    type Open = ();
    fn opened(&self) {}
}

fn config() -> Config {
    Config {
        max_concurrent_streams: 16,
        max_header_list: 16 * 1024,
        stream_window: 64 * 1024,
        connection_window: 256 * 1024,
        keepalive_interval: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(20),
        body_read_timeout: Duration::from_secs(10),
        max_body_bytes: 64 * 1024 + 5,
    }
}

fn push(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(0) & 0x00ff_ffff;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A request block for `path`: `:method POST`, `:scheme http` (static entries 3 and 6) and
/// `:path` as a literal without indexing.
fn block(path: &[u8]) -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).unwrap_or(0)];
    block.extend_from_slice(path);
    block
}

/// What the server wrote and the most its budget held, with `input` written after the
/// client's preface and SETTINGS and the write side then closed.
async fn serve(input: &[u8]) -> (Vec<u8>, usize, Arc<Budget>) {
    serve_in(&[input]).await
}

/// [`serve`] with the input in `pieces`, each written after the server has taken the one
/// before (and answered what it could).
async fn serve_in(pieces: &[&[u8]]) -> (Vec<u8>, usize, Arc<Budget>) {
    let config = config();
    let base = connection_base(
        config.connection_window,
        config.max_concurrent_streams,
        PER_STREAM_BYTES,
    );
    let budget = Budget::new(4 * base, base, |_, _| {});
    let charge = budget.admit().expect("room for one");
    let (client, server) = tokio::io::duplex(64 * 1024);
    let connection = tokio::spawn(Connection::new(server, Arc::new(Stub), config, charge));
    let (mut reading, mut writing) = tokio::io::split(client);
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = reading.read_to_end(&mut out).await;
        out
    });
    let mut hello = frame::PREFACE.to_vec();
    push(&mut hello, frame::SETTINGS, 0, 0, &[]);
    let mut peak = budget.used();
    for piece in std::iter::once(&hello[..]).chain(pieces.iter().copied()) {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        for chunk in piece.chunks(4096) {
            if writing.write_all(chunk).await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
            peak = peak.max(budget.used());
        }
    }
    let _ = writing.shutdown().await;
    tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the connection ends once the client closes")
        .expect("no panic");
    let out = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("read to the end")
        .expect("joined");
    (out, peak, budget)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The frames the server wrote: (type, flags, stream, payload).
fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while out.len() >= 9 {
        let len = usize::from(out[0]) << 16 | usize::from(out[1]) << 8 | usize::from(out[2]);
        let Some(payload) = out.get(9..9 + len) else {
            break;
        };
        let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]);
        frames.push((out[3], out[4], stream, payload.to_vec()));
        out = &out[9 + len..];
    }
    frames
}

/// A unary call on `stream`: its HEADERS, then `message` in one DATA frame that ends it.
fn call(input: &mut Vec<u8>, stream: u32, message: &[u8]) {
    push(
        input,
        frame::HEADERS,
        frame::END_HEADERS,
        stream,
        &block(UNARY),
    );
    push(input, frame::DATA, frame::END_STREAM, stream, message);
}

#[test]
fn a_unary_call_is_answered_with_its_body() {
    let mut input = Vec::new();
    call(&mut input, 1, b"\0\0\0\0\x02hi");
    let (out, _, budget) = runtime().block_on(serve(&input));
    let data: Vec<_> = frames(&out)
        .into_iter()
        .filter(|f| f.0 == frame::DATA && f.2 == 1)
        .collect();
    assert_eq!(data.first().map(|f| &f.3[..]), Some(&b"\0\0\0\0\x02hi"[..]));
    assert_eq!(budget.used(), 0, "the charge is returned");
}

/// A request with `method` on a stream of its own, ended in its HEADERS: the server's frames on
/// that stream.
fn with_method(method: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut block = vec![0x42, u8::try_from(method.len()).unwrap_or(0)];
    block.extend_from_slice(method);
    block.extend_from_slice(&block_path(TASK));
    let mut input = Vec::new();
    push(
        &mut input,
        frame::HEADERS,
        frame::END_HEADERS | frame::END_STREAM,
        1,
        &block,
    );
    let (out, _, budget) = runtime().block_on(serve(&input));
    assert_eq!(budget.used(), 0, "the charge is returned");
    frames(&out).into_iter().filter(|f| f.2 == 1).collect()
}

/// `:scheme http` and `:path` (a literal without indexing).
fn block_path(path: &[u8]) -> Vec<u8> {
    block(path)[1..].to_vec()
}

#[test]
fn a_method_not_served_is_answered_by_the_service_and_one_not_a_token_is_malformed() {
    assert_eq!(
        with_method(b"GET"),
        [(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            b"\x08\x03405".to_vec()
        )],
        "the service's answer to Refused::Method, the stream ended"
    );
    let protocol = (Code::Protocol as u32).to_be_bytes().to_vec();
    assert_eq!(with_method(b"GE T"), [(frame::RST_STREAM, 0, 1, protocol)]);
}

/// A frame a strategy makes: a type (the ten, and an unknown one), flags, a stream id among
/// the first few, and a payload that is empty, random, a request block, a window increment or
/// a message.
fn any_frame() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![0u8..=9, Just(0x20u8)];
    let flags = prop_oneof![
        Just(0u8),
        Just(1),
        Just(4),
        Just(5),
        Just(8),
        Just(0x20),
        any::<u8>()
    ];
    let stream = prop_oneof![Just(0u32), 1u32..12];
    let payload = prop_oneof![
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), 0..64),
        Just(block(UNARY)),
        Just(block(TASK)),
        any::<u32>().prop_map(|n| n.to_be_bytes().to_vec()),
        Just(b"\0\0\0\0\x02hi".to_vec()),
        Just(vec![0; 8]),
    ];
    (kind, flags, stream, payload).prop_map(|(kind, flags, stream, payload)| {
        let mut out = Vec::new();
        push(&mut out, kind, flags, stream, &payload);
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Arbitrary frames, then one of the attacks (or none), then arbitrary frames again, and
    /// in some cases a flood of the last of them: nothing panics (a panic fails the case), what
    /// the connection holds stays within its base, its charge is returned, and it ends once the
    /// client closes (`serve` waits 10 s at most).
    #[test]
    fn any_frames_end_without_panic_within_the_base(
        before in proptest::collection::vec(any_frame(), 0..30),
        attack in proptest::option::of(attacks::any_attack()),
        after in proptest::collection::vec(any_frame(), 0..30),
        flood in 0usize..3,
    ) {
        let mut input: Vec<u8> = before.concat();
        if let Some(attack) = &attack {
            input.extend(attack.frames());
        }
        input.extend(after.concat());
        // Some cases end in a flood of the last frame (a few thousand of it).
        if let Some(last) = after.last().or(before.last()) {
            for _ in 0..flood * 3_000 {
                input.extend_from_slice(last);
            }
        }
        let (_, peak, budget) = runtime().block_on(serve(&input));
        let base = connection_base(256 * 1024, 16, PER_STREAM_BYTES);
        prop_assert!(peak <= base, "held {} over the base {} ({:?})", peak, base, attack);
        prop_assert_eq!(budget.used(), 0);
    }
}

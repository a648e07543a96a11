//! Attacks on CPU: frames that make no progress, resets, header blocks that never end, and
//! control frames against streams stalled on a closed window. Each attacker runs bounded in
//! frames and time and must be sent `GOAWAY(ENHANCE_YOUR_CALM)`, while a well-behaved client
//! on another connection is answered throughout.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::daemon::{Daemon, Monitor};
use crate::raw::*;

/// Longest any flood runs.
const FLOOD_TIME: Duration = Duration::from_secs(8);

/// Writes `unit` repeated (batches of 64 KiB) until the server ends the connection, at most
/// `max` units or [`FLOOD_TIME`]; the GOAWAY code and the units written.
async fn flood(attacker: &mut Attacker, unit: &[u8], max: usize) -> usize {
    let per_batch = (64 * 1024 / unit.len()).max(1);
    let batch = unit.repeat(per_batch);
    let started = Instant::now();
    let mut written = 0;
    while written < max && started.elapsed() < FLOOD_TIME && !attacker.ended() {
        if !attacker.send(&batch).await {
            break;
        }
        written += per_batch;
        tokio::task::yield_now().await;
    }
    written
}

/// One flood at a time: run side by side on a small machine, a dozen floods starve each other's
/// readers, and a reader that falls a second behind loses the GOAWAY its server wrote behind
/// the answers to its flood (the server drains the client's bytes for at most 1 s, then closes).
static ONE_FLOOD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs a flood of `unit` after `setup` on a fresh connection while a well-behaved client asks; asserts the
/// attacker is told to calm down.
async fn calmed(name: &str, setup: Vec<u8>, unit: Vec<u8>) {
    let _one = ONE_FLOOD.lock().await;
    let daemon = Daemon::start("");
    let monitor = Monitor::start(&daemon).await;
    let mut attacker = Attacker::open(daemon.grpc, &[], 1 << 30).await;
    assert!(attacker.send(&setup).await, "{name}: the setup written");
    let written = flood(&mut attacker, &unit, 10_000_000).await;
    let code = attacker.end(Duration::from_secs(10)).await;
    let seen = monitor.stop().await;
    eprintln!("{name}: {written} frames written, GOAWAY {code:?}");
    assert_eq!(
        code,
        Some(ENHANCE_YOUR_CALM),
        "{name}: {written} frames written"
    );
    seen.assert_served(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_length_continuations_get_enhance_your_calm() {
    calmed(
        "zero-length CONTINUATION",
        frame(HEADERS, 0, 1, &block()),
        frame(CONTINUATION, 0, 1, &[]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_block_of_small_continuations_gets_enhance_your_calm() {
    // One byte a frame: within the block's byte bound long after the frame count bound.
    calmed(
        "one-byte CONTINUATIONs",
        frame(HEADERS, 0, 1, &block()),
        frame(CONTINUATION, 0, 1, &[0x82]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_data_frames_get_enhance_your_calm() {
    calmed(
        "empty DATA",
        frame(HEADERS, END_HEADERS, 1, &block()),
        frame(DATA, 0, 1, &[]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_frames_get_enhance_your_calm() {
    calmed(
        "PRIORITY",
        Vec::new(),
        frame(PRIORITY, 0, 1, &[0, 0, 0, 0, 16]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_frames_get_enhance_your_calm() {
    calmed("unknown type 0x20", Vec::new(), frame(0x20, 0, 0, b"x")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_get_enhance_your_calm() {
    calmed("PING", Vec::new(), frame(PING, 0, 0, b"flooding")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_get_enhance_your_calm() {
    let setting = [
        &SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes()[..],
        &65_535u32.to_be_bytes(),
    ]
    .concat();
    calmed("SETTINGS", Vec::new(), frame(SETTINGS, 0, 0, &setting)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_updates_get_enhance_your_calm() {
    calmed(
        "WINDOW_UPDATE(0, +1)",
        Vec::new(),
        frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes()),
    )
    .await;
}

/// Opens streams with `block` and breaks each at once with `breaking(stream)`, 200 at a time,
/// until the server ends the connection (at most 100,000 streams or [`FLOOD_TIME`]), while a
/// well-behaved client asks; asserts the attacker is calmed.
async fn streams_broken(name: &str, block: Vec<u8>, breaking: impl Fn(u32) -> Vec<u8>) {
    let daemon = Daemon::start("");
    let monitor = Monitor::start(&daemon).await;
    let mut attacker = Attacker::open(daemon.grpc, &[], 1 << 30).await;
    let mut written = 0;
    let started = Instant::now();
    while written < 100_000 && started.elapsed() < FLOOD_TIME && !attacker.ended() {
        let mut bytes = Vec::new();
        for _ in 0..200 {
            let stream = attacker.stream();
            push_frame(&mut bytes, HEADERS, END_HEADERS, stream, &block);
            bytes.extend_from_slice(&breaking(stream));
        }
        if !attacker.send(&bytes).await {
            break;
        }
        written += 200;
    }
    let code = attacker.end(Duration::from_secs(10)).await;
    let seen = monitor.stop().await;
    eprintln!("{name}: {written} streams, GOAWAY {code:?}");
    assert_eq!(code, Some(ENHANCE_YOUR_CALM), "{name}");
    seen.assert_served(1);
}

/// Rapid reset (CVE-2023-44487): streams opened and cancelled at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_gets_enhance_your_calm() {
    streams_broken("rapid reset", block(), |stream| {
        frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes())
    })
    .await;
}

/// Streams the server resets for the client's errors count as resets: a streamed call opened
/// and broken at once (`WINDOW_UPDATE` of 0 on it), over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_for_the_clients_errors_get_enhance_your_calm() {
    streams_broken(
        "streams reset for the client's errors",
        block_for("/grpc.health.v1.Health/Watch"),
        |stream| frame(WINDOW_UPDATE, 0, stream, &0u32.to_be_bytes()),
    )
    .await;
}

/// Control frames against 255 answered streams stalled on a zero window, on 4 and 16
/// connections: each a constant cost, and the attackers calmed.
async fn control_frames_against_stalled_streams(connections: usize, unit: Vec<u8>) {
    let daemon = Daemon::start("");
    let monitor = Monitor::start(&daemon).await;
    let mut attackers = Vec::new();
    for _ in 0..connections {
        let mut attacker =
            Attacker::open(daemon.grpc, &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)], 1 << 30).await;
        let mut bytes = Vec::new();
        for _ in 0..255 {
            let stream = attacker.stream();
            bytes.extend_from_slice(&request_frames(stream));
        }
        assert!(attacker.send(&bytes).await, "the stalled streams opened");
        attackers.push(attacker);
    }
    // The answers are made and stall.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let floods: Vec<_> = attackers
        .into_iter()
        .map(|mut attacker| {
            let unit = unit.clone();
            tokio::spawn(async move {
                let written = flood(&mut attacker, &unit, 10_000_000).await;
                (written, attacker.end(Duration::from_secs(10)).await)
            })
        })
        .collect();
    let mut codes = Vec::new();
    for task in floods {
        codes.push(task.await.expect("joined"));
    }
    let seen = monitor.stop().await;
    eprintln!("{connections} connections of control frames against stalled streams: {codes:?}");
    for (written, code) in codes {
        assert_eq!(code, Some(ENHANCE_YOUR_CALM), "{written} frames written");
    }
    seen.assert_served(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_against_stalled_streams_are_calmed() {
    let setting = [
        &SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes()[..],
        &0u32.to_be_bytes(),
    ]
    .concat();
    control_frames_against_stalled_streams(4, frame(SETTINGS, 0, 0, &setting)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_updates_against_stalled_streams_on_16_connections_are_calmed() {
    control_frames_against_stalled_streams(16, frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes()))
        .await;
}

/// HPACK bomb: a 4,000-byte field entered in the dynamic table, then blocks of 5,000
/// references to it (20 MB decoded each), over and over: each refused, then the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hpack_bombs_are_refused_then_calmed() {
    let daemon = Daemon::start("");
    let before = daemon.rss();
    let monitor = Monitor::start(&daemon).await;
    let mut attacker = Attacker::open(daemon.grpc, &[], 1 << 30).await;
    let mut first = block();
    first.push(0x40);
    first.push(6);
    first.extend_from_slice(b"x-bomb");
    // 4,000 as an HPACK string length: 127 + 3873 (0x7f, then 3873 in 7-bit groups).
    first.extend_from_slice(&[0x7f, 0xa1, 0x1e]);
    first.extend_from_slice(&[b'a'; 4_000]);
    let mut setup = frame(HEADERS, END_HEADERS, attacker.stream(), &first);
    push_frame(&mut setup, DATA, END_STREAM, 1, &message());
    assert!(attacker.send(&setup).await);
    let mut bomb = block();
    bomb.extend(std::iter::repeat_n(0x80 | 62, 5_000));
    let mut written = 0;
    let started = Instant::now();
    while written < 10_000 && started.elapsed() < FLOOD_TIME && !attacker.ended() {
        let stream = attacker.stream();
        let mut bytes = Vec::new();
        // 5,000 bytes a block: one frame.
        push_frame(&mut bytes, HEADERS, END_HEADERS, stream, &bomb);
        push_frame(&mut bytes, DATA, END_STREAM, stream, &message());
        if !attacker.send(&bytes).await {
            break;
        }
        written += 1;
    }
    let code = attacker.end(Duration::from_secs(10)).await;
    let seen = monitor.stop().await;
    let after = daemon.rss();
    eprintln!("HPACK bombs: {written} written, GOAWAY {code:?}, RSS {before} -> {after}");
    assert_eq!(code, Some(ENHANCE_YOUR_CALM));
    assert!(after < before + 16 * 1024 * 1024, "RSS {before} -> {after}");
    seen.assert_served(1);
}

/// A header block that never ends, in CONTINUATIONs of 16 KiB: cut at the header list's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_of_full_frames_gets_enhance_your_calm() {
    calmed(
        "16 KiB CONTINUATIONs",
        frame(HEADERS, 0, 1, &block()),
        frame(CONTINUATION, 0, 1, &[b'a'; 16_384]),
    )
    .await;
}

/// A header list over the daemon's bound (a 64 KiB value over CONTINUATIONs): the stream or
/// the connection refused, never answered OK; a new connection is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_list_over_the_bound_is_refused() {
    let daemon = Daemon::start("");
    let mut conn = Conn::open(daemon.grpc).await;
    let mut block = block();
    // `x-big`, a literal without indexing, its 65,536-byte value's length as an HPACK integer.
    block.extend_from_slice(&[0x00, 5]);
    block.extend_from_slice(b"x-big");
    block.extend_from_slice(&[0x7f, 0x81, 0xff, 0x03]);
    block.extend(std::iter::repeat_n(b'a', 65_536));
    let stream = conn.stream();
    let mut pieces = block.chunks(16_384).peekable();
    let mut out = frame(HEADERS, 0, stream, pieces.next().expect("one"));
    while let Some(piece) = pieces.next() {
        let flags = if pieces.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        push_frame(&mut out, CONTINUATION, flags, stream, piece);
    }
    push_frame(&mut out, DATA, END_STREAM, stream, &message());
    let _ = tokio::time::timeout(WAIT, conn.writer.write_all(&out)).await;
    let outcome = conn.reader.outcome(stream).await;
    eprintln!("64 KiB header list: {outcome:?}");
    assert!(outcome != Outcome::Code(OK), "answered OK");
    assert_eq!(
        Conn::open(daemon.grpc).await.check().await,
        Outcome::Code(OK)
    );
}

//! Abuse: the bound is what matters, and a well-behaved connection is answered throughout.

use super::*;

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

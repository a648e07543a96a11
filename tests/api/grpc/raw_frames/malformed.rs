//! Malformed requests (RFC 9113 section 8.1.1 and 8.2): answered `RST_STREAM(PROTOCOL_ERROR)`,
//! never `OK`; frames on a half-closed stream: `STREAM_CLOSED`; and no RST_STREAM ever names a
//! stream the client has not opened. The connection keeps serving.

use super::*;

/// A request block for `ShouldRateLimit` with `method` and `path`, and `extra` fields.
fn request_with(method: &[u8], path: &[u8], extra: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut block = Vec::new();
    literal(&mut block, b":method", method, false);
    block.push(0x86);
    literal(&mut block, b":path", path, false);
    literal(&mut block, b":authority", b"localhost", false);
    literal(&mut block, b"content-type", b"application/grpc", false);
    for (name, value) in extra {
        literal(&mut block, name, value, false);
    }
    block
}

fn path() -> Vec<u8> {
    format!("/{SERVICE_NAME}/ShouldRateLimit").into_bytes()
}

/// Sends the request made of `block` and the message on a new stream: how it ended, then
/// checks that the connection still answers.
async fn sent(conn: &mut Conn, block: &[u8]) -> Outcome {
    let stream = conn.stream();
    let mut out = frame(HEADERS, END_HEADERS, stream, block);
    push_frame(&mut out, DATA, END_STREAM, stream, &message());
    conn.send(&out).await;
    let outcome = conn.reader.outcome(stream).await;
    assert_eq!(conn.check().await, Outcome::Code(OK), "after {outcome:?}");
    outcome
}

#[tokio::test]
async fn malformed_requests_are_reset_with_protocol_error() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let path = path();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("an empty :path", request_with(b"POST", b"", &[])),
        (":method PO ST", request_with(b"PO ST", &path, &[])),
        (
            "NUL in a value",
            request_with(b"POST", &path, &[(b"x-a", b"a\0b")]),
        ),
        (
            "CR LF in a value",
            request_with(b"POST", &path, &[(b"x-a", b"a\r\nb: c")]),
        ),
        (
            "a leading space",
            request_with(b"POST", &path, &[(b"x-a", b" a")]),
        ),
        (
            "a space in a name",
            request_with(b"POST", &path, &[(b"x a", b"a")]),
        ),
        (
            "a content-length that is not a number",
            request_with(b"POST", &path, &[(b"content-length", b"12a")]),
        ),
        (
            "a content-length other than the body's",
            request_with(b"POST", &path, &[(b"content-length", b"3")]),
        ),
    ];
    for (name, block) in cases {
        assert_eq!(
            sent(&mut conn, &block).await,
            Outcome::Reset(PROTOCOL_ERROR),
            "{name}"
        );
    }
    // The body's own length, declared: answered.
    let length = message().len().to_string();
    let block = request_with(b"POST", &path, &[(b"content-length", length.as_bytes())]);
    assert_eq!(
        sent(&mut conn, &block).await,
        Outcome::Code(OK),
        "content-length right"
    );
}

/// A method gRPC does not use is a request like any other (RFC 9110): answered 405 with
/// `allow: POST`, the stream ended, the connection served on; a method that is not a token is
/// malformed (above).
#[tokio::test]
async fn other_methods_are_answered_405() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let path = path();
    for method in [&b"GET"[..], b"HEAD", b"PUT", b"OPTIONS"] {
        let stream = conn.stream();
        conn.send(&frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            stream,
            &request_with(method, &path, &[]),
        ))
        .await;
        // The stream's frames, to its end: the head, a line of text, empty trailers.
        let mut seen = Vec::new();
        for _ in 0..1_000 {
            let frame = conn.reader.frame().await.expect("the connection stays");
            if frame.stream == stream {
                let end = frame.flags & END_STREAM != 0;
                seen.push((frame.kind, frame.payload));
                if end || frame.kind == RST_STREAM {
                    break;
                }
            }
        }
        let kinds: Vec<u8> = seen.iter().map(|f| f.0).collect();
        assert_eq!(kinds, [HEADERS, DATA, HEADERS], "{method:?}: no reset");
        // `:status: 405`, `allow: POST`, `content-type: text/plain`, as literals without
        // indexing.
        assert_eq!(
            seen[0].1, b"\x08\x03405\x0f\x07\x04POST\x0f\x10\x0atext/plain",
            "{method:?}"
        );
        assert_eq!(conn.check().await, Outcome::Code(OK), "after {method:?}");
    }
}

/// Trailers that carry a pseudo-header: malformed.
#[tokio::test]
async fn a_pseudo_header_in_trailers_is_a_protocol_error() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let stream = conn.stream();
    let mut out = frame(HEADERS, END_HEADERS, stream, &block());
    push_frame(&mut out, DATA, 0, stream, &message());
    let mut trailers = Vec::new();
    literal(&mut trailers, b":path", b"/x", false);
    push_frame(
        &mut out,
        HEADERS,
        END_HEADERS | END_STREAM,
        stream,
        &trailers,
    );
    conn.send(&out).await;
    assert_eq!(
        conn.reader.outcome(stream).await,
        Outcome::Reset(PROTOCOL_ERROR)
    );
    assert_eq!(conn.check().await, Outcome::Code(OK));
}

/// A second HEADERS on a stream the client already ended (half-closed, remote): STREAM_CLOSED.
#[tokio::test]
async fn headers_on_a_half_closed_stream_are_stream_closed() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    let stream = conn.stream();
    // The window for answers closed, so that the stream is still open on our side.
    conn.send(&frame(
        SETTINGS,
        0,
        0,
        &[
            &SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes()[..],
            &0u32.to_be_bytes(),
        ]
        .concat(),
    ))
    .await;
    let mut out = request_frames(stream);
    push_frame(&mut out, HEADERS, END_HEADERS | END_STREAM, stream, &[]);
    conn.send(&out).await;
    let mut reset = None;
    for _ in 0..100 {
        let Some(frame) = conn.reader.frame().await else {
            break;
        };
        assert_ne!(frame.kind, GOAWAY, "{frame:?}");
        if frame.kind == RST_STREAM && frame.stream == stream {
            reset = Some(frame.code());
            break;
        }
    }
    assert_eq!(reset, Some(STREAM_CLOSED));
}

/// A PRIORITY frame of 4 bytes on a stream the client never opened: no RST_STREAM may name an
/// idle stream, so the stream error is the connection's (FRAME_SIZE_ERROR); on an open stream,
/// RST_STREAM(FRAME_SIZE_ERROR).
#[tokio::test]
async fn a_short_priority_frame_never_resets_an_idle_stream() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    conn.send(&frame(PRIORITY, 0, 9, &[0, 0, 0, 0])).await;
    let mut seen = Vec::new();
    for _ in 0..100 {
        let Some(frame) = conn.reader.frame().await else {
            break;
        };
        let kind = frame.kind;
        let code = if kind == GOAWAY || kind == RST_STREAM {
            frame.code()
        } else {
            0
        };
        seen.push((kind, frame.stream, code));
        if kind == GOAWAY || kind == RST_STREAM {
            break;
        }
    }
    assert!(
        !seen.iter().any(|&(kind, _, _)| kind == RST_STREAM),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(|&(k, _, c)| (k, c)),
        Some((GOAWAY, FRAME_SIZE_ERROR))
    );
    let mut conn = Conn::open(daemon.addr).await;
    let stream = conn.stream();
    conn.send(&frame(HEADERS, END_HEADERS, stream, &block()))
        .await;
    conn.send(&frame(PRIORITY, 0, stream, &[0, 0, 0, 0])).await;
    assert_eq!(
        conn.reader.outcome(stream).await,
        Outcome::Reset(FRAME_SIZE_ERROR)
    );
}

//! Protocol errors (RFC 9113): GOAWAY with the code the RFC names, then the connection closes.

use super::*;

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

/// A GOAWAY names only streams the server took: the client's GOAWAY is answered with the last
/// stream taken (one still open); a stream opened after that is ignored, and a later connection
/// error's GOAWAY still names the same last stream, so the client knows to retry it elsewhere.
#[tokio::test]
async fn a_goaway_never_names_an_ignored_stream() {
    let daemon = daemon(|_| {}).await;
    let mut conn = Conn::open(daemon.addr).await;
    assert_eq!(conn.check().await, Outcome::Code(OK));
    // Headers now, the body never: the stream stays open.
    let open = conn.stream();
    conn.send(&frame(HEADERS, END_HEADERS, open, &block()))
        .await;
    conn.send(&frame(GOAWAY, 0, 0, &[0; 8])).await;
    assert_eq!(conn.reader.next_goaway().await, Some((open, NO_ERROR)));
    let ignored = conn.stream();
    conn.send(&request_frames(ignored)).await;
    conn.send_any(&frame(PING, 0, 1, &[0; 8])).await;
    assert_eq!(
        conn.reader.next_goaway().await,
        Some((open, PROTOCOL_ERROR))
    );
}

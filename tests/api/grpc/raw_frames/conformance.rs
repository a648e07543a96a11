//! Conformance: what any HTTP/2 server answers.

use super::*;

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

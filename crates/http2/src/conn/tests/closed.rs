//! RFC 9113 section 5.1 on the wire: what a client sends on a stream the server reset while
//! the stream's unary call is still being dropped (the stream is closed, "reset by us", and
//! still kept by the connection). The RFC lets such frames arrive, since the client may have
//! sent them before it read the reset: they are ignored, never answered with another reset,
//! and never applied to a window. (That a client's RST_STREAM there is not counted as one of its
//! resets is `state.rs`'s table: the stream goes once the connection polls the dropped call, so
//! no read holds enough of them to reach the reset bound.)

use super::*;

/// Stream 1's slow call, then a DATA frame after its END_STREAM (half-closed (remote): reset
/// `STREAM_CLOSED`), then `late` on stream 1, then a call on stream 3 that must be answered.
fn after_our_reset(late: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut input = Vec::new();
    call(&mut input, 1, SLOW);
    push(&mut input, frame::DATA, 0, 1, b"x");
    input.extend_from_slice(late);
    call(&mut input, 3, b"\0\0\0\0\x02hi");
    assert!(
        input.len() < 4096,
        "one write: the late frames come before the call is polled"
    );
    let (out, _, budget) = runtime().block_on(serve(&input));
    assert_eq!(budget.used(), 0, "the charge is returned");
    let frames = frames(&out);
    let answered: Vec<_> = frames
        .iter()
        .filter(|f| f.0 == frame::DATA && f.2 == 3)
        .collect();
    assert_eq!(
        answered.first().map(|f| &f.3[..]),
        Some(&b"\0\0\0\0\x02hi"[..]),
        "the connection goes on: stream 3 is answered"
    );
    if let Some(goaway) = frames.iter().find(|f| f.0 == frame::GOAWAY) {
        assert_eq!(goaway.3.get(7), Some(&0), "no connection error: {goaway:?}");
    }
    frames.into_iter().filter(|f| f.2 == 1).collect()
}

/// The one frame the server wrote on stream 1: its `RST_STREAM(STREAM_CLOSED)`, no answer.
fn only_our_reset(stream_1: &[(u8, u8, u32, Vec<u8>)]) {
    let closed = (Code::StreamClosed as u32).to_be_bytes().to_vec();
    assert_eq!(
        stream_1,
        [(frame::RST_STREAM, 0, 1, closed)],
        "one reset on stream 1 and nothing else"
    );
}

#[test]
fn data_and_trailers_on_a_stream_we_reset_are_ignored() {
    let mut late = Vec::new();
    push(&mut late, frame::DATA, 0, 1, b"y");
    push(&mut late, frame::DATA, 0, 1, b"");
    push(
        &mut late,
        frame::HEADERS,
        frame::END_HEADERS | frame::END_STREAM,
        1,
        &[0x40, 1, b'a', 1, b'b'],
    );
    only_our_reset(&after_our_reset(&late));
}

#[test]
fn window_updates_on_a_stream_we_reset_are_not_applied() {
    // Applied, two increments of 2^31-1 would take the stream's window past the most a window
    // may be: a FLOW_CONTROL_ERROR reset. Ignored, nothing is written.
    let mut late = Vec::new();
    for _ in 0..2 {
        push(
            &mut late,
            frame::WINDOW_UPDATE,
            0,
            1,
            &0x7fff_ffffu32.to_be_bytes(),
        );
    }
    only_our_reset(&after_our_reset(&late));
}

/// Stream 1 asked and answered whole (both sides ended, the stream forgotten), then `late`:
/// the server's frames after its answer.
fn after_the_answer(late: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut input = Vec::new();
    call(&mut input, 1, b"\0\0\0\0\x02hi");
    let (out, _, budget) = runtime().block_on(serve_in(&[&input, late]));
    assert_eq!(budget.used(), 0, "the charge is returned");
    let frames = frames(&out);
    let answered = frames
        .iter()
        .position(|f| f.0 == frame::HEADERS && f.2 == 1 && f.1 & frame::END_STREAM != 0)
        .expect("stream 1 answered whole");
    frames[answered + 1..].to_vec()
}

#[test]
fn data_after_both_sides_ended_is_a_connection_stream_closed() {
    let mut late = Vec::new();
    push(&mut late, frame::DATA, frame::END_STREAM, 1, b"x");
    let goaway = after_the_answer(&late)
        .into_iter()
        .find(|f| f.0 == frame::GOAWAY)
        .expect("a GOAWAY");
    assert_eq!(goaway.3.get(7), Some(&(Code::StreamClosed as u8)));
}

#[test]
fn a_zero_window_increment_on_a_closed_stream_is_a_stream_error() {
    let mut late = Vec::new();
    push(&mut late, frame::WINDOW_UPDATE, 0, 1, &0u32.to_be_bytes());
    let resets: Vec<_> = after_the_answer(&late)
        .into_iter()
        .filter(|f| f.0 == frame::RST_STREAM && f.2 == 1)
        .collect();
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert_eq!(resets[0].3, (Code::Protocol as u32).to_be_bytes());
}

#[test]
fn a_stream_that_depends_on_itself_is_reset() {
    // HEADERS with the PRIORITY flag naming stream 1 itself, weight 16.
    let mut headers = 1u32.to_be_bytes().to_vec();
    headers.push(15);
    headers.extend_from_slice(&block(UNARY));
    let mut input = Vec::new();
    push(
        &mut input,
        frame::HEADERS,
        frame::END_HEADERS | frame::PRIORITY_FLAG,
        1,
        &headers,
    );
    // And a PRIORITY frame doing the same to stream 3, already open.
    push(
        &mut input,
        frame::HEADERS,
        frame::END_HEADERS,
        3,
        &block(UNARY),
    );
    let mut priority = 3u32.to_be_bytes().to_vec();
    priority.push(15);
    push(&mut input, frame::PRIORITY, 0, 3, &priority);
    let (out, _, budget) = runtime().block_on(serve(&input));
    assert_eq!(budget.used(), 0, "the charge is returned");
    let protocol = (Code::Protocol as u32).to_be_bytes().to_vec();
    for stream in [1, 3] {
        let on: Vec<_> = frames(&out).into_iter().filter(|f| f.2 == stream).collect();
        assert_eq!(
            on,
            [(frame::RST_STREAM, 0, stream, protocol.clone())],
            "stream {stream}"
        );
    }
}

#[test]
fn a_method_not_served_is_answered_once_the_client_ends_its_side() {
    // GET on a stream the client has not ended, then an error of its own there: the stream is
    // still open (nothing answered yet), so the error is the stream's and nothing else is sent.
    let mut input = Vec::new();
    let mut get = vec![0x42, 3];
    get.extend_from_slice(b"GET");
    get.extend_from_slice(&block(TASK)[1..]);
    push(&mut input, frame::HEADERS, frame::END_HEADERS, 1, &get);
    push(&mut input, frame::WINDOW_UPDATE, 0, 1, &0u32.to_be_bytes());
    // And on stream 3 a GET whose body comes later: answered after it.
    push(&mut input, frame::HEADERS, frame::END_HEADERS, 3, &get);
    let mut body = Vec::new();
    push(&mut body, frame::DATA, frame::END_STREAM, 3, b"ignored");
    let (out, _, budget) = runtime().block_on(serve_in(&[&input, &body]));
    assert_eq!(budget.used(), 0, "the charge is returned");
    let frames = frames(&out);
    let protocol = (Code::Protocol as u32).to_be_bytes().to_vec();
    let on_1: Vec<_> = frames.iter().filter(|f| f.2 == 1).cloned().collect();
    assert_eq!(on_1, [(frame::RST_STREAM, 0, 1, protocol)]);
    let on_3: Vec<_> = frames.iter().filter(|f| f.2 == 3).cloned().collect();
    assert_eq!(
        on_3,
        [(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            3,
            b"\x08\x03405".to_vec()
        )]
    );
}

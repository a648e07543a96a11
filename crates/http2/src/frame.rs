//! HTTP/2 frames (RFC 9113 section 4 and 6): the 9-byte header, the types and flags the server
//! reads, and the frames it writes.

use bytes::{BufMut, BytesMut};

/// The client's connection preface.
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header.
pub(super) const HEADER_BYTES: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE, ours and the protocol's default (the client's is read from its
/// SETTINGS): the server announces no larger.
pub(super) const MAX_FRAME_BYTES: usize = 16_384;
/// The largest stream id (2^31 - 1): a GOAWAY that still takes every stream.
pub(super) const MAX_STREAM: u32 = (1 << 31) - 1;
/// The largest flow-control window (2^31 - 1).
pub(super) const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The window both sides start with, before SETTINGS and WINDOW_UPDATEs.
pub(super) const DEFAULT_WINDOW: i64 = 65_535;

pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const PRIORITY: u8 = 0x2;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;

pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY_FLAG: u8 = 0x20;

/// SETTINGS identifiers (RFC 9113 section 6.5.2).
pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(super) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 section 7): those the server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    Compression = 0x9,
    EnhanceYourCalm = 0xb,
}

/// A frame's header, as read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    pub(super) len: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
}

impl Head {
    pub(super) fn parse(bytes: &[u8; HEADER_BYTES]) -> Self {
        Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            // The reserved bit is ignored on receipt.
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }
}

/// Appends a frame header; `len` is at most [`MAX_FRAME_BYTES`] (or the client's larger
/// maximum, which fits 24 bits).
pub(super) fn head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    let len = u32::try_from(len).unwrap_or(0);
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream & 0x7fff_ffff);
}

pub(super) fn rst_stream(out: &mut BytesMut, stream: u32, code: Code) {
    head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(code as u32);
}

pub(super) fn goaway(out: &mut BytesMut, last_stream: u32, code: Code, debug: &str) {
    let debug = &debug.as_bytes()[..debug.len().min(256)];
    head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.put_u32(last_stream & 0x7fff_ffff);
    out.put_u32(code as u32);
    out.put_slice(debug);
}

pub(super) fn window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment & 0x7fff_ffff);
}

pub(super) fn ping(out: &mut BytesMut, flags: u8, payload: [u8; 8]) {
    head(out, 8, PING, flags, 0);
    out.put_slice(&payload);
}

pub(super) fn settings(out: &mut BytesMut, values: &[(u16, u32)]) {
    head(out, values.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in values {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub(super) fn settings_ack(out: &mut BytesMut) {
    head(out, 0, SETTINGS, ACK, 0);
}

/// Removes a frame's padding (PADDED flag): the payload without its pad length byte and pad,
/// or `None` when the padding is longer than the payload (a PROTOCOL_ERROR).
pub(super) fn unpad(payload: &[u8], flags: u8) -> Option<&[u8]> {
    if flags & PADDED == 0 {
        return Some(payload);
    }
    let (&pad, rest) = payload.split_first()?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_header_reads_back() {
        let mut out = BytesMut::new();
        head(
            &mut out,
            16_383,
            HEADERS,
            END_HEADERS | END_STREAM,
            0x8000_0003,
        );
        let bytes: [u8; HEADER_BYTES] = out[..].try_into().unwrap();
        let read = Head::parse(&bytes);
        assert_eq!(
            (read.len, read.kind, read.flags, read.stream),
            (16_383, HEADERS, END_HEADERS | END_STREAM, 3)
        );
    }

    #[test]
    fn padding_is_removed_or_refused() {
        assert_eq!(unpad(b"abc", 0), Some(&b"abc"[..]));
        assert_eq!(unpad(&[2, b'a', 0, 0], PADDED), Some(&b"a"[..]));
        assert_eq!(unpad(&[3, b'a', 0], PADDED), None);
        assert_eq!(unpad(&[], PADDED), None);
    }
}

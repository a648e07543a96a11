//! gRPC's length-prefixed messages on a long-lived stream: cut out of the request body as its
//! chunks arrive (each message at most `limits.max_body_bytes`, uncompressed), and framed for
//! the response body.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tonic::Status;

/// The gRPC message prefix: a compressed flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// The messages of a stream's body, cut as its chunks arrive; holds at most one message and
/// the chunk that completes it.
pub(super) struct Deframer {
    buffer: BytesMut,
    max_message_bytes: usize,
}

impl Deframer {
    /// A deframer refusing messages over `max_message_bytes`.
    pub(super) fn new(max_message_bytes: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_message_bytes,
        }
    }

    /// Adds a chunk of the body.
    pub(super) fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole message, `None` until one has arrived, or the status that refuses the
    /// stream (compressed, oversized).
    pub(super) fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        let Some(prefix) = self.buffer.first_chunk::<PREFIX_BYTES>() else {
            return Ok(None);
        };
        match prefix[0] {
            0 => {}
            1 => {
                return Err(Status::invalid_argument(
                    "compressed messages are not accepted (no grpc-encoding)",
                ))
            }
            flag => {
                return Err(Status::invalid_argument(format!(
                    "message flag {flag} is neither 0 nor 1"
                )))
            }
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.max_message_bytes {
            return Err(Status::resource_exhausted(format!(
                "message over limits.max_body_bytes ({} bytes)",
                self.max_message_bytes
            )));
        }
        if self.buffer.len() < PREFIX_BYTES + len {
            return Ok(None);
        }
        self.buffer.advance(PREFIX_BYTES);
        Ok(Some(self.buffer.split_to(len).freeze()))
    }

    /// Whether part of a message is still waiting for the rest.
    pub(super) fn is_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

/// `message` framed for a gRPC body.
pub(super) fn frame(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = BytesMut::with_capacity(PREFIX_BYTES + len);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // A `BytesMut` grows as needed: encoding into it cannot run out of room.
    let _ = message.encode(&mut framed);
    framed.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_as_their_bytes_arrive() {
        let mut d = Deframer::new(16);
        d.push(&[0, 0, 0]);
        assert_eq!(d.next_message().unwrap(), None);
        d.push(&[0, 3, 7, 8]);
        assert_eq!(d.next_message().unwrap(), None);
        assert!(d.is_partial());
        d.push(&[9, 0, 0, 0, 0, 0]);
        assert_eq!(d.next_message().unwrap().as_deref(), Some(&[7, 8, 9][..]));
        assert_eq!(d.next_message().unwrap().as_deref(), Some(&[][..]));
        assert_eq!(d.next_message().unwrap(), None);
        assert!(!d.is_partial());
    }

    #[test]
    fn oversized_and_compressed_messages_end_the_stream() {
        let mut d = Deframer::new(16);
        d.push(&[0, 0, 0, 0, 17]);
        assert_eq!(
            d.next_message().unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        let mut d = Deframer::new(16);
        d.push(&[1, 0, 0, 0, 1, 0]);
        assert!(d
            .next_message()
            .unwrap_err()
            .message()
            .contains("compressed"));
    }
}

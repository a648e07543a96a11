//! The protobuf codec of the generated rate limit service: tonic's prost codec, except that a
//! message that does not decode (invalid UTF-8 in a string, a bad varint, a wrong wire type) is
//! `INVALID_ARGUMENT` (the sender got it wrong), where tonic answers `INTERNAL`. `build.rs`
//! names it as the generated code's codec.

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// tonic's prost codec with decode errors as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decode<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decode(self.0.decoder())
    }
}

/// The decoder of [`Codec`].
#[derive(Debug, Clone)]
pub struct Decode<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for Decode<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!("the message does not decode: {}", status.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

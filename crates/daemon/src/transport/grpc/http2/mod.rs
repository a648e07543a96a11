//! A narrow HTTP/2 server for the gRPC listeners (RFC 9113 server side, RFC 7541 HPACK),
//! written for unary gRPC calls: the frames and HPACK a gRPC client or Envoy sends, the windows,
//! bounds and keepalive of [`conn`]. What it costs per check against h2 and hyper is in
//! docs/benchmarks.md.

mod budget;
mod conn;
mod frame;
pub(super) mod hpack;
mod huffman;

pub(crate) use budget::{connection_base, Budget, Charge, Refusal};
pub(super) use conn::{
    status_trailers, Config, Connection, RecvBody, Service, StreamFuture, Trace, UnaryFuture,
    PER_STREAM_BYTES,
};

//! A narrow HTTP/2 server for the gRPC listeners (RFC 9113 server side, RFC 7541 HPACK),
//! written for unary gRPC calls: the frames and HPACK a gRPC client or Envoy sends, the windows,
//! bounds and keepalive of [`conn`], the memory [`budget`] every connection draws from. What it
//! costs per check against h2 and hyper is in docs/benchmarks.md.
//!
//! Every bound, beside hyperium/h2's (its server defaults) where it has one:
//!
//! | bound | here | h2 |
//! |---|---|---|
//! | memory of all connections | `limits.grpc_memory_bytes` (32 MiB); a base reserved per connection at accept, else it is closed; over the budget, `REFUSED_STREAM` for connections over their base ([`budget`]) | none |
//! | frame size | 16,384 (`FRAME_SIZE_ERROR`) | the same |
//! | header list | 16 KiB decoded (`RESOURCE_EXHAUSTED`, counted as a reset); encoded block over it + 1 KiB: `ENHANCE_YOUR_CALM` | 16 MiB |
//! | CONTINUATION frames a block | 16 (`ENHANCE_YOUR_CALM`) | counted |
//! | HPACK table | 4,096, updates at a block's start only | the same |
//! | concurrent streams | `envoy.max_concurrent_streams` (256), `REFUSED_STREAM` past it | none unless set |
//! | resets (the client's, refused streams, ours for its errors) | 2,000 per 10 s (`ENHANCE_YOUR_CALM`) | 20 pending accept, 1,024 local errors |
//! | frames that make no progress (empty DATA and CONTINUATION, PRIORITY, PING, SETTINGS, WINDOW_UPDATE, unknown) | 10,000 per 10 s (`ENHANCE_YOUR_CALM`) | small DATA frames (a budget of their overhead) |
//! | request bodies held | the connection window (256 KiB), given back only as calls take their bodies; a stream's body `limits.max_body_bytes` | windows, released as the app reads |
//! | answers queued for a closed window | 256 KiB a connection (the stream over it reset `CANCEL`) | 400 KiB a stream |
//! | write buffer | reading stops at 64 KiB unwritten | one pending PING/SETTINGS ACK |
//! | time | a body within `limits.body_read_timeout`, keepalive PINGs, handshake, idle and age ([`super::connection`]) | keepalive only |
//! | CPU per poll | 16 reads, then the task yields | tokio's budget |
//!
//! Work per frame is constant: a connection WINDOW_UPDATE visits only the streams blocked on the
//! connection's window, SETTINGS every stream only when the initial window grows (and SETTINGS
//! are counted above). A client's RST_STREAM drops its unary call, so a check not yet sent to
//! the store is never sent.

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

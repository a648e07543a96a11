//! sluice's HTTP/2 server: RFC 9113 server side and RFC 7541 HPACK, written for unary calls
//! answered on the connection's own task (the frames and HPACK a gRPC client or Envoy sends),
//! with anything else served on a task per stream. It knows nothing of what it serves: a
//! [`Service`] says which paths are unary, answers them ([`Answer`]), serves the others
//! ([`Responder`]) and says how a stream the connection refuses is answered ([`Refused`]). One
//! connection is a [`Connection`] (its windows, bounds and keepalive), each of its streams in
//! an RFC 9113 section 5.1 [`State`] (the table of what each frame does in each state is in
//! its doc); the memory [`Budget`] is what every connection draws from. What it costs per call against h2 and hyper is in
//! docs/benchmarks.md.
//!
//! Every bound, beside hyperium/h2's (its server defaults) where it has one; after `sluice:`,
//! what sluice's gRPC listeners configure:
//!
//! | bound | here | h2 |
//! |---|---|---|
//! | memory of all connections | [`Budget`]'s limit (sluice: `limits.grpc_memory_bytes`, 32 MiB); a base reserved per connection at accept ([`connection_base`]), else it is closed; over the budget, `REFUSED_STREAM` for connections over their base | none |
//! | frame size | 16,384 (`FRAME_SIZE_ERROR`) | the same |
//! | header list | [`Config::max_header_list`] decoded (sluice: 16 KiB; [`Refused::HeadersTooLarge`], counted as a reset); encoded block over it + 1 KiB: `ENHANCE_YOUR_CALM` | 16 MiB |
//! | CONTINUATION frames a block | 16 (`ENHANCE_YOUR_CALM`) | counted |
//! | HPACK table | 4,096, updates at a block's start only | the same |
//! | concurrent streams | [`Config::max_concurrent_streams`] (sluice: `envoy.max_concurrent_streams`, 256), `REFUSED_STREAM` past it | none unless set |
//! | resets (the client's, refused streams, ours for its errors) | 2,000 per 10 s (`ENHANCE_YOUR_CALM`) | 20 pending accept, 1,024 local errors |
//! | frames that make no progress (empty DATA and CONTINUATION, PRIORITY, PING, SETTINGS, WINDOW_UPDATE, unknown) | 10,000 per 10 s (`ENHANCE_YOUR_CALM`) | small DATA frames (a budget of their overhead) |
//! | request bodies held | the connection window ([`Config::connection_window`], sluice: 256 KiB), given back only as calls take their bodies; a unary body [`Config::max_body_bytes`] ([`Refused::BodyTooLarge`]) | windows, released as the app reads |
//! | answers queued for a closed window | 256 KiB a connection (the stream over it reset `CANCEL`) | 400 KiB a stream |
//! | write buffer | reading stops at 64 KiB unwritten | one pending PING/SETTINGS ACK |
//! | time | a unary body within [`Config::body_read_timeout`] ([`Refused::BodyTimeout`]), keepalive PINGs; handshake, idle and age are the caller's (sluice: `transport::grpc::connection`) | keepalive only |
//! | CPU per poll | 16 reads, then the task yields | tokio's budget |
//!
//! Work per frame is constant: a connection WINDOW_UPDATE visits only the streams blocked on the
//! connection's window, SETTINGS every stream only when the initial window grows (and SETTINGS
//! are counted above). A client's RST_STREAM drops its unary call, so a call not yet past its
//! first await (sluice: a check not yet sent to the store) never goes further.

mod budget;
mod conn;
mod frame;
mod hpack;
mod huffman;
mod state;

pub use budget::{connection_base, Budget, Charge, Refusal, Warn};
pub use conn::{
    Answer, Block, Broken, Config, Connection, Gone, Kept, RecvBody, Refused, Responder, Sending,
    Service, StreamFuture, UnaryFuture, PER_STREAM_BYTES,
};
pub use frame::Code;
pub use state::{Closed, FrameError, Recv, State};

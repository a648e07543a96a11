//! The attack suite: a real `sluice serve` process attacked over its gRPC listener by clients
//! that keep to HTTP/2's rules (or break them on purpose), each attack bounded in frames and
//! time. Each test asserts the bound the daemon documents (its RSS under the gRPC memory
//! budget, read from `/proc`; the refusal: `GOAWAY(ENHANCE_YOUR_CALM)`, a refused stream or
//! connection) and that a well-behaved client on another connection is answered throughout,
//! over gRPC and `/v1/check`. Timings are printed, never asserted: `sluice bench` measures.

mod daemon;
mod frames;
mod memory;
mod raw;

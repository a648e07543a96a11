//! Integration tests of the public API: real daemons on loopback and temporary Unix sockets (with a
//! manual clock), and the real `sluice` binary.

mod admin;
mod bad_input;
mod batch;
mod check;
mod cli;
mod helpers;
mod policies;
mod redis_differential;
mod redis_exactness;
mod redis_failures;
mod redis_server;
mod redis_store;
mod shutdown;
mod transports;

//! Fuzz targets for Warren, written as plain functions of a byte slice so that the same code
//! runs under libFuzzer (the cargo-fuzz crate in `fuzz/`, one thin binary per target) and in
//! `cargo test` (the committed corpus and every crash found are replayed by this crate's tests).
//!
//! Targets ([`TARGETS`]):
//!
//! * `frame_reader` ([`codec::frame_reader`]): the incremental frame parser, fed the input in
//!   one piece and in chunks; both must agree, and every frame must re-encode stably.
//! * `method_decode` ([`codec::method_decode`]): method payloads; a decoded method re-encodes
//!   to bytes that decode to the same method.
//! * `table_decode` ([`codec::table_decode`]): field tables, field values and `basic`
//!   content properties, with the same round-trip check.
//! * `connection` ([`session::connection`]): the server's real connection code
//!   (`warren_server::connection::serve`) over in-memory streams against an in-memory broker.
//!   The input is decoded into a [`session::Session`] (a handshake variant and a sequence of
//!   operations: channel, exchange, queue and basic methods, content in and out of order, raw
//!   frames, disconnects), so the fuzzer spends its time past the handshake.
//!
//! A target panics on a bug: a decoder that panics or loses round-trip stability, a server
//! that sends a malformed frame, breaks content framing or delivery-tag order, hangs, or
//! leaves consumers, unacknowledged messages or exclusive queues behind its closed
//! connections.

pub mod codec;
pub mod seeds;
pub mod session;

/// A fuzz target: takes any input, panics on a bug.
pub type Target = fn(&[u8]);

/// The fuzz targets by name: the same names as the binaries in `fuzz/fuzz_targets/` and the
/// folders of `fuzz/corpus/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_reader", codec::frame_reader),
    ("method_decode", codec::method_decode),
    ("table_decode", codec::table_decode),
    ("connection", session::connection),
];

//! Fuzz target `frame_reader`: see `warren_fuzz::codec::frame_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::codec::frame_reader(data));

//! Fuzz target `method_decode`: see `warren_fuzz::codec::method_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::codec::method_decode(data));

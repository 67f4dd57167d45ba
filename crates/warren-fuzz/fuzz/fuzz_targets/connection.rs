//! Fuzz target `connection`: see `warren_fuzz::session::connection`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::session::connection(data));

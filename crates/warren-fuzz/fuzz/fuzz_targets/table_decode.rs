//! Fuzz target `table_decode`: see `warren_fuzz::codec::table_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::codec::table_decode(data));

//! Fuzz target: feeds arbitrary bytes to the frame parser and the method,
//! property and table decoders. Any panic is a bug.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use warren_amqp::frame::{parse_frame, Limits};
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::{decode_table, Decoder};
use warren_amqp::Method;

fuzz_target!(|data: &[u8]| {
    let _ = Method::decode(data);
    let _ = BasicProperties::decode(data, 8);
    let _ = decode_table(&mut Decoder::new(data), 8);

    // Parse frames until the input is exhausted or invalid, with and
    // without a frame size limit. The first byte picks the limit.
    let frame_max = match data.first() {
        Some(b) if b & 1 == 0 => 0,
        _ => 4096,
    };
    let limits = Limits {
        frame_max,
        max_table_depth: 8,
    };
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = parse_frame(&mut buf, &limits) {
        // Re-encoding a decoded method must be stable: encode, decode and
        // encode again gives the same bytes (compared as bytes because
        // NaN floats inside tables are never equal to themselves).
        if let warren_amqp::Frame::Method { method, .. } = frame {
            let mut first = BytesMut::new();
            method.encode(&mut first);
            let again = Method::decode(&first).expect("re-encoded method decodes");
            let mut second = BytesMut::new();
            again.encode(&mut second);
            assert_eq!(first, second);
        }
    }
});

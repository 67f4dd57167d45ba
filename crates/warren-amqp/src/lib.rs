//! AMQP 0-9-1 wire codec for the Warren message broker (RabbitMQ compatible).
//!
//! * [`frame`] — frame parsing ([`parse_frame`]) and encoding, protocol header.
//! * [`generated`] (re-exported at the crate root) — one struct per protocol
//!   method, the [`Method`] enum and its binary encoding, generated from
//!   RabbitMQ's `amqp-rabbitmq-0.9.1.json` by `gen/generate.py`.
//! * [`table`] — field tables/values and the [`table::Decoder`] cursor.
//! * [`properties`] — `basic` content header properties; [`shortstr`] — their
//!   short-string values, opaque bytes.
//! * [`constants`] — reply codes.
//! * [`error`] — [`DecodeError`].
//!
//! Encoding appends to a [`bytes::BytesMut`] and cannot fail. Decoding is
//! strict and never panics, whatever the input.
//!
//! ```
//! use warren_amqp::{frame, BasicPublish, Method};
//! use bytes::BytesMut;
//!
//! let mut buf = BytesMut::new();
//! let publish = BasicPublish { exchange: "amq.direct".into(), routing_key: "k".into(), ..Default::default() };
//! frame::encode_method_frame(1, &publish.clone().into(), &mut buf);
//! let parsed = frame::parse_frame(&mut buf, &frame::Limits::default()).unwrap().unwrap();
//! assert_eq!(parsed, frame::Frame::Method { channel: 1, method: Method::BasicPublish(publish) });
//! assert!(buf.is_empty());
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod constants;
pub mod error;
pub mod frame;
pub mod generated;
pub mod properties;
pub mod shortstr;
pub mod table;

#[cfg(test)]
mod arbitrary;
#[cfg(test)]
mod generated_tests;
#[cfg(test)]
mod tests;

pub use bytes::Bytes;
pub use error::DecodeError;
pub use frame::{
    encode_body_frames, encode_header_frame, encode_heartbeat, encode_method_frame, parse_frame,
    Frame, Limits,
};
pub use generated::*;
pub use properties::BasicProperties;
pub use shortstr::ShortStr;
pub use table::{decode_table, encode_table, Decoder, FieldTable, FieldValue};

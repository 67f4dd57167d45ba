//! Error type returned by every decoding routine of this crate.
//!
//! Decoding is strict: any input that does not form a complete, well-formed
//! AMQP 0-9-1 structure yields a [`DecodeError`]; no input makes the decoder
//! panic. Encoding is infallible and therefore has no error type.

/// Why a frame, method, field table or property list could not be decoded.
///
/// A broker reports them to its peer as `FRAME_ERROR` (501), an unknown
/// method as `COMMAND_INVALID` (503); see [`DecodeError::reply_code`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended before the structure was complete, or a length prefix
    /// announced more bytes than the input holds.
    #[error("truncated input: a value or length prefix extends past the end of the data")]
    Truncated,
    /// The (class id, method id) pair of a method frame is not defined by the
    /// protocol.
    #[error("unknown method: class id {class_id}, method id {method_id}")]
    UnknownMethod {
        /// Class id read from the method payload.
        class_id: u16,
        /// Method id read from the method payload.
        method_id: u16,
    },
    /// The octet after a frame payload was not the frame-end marker `0xCE`.
    #[error("bad frame end octet 0x{0:02x} (expected 0xce)")]
    BadFrameEnd(u8),
    /// The frame type octet is not one of method (1), header (2), body (3) or
    /// heartbeat (8).
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// A frame header announced a frame larger than the negotiated maximum.
    #[error("frame of {size} bytes exceeds the frame-max of {max} bytes")]
    FrameTooLarge {
        /// Announced total frame size in bytes (payload plus the 8 bytes of
        /// header and frame end), saturated at `u32::MAX`.
        size: u32,
        /// Configured maximum total frame size in bytes.
        max: u32,
    },
    /// A field table or array contained an unknown field type tag.
    #[error("unknown field value type tag 0x{0:02x}")]
    BadFieldType(u8),
    /// A short string that names something (a method argument such as a queue
    /// name, or a field-table key) was not valid UTF-8. Content property values
    /// are bytes and never fail this way.
    #[error("Malformed UTF-8 in shortstr")]
    InvalidUtf8,
    /// Field tables/arrays were nested deeper than the configured limit.
    #[error("field table nesting exceeds the configured maximum depth")]
    TableTooDeep,
    /// A method or header payload had bytes left after its last field.
    #[error("unexpected trailing bytes after the last field")]
    TrailingBytes,
    /// A content header's property flags had a bit set that names no property
    /// of the class.
    #[error("content header property flags 0x{0:04x} set an undefined property bit")]
    BadPropertyFlags(u16),
    /// The arguments of a known method could not be decoded: they run past the
    /// end of the frame, leave bytes after the last argument, or hold a
    /// malformed field table or short string. `reason` says which.
    #[error("cannot decode the arguments of {}: {reason}", crate::generated::method_name(*.class_id, *.method_id).unwrap_or("a method"))]
    MethodArguments {
        /// Class id of the method.
        class_id: u16,
        /// Method id of the method.
        method_id: u16,
        /// What was wrong.
        reason: Box<DecodeError>,
    },
    /// A heartbeat frame carried a payload (it must be empty).
    #[error("heartbeat frame with a non-empty payload of {0} bytes")]
    BadHeartbeat(u32),
}

impl DecodeError {
    /// The AMQP reply code a broker should use when closing the connection
    /// because of this error: `COMMAND_INVALID` (503) for an unknown method,
    /// `FRAME_ERROR` (501) for everything else, as RabbitMQ reports a frame or
    /// method it cannot decode.
    pub fn reply_code(&self) -> u16 {
        use crate::constants::{COMMAND_INVALID, FRAME_ERROR};
        match self {
            DecodeError::UnknownMethod { .. } => COMMAND_INVALID,
            _ => FRAME_ERROR,
        }
    }

    /// The (class id, method id) a connection.close for this error names: the
    /// method whose arguments could not be decoded, else (0, 0). As in
    /// RabbitMQ, a malformed UTF-8 name names no method.
    pub fn method_ids(&self) -> (u16, u16) {
        match self {
            DecodeError::MethodArguments {
                class_id,
                method_id,
                reason,
            } if **reason != DecodeError::InvalidUtf8 => (*class_id, *method_id),
            _ => (0, 0),
        }
    }
}

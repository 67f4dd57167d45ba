//! Error type returned by every decoding routine of this crate.
//!
//! Decoding is strict: any input that does not form a complete, well-formed
//! AMQP 0-9-1 structure yields a [`DecodeError`]; no input makes the decoder
//! panic. Encoding is infallible and therefore has no error type.

/// Why a frame, method, field table or property list could not be decoded.
///
/// Most variants map to the AMQP reply code `FRAME_ERROR` (501) or
/// `SYNTAX_ERROR` (502) when a broker reports them to a peer; see
/// [`DecodeError::reply_code`].
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
    /// A short string (or a table key) was not valid UTF-8.
    #[error("short string is not valid UTF-8")]
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
    /// A content header frame was sent for a class that has no content
    /// (only class 60, basic, carries content).
    #[error("content header for class {0}, which has no content")]
    BadContentClass(u16),
    /// A heartbeat frame carried a payload (it must be empty).
    #[error("heartbeat frame with a non-empty payload of {0} bytes")]
    BadHeartbeat(u32),
}

impl DecodeError {
    /// The AMQP reply code a broker should use when closing the connection
    /// because of this error: `FRAME_ERROR` (501) for framing problems,
    /// `COMMAND_INVALID` (503) for unknown methods, `SYNTAX_ERROR` (502)
    /// otherwise.
    pub fn reply_code(&self) -> u16 {
        use crate::constants::{COMMAND_INVALID, FRAME_ERROR, SYNTAX_ERROR};
        match self {
            DecodeError::BadFrameEnd(_)
            | DecodeError::UnknownFrameType(_)
            | DecodeError::FrameTooLarge { .. }
            | DecodeError::BadHeartbeat(_)
            | DecodeError::Truncated => FRAME_ERROR,
            DecodeError::UnknownMethod { .. } => COMMAND_INVALID,
            _ => SYNTAX_ERROR,
        }
    }
}

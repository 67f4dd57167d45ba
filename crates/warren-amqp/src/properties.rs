//! Content header properties of the `basic` class (spec section 4.2.6.1
//! and the `basic` class property list).
//!
//! Wire layout: one or more 16-bit property-flag words followed by the
//! values of the present properties in declaration order. In each flag word
//! bit 15 is the first property of that word and bit 0, when set, means
//! another flag word follows. `basic` defines 14 properties, so they all fit
//! in the first word (bits 15..=2); bit 1 is unused.

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;
use crate::shortstr::ShortStr;
use crate::table::{decode_table, encode_table, put_shortstr_bytes, Decoder, FieldTable};

/// Flag bit of `content-type`.
pub const FLAG_CONTENT_TYPE: u16 = 1 << 15;
/// Flag bit of `content-encoding`.
pub const FLAG_CONTENT_ENCODING: u16 = 1 << 14;
/// Flag bit of `headers`.
pub const FLAG_HEADERS: u16 = 1 << 13;
/// Flag bit of `delivery-mode`.
pub const FLAG_DELIVERY_MODE: u16 = 1 << 12;
/// Flag bit of `priority`.
pub const FLAG_PRIORITY: u16 = 1 << 11;
/// Flag bit of `correlation-id`.
pub const FLAG_CORRELATION_ID: u16 = 1 << 10;
/// Flag bit of `reply-to`.
pub const FLAG_REPLY_TO: u16 = 1 << 9;
/// Flag bit of `expiration`.
pub const FLAG_EXPIRATION: u16 = 1 << 8;
/// Flag bit of `message-id`.
pub const FLAG_MESSAGE_ID: u16 = 1 << 7;
/// Flag bit of `timestamp`.
pub const FLAG_TIMESTAMP: u16 = 1 << 6;
/// Flag bit of `type`.
pub const FLAG_TYPE: u16 = 1 << 5;
/// Flag bit of `user-id`.
pub const FLAG_USER_ID: u16 = 1 << 4;
/// Flag bit of `app-id`.
pub const FLAG_APP_ID: u16 = 1 << 3;
/// Flag bit of `cluster-id` (deprecated, still carried through).
pub const FLAG_CLUSTER_ID: u16 = 1 << 2;
/// Continuation bit: another flag word follows.
pub const FLAG_CONTINUATION: u16 = 1;

/// Delivery mode value for transient messages.
pub const DELIVERY_MODE_TRANSIENT: u8 = 1;
/// Delivery mode value for persistent messages.
pub const DELIVERY_MODE_PERSISTENT: u8 = 2;

/// Properties of a `basic` content header. `None` means the property is
/// absent (its flag bit is clear).
///
/// Short-string values are opaque bytes ([`ShortStr`]), as RabbitMQ treats them: a binary
/// `correlation-id` is stored and delivered unchanged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BasicProperties {
    /// MIME content type (`content-type`).
    pub content_type: Option<ShortStr>,
    /// MIME content encoding (`content-encoding`).
    pub content_encoding: Option<ShortStr>,
    /// Application headers (`headers`), used e.g. by headers exchanges.
    pub headers: Option<FieldTable>,
    /// 1 = transient, 2 = persistent (`delivery-mode`).
    pub delivery_mode: Option<u8>,
    /// Message priority, 0 to 9 (`priority`).
    pub priority: Option<u8>,
    /// Application correlation identifier (`correlation-id`).
    pub correlation_id: Option<ShortStr>,
    /// Address to reply to (`reply-to`).
    pub reply_to: Option<ShortStr>,
    /// Per-message TTL in milliseconds, as a decimal string (`expiration`).
    pub expiration: Option<ShortStr>,
    /// Application message identifier (`message-id`).
    pub message_id: Option<ShortStr>,
    /// Message timestamp, seconds since the Unix epoch (`timestamp`).
    pub timestamp: Option<u64>,
    /// Message type name (`type`).
    pub kind: Option<ShortStr>,
    /// Creating user id, validated by RabbitMQ against the connection user
    /// (`user-id`).
    pub user_id: Option<ShortStr>,
    /// Creating application id (`app-id`).
    pub app_id: Option<ShortStr>,
    /// Deprecated cluster id (`cluster-id`).
    pub cluster_id: Option<ShortStr>,
}

impl BasicProperties {
    /// The first property-flag word for these properties.
    pub fn flags(&self) -> u16 {
        let mut f = 0;
        let mut set = |present: bool, bit: u16| {
            if present {
                f |= bit;
            }
        };
        set(self.content_type.is_some(), FLAG_CONTENT_TYPE);
        set(self.content_encoding.is_some(), FLAG_CONTENT_ENCODING);
        set(self.headers.is_some(), FLAG_HEADERS);
        set(self.delivery_mode.is_some(), FLAG_DELIVERY_MODE);
        set(self.priority.is_some(), FLAG_PRIORITY);
        set(self.correlation_id.is_some(), FLAG_CORRELATION_ID);
        set(self.reply_to.is_some(), FLAG_REPLY_TO);
        set(self.expiration.is_some(), FLAG_EXPIRATION);
        set(self.message_id.is_some(), FLAG_MESSAGE_ID);
        set(self.timestamp.is_some(), FLAG_TIMESTAMP);
        set(self.kind.is_some(), FLAG_TYPE);
        set(self.user_id.is_some(), FLAG_USER_ID);
        set(self.app_id.is_some(), FLAG_APP_ID);
        set(self.cluster_id.is_some(), FLAG_CLUSTER_ID);
        f
    }

    /// Whether `delivery_mode` is 2 (persistent).
    pub fn is_persistent(&self) -> bool {
        self.delivery_mode == Some(DELIVERY_MODE_PERSISTENT)
    }

    /// Appends the flag word and the present property values to `buf`.
    ///
    /// Short strings longer than 255 bytes are cut to 255 bytes.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u16(self.flags());
        let s = |buf: &mut BytesMut, v: &Option<ShortStr>| {
            if let Some(v) = v {
                put_shortstr_bytes(buf, v);
            }
        };
        s(buf, &self.content_type);
        s(buf, &self.content_encoding);
        if let Some(h) = &self.headers {
            encode_table(h, buf);
        }
        if let Some(v) = self.delivery_mode {
            buf.put_u8(v);
        }
        if let Some(v) = self.priority {
            buf.put_u8(v);
        }
        s(buf, &self.correlation_id);
        s(buf, &self.reply_to);
        s(buf, &self.expiration);
        s(buf, &self.message_id);
        if let Some(v) = self.timestamp {
            buf.put_u64(v);
        }
        s(buf, &self.kind);
        s(buf, &self.user_id);
        s(buf, &self.app_id);
        s(buf, &self.cluster_id);
    }

    /// Reads property flags and values from `d`, leaving any bytes after the
    /// last present property unread.
    ///
    /// Continuation flag words are accepted as long as they set no property
    /// bits; bit 1 of the first word, which names no property, is ignored (as
    /// RabbitMQ does). Short-string values are taken as bytes, unchecked.
    /// `max_depth` limits nesting inside `headers`.
    ///
    /// Errors: [`DecodeError::Truncated`], [`DecodeError::BadPropertyFlags`]
    /// when a continuation word sets a property bit, plus field-table errors
    /// for `headers`.
    pub fn decode_from(d: &mut Decoder, max_depth: usize) -> Result<Self, DecodeError> {
        let flags = d.read_u16()?;
        let mut more = flags & FLAG_CONTINUATION != 0;
        while more {
            let w = d.read_u16()?;
            if w & !FLAG_CONTINUATION != 0 {
                return Err(DecodeError::BadPropertyFlags(w));
            }
            more = w & FLAG_CONTINUATION != 0;
        }
        let has = |bit: u16| flags & bit != 0;
        let s = |d: &mut Decoder, bit: u16| -> Result<Option<ShortStr>, DecodeError> {
            if has(bit) {
                d.read_shortstr_bytes().map(|b| Some(ShortStr::from(b)))
            } else {
                Ok(None)
            }
        };
        let o = |d: &mut Decoder, bit: u16| -> Result<Option<u8>, DecodeError> {
            if has(bit) {
                d.read_u8().map(Some)
            } else {
                Ok(None)
            }
        };
        let content_type = s(d, FLAG_CONTENT_TYPE)?;
        let content_encoding = s(d, FLAG_CONTENT_ENCODING)?;
        let headers = if has(FLAG_HEADERS) {
            Some(decode_table(d, max_depth)?)
        } else {
            None
        };
        let delivery_mode = o(d, FLAG_DELIVERY_MODE)?;
        let priority = o(d, FLAG_PRIORITY)?;
        let correlation_id = s(d, FLAG_CORRELATION_ID)?;
        let reply_to = s(d, FLAG_REPLY_TO)?;
        let expiration = s(d, FLAG_EXPIRATION)?;
        let message_id = s(d, FLAG_MESSAGE_ID)?;
        let timestamp = if has(FLAG_TIMESTAMP) {
            Some(d.read_u64()?)
        } else {
            None
        };
        Ok(BasicProperties {
            content_type,
            content_encoding,
            headers,
            delivery_mode,
            priority,
            correlation_id,
            reply_to,
            expiration,
            message_id,
            timestamp,
            kind: s(d, FLAG_TYPE)?,
            user_id: s(d, FLAG_USER_ID)?,
            app_id: s(d, FLAG_APP_ID)?,
            cluster_id: s(d, FLAG_CLUSTER_ID)?,
        })
    }

    /// Decodes a complete property list (flags and values) from `payload`;
    /// trailing bytes are an error ([`DecodeError::TrailingBytes`]).
    pub fn decode(payload: &[u8], max_depth: usize) -> Result<Self, DecodeError> {
        let mut d = Decoder::new(payload);
        let props = Self::decode_from(&mut d, max_depth)?;
        if !d.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(props)
    }
}

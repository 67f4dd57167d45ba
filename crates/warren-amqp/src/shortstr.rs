//! [`ShortStr`]: the value of a short-string content property, kept as opaque bytes.
//!
//! The 0-9-1 grammar makes every short string "UTF-8", but RabbitMQ never checks the ones in
//! content properties, and real programs rely on it: Go and .NET clients put raw 16-byte UUIDs in
//! `correlation-id` and `message-id`. A broker must store and deliver those bytes unchanged, so
//! property values are bytes here; whoever interprets one (the broker reads `expiration`,
//! `user-id` and `reply-to`) asks for it as text with [`ShortStr::as_str`].

use bytes::Bytes;
use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;

/// A short-string property value: at most 255 bytes on the wire, not necessarily UTF-8.
///
/// Cheap to clone (a reference-counted [`Bytes`]). Compares equal to a `&str` with the same
/// bytes. Values longer than 255 bytes are cut to 255 when encoded.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShortStr(Bytes);

impl ShortStr {
    /// A value from a static string, without copying.
    pub const fn from_static(s: &'static str) -> Self {
        ShortStr(Bytes::from_static(s.as_bytes()))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as text, when it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The value as text, with invalid UTF-8 sequences replaced by U+FFFD (for messages and
    /// logs, never for comparisons).
    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }
}

impl Deref for ShortStr {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for ShortStr {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ShortStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(s) => fmt::Debug::fmt(s, f),
            None => write!(f, "b{:?}", self.0),
        }
    }
}

impl fmt::Display for ShortStr {
    /// Lossy: invalid UTF-8 shows as U+FFFD.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

impl From<&str> for ShortStr {
    fn from(s: &str) -> Self {
        ShortStr(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<String> for ShortStr {
    fn from(s: String) -> Self {
        ShortStr(Bytes::from(s.into_bytes()))
    }
}

impl From<&String> for ShortStr {
    fn from(s: &String) -> Self {
        s.as_str().into()
    }
}

impl From<&[u8]> for ShortStr {
    fn from(b: &[u8]) -> Self {
        ShortStr(Bytes::copy_from_slice(b))
    }
}

impl From<Vec<u8>> for ShortStr {
    fn from(b: Vec<u8>) -> Self {
        ShortStr(Bytes::from(b))
    }
}

impl From<Bytes> for ShortStr {
    fn from(b: Bytes) -> Self {
        ShortStr(b)
    }
}

impl PartialEq<str> for ShortStr {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for ShortStr {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<[u8]> for ShortStr {
    fn eq(&self, other: &[u8]) -> bool {
        self.0 == other
    }
}

//! AMQP field tables and field values (spec section 4.2.5.5), plus the
//! [`Decoder`] cursor shared by all decoding routines of this crate.
//!
//! Field value type tags follow RabbitMQ's errata to the 0-9-1 grammar
//! (which is what every mainstream client speaks): `s` is a signed 16-bit
//! integer, `u` unsigned 16-bit, `I` signed 32-bit, `i` unsigned 32-bit,
//! `l` signed 64-bit, `x` a byte array.
//!
//! Wire layout of a table: a `u32` byte length followed by entries, each a
//! short string key (`u8` length + UTF-8 bytes), a type tag octet and the
//! value. All integers are big-endian.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// Default maximum nesting depth for field tables and arrays.
pub const DEFAULT_MAX_TABLE_DEPTH: usize = 16;

/// A single typed value inside a [`FieldTable`] or a field array.
///
/// The comment after each variant is its wire type tag.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// `t`: boolean, one octet (0 = false, anything else = true).
    Bool(bool),
    /// `b`: signed 8-bit integer.
    I8(i8),
    /// `B`: unsigned 8-bit integer.
    U8(u8),
    /// `s`: signed 16-bit integer (RabbitMQ errata).
    I16(i16),
    /// `u`: unsigned 16-bit integer.
    U16(u16),
    /// `I`: signed 32-bit integer.
    I32(i32),
    /// `i`: unsigned 32-bit integer.
    U32(u32),
    /// `l`: signed 64-bit integer.
    I64(i64),
    /// `f`: IEEE-754 single precision float.
    F32(f32),
    /// `d`: IEEE-754 double precision float.
    F64(f64),
    /// `D`: decimal, `value * 10^-scale`; a scale octet then a `u32`.
    Decimal {
        /// Number of decimal digits after the point.
        scale: u8,
        /// Unscaled value.
        value: u32,
    },
    /// `S`: long string, `u32` length prefixed bytes (not necessarily UTF-8).
    LongString(Bytes),
    /// `x`: byte array, `u32` length prefixed bytes.
    ByteArray(Bytes),
    /// `A`: field array, `u32` byte length then tagged values.
    Array(Vec<FieldValue>),
    /// `T`: timestamp, seconds since the Unix epoch as `u64`.
    Timestamp(u64),
    /// `F`: nested field table.
    Table(FieldTable),
    /// `V`: no value.
    Void,
}

impl FieldValue {
    /// The wire type tag of this value (e.g. `b'S'` for a long string).
    pub fn type_char(&self) -> u8 {
        match self {
            FieldValue::Bool(_) => b't',
            FieldValue::I8(_) => b'b',
            FieldValue::U8(_) => b'B',
            FieldValue::I16(_) => b's',
            FieldValue::U16(_) => b'u',
            FieldValue::I32(_) => b'I',
            FieldValue::U32(_) => b'i',
            FieldValue::I64(_) => b'l',
            FieldValue::F32(_) => b'f',
            FieldValue::F64(_) => b'd',
            FieldValue::Decimal { .. } => b'D',
            FieldValue::LongString(_) => b'S',
            FieldValue::ByteArray(_) => b'x',
            FieldValue::Array(_) => b'A',
            FieldValue::Timestamp(_) => b'T',
            FieldValue::Table(_) => b'F',
            FieldValue::Void => b'V',
        }
    }

    /// The value as `&str` if it is a [`FieldValue::LongString`] holding
    /// valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            FieldValue::LongString(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value widened to `i64` if it is any integer variant
    /// (`I8`, `U8`, `I16`, `U16`, `I32`, `U32`, `I64`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            FieldValue::I8(v) => Some(v.into()),
            FieldValue::U8(v) => Some(v.into()),
            FieldValue::I16(v) => Some(v.into()),
            FieldValue::U16(v) => Some(v.into()),
            FieldValue::I32(v) => Some(v.into()),
            FieldValue::U32(v) => Some(v.into()),
            FieldValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value if it is a [`FieldValue::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            FieldValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The nested table if this is a [`FieldValue::Table`].
    pub fn as_table(&self) -> Option<&FieldTable> {
        match self {
            FieldValue::Table(t) => Some(t),
            _ => None,
        }
    }

    /// The elements if this is a [`FieldValue::Array`].
    pub fn as_array(&self) -> Option<&[FieldValue]> {
        match self {
            FieldValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl From<&str> for FieldValue {
    fn from(s: &str) -> Self {
        FieldValue::LongString(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<String> for FieldValue {
    fn from(s: String) -> Self {
        FieldValue::LongString(Bytes::from(s))
    }
}

impl From<bool> for FieldValue {
    fn from(b: bool) -> Self {
        FieldValue::Bool(b)
    }
}

impl From<i32> for FieldValue {
    fn from(v: i32) -> Self {
        FieldValue::I32(v)
    }
}

impl From<i64> for FieldValue {
    fn from(v: i64) -> Self {
        FieldValue::I64(v)
    }
}

impl From<FieldTable> for FieldValue {
    fn from(t: FieldTable) -> Self {
        FieldValue::Table(t)
    }
}

/// An AMQP field table: string keys mapped to [`FieldValue`]s.
///
/// Entries are kept in wire order, so decoding then encoding a table
/// reproduces the same bytes. Lookups are linear, which is faster than
/// hashing for the handful of entries tables usually hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldTable(pub Vec<(String, FieldValue)>);

impl FieldTable {
    /// An empty table.
    pub fn new() -> Self {
        FieldTable(Vec::new())
    }

    /// The value stored under `key`, if any (first match).
    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` to `v`, replacing the value in place if the key already
    /// exists, appending otherwise.
    pub fn insert(&mut self, key: impl Into<String>, v: FieldValue) {
        let key = key.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = v,
            None => self.0.push((key, v)),
        }
    }

    /// Removes `key` and returns its value, if present.
    pub fn remove(&mut self, key: &str) -> Option<FieldValue> {
        let pos = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(pos).1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates over `(key, value)` entries in wire order.
    pub fn iter(&self) -> impl Iterator<Item = &(String, FieldValue)> {
        self.0.iter()
    }
}

impl<K: Into<String>> FromIterator<(K, FieldValue)> for FieldTable {
    fn from_iter<I: IntoIterator<Item = (K, FieldValue)>>(iter: I) -> Self {
        let mut t = FieldTable::new();
        for (k, v) in iter {
            t.insert(k, v);
        }
        t
    }
}

/// A bounds-checked read cursor over a byte slice.
///
/// Every read returns [`DecodeError::Truncated`] instead of panicking when
/// the input is too short; multi-byte integers are big-endian (network
/// order) as everywhere in AMQP.
#[derive(Clone, Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// A cursor positioned at the start of `buf`.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf }
    }

    /// Bytes not consumed yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Whether all input has been consumed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The unconsumed input.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Consumes and returns the next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self.buf.split_first_chunk::<N>() {
            Some((head, tail)) => {
                self.buf = tail;
                Ok(*head)
            }
            None => Err(DecodeError::Truncated),
        }
    }

    /// Reads an octet.
    #[inline]
    pub fn read_u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(|[b]| b)
    }

    /// Reads a big-endian `u16` (AMQP `short`).
    #[inline]
    pub fn read_u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_be_bytes)
    }

    /// Reads a big-endian `u32` (AMQP `long`).
    #[inline]
    pub fn read_u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    /// Reads a big-endian `u64` (AMQP `longlong` / `timestamp`).
    #[inline]
    pub fn read_u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_be_bytes)
    }

    /// Reads a short string (`u8` length + bytes) and validates it as UTF-8.
    ///
    /// Errors: [`DecodeError::Truncated`], [`DecodeError::InvalidUtf8`].
    #[inline]
    pub fn read_shortstr(&mut self) -> Result<String, DecodeError> {
        let len = self.read_u8()? as usize;
        let raw = self.take(len)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8)
    }

    /// Reads a short string (`u8` length + bytes) without checking its encoding or copying.
    ///
    /// Errors: [`DecodeError::Truncated`].
    #[inline]
    pub fn read_shortstr_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.read_u8()? as usize;
        self.take(len)
    }

    /// Reads a long string (`u32` length + bytes) without copying.
    #[inline]
    pub fn read_longstr_slice(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.read_u32()? as usize;
        self.take(len)
    }

    /// Reads a long string (`u32` length + bytes) into an owned [`Bytes`].
    #[inline]
    pub fn read_longstr(&mut self) -> Result<Bytes, DecodeError> {
        self.read_longstr_slice().map(Bytes::copy_from_slice)
    }
}

/// Longest byte length a short string can have on the wire.
pub const SHORTSTR_MAX: usize = 255;

/// Writes a short string: `u8` length then bytes.
///
/// Strings longer than 255 bytes cannot be represented; they are cut at the
/// last UTF-8 character boundary at or before 255 bytes.
#[inline]
pub fn put_shortstr(buf: &mut BytesMut, s: &str) {
    let mut len = s.len().min(SHORTSTR_MAX);
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    buf.reserve(1 + len);
    buf.put_u8(len as u8);
    buf.put_slice(&s.as_bytes()[..len]);
}

/// Writes a short string of arbitrary bytes: `u8` length then at most 255 bytes.
#[inline]
pub fn put_shortstr_bytes(buf: &mut BytesMut, b: &[u8]) {
    let len = b.len().min(SHORTSTR_MAX);
    buf.reserve(1 + len);
    buf.put_u8(len as u8);
    buf.put_slice(&b[..len]);
}

/// Writes a long string: `u32` length then bytes (data beyond `u32::MAX`
/// bytes is cut off; no frame can carry that much anyway).
#[inline]
pub fn put_longstr(buf: &mut BytesMut, b: &[u8]) {
    let len = b.len().min(u32::MAX as usize);
    buf.reserve(4 + len);
    buf.put_u32(len as u32);
    buf.put_slice(&b[..len]);
}

/// Writes `t`: a `u32` byte length followed by its entries.
pub fn encode_table(t: &FieldTable, buf: &mut BytesMut) {
    let start = buf.len();
    buf.put_u32(0);
    for (k, v) in &t.0 {
        put_shortstr(buf, k);
        encode_field_value(v, buf);
    }
    patch_len(buf, start);
}

/// Overwrites the `u32` placeholder at `start` with the number of bytes
/// written after it.
#[inline]
fn patch_len(buf: &mut BytesMut, start: usize) {
    let len = (buf.len() - start - 4) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Writes one field value: its type tag then its payload.
pub fn encode_field_value(v: &FieldValue, buf: &mut BytesMut) {
    buf.put_u8(v.type_char());
    match v {
        FieldValue::Bool(b) => buf.put_u8(u8::from(*b)),
        FieldValue::I8(x) => buf.put_i8(*x),
        FieldValue::U8(x) => buf.put_u8(*x),
        FieldValue::I16(x) => buf.put_i16(*x),
        FieldValue::U16(x) => buf.put_u16(*x),
        FieldValue::I32(x) => buf.put_i32(*x),
        FieldValue::U32(x) => buf.put_u32(*x),
        FieldValue::I64(x) => buf.put_i64(*x),
        FieldValue::F32(x) => buf.put_f32(*x),
        FieldValue::F64(x) => buf.put_f64(*x),
        FieldValue::Decimal { scale, value } => {
            buf.put_u8(*scale);
            buf.put_u32(*value);
        }
        FieldValue::LongString(b) | FieldValue::ByteArray(b) => put_longstr(buf, b),
        FieldValue::Array(items) => {
            let start = buf.len();
            buf.put_u32(0);
            for item in items {
                encode_field_value(item, buf);
            }
            patch_len(buf, start);
        }
        FieldValue::Timestamp(t) => buf.put_u64(*t),
        FieldValue::Table(t) => encode_table(t, buf),
        FieldValue::Void => {}
    }
}

/// Reads a field table (`u32` byte length then entries) from `buf`.
///
/// `depth` is the number of table/array nesting levels still allowed; this
/// table itself uses one, so `depth == 0` fails immediately with
/// [`DecodeError::TableTooDeep`]. Pass [`DEFAULT_MAX_TABLE_DEPTH`] for the
/// usual limit.
///
/// Errors: [`DecodeError::Truncated`] (also when the length prefix exceeds
/// the input), [`DecodeError::InvalidUtf8`] for a non-UTF-8 key,
/// [`DecodeError::BadFieldType`] for an unknown tag,
/// [`DecodeError::TableTooDeep`].
pub fn decode_table(buf: &mut Decoder, depth: usize) -> Result<FieldTable, DecodeError> {
    if depth == 0 {
        return Err(DecodeError::TableTooDeep);
    }
    let body = buf.read_longstr_slice()?;
    let mut inner = Decoder::new(body);
    let mut entries = Vec::with_capacity(count_entries(body));
    while !inner.is_empty() {
        let key = inner.read_shortstr()?;
        let value = decode_field_value(&mut inner, depth - 1)?;
        entries.push((key, value));
    }
    Ok(FieldTable(entries))
}

/// Reads one tagged field value. `depth` is the number of nesting levels
/// still available to nested tables/arrays inside this value.
pub fn decode_field_value(buf: &mut Decoder, depth: usize) -> Result<FieldValue, DecodeError> {
    let tag = buf.read_u8()?;
    Ok(match tag {
        b't' => FieldValue::Bool(buf.read_u8()? != 0),
        b'b' => FieldValue::I8(buf.read_u8()? as i8),
        b'B' => FieldValue::U8(buf.read_u8()?),
        b's' => FieldValue::I16(buf.read_u16()? as i16),
        b'u' => FieldValue::U16(buf.read_u16()?),
        b'I' => FieldValue::I32(buf.read_u32()? as i32),
        b'i' => FieldValue::U32(buf.read_u32()?),
        b'l' => FieldValue::I64(buf.read_u64()? as i64),
        b'f' => FieldValue::F32(f32::from_bits(buf.read_u32()?)),
        b'd' => FieldValue::F64(f64::from_bits(buf.read_u64()?)),
        b'D' => {
            let scale = buf.read_u8()?;
            let value = buf.read_u32()?;
            FieldValue::Decimal { scale, value }
        }
        b'S' => FieldValue::LongString(buf.read_longstr()?),
        b'x' => FieldValue::ByteArray(buf.read_longstr()?),
        b'A' => {
            if depth == 0 {
                return Err(DecodeError::TableTooDeep);
            }
            let body = buf.read_longstr_slice()?;
            let mut inner = Decoder::new(body);
            let mut items = Vec::with_capacity(count_values(body));
            while !inner.is_empty() {
                items.push(decode_field_value(&mut inner, depth - 1)?);
            }
            FieldValue::Array(items)
        }
        b'T' => FieldValue::Timestamp(buf.read_u64()?),
        b'F' => FieldValue::Table(decode_table(buf, depth)?),
        b'V' => FieldValue::Void,
        other => return Err(DecodeError::BadFieldType(other)),
    })
}

/// Number of entries in the body of a field table, found by skipping over them without
/// decoding, so that the decoder allocates its entry vector once and exactly. Counting stops
/// at the first malformed entry; the decoder then reports the error.
fn count_entries(mut body: &[u8]) -> usize {
    let mut n = 0;
    while let Some((&key_len, rest)) = body.split_first() {
        let Some((&tag, rest)) = rest.get(key_len as usize..).and_then(<[u8]>::split_first) else {
            break;
        };
        let Some(rest) = value_len(tag, rest).and_then(|len| rest.get(len..)) else {
            break;
        };
        body = rest;
        n += 1;
    }
    n
}

/// Number of values in the body of a field array; see [`count_entries`].
fn count_values(mut body: &[u8]) -> usize {
    let mut n = 0;
    while let Some((&tag, rest)) = body.split_first() {
        let Some(rest) = value_len(tag, rest).and_then(|len| rest.get(len..)) else {
            break;
        };
        body = rest;
        n += 1;
    }
    n
}

/// Wire size of a value with type tag `tag` whose payload starts `rest`, or `None` for an
/// unknown tag or a truncated length prefix.
#[inline]
fn value_len(tag: u8, rest: &[u8]) -> Option<usize> {
    Some(match tag {
        b'V' => 0,
        b't' | b'b' | b'B' => 1,
        b's' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'l' | b'd' | b'T' => 8,
        b'S' | b'x' | b'A' | b'F' => {
            (u32::from_be_bytes(*rest.first_chunk::<4>()?) as usize).checked_add(4)?
        }
        _ => return None,
    })
}

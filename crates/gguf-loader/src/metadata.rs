//! Typed GGUF metadata values. Strings and arrays borrow from the mapped file.

use crate::cursor::Cursor;
use crate::GgufError;

/// The value type ids of the GGUF format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Size in bytes of a fixed-size value; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The smallest number of bytes one value of this type occupies in a file.
    fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8, // u64 length
            ValueType::Array => 12, // u32 element type + u64 count
            other => other.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value. `'a` is the lifetime of the mapped file.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(MetadataArray<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value. Fixed-size elements stay as little-endian bytes in the file and are decoded
/// on access; strings are validated once and kept as borrowed slices.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray<'a> {
    /// `count` elements of a fixed-size type, `bytes.len() == count * size`.
    Scalars {
        elem: ValueType,
        count: usize,
        bytes: &'a [u8],
    },
    Strings(Vec<&'a str>),
    Arrays(Vec<MetadataArray<'a>>),
}

impl<'a> MetadataValue<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// A short description of the type for error messages, e.g. `array of string`.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetadataValue::Array(a) => match a.elem_type() {
                ValueType::String => "array of string",
                ValueType::Array => "array of array",
                ValueType::F32 => "array of f32",
                ValueType::I32 => "array of i32",
                _ => "array",
            },
            other => other.value_type().name(),
        }
    }

    /// Any integer value, widened to i128 so every GGUF integer type fits exactly.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetadataArray<'a>> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl<'a> MetadataArray<'a> {
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::Scalars { count, .. } => *count,
            MetadataArray::Strings(v) => v.len(),
            MetadataArray::Arrays(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            MetadataArray::Scalars { elem, .. } => *elem,
            MetadataArray::Strings(_) => ValueType::String,
            MetadataArray::Arrays(_) => ValueType::Array,
        }
    }

    /// The element at `index`, decoded.
    pub fn get(&self, index: usize) -> Option<MetadataValue<'a>> {
        match self {
            MetadataArray::Scalars { elem, count, bytes } => {
                if index >= *count {
                    return None;
                }
                let size = elem.fixed_size()?;
                let start = index.checked_mul(size)?;
                let raw = bytes.get(start..start.checked_add(size)?)?;
                Some(decode_scalar(*elem, raw))
            }
            MetadataArray::Strings(v) => v.get(index).map(|s| MetadataValue::String(s)),
            MetadataArray::Arrays(v) => v.get(index).cloned().map(MetadataValue::Array),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = MetadataValue<'a>> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// The strings of a string array, borrowed from the file.
    pub fn as_strs(&self) -> Option<&[&'a str]> {
        match self {
            MetadataArray::Strings(v) => Some(v),
            _ => None,
        }
    }

    /// The raw little-endian bytes of a fixed-size element array.
    pub fn raw_bytes(&self) -> Option<&'a [u8]> {
        match self {
            MetadataArray::Scalars { bytes, .. } => Some(bytes),
            _ => None,
        }
    }
}

/// Decodes one fixed-size value from exactly `elem.fixed_size()` bytes.
fn decode_scalar(elem: ValueType, raw: &[u8]) -> MetadataValue<'static> {
    let b = |n: usize| -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..n].copy_from_slice(&raw[..n]);
        out
    };
    match elem {
        ValueType::U8 => MetadataValue::U8(raw[0]),
        ValueType::I8 => MetadataValue::I8(raw[0] as i8),
        ValueType::Bool => MetadataValue::Bool(raw[0] != 0),
        ValueType::U16 => MetadataValue::U16(u16::from_le_bytes([raw[0], raw[1]])),
        ValueType::I16 => MetadataValue::I16(i16::from_le_bytes([raw[0], raw[1]])),
        ValueType::U32 => MetadataValue::U32(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        ValueType::I32 => MetadataValue::I32(i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        ValueType::F32 => MetadataValue::F32(f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
        ValueType::U64 => MetadataValue::U64(u64::from_le_bytes(b(8))),
        ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(b(8))),
        ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(b(8))),
        // Not fixed-size: never stored as scalars (the parser guarantees it).
        ValueType::String | ValueType::Array => MetadataValue::U8(0),
    }
}

/// How deeply arrays may nest. Real files use one level; the bound keeps hostile files from
/// exhausting the stack.
pub(crate) const MAX_ARRAY_DEPTH: usize = 4;

pub(crate) fn parse_value<'a>(
    cur: &mut Cursor<'a>,
    ty: ValueType,
    key: &str,
    depth: usize,
) -> Result<MetadataValue<'a>, GgufError> {
    let what = || format!("the value of metadata key {key:?}");
    if let Some(size) = ty.fixed_size() {
        let offset = cur.pos();
        let raw = cur.take(size, what)?;
        if ty == ValueType::Bool && raw[0] > 1 {
            return Err(GgufError::InvalidValue {
                key: key.to_owned(),
                value: format!("byte {} at offset {offset}", raw[0]),
                reason: "a bool must be 0 or 1".into(),
            });
        }
        return Ok(decode_scalar(ty, raw));
    }
    match ty {
        ValueType::String => Ok(MetadataValue::String(cur.string(what)?)),
        _ => Ok(MetadataValue::Array(parse_array(cur, key, depth)?)),
    }
}

fn parse_array<'a>(
    cur: &mut Cursor<'a>,
    key: &str,
    depth: usize,
) -> Result<MetadataArray<'a>, GgufError> {
    let start = cur.pos() as u64;
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_owned(),
            max_depth: MAX_ARRAY_DEPTH,
            offset: start,
        });
    }
    let elem_id = cur.u32(|| format!("the element type of array {key:?}"))?;
    let elem = ValueType::from_id(elem_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        id: elem_id,
        offset: start,
    })?;
    let count = cur.u64(|| format!("the length of array {key:?}"))?;
    let count = cur.check_count(count, elem.min_encoded_size(), || format!("array {key:?}"))?;
    if let Some(size) = elem.fixed_size() {
        let offset = cur.pos();
        // check_count proved count * size fits in the file, so this cannot overflow.
        let bytes = cur.take(count * size, || format!("the elements of array {key:?}"))?;
        if elem == ValueType::Bool {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(GgufError::InvalidValue {
                    key: key.to_owned(),
                    value: format!("byte {} at offset {}", bytes[i], offset + i),
                    reason: "a bool must be 0 or 1".into(),
                });
            }
        }
        return Ok(MetadataArray::Scalars { elem, count, bytes });
    }
    if elem == ValueType::String {
        return parse_string_array(cur, key, count).map(MetadataArray::Strings);
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(parse_array(cur, key, depth + 1)?);
    }
    Ok(MetadataArray::Arrays(out))
}

/// A string array. Vocabularies hold hundreds of thousands of short strings, so instead of
/// validating each string's UTF-8 separately, the lengths are walked first (bounds-checked),
/// then the whole region, length prefixes included, is validated once. That is equivalent when
/// every string starts and ends on a character boundary of the region, which `str::get`
/// checks; any doubt falls back to validating string by string, which also finds the culprit
/// for the error message.
fn parse_string_array<'a>(
    cur: &mut Cursor<'a>,
    key: &str,
    count: usize,
) -> Result<Vec<&'a str>, GgufError> {
    let start = cur.pos();
    for i in 0..count {
        let len = cur.u64(|| format!("the length of element {i} of array {key:?}"))?;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated {
            what: format!("element {i} of array {key:?}"),
            offset: cur.pos() as u64,
            needed: len,
            file_len: (cur.pos() + cur.remaining()) as u64,
        })?;
        cur.take(len, || format!("element {i} of array {key:?}"))?;
    }
    let region = cur.passed(start);
    // simdutf8 validates non-ASCII text (most of a multilingual vocabulary) many times faster.
    if let Ok(text) = simdutf8::basic::from_utf8(region) {
        if let Some(strings) = split_validated(region, text, count) {
            return Ok(strings);
        }
    }
    let mut again = Cursor::new(region);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        match again.string(|| format!("element {i} of array {key:?}")) {
            Ok(s) => out.push(s),
            Err(GgufError::InvalidUtf8 { what, offset }) => {
                return Err(GgufError::InvalidUtf8 {
                    what,
                    offset: offset + start as u64,
                })
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Cuts a validated region into its strings; `None` if a string does not start and end on a
/// character boundary (then the strings must be checked one by one).
fn split_validated<'a>(region: &'a [u8], text: &'a str, count: usize) -> Option<Vec<&'a str>> {
    let mut out = Vec::with_capacity(count);
    let mut pos = 0usize;
    for _ in 0..count {
        let len_bytes: [u8; 8] = region.get(pos..pos.checked_add(8)?)?.try_into().ok()?;
        let len = usize::try_from(u64::from_le_bytes(len_bytes)).ok()?;
        pos += 8;
        let end = pos.checked_add(len)?;
        out.push(text.get(pos..end)?);
        pos = end;
    }
    Some(out)
}

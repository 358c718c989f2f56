//! A GGUF v3 writer.
//!
//! The header (metadata and tensor infos) is planned up front, so tensor data can be streamed:
//! either held in memory by the writer ([`GgufWriter::add_tensor`]) or produced on demand, one
//! tensor at a time, by a callback ([`GgufWriter::add_tensor_planned`] with
//! [`GgufWriter::write_streaming`]), which is how multi-gigabyte synthetic models are written
//! without holding them in memory. Files are written under a temporary name and renamed.

use crate::file::DEFAULT_ALIGNMENT;
use crate::metadata::ValueType;
use crate::quant::GgmlType;
use crate::GgufError;
use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

/// An owned metadata value to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// An array whose elements all have type `elem` (arrays of arrays are not needed by any
    /// model file and are not written).
    Array {
        elem: ValueType,
        items: Vec<Value>,
    },
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
            Value::Array { .. } => ValueType::Array,
        }
    }

    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Value {
        Value::Array {
            elem: ValueType::String,
            items: items.into_iter().map(|s| Value::String(s.into())).collect(),
        }
    }

    pub fn f32s(items: impl IntoIterator<Item = f32>) -> Value {
        Value::Array {
            elem: ValueType::F32,
            items: items.into_iter().map(Value::F32).collect(),
        }
    }

    pub fn i32s(items: impl IntoIterator<Item = i32>) -> Value {
        Value::Array {
            elem: ValueType::I32,
            items: items.into_iter().map(Value::I32).collect(),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::U32(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::F32(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

/// A tensor in the plan: where its data goes and, if the writer holds it, the data.
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
    data: Option<Vec<u8>>,
}

/// Builds a GGUF v3 file.
#[derive(Debug)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PlannedTensor>,
    names: HashSet<String>,
    alignment: u64,
    data_len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// A writer with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
            data_len: 0,
        }
    }

    /// Uses `alignment` for tensor data and records it as `general.alignment`. Must be called
    /// before any tensor is added.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                value: alignment.into(),
            });
        }
        if !self.tensors.is_empty() {
            return Err(GgufError::Invalid {
                what: "set_alignment".into(),
                reason: "the alignment must be set before tensors are added".into(),
            });
        }
        self.alignment = alignment.into();
        self.add("general.alignment", Value::U32(alignment))
    }

    /// Adds a metadata entry. Keys must be unique.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        let value = value.into();
        check_value(&key, &value)?;
        if !self.keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { key });
        }
        self.metadata.push((key, value));
        Ok(())
    }

    /// Plans a tensor whose data the caller supplies later, in plan order, through
    /// [`GgufWriter::write_streaming`].
    pub fn add_tensor_planned(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
    ) -> Result<&PlannedTensor, GgufError> {
        let name = name.into();
        let bad = |problem: String| GgufError::BadTensor {
            tensor: name.clone(),
            problem,
        };
        if dims.is_empty() || dims.len() > crate::file::MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions; a tensor has 1 to 4",
                dims.len()
            )));
        }
        if !dims[0].is_multiple_of(ggml_type.block_size() as u64) {
            return Err(bad(format!(
                "row length {} is not a multiple of the {ggml_type} block size {}",
                dims[0],
                ggml_type.block_size()
            )));
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("element count overflows".into()))?;
        let n_bytes = ggml_type
            .bytes_for(n_elements)
            .ok_or_else(|| bad("byte size overflows".into()))?;
        if !self.names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let offset = self.data_len;
        self.data_len = offset
            .checked_add(n_bytes)
            .and_then(|end| end.checked_next_multiple_of(self.alignment))
            .ok_or_else(|| GgufError::overflow("the data section size"))?;
        self.tensors.push(PlannedTensor {
            name,
            dims: dims.to_vec(),
            ggml_type,
            offset,
            n_bytes,
            data: None,
        });
        Ok(self.tensors.last().expect("just pushed"))
    }

    /// Adds a tensor with its data (raw bytes in ggml layout).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let planned = self.add_tensor_planned(name, dims, ggml_type)?;
        if planned.n_bytes != data.len() as u64 {
            let err = GgufError::SizeMismatch {
                what: format!("data of tensor {:?}", planned.name),
                expected: planned.n_bytes,
                actual: data.len() as u64,
            };
            let name = planned.name.clone();
            self.tensors.pop();
            self.names.remove(&name);
            self.data_len = self.tensors.last().map_or(0, |t| {
                (t.offset + t.n_bytes).next_multiple_of(self.alignment)
            });
            return Err(err);
        }
        if let Some(last) = self.tensors.last_mut() {
            last.data = Some(data);
        }
        Ok(())
    }

    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    /// Total size the file will have.
    pub fn file_size(&self) -> u64 {
        let header = self.header_bytes().len() as u64;
        header.next_multiple_of(self.alignment) + self.data_len
    }

    /// Writes the file; every tensor must have been added with its data.
    pub fn write_file(&self, path: &Path) -> Result<(), GgufError> {
        self.write_streaming(path, |t, _| {
            Err(GgufError::Invalid {
                what: format!("tensor {:?}", t.name),
                reason: "it was planned without data and write_file has no data source".into(),
            })
        })
    }

    /// Writes the file, asking `produce` for the data of each planned tensor without data, in
    /// order. `produce` must write exactly `n_bytes` bytes to the sink.
    pub fn write_streaming(
        &self,
        path: &Path,
        produce: impl FnMut(&PlannedTensor, &mut dyn Write) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        let tmp = path.with_extension(format!("gguf.partial-{}", std::process::id()));
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(|e| GgufError::io("create", &tmp, e))?;
            let mut out = BufWriter::with_capacity(1 << 20, file);
            self.write_to(&mut out, &tmp, produce)?;
            let io = |e| GgufError::io("write", &tmp, e);
            let file = out.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, path).map_err(|e| GgufError::io("rename into place", path, e))
    }

    /// The whole file in memory, asking `produce` for the data of each planned tensor without
    /// data, as [`GgufWriter::write_streaming`] does (a small model made without touching disk).
    pub fn to_bytes_streaming(
        &self,
        produce: impl FnMut(&PlannedTensor, &mut dyn Write) -> Result<(), GgufError>,
    ) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::with_capacity(usize::try_from(self.file_size()).unwrap_or(0));
        self.write_to(&mut out, Path::new("<memory>"), produce)?;
        Ok(out)
    }

    /// The file's bytes into `out`; `label` names the destination in errors.
    fn write_to(
        &self,
        out: &mut dyn Write,
        label: &Path,
        mut produce: impl FnMut(&PlannedTensor, &mut dyn Write) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        let io = |e| GgufError::io("write", label, e);
        let header = self.header_bytes();
        out.write_all(&header).map_err(io)?;
        let pad = header.len() as u64;
        write_zeros(out, pad.next_multiple_of(self.alignment) - pad).map_err(io)?;
        let mut written = 0u64;
        for t in &self.tensors {
            write_zeros(out, t.offset - written).map_err(io)?;
            match &t.data {
                Some(data) => out.write_all(data).map_err(io)?,
                None => {
                    let mut counter = CountingWriter {
                        inner: &mut *out,
                        count: 0,
                    };
                    produce(t, &mut counter)?;
                    if counter.count != t.n_bytes {
                        return Err(GgufError::SizeMismatch {
                            what: format!("data produced for tensor {:?}", t.name),
                            expected: t.n_bytes,
                            actual: counter.count,
                        });
                    }
                }
            }
            written = t.offset + t.n_bytes;
        }
        write_zeros(out, self.data_len - written).map_err(io)
    }

    /// The whole file in memory (for tests and small models).
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = self.header_bytes();
        out.resize(out.len().next_multiple_of(self.alignment as usize), 0);
        let data_start = out.len();
        for t in &self.tensors {
            let data = t.data.as_ref().ok_or_else(|| GgufError::Invalid {
                what: format!("tensor {:?}", t.name),
                reason: "it was planned without data".into(),
            })?;
            out.resize(data_start + t.offset as usize, 0);
            out.extend_from_slice(data);
        }
        out.resize(data_start + self.data_len as usize, 0);
        Ok(out)
    }

    fn header_bytes(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut h, key);
            h.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut h, value);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        h
    }
}

fn check_value(key: &str, value: &Value) -> Result<(), GgufError> {
    if let Value::Array { elem, items } = value {
        if *elem == ValueType::Array {
            return Err(GgufError::Invalid {
                what: format!("metadata key {key:?}"),
                reason: "arrays of arrays are not supported by the writer".into(),
            });
        }
        if let Some(bad) = items.iter().find(|v| v.value_type() != *elem) {
            return Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: elem.name(),
                found: bad.value_type().name(),
            });
        }
    }
    Ok(())
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => h.push(*v),
        Value::I8(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => h.push(u8::from(*v)),
        Value::String(s) => put_str(h, s),
        Value::U64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => h.extend_from_slice(&v.to_le_bytes()),
        Value::Array { elem, items } => {
            h.extend_from_slice(&elem.id().to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
    }
}

fn write_zeros(out: &mut (impl Write + ?Sized), mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Counts what a tensor producer writes, so a wrong size is caught before it corrupts the file.
struct CountingWriter<'w, W: Write + ?Sized> {
    inner: &'w mut W,
    count: u64,
}

impl<W: Write + ?Sized> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

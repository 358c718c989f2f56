//! The GGUF file: header, metadata, tensor index and tensor data, all borrowed from one mapping.
//!
//! Layout (v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata
//! count, the metadata key/value pairs, the tensor infos, padding to `general.alignment`, then
//! the tensor data. Parsing reads only the header region; tensor bytes are never touched until
//! someone asks for them.

use crate::cursor::Cursor;
use crate::metadata::{parse_value, MetadataArray, MetadataValue, ValueType};
use crate::quant::{dequantize, GgmlType};
use crate::GgufError;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::Path;

/// Alignment of the data section and of every tensor when `general.alignment` is absent
/// (the GGUF specification's default).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;

/// One tensor's entry in the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous row length (ne0), `dims[1]` the number of rows.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of `dims`; the index checked it does not overflow).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in numpy order (outermost first), as gguf-py reports it reversed.
    pub fn shape_outer_first(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A tensor whose type this crate cannot read (an id it does not know, or one it names but does
/// not handle, such as IQ2_XXS or I32). It is indexed all the same, so that the rest of the file
/// opens and `inspect` can show it; only reading it fails ([`GgufFile::require_tensor`] names
/// the tensor and its type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableTensor {
    pub name: String,
    /// GGML order, as [`TensorInfo::dims`].
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// ggml's name for the type, when it is one ggml defines.
    pub type_name: Option<&'static str>,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// The most bytes the data can take: up to the next tensor's data, or the end of the file
    /// (its real size depends on the type's block geometry, which is unknown here).
    pub max_bytes: u64,
}

impl UnreadableTensor {
    /// The error a read of this tensor gets: its type, by name where ggml has one, and the
    /// tensor's name.
    pub fn error(&self) -> GgufError {
        let context = format!(" (tensor {:?})", self.name);
        match self.type_name {
            Some(name) => GgufError::UnsupportedGgmlType {
                name,
                id: self.type_id,
                context,
            },
            None => GgufError::UnknownGgmlType {
                id: self.type_id,
                context,
            },
        }
    }
}

/// Where the bytes come from. Both kinds keep their bytes at a fixed address for as long as
/// they live, which is what lets the index borrow them (see [`GgufFile`]).
enum Backing {
    /// The guard is declared first so it leaves the SIGBUS table before the mapping goes.
    Mapped {
        _guard: crate::mapping_guard::Guard,
        map: Mmap,
    },
    Owned(Box<[u8]>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped { map, .. } => map,
            Backing::Owned(b) => b,
        }
    }
}

/// Everything parsed out of the header, borrowing from the file bytes.
struct Index<'a> {
    version: u32,
    metadata: Vec<(&'a str, MetadataValue<'a>)>,
    metadata_by_key: HashMap<&'a str, usize>,
    tensors: Vec<TensorInfo>,
    tensors_by_name: HashMap<String, usize>,
    /// Tensors of a type this crate cannot read, in file order.
    unreadable: Vec<UnreadableTensor>,
    alignment: u64,
    data_start: u64,
}

/// A GGUF model file, memory-mapped. Opening parses and validates the header and the tensor
/// index; tensor data stays in the mapping and is handed out as borrowed slices.
pub struct GgufFile {
    // Field order matters: `index` borrows from `backing` and must be dropped first.
    index: Index<'static>,
    backing: Backing,
    /// Parts of fused tensors, by name ([`crate::fused`]); looked up before the file's own.
    views: HashMap<String, TensorInfo>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.index.version)
            .field("metadata", &self.index.metadata.len())
            .field("tensors", &self.index.tensors.len())
            .field("file_len", &self.backing.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and indexes the file at `path`.
    ///
    /// Like every memory-mapped reader, this assumes nobody truncates or rewrites the file
    /// while it is open; model files are written once (the fetch and synth commands write to a
    /// temporary name and rename). If it happens anyway, reading a page past the new end ends
    /// the process with a message naming the file and status 1 (see `mapping_guard`), not a
    /// bare SIGBUS.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        // Before opening: opening a FIFO blocks until a writer comes, and a directory or a
        // device would fail later with an error about mapping.
        let kind = std::fs::metadata(path)
            .map_err(|e| GgufError::io("open", path, e))?
            .file_type();
        if !kind.is_file() {
            return Err(GgufError::NotAFile {
                path: path.to_path_buf(),
                kind: file_kind(kind),
            });
        }
        let file = std::fs::File::open(path).map_err(|e| GgufError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::io("stat", path, e))?
            .len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; report it as what it is.
            return Err(GgufError::EmptyFile {
                path: path.to_path_buf(),
            });
        }
        // SAFETY: the mapping is read-only and private to this value. The documented
        // precondition of `open` is that the file is not modified while mapped; model files are
        // written under a temporary name and renamed, so a reader never sees one being written.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::io("memory-map", path, e))?;
        let _guard = crate::mapping_guard::register(&map, path);
        Self::from_backing(Backing::Mapped { _guard, map })
    }

    /// Indexes a GGUF image held in memory (tests, fuzzing, files received over a network).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(Backing::Owned(bytes.into_boxed_slice()))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let bytes: &[u8] = backing.bytes();
        // SAFETY: `bytes` points into the mapping or the boxed slice, whose address does not
        // change when `backing` is moved into the struct below. The extended lifetime never
        // leaves this module as 'static: the index is stored next to `backing`, dropped before
        // it (field order), and every accessor re-borrows it for the lifetime of `&self`.
        let bytes: &'static [u8] =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) };
        let index = parse(bytes)?;
        let mut file = GgufFile {
            index,
            backing,
            views: HashMap::new(),
        };
        file.views = file.fused_views()?;
        Ok(file)
    }

    /// Entries for the parts of the file's fused tensors ([`crate::fused`]), by name.
    fn fused_views(&self) -> Result<HashMap<String, TensorInfo>, GgufError> {
        let Ok(arch) = self.get_str("general.architecture") else {
            return Ok(HashMap::new());
        };
        let metadata = |key: &str| -> Result<Option<u64>, GgufError> {
            match self.get(key) {
                Some(_) => self.get_u32(key).map(|v| Some(u64::from(v))),
                None => Ok(None),
            }
        };
        let rows = |name: &str| self.file_tensor(name).and_then(|t| t.dims.get(1).copied());
        let tensors = self.tensors().len() as u64;
        let parts = crate::fused::parts(arch, &metadata, &rows, tensors)?;
        let mut views = HashMap::with_capacity(parts.len());
        for part in parts {
            // `parts` named only tensors `rows` found, with at least one row each.
            let Some(fused) = self.file_tensor(&part.fused) else {
                continue;
            };
            let row_bytes = fused.n_bytes / fused.dims[1].max(1);
            views.insert(
                part.name.clone(),
                TensorInfo {
                    name: part.name,
                    dims: vec![fused.dims[0], part.rows],
                    ggml_type: fused.ggml_type,
                    offset: fused.offset + part.first_row * row_bytes,
                    n_bytes: part.rows * row_bytes,
                },
            );
        }
        Ok(views)
    }

    pub fn version(&self) -> u32 {
        self.index.version
    }

    /// The whole file image (the mapping itself, not a copy).
    pub fn file_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The alignment of tensor data (`general.alignment`, or 32 when absent).
    pub fn alignment(&self) -> u64 {
        self.index.alignment
    }

    /// Absolute file offset where the data section starts.
    pub fn data_start(&self) -> u64 {
        self.index.data_start
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetadataValue<'_>)> {
        self.index.metadata.iter().map(|(k, v)| (*k, v))
    }

    pub fn metadata_len(&self) -> usize {
        self.index.metadata.len()
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue<'_>> {
        self.index
            .metadata_by_key
            .get(key)
            .map(|&i| &self.index.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&MetadataValue<'_>, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    fn integer(&self, key: &str) -> Result<i128, GgufError> {
        let value = self.require(key)?;
        value.as_integer().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected: "an integer",
            found: value.type_name(),
        })
    }

    /// An integer value of any GGUF integer type that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.integer(key)?;
        u32::try_from(v).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: v.to_string(),
            target: "u32",
        })
    }

    /// An integer value of any GGUF integer type that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.integer(key)?;
        u64::try_from(v).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: v.to_string(),
            target: "u64",
        })
    }

    /// An f32 value (f64 values are accepted when they convert without becoming infinite).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match *self.require(key)? {
            MetadataValue::F32(v) => Ok(v),
            MetadataValue::F64(v) if v.is_nan() || (v as f32).is_finite() == v.is_finite() => {
                Ok(v as f32)
            }
            MetadataValue::F64(v) => Err(GgufError::OutOfRange {
                key: key.to_owned(),
                value: v.to_string(),
                target: "f32",
            }),
            ref other => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "f32",
                found: other.type_name(),
            }),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match *self.require(key)? {
            MetadataValue::Bool(v) => Ok(v),
            ref other => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "bool",
                found: other.type_name(),
            }),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match *self.require(key)? {
            MetadataValue::String(s) => Ok(s),
            ref other => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "string",
                found: other.type_name(),
            }),
        }
    }

    /// The array value of `key`, borrowed.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray<'_>, GgufError> {
        let value = self.require(key)?;
        value.as_array().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected: "array",
            found: value.type_name(),
        })
    }

    /// A string array, borrowed from the file without copying the strings.
    pub fn get_str_slice(&self, key: &str) -> Result<&[&str], GgufError> {
        let array = self.get_array(key)?;
        array.as_strs().ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected: "array of string",
            found: self.require(key).map(|v| v.type_name()).unwrap_or("array"),
        })
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        Ok(self.get_str_slice(key)?.to_vec())
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.scalar_array(key, ValueType::F32, "array of f32", |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.scalar_array(key, ValueType::I32, "array of i32", |b| {
            i32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })
    }

    fn scalar_array<T>(
        &self,
        key: &str,
        elem: ValueType,
        expected: &'static str,
        decode: impl Fn(&[u8]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let array = self.get_array(key)?;
        match array {
            MetadataArray::Scalars { elem: e, bytes, .. } if *e == elem => {
                let size = elem.fixed_size().unwrap_or(1);
                Ok(bytes.chunks_exact(size).map(decode).collect())
            }
            _ => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected,
                found: self.require(key).map(|v| v.type_name()).unwrap_or("array"),
            }),
        }
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.index.tensors
    }

    /// The tensors of a type this crate cannot read (not in [`GgufFile::tensors`]).
    pub fn unreadable_tensors(&self) -> &[UnreadableTensor] {
        &self.index.unreadable
    }

    /// The tensor of that name as a model reads it: a part of a fused tensor where the
    /// architecture fuses one ([`crate::fused`]: Phi-3's `attn_q`, `ffn_gate`, and `ffn_up`,
    /// whose part shadows the fused tensor of the same name), else the file's own.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.views.get(name).or_else(|| self.file_tensor(name))
    }

    /// The tensor the file itself stores under that name (one of [`GgufFile::tensors`]), never
    /// a part of a fused one.
    pub fn file_tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index
            .tensors_by_name
            .get(name)
            .map(|&i| &self.index.tensors[i])
    }

    /// Like [`GgufFile::tensor`], but a missing tensor is an error naming it, and so is one of
    /// a type this crate cannot read (naming the type too).
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        if let Some(t) = self.tensor(name) {
            return Ok(t);
        }
        match self.index.unreadable.iter().find(|u| u.name == name) {
            Some(u) => Err(u.error()),
            None => Err(GgufError::MissingTensor {
                name: name.to_owned(),
            }),
        }
    }

    /// The tensor's bytes, borrowed from the mapping (no copy). For a `TensorInfo` that did not
    /// come from this file and does not fit in it, returns an empty slice; use
    /// [`GgufFile::try_tensor_data`] to get an error instead.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.try_tensor_data(t).unwrap_or(&[])
    }

    /// The tensor's bytes, or an error if `t` does not describe a range inside this file.
    pub fn try_tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.backing.bytes();
        let out_of_bounds = || GgufError::TensorOutOfBounds {
            tensor: t.name.clone(),
            start: self.index.data_start.saturating_add(t.offset),
            end: self
                .index
                .data_start
                .saturating_add(t.offset)
                .saturating_add(t.n_bytes),
            file_len: bytes.len() as u64,
        };
        let start = self
            .index
            .data_start
            .checked_add(t.offset)
            .ok_or_else(out_of_bounds)?;
        let end = start.checked_add(t.n_bytes).ok_or_else(out_of_bounds)?;
        let (start, end) = (
            usize::try_from(start).map_err(|_| out_of_bounds())?,
            usize::try_from(end).map_err(|_| out_of_bounds())?,
        );
        bytes.get(start..end).ok_or_else(out_of_bounds)
    }

    /// The whole tensor dequantized to f32, in GGML element order.
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let data = self.try_tensor_data(t)?;
        let n =
            usize::try_from(t.n_elements()).map_err(|_| GgufError::overflow("element count"))?;
        let mut out = vec![0f32; n];
        dequantize(t.ggml_type, data, &mut out)?;
        Ok(out)
    }
}

/// What a path that is not a regular file is, for [`GgufError::NotAFile`].
fn file_kind(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if kind.is_block_device() || kind.is_char_device() {
            return "a device file";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Minimum encoded size of one metadata entry: key length (8) + value type (4) + 1-byte value.
const MIN_KV_BYTES: usize = 13;
/// Minimum encoded size of one tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 24;

fn parse(bytes: &[u8]) -> Result<Index<'_>, GgufError> {
    let mut cur = Cursor::new(bytes);
    let magic = cur.take(4, || "the GGUF magic".into())?;
    if magic != b"GGUF" {
        let mut found = [0u8; 4];
        found.copy_from_slice(magic);
        return Err(GgufError::BadMagic { found });
    }
    let version = cur.u32(|| "the GGUF version".into())?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(GgufError::BigEndian {
                version: v.swap_bytes(),
            })
        }
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }
    let n_tensors = cur.u64(|| "the tensor count".into())?;
    let n_kv = cur.u64(|| "the metadata count".into())?;
    // Both counts are bounded by the bytes left, so a corrupt count cannot allocate much.
    let n_kv = cur.check_count(n_kv, MIN_KV_BYTES, || "the metadata count".into())?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut metadata_by_key = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = cur.string(|| format!("the key of metadata entry {i}"))?;
        let type_offset = cur.pos() as u64;
        let type_id = cur.u32(|| format!("the value type of metadata key {key:?}"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            id: type_id,
            offset: type_offset,
        })?;
        let value = parse_value(&mut cur, ty, key, 0)?;
        if metadata_by_key.insert(key, metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
            });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata_by_key
        .get("general.alignment")
        .map(|&i| &metadata[i].1)
    {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_integer().ok_or_else(|| GgufError::WrongType {
                key: "general.alignment".into(),
                expected: "an integer",
                found: v.type_name(),
            })?;
            match u64::try_from(a) {
                Ok(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::BadAlignment {
                        value: u64::try_from(a).unwrap_or(0),
                    })
                }
            }
        }
    };

    let n_tensors = cur.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, || {
        "the tensor count".into()
    })?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensors_by_name = HashMap::with_capacity(n_tensors);
    let mut unreadable = Vec::new();
    let mut names = std::collections::HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let entry = parse_tensor_info(&mut cur, i)?;
        let (name, offset) = match &entry {
            Parsed::Readable(t) => (&t.name, t.offset),
            Parsed::Unreadable(u) => (&u.name, u.offset),
        };
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: name.clone(),
                offset,
                alignment,
            });
        }
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor { name: name.clone() });
        }
        match entry {
            Parsed::Readable(info) => {
                tensors_by_name.insert(info.name.clone(), tensors.len());
                tensors.push(info);
            }
            Parsed::Unreadable(u) => unreadable.push(u),
        }
    }

    let header_end = cur.pos() as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::overflow("the data section offset"))?;
    check_tensor_ranges(&tensors, data_start, bytes.len() as u64)?;
    bound_unreadable(&mut unreadable, &tensors, data_start, bytes.len() as u64)?;

    Ok(Index {
        version,
        metadata,
        metadata_by_key,
        tensors,
        tensors_by_name,
        unreadable,
        alignment,
        data_start,
    })
}

/// A tensor's index entry, by whether its type can be read.
enum Parsed {
    Readable(TensorInfo),
    Unreadable(UnreadableTensor),
}

/// Sets each unreadable tensor's `max_bytes`: its data runs at most to the next tensor's data
/// (of either kind) or to the end of the file. Its start must lie inside the file.
fn bound_unreadable(
    unreadable: &mut [UnreadableTensor],
    tensors: &[TensorInfo],
    data_start: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let data_len = file_len.saturating_sub(data_start);
    let mut starts: Vec<u64> = tensors.iter().map(|t| t.offset).collect();
    starts.extend(unreadable.iter().map(|u| u.offset));
    starts.sort_unstable();
    for u in unreadable.iter_mut() {
        if u.offset > data_len {
            return Err(GgufError::BadTensor {
                tensor: u.name.clone(),
                problem: format!(
                    "its data starts at byte {} of a {data_len}-byte data section",
                    u.offset
                ),
            });
        }
        let after = starts.partition_point(|&s| s <= u.offset);
        let next = starts.get(after).copied().unwrap_or(data_len).min(data_len);
        u.max_bytes = next - u.offset;
    }
    Ok(())
}

fn parse_tensor_info(cur: &mut Cursor<'_>, i: usize) -> Result<Parsed, GgufError> {
    let name = cur.string(|| format!("the name of tensor {i}"))?.to_owned();
    let n_dims = cur.u32(|| format!("the dimension count of tensor {name:?}"))?;
    let bad = |problem: String| GgufError::BadTensor {
        tensor: name.clone(),
        problem,
    };
    if n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions; ggml allows at most {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(cur.u64(|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let type_id = cur.u32(|| format!("the type of tensor {name:?}"))?;
    let offset = cur.u64(|| format!("the data offset of tensor {name:?}"))?;
    let ggml_type = match GgmlType::from_id(type_id) {
        Ok(t) => t,
        Err(e) => {
            let type_name = match e {
                GgufError::UnsupportedGgmlType { name, .. } => Some(name),
                _ => None,
            };
            // Indexed as it is; its size is set once every offset is known.
            return Ok(Parsed::Unreadable(UnreadableTensor {
                name,
                dims,
                type_id,
                type_name,
                offset,
                max_bytes: 0,
            }));
        }
    };

    // ggml stores element counts in int64; anything larger is corrupt.
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad(format!("the element count of shape {dims:?} overflows")))?;
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % ggml_type.block_size() as u64 != 0 {
        return Err(bad(format!(
            "row length {ne0} is not a multiple of the {ggml_type} block size {}",
            ggml_type.block_size()
        )));
    }
    let n_bytes = ggml_type
        .bytes_for(n_elements)
        .ok_or_else(|| bad(format!("the byte size of shape {dims:?} overflows")))?;
    Ok(Parsed::Readable(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    }))
}

/// Every tensor lies inside the file and no two overlap.
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    data_start: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by_key(|&i| tensors[i].offset);
    let mut previous: Option<(usize, u64)> = None;
    for i in order {
        let t = &tensors[i];
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => {
                if let Some((p, prev_end)) = previous {
                    if start < prev_end {
                        return Err(GgufError::TensorOverlap {
                            first: tensors[p].name.clone(),
                            second: t.name.clone(),
                        });
                    }
                }
                if previous.is_none_or(|(_, prev_end)| end >= prev_end) {
                    previous = Some((i, end));
                }
            }
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    Ok(())
}

//! The one error type of the crate. Every variant names what was wrong and, where it helps,
//! where in the file it was found and what would fix it.

use std::path::PathBuf;

/// Everything that can go wrong reading, interpreting or writing a model file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is {kind}, not a GGUF file; give the path of a .gguf model file")]
    NotAFile { path: PathBuf, kind: &'static str },

    #[error("{path} is empty (0 bytes), not a GGUF file; was its download or copy cut short?")]
    EmptyFile { path: PathBuf },

    #[error(
        "file is truncated: reading {what} needs {needed} bytes at offset {offset}, but the file \
         has {file_len} bytes (an incomplete download? fetch the file again)"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },

    #[error("not a GGUF file: the magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: [u8; 4] },

    #[error("GGUF version {version} is not supported (this reader handles versions 2 and 3)")]
    UnsupportedVersion { version: u32 },

    #[error(
        "big-endian GGUF files are not supported (version field reads {version} byte-swapped); \
         convert the model to little-endian"
    )]
    BigEndian { version: u32 },

    #[error(
        "{what} at offset {offset} claims {count} entries, more than the {remaining} bytes left \
         in the file could hold: the file is truncated or corrupt"
    )]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },

    #[error("arithmetic overflow computing {what}: the file is corrupt")]
    Overflow { what: String },

    #[error("metadata key {key:?} has unknown value type id {id} (offset {offset})")]
    UnknownValueType { key: String, id: u32, offset: u64 },

    #[error("metadata key {key:?} nests arrays deeper than {max_depth} levels (offset {offset})")]
    NestingTooDeep {
        key: String,
        max_depth: usize,
        offset: u64,
    },

    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    #[error("metadata key {key:?} appears more than once")]
    DuplicateKey { key: String },

    #[error("tensor name {name:?} appears more than once")]
    DuplicateTensor { name: String },

    #[error("general.alignment is {value}; it must be a non-zero power of two")]
    BadAlignment { value: u64 },

    #[error("ggml type id {id} is unknown{context}")]
    UnknownGgmlType { id: u32, context: String },

    #[error("ggml type {name} (id {id}) is not supported by this crate{context}")]
    UnsupportedGgmlType {
        name: &'static str,
        id: u32,
        context: String,
    },

    #[error("CPU dequantization of {ty} is not implemented")]
    DequantUnsupported { ty: &'static str },

    #[error("tensor {tensor:?}: {problem}")]
    BadTensor { tensor: String, problem: String },

    #[error(
        "tensor {tensor:?}: data at offset {offset} (relative to the data section) is not a \
         multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor {tensor:?}: data runs from byte {start} to {end}, past the end of the file \
         ({file_len} bytes; truncated download?)"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },

    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    TensorOverlap { first: String, second: String },

    #[error("tensor {name:?} not found in the model file")]
    MissingTensor { name: String },

    #[error("metadata key {key:?} is missing")]
    MissingKey { key: String },

    #[error("metadata key {key:?} is a {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("metadata key {key:?} = {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("metadata key {key:?} = {value} is invalid: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },

    #[error("architecture {name:?} is not supported (supported: {supported})")]
    UnsupportedArchitecture { name: String, supported: String },

    #[error("{what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },

    #[error("safetensors file {path}: {message}")]
    Safetensors { path: PathBuf, message: String },

    #[error("{what} is invalid: {reason}")]
    Invalid { what: String, reason: String },
}

impl GgufError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        GgufError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn overflow(what: impl Into<String>) -> Self {
        GgufError::Overflow { what: what.into() }
    }
}

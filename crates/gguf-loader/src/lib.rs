//! Zero-copy GGUF and safetensors model files: metadata, tensor index, quantized formats and a writer.
//!
//! [`GgufFile::open`] memory-maps a file and indexes its header; tensor data is never copied
//! until a caller dequantizes it. Every malformed input is a [`GgufError`] naming the problem.

mod cursor;
pub mod error;
pub mod file;
pub mod fused;
pub mod fuzzing;
pub mod inspect;
pub mod knobs;
pub mod mapping_guard;
pub mod metadata;
pub mod model;
pub mod npy;
pub mod paths;
pub mod quant;
pub mod safetensors_file;
pub mod synth;
pub mod writer;

pub use error::GgufError;
pub use file::{GgufFile, TensorInfo, UnreadableTensor};
pub use metadata::{MetadataArray, MetadataValue, ValueType};
pub use model::{Architecture, ModelConfig, RopeScaling};
pub use quant::{dequantize, GgmlType};
pub use writer::GgufWriter;

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

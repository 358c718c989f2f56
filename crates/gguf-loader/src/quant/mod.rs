//! ggml tensor types: block geometry, block layouts and CPU dequantization to f32.

mod blocks;
mod dequant;
mod ggml_type;

pub use blocks::*;
pub use dequant::{dequantize, IQ4_NL_VALUES, MXFP4_VALUES};
pub use ggml_type::{GgmlType, QK_K};

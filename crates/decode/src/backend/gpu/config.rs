//! The GPU backend's choices of path and precision, each set by its knob.

use crate::error::Result;
use knobs::{Knob, Scope};
use rocm_kernels::ops::{attention as attn, matvec::MAX_TOKENS};

/// How the KV cache stores keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (the default): half the bytes, a relative rounding of 2^-11.
    F16,
    /// Single precision, as the CPU backend stores it (the exact comparisons).
    F32,
}

pub static KV_TYPE: Knob<KvType> = Knob {
    name: "HIPDECODE_KV_TYPE",
    default: "f16",
    doc: "the GPU's KV cache element type: `f16` or `f32` (as the CPU stores it; the exact \
          comparisons)",
    scope: Scope::Run,
    parse: |v| knobs::parse::choice(v, &[("f16", KvType::F16), ("f32", KvType::F32)]),
};

impl KvType {
    /// The type [`KV_TYPE`] asks for.
    pub fn from_env() -> Result<KvType> {
        Ok(KV_TYPE.read()?)
    }
}

/// How decode's matrix-vector products treat activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatvecPath {
    /// Quantize activations to 8 bits once per group of 32 and use integer dot products
    /// (the default: several times faster; about 0.4 % rounding per activation).
    Int8,
    /// f32 activations against weights dequantized in registers (the reference path).
    Exact,
}

/// Most rows (tokens) a product takes on the int8 path; larger batches (prefill) use the
/// tiled f32 kernels.
pub const INT8_MAX_ROWS: usize = MAX_TOKENS;

pub static MATVEC_PATH: Knob<MatvecPath> = Knob {
    name: "HIPDECODE_GPU_MATVEC",
    default: "int8",
    doc: "decode's matrix-vector products on the GPU: `int8` (activations quantized per 32, \
          integer dot products) or `exact` (f32 activations; the reference path)",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[("int8", MatvecPath::Int8), ("exact", MatvecPath::Exact)],
        )
    },
};

impl MatvecPath {
    /// The path [`MATVEC_PATH`] asks for.
    pub fn from_env() -> Result<MatvecPath> {
        Ok(MATVEC_PATH.read()?)
    }
}

pub static ATTN_PREFILL: Knob<attn::PrefillKernel> = Knob {
    name: "HIPDECODE_GPU_ATTN_PREFILL",
    default: "tiled",
    doc: "the prefill attention kernel: `tiled` or `per-query` (for A/B runs)",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("tiled", attn::PrefillKernel::Tiled),
                ("per-query", attn::PrefillKernel::PerQuery),
            ],
        )
    },
};

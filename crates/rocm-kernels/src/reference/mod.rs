//! The CPU reference of every op: plain, obviously-correct f32 code with the same
//! signature shapes as the GPU ops, used by the GPU tests as the truth. Weights in quantized
//! formats are read with `gguf_loader::dequantize`.

pub mod attention;
pub mod dequant;
pub mod elementwise;
pub mod embed;
pub mod kv_cache;
pub mod kv_q8;
pub mod matmul;
pub mod matmul_mma;
pub mod matvec;
pub mod matvec_q8;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod sampling;

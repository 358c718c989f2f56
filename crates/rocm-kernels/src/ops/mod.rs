//! One safe launch wrapper per op. Each checks its shape against the views' lengths, then queues
//! the kernel on the given stream. Per-step values that change between replays of a captured
//! step (token ids, positions, random draws) are read by the kernels from device memory, never
//! passed as launch arguments, so a captured graph replays with new values.

pub mod attention;
pub mod dequant;
pub mod elementwise;
pub mod embed;
pub mod kv_cache;
pub mod matmul;
pub mod matmul_mma;
pub mod matmul_q8_mma;
pub mod matvec;
pub mod matvec_q8;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod sampling;

// Conventions every wrapper follows:
// - Activations are f32, row-major `[rows][dim]`; `rows` and `dim` are host-known shapes.
// - Per-token positions are a `DeviceSlice<i32>` (one per token of the step) and token ids a
//   `DeviceSlice<i32>`: both live in the backend's device-side step block.
// - Sampling writes the chosen token id into a one-element `DeviceSliceMut<i32>` (the step
//   block's first next-token slot; `argmax_rows` writes one per row) and reads its uniform
//   random draw in [0, 1) from a `DeviceSlice<f32>` that the host fills from the seeded
//   sampler each step.
// - The KV cache of a layer is `[slots][n_head_kv * head_dim]` in f16 (stored as u16 bits) or
//   f32; position p lives in slot `p % slots` (a ring for sliding-window layers).
// - Quantized weights are raw GGUF blocks in device memory, described by `matvec::QuantMatrix`.
// - Wave size is never assumed: kernels use WARP_SIZE, launch shapes come from
//   `Kernels::wave_size()`.

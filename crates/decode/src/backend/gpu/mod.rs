//! The GPU backend: every device byte from rocm-alloc under its tag, every op a rocm-kernels
//! kernel queued on one stream.
//!
//! Per-step values (positions, token ids, the next token) live in a device-side step
//! block that the kernels read, so the sequence of launches of a decode step is the same at
//! every position and can be captured into a graph and replayed. The host writes the step block
//! through a small pinned staging buffer with one stream-ordered copy per step. The per-step
//! workspace is reserved when the model is loaded (`Backend::reserve_workspace`), so no step
//! allocates. A decode step is captured into a graph on its first run and replayed from then
//! on; the capture goes through rocm-alloc's graph pool, so a step that did allocate would do
//! so in a pool of its own, never in memory an eager step frees.
//!
//! Memory: weights, KV cache, activations and workspace are rocm-alloc allocations on the
//! backend's stream, tagged like the CPU backend's books. `Backend::device_report` adds
//! what the allocator reserved and cached and what the process holds outside it (context,
//! module code), from `mem_get_info` before load and now.

mod backend_impl;
mod block_tables;
mod buffer;
mod capture;
pub mod capture_stream;
mod config;
mod construct;
mod error;
pub mod graph_rows;
mod int8_mma;
mod launch;
mod moe_prefill;
pub mod offload;
pub mod profile;
mod report;
mod scratch;
mod step_block;
pub mod vendor_gemm;
mod weight;
mod weight_block;

pub use buffer::GpuBuffer;
pub use config::{
    EmbedTable, GpuConfig, KvPool, KvType, MatvecPath, MoeGrouped, MoeIndex, ATTN_DECODE,
    ATTN_PREFILL, EMBED_TABLE, INT8_MAX_ROWS, INT8_MMA_MAX_ROWS, INT8_MMA_ROWS_DEFAULT, KV_POOL,
    MATVEC_PATH, MMA_MAX_ROWS, MOE_GROUPED, MOE_INDEX,
};
pub use graph_rows::{GraphRows, GRAPH_ROWS};
pub use offload::host_weights::{HostPlacement, WeightMemory};
pub use offload::hybrid::{CpuShare, CPU_SHARE, MAX_CPU_SHARE};
pub use weight::{GpuWeight, ReadPath};
pub use weight_block::piece_bytes as weight_piece_bytes;

use super::{Phase, StepKey};
use hip_ffi::{Event, GraphExec, MemInfo, PinnedHostBuffer, Stream};
use offload::prefetch::{HostPrefill, Prefetch};
use offload::{host_weights, hybrid};
use profile::OpProfile;
use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{Allocation, Allocator, GraphPool, StreamId};
use rocm_kernels::ops::attention as attn;
use rocm_kernels::Kernels;
use std::collections::HashMap;
use std::sync::Arc;
use vendor_gemm::VendorGemm;

/// Tokens per step the step block and the per-step scratch are sized for (prefill runs in
/// chunks of at most this many tokens).
pub const DEFAULT_MAX_BATCH: usize = 512;

/// The device-side step block and its pinned staging.
struct StepBlock {
    /// `positions[max_batch]`, `tokens[max_batch]`, `next_tokens[max_batch]`: i32
    /// ([`StepBlock::ints_len`]).
    ints: Allocation,
    staging: PinnedHostBuffer,
    /// Recorded after the copy out of `staging`; waited on before `staging` is written again.
    copied: Event,
    max_batch: usize,
}

/// The device copy of a step's paged-KV addressing (`block_tables.rs`): a sequence id per row,
/// then every block table of the context.
struct DeviceTables {
    ints: Allocation,
    staging: PinnedHostBuffer,
    /// Recorded after the copy out of `staging`; waited on before it is written again.
    copied: Event,
    /// Rows of the largest step (the sequence ids come first).
    max_tokens: usize,
    /// i32 values the buffer holds.
    len: usize,
    /// The tables as last copied, and where each group's start.
    written: Option<crate::kv::BlockTables>,
    offsets: Vec<usize>,
}

/// Rows `start..start + rows` of a step: one sequence's, at consecutive positions ending at
/// `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepRun {
    start: usize,
    rows: usize,
    last: usize,
}

/// Scratch sized on first use and kept (so a warm step allocates nothing).
#[derive(Default)]
struct Scratch {
    /// argmax partials (u64).
    argmax: Option<Allocation>,
    /// Split-KV attention partials (f32).
    attention: Option<GpuBuffer>,
    /// MoE: ids and weights `[rows][k]`, gate/up `[rows*k][n_ff]`, expert outputs
    /// `[rows*k][n_embd]`.
    moe_ids: Option<Allocation>,
    moe_weights: Option<GpuBuffer>,
    moe_gate: Option<GpuBuffer>,
    moe_up: Option<GpuBuffer>,
    moe_out: Option<GpuBuffer>,
    /// MoE on the int8 path: the gated activations quantized for the down projection.
    moe_q8: Option<Allocation>,
    /// The sampler's uniform draw for the device (one f32).
    draw: Option<Allocation>,
    /// MoE prefill grouped by expert on the vendor GEMM.
    moe_prefill: MoePrefillScratch,
    /// The CPU's slots of a hybrid MoE, uploaded to be added to the GPU's (`[n_embd]`).
    hybrid_moe: Option<GpuBuffer>,
}

/// The grouped prefill's buffers (workspace tag), reserved with the rest of the workspace.
#[derive(Default)]
struct MoePrefillScratch {
    /// i32: for each slot in expert order its token row (`slots`), then for each (token,
    /// choice) pair its slot (`pairs`).
    index: Option<Allocation>,
    /// f32 `[slots][n_embd]`: the gathered token rows, later the expert outputs in slot order.
    sorted: Option<Allocation>,
    /// f16 `[slots][n_embd]` token rows and `[slots][n_ff]` gated activations, the products'
    /// inputs.
    tokens_f16: Option<Allocation>,
    hidden_f16: Option<Allocation>,
    /// The (token, choice) pairs, slots and widths it was reserved for.
    pairs: usize,
    slots: usize,
    n_embd: usize,
    n_ff: usize,
}

/// The GPU backend.
pub struct GpuBackend {
    hip: Arc<HipDevice>,
    alloc: Arc<Allocator>,
    stream_id: StreamId,
    stream: Arc<Stream>,
    kernels: Kernels,
    step: StepBlock,
    scratch: Scratch,
    /// Device memory as the runtime reported it before anything of ours was allocated.
    mem_before: MemInfo,
    /// Replay captured decode steps (`--no-graph` turns this off).
    use_graphs: bool,
    /// How matrix-vector products read activations.
    matvec_path: MatvecPath,
    /// Most token rows of a product on the matrix-core kernel (`HIPDECODE_GPU_MMA_ROWS`).
    mma_max_rows: usize,
    /// Most token rows of a product on the int8 matrix-core kernel
    /// (`HIPDECODE_GPU_INT8_MMA_ROWS`).
    int8_mma_max_rows: usize,
    /// The products of the grouped MoE prefill (`HIPDECODE_GPU_MOE_GROUPED`).
    moe_grouped: MoeGrouped,
    /// Where the grouped prefill's index is built (`HIPDECODE_GPU_MOE_INDEX`).
    moe_index: MoeIndex,
    /// Where an embedding table that is only looked up goes (`HIPDECODE_GPU_EMBED_TABLE`).
    embed_table: EmbedTable,
    kv_pool: KvPool,
    /// The prefill attention kernel.
    attn_prefill: attn::PrefillKernel,
    /// The decode attention kernel.
    attn_decode: attn::DecodeKernel,
    /// Element type of KV cache buffers allocated from now on.
    kv_type: KvType,
    /// Prefill products on the vendor GEMM (None: our kernels), and why not where it could
    /// not open.
    vendor_gemm: Option<VendorGemm>,
    vendor_gemm_absent: Option<String>,
    /// Values and columns of the largest weight matrix loaded (one expert of a stacked MoE
    /// tensor), which size the vendor GEMM's buffers.
    largest_matrix: (usize, usize),
    /// (rows a product covers, columns, bytes per row) of each matrix in pinned host memory:
    /// what sizes the streamed prefetch's slots.
    host_matrices: Vec<(usize, usize, usize)>,
    /// How prefill reads those matrices (`HIPDECODE_OFFLOAD_PREFILL`).
    host_prefill: HostPrefill,
    /// The device slots that host weights are streamed through: by prefill's vendor GEMM, and
    /// by decode for the weights the plan streams. Taken before the first step.
    prefetch: Option<Prefetch>,
    /// The current step's runs of one sequence's consecutive rows (prefill attention launches
    /// each apart; the profile counts their keys), and its token count.
    step_runs: Vec<StepRun>,
    step_tokens: usize,
    /// The device copy of the context's block tables and the step's rows' sequences.
    tables: Option<DeviceTables>,
    /// The MoE call of the largest step (from `reserve_workspace`), for MoE models.
    moe_shape: Option<crate::backend::MoeShape>,
    /// The current step's phase: decode steps take the decode kernels and are captured.
    step_phase: Phase,
    /// Per-op timing, when profiling (steps then run eagerly).
    profile: Option<OpProfile>,
    /// Captured steps by key.
    graphs: HashMap<StepKey, GraphExec>,
    /// Which row counts decode steps are captured for (`HIPDECODE_GPU_GRAPH_ROWS`).
    graph_rows: GraphRows,
    /// This rank's end of a tensor-parallel group over host memory
    /// (`GpuBackend::with_host_collective`); its steps are never captured.
    collective: Option<Box<dyn collective::Collective>>,
    /// The private pool a capture allocates from (empty when a warm step allocates nothing).
    graph_pool: GraphPool,
    /// The capture stream and pool, and the books of what graphs took.
    capture: capture_stream::CaptureState,
    /// Weights placed in pinned host memory (none unless a placement was set).
    host_weights: host_weights::HostWeights,
    /// The block of the device weights, once the first device weight made it.
    weight_block: Option<weight_block::WeightBlock>,
    /// Bytes of that block when no budget run's plan sized it: the device weights of the model
    /// being loaded ([`crate::backend::Backend::reserve_weights`]); 0 for one allocation per
    /// weight.
    reserved_weight_bytes: u64,
    /// How offloaded decode products are split with the host's cores.
    hybrid: hybrid::Hybrid,
}

//! The GPU backend's choices of path and precision, each set by its knob, and [`GpuConfig`],
//! all of them read once.

use crate::backend::gpu::capture_stream::{
    CaptureStream, GraphPoolMode, CAPTURE_STREAM, GRAPH_POOL,
};
use crate::backend::gpu::graph_rows::{GraphRows, GRAPH_ROWS};
use crate::backend::gpu::offload::hybrid::{CpuShare, CPU_SHARE};
use crate::backend::gpu::offload::prefetch::{HostPrefill, OFFLOAD_PREFILL};
use crate::backend::gpu::vendor_gemm::{PrefillPath, GPU_PREFILL};
use crate::error::Result;
use knobs::{Env, Knob, Scope};
use rocm_kernels::ops::{attention as attn, matvec::MAX_TOKENS};

pub use crate::kv::KvType;

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

/// Off by default: on the H200 the matrix-core products were 3.5 to 5.4 times slower than the
/// vendor GEMM at every row count from 16 to 256 (`docs/benchmark_results/matrix-cores-*`);
/// with the columns split over the grid they are level with it at 16 rows and 10 % and 25 %
/// slower at 32 and 64 (`docs/benchmark_results/batching-split-k-*`).
pub static MMA_MAX_ROWS: Knob<usize> = Knob {
    name: "HIPDECODE_GPU_MMA_ROWS",
    default: "0",
    doc: "most token rows of a step whose products run on the matrix-core kernel (where the \
          device has native matrix cores), from the vendor GEMM's threshold up; 0 (the \
          default, since it is slower than the vendor GEMM so far) turns it off; for A/B runs",
    scope: Scope::Run,
    parse: |v| {
        v.trim().parse::<usize>().map_err(|_| {
            "not a row count; use a whole number (0 turns the matrix-core kernel off)".to_string()
        })
    },
};

/// Most token rows of a product on the int8 matrix-core kernel by default. On an H100 (8B
/// shape, `docs/benchmark_results/int8-mma-h100-2026-12-06.md`) it made batched decode 44 %
/// faster than the vendor GEMM at 16 rows and 21 % at 32, and 4.8 % slower at 64; on the H200
/// (`docs/benchmark_results/int8-moe-h200-2026-12-06.md`, with a pipelined tile since reverted,
/// itself 0.5 % from the parent's at 64 rows) 11.9 % slower at 48 rows and 21.4 % at 64. Its
/// time grows with the rows, and the vendor GEMM's f16 copy costs the same at any row count.
/// The kernel with packed scales and per-step tiles made a cap of 64 faster than 32 on an H100
/// (+23 % at 40 and 48 sequences, +10 % at 64;
/// `docs/benchmark_results/int8-mma-tiles-h100-2026-12-07.md`, section 8), so 64 is the
/// default: steps of 33 to 64 rows (batched decode, and a tiny model's first prefill chunk)
/// run on it too.
pub const INT8_MMA_ROWS_DEFAULT: usize = 64;

pub static INT8_MMA_MAX_ROWS: Knob<usize> = Knob {
    name: "HIPDECODE_GPU_INT8_MMA_ROWS",
    default: "64",
    doc: "most token rows of a step whose products run on the int8 matrix-core kernel \
          (quantized weights in their GGUF blocks against 8-bit activations, on devices with \
          native matrix cores), from 9 rows up; 0 turns it off, and such steps take the vendor \
          GEMM (or HIPDECODE_GPU_MMA_ROWS's kernel); for A/B runs",
    scope: Scope::Run,
    parse: |v| {
        v.trim().parse::<usize>().map_err(|_| {
            "not a row count; use a whole number (0 turns the int8 matrix-core kernel off)"
                .to_string()
        })
    },
};

/// Which products a mixture of experts' grouped prefill (steps of `MOE_GROUPED_MIN_ROWS` rows
/// or more) runs its experts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeGrouped {
    /// The int8 matrix-core kernel, one launch per projection for all experts, reading the
    /// GGUF blocks in place, where the device has native matrix cores and every projection's
    /// format has a kernel; else the vendor GEMM.
    Int8,
    /// The vendor GEMM, one product per expert and projection over an f16 copy of the
    /// expert's rows.
    Vendor,
}

pub static MOE_GROUPED: Knob<MoeGrouped> = Knob {
    name: "HIPDECODE_GPU_MOE_GROUPED",
    default: "int8",
    doc: "the products of a mixture of experts' grouped prefill: `int8` (one launch per \
          projection for all experts on the int8 matrix-core kernel, weights read in their \
          GGUF blocks, where the device has native matrix cores and the formats have a kernel) or \
          `vendor` (the vendor GEMM per expert over f16 copies of its rows); for A/B runs",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[("int8", MoeGrouped::Int8), ("vendor", MoeGrouped::Vendor)],
        )
    },
};

/// Where a grouped MoE prefill on the int8 kernel builds its slots and tile table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeIndex {
    /// On the host, from the routing read back: one synchronization per layer.
    Host,
    /// On the device (`matmul_q8_mma::group_pairs`): no synchronization.
    Device,
}

pub static MOE_INDEX: Knob<MoeIndex> = Knob {
    name: "HIPDECODE_GPU_MOE_INDEX",
    default: "device",
    doc: "where a mixture of experts' grouped prefill on the int8 kernel builds its slots and \
          tile table: `device` (one kernel, no synchronization; 3.3 % faster at pp512 and \
          pp4096 on the 30B-A3B shape, H100, 2026-12-07) or `host` (the routing read back, one \
          synchronization per layer: the fallback, as the grouping kernel has run on no AMD \
          GPU yet)",
    scope: Scope::Run,
    parse: |v| knobs::parse::choice(v, &[("host", MoeIndex::Host), ("device", MoeIndex::Device)]),
};

/// Where the GPU backend keeps an embedding table that is only looked up (one not tied to the
/// output projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedTable {
    /// In mapped pinned host memory, its rows read in place by the lookup kernel: a step
    /// reads one row a token (2.3 KiB for Llama 3.1 8B at Q4_K) across the host link, and the
    /// device keeps the table's size free (281 MiB there), as llama.cpp keeps it on the host.
    Host,
    /// In device memory.
    Device,
}

pub static EMBED_TABLE: Knob<EmbedTable> = Knob {
    name: "HIPDECODE_GPU_EMBED_TABLE",
    default: "host",
    doc: "where the GPU backend keeps an embedding table that is only looked up (not tied to \
          the output): `host` (pinned host memory, a token's row read in place over the link, \
          the table's size left free on the device) or `device`; a tied table is always on \
          the device, since the output product reads all of it",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[("host", EmbedTable::Host), ("device", EmbedTable::Device)],
        )
    },
};

/// How the GPU backend backs a shared KV pool (one a scheduler hands blocks out of, as a
/// server's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPool {
    /// Address space for the whole pool at start, device memory mapped into it as blocks are
    /// handed out (where the device maps memory piece by piece; else taken whole).
    Grow,
    /// The whole pool's memory at start: a server that started keeps its room whatever else
    /// takes device memory later.
    Whole,
}

pub static KV_POOL: Knob<KvPool> = Knob {
    name: "HIPDECODE_GPU_KV_POOL",
    default: "grow",
    doc: "how a server's shared KV pool takes device memory: `grow` (the pool's addresses are \
          set aside at start and memory is mapped into them as blocks are handed out, in the \
          device's pieces, never above the KV budget) or `whole` (the whole budget at start, \
          so memory other processes take later cannot stop the pool growing)",
    scope: Scope::Run,
    parse: |v| knobs::parse::choice(v, &[("grow", KvPool::Grow), ("whole", KvPool::Whole)]),
};

pub static ATTN_PREFILL: Knob<attn::PrefillKernel> = Knob {
    name: "HIPDECODE_GPU_ATTN_PREFILL",
    default: "auto",
    doc: "the prefill attention kernel: `auto` (flash attention on the matrix cores where the \
          device has them and the cache is f16, else `tiled`), `flash`, `flash-regs` (flash \
          with the scores in registers; not yet run on a GPU, hence not what `auto` takes), \
          `tiled` or `per-query` (for A/B runs)",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("auto", attn::PrefillKernel::Auto),
                ("flash", attn::PrefillKernel::Flash),
                ("flash-regs", attn::PrefillKernel::FlashRegs),
                ("tiled", attn::PrefillKernel::Tiled),
                ("per-query", attn::PrefillKernel::PerQuery),
            ],
        )
    },
};

pub static ATTN_DECODE: Knob<attn::DecodeKernel> = Knob {
    name: "HIPDECODE_GPU_ATTN_DECODE",
    default: "auto",
    doc: "the decode attention kernel for heads of 64, 128 or 256: `auto` (key streams for \
          f16 and q8_0 caches, else one warp per key), `key-streams` (f16 and q8_0 caches) or \
          `warp-per-key` (for A/B runs)",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("auto", attn::DecodeKernel::Auto),
                ("key-streams", attn::DecodeKernel::KeyStreams),
                ("warp-per-key", attn::DecodeKernel::WarpPerKey),
            ],
        )
    },
};

/// Every setting of the GPU backend that a knob sets, read from one environment snapshot: a
/// program reads it once at start-up and passes it down (through
/// [`crate::device::BackendSettings`]), so a run's backends all see the same settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuConfig {
    pub matvec_path: MatvecPath,
    pub mma_max_rows: usize,
    pub int8_mma_max_rows: usize,
    pub moe_grouped: MoeGrouped,
    pub moe_index: MoeIndex,
    pub embed_table: EmbedTable,
    pub kv_pool: KvPool,
    pub kv_type: KvType,
    pub attn_prefill: attn::PrefillKernel,
    pub attn_decode: attn::DecodeKernel,
    pub prefill_path: PrefillPath,
    pub host_prefill: HostPrefill,
    pub cpu_share: CpuShare,
    pub capture_stream: CaptureStream,
    pub graph_pool: GraphPoolMode,
    pub graph_rows: GraphRows,
}

impl GpuConfig {
    /// The settings `env` asks for (the knobs' defaults where it sets nothing).
    pub fn from_env(env: &Env) -> Result<GpuConfig> {
        Ok(GpuConfig {
            matvec_path: MATVEC_PATH.value(env)?,
            mma_max_rows: MMA_MAX_ROWS.value(env)?,
            int8_mma_max_rows: INT8_MMA_MAX_ROWS.value(env)?,
            moe_grouped: MOE_GROUPED.value(env)?,
            moe_index: MOE_INDEX.value(env)?,
            embed_table: EMBED_TABLE.value(env)?,
            kv_pool: KV_POOL.value(env)?,
            // `-ctk` / `-ctv` set it (`BackendSettings::kv_type`); no knob reads it.
            kv_type: KvType::F16,
            attn_prefill: ATTN_PREFILL.value(env)?,
            attn_decode: ATTN_DECODE.value(env)?,
            prefill_path: GPU_PREFILL.value(env)?,
            host_prefill: OFFLOAD_PREFILL.value(env)?,
            cpu_share: CPU_SHARE.value(env)?,
            capture_stream: CAPTURE_STREAM.value(env)?,
            graph_pool: GRAPH_POOL.value(env)?,
            graph_rows: GRAPH_ROWS.value(env)?,
        })
    }

    /// The settings of the process environment now.
    pub fn from_process() -> Result<GpuConfig> {
        Self::from_env(&Env::process())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_reads_every_knob_from_one_snapshot() {
        let defaults = GpuConfig::from_env(&Env::default()).unwrap();
        assert_eq!(defaults.matvec_path, MatvecPath::Int8);
        assert_eq!(defaults.kv_type, KvType::F16);
        let env = Env::from_pairs([(MATVEC_PATH.name, "exact"), (CAPTURE_STREAM.name, "side")]);
        let set = GpuConfig::from_env(&env).unwrap();
        assert_eq!(set.matvec_path, MatvecPath::Exact);
        assert_eq!(set.capture_stream, CaptureStream::Side);
        assert_eq!(set.graph_pool, defaults.graph_pool);
        let bad = Env::from_pairs([(GPU_PREFILL.name, "cublas")]);
        let e = GpuConfig::from_env(&bad).unwrap_err().to_string();
        assert!(e.contains(GPU_PREFILL.name) && e.contains("cublas"), "{e}");
    }
}

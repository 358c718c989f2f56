//! What a model needs on the GPU besides its weights, and its weights as the offload planner
//! sees them: the input of [`offload::plan()`], estimated from the file alone.
//!
//! Every figure here mirrors what [`crate::model::Model::load`] and the GPU backend allocate:
//! the KV cache for the requested context (ring slots on sliding-window layers), the
//! activation buffers and their 8-bit copies, and the workspace the backend reserves at load
//! (split-attention partials, argmax, the sampling draw, the MoE scratch, the step block and
//! the vendor-GEMM buffers of docs/memory.md's knob table). **These are estimates**, computed
//! without a GPU: they are to be checked against the allocator's per-tag report of a real load
//! (`hipdecode run --device gpu` prints it), and updated where the backend changes what it
//! takes. Two figures are not mirrored but assumed: [`GRAPH_AND_RUNTIME_BYTES`] and the
//! allocator's segment tails ([`POOL_TAIL_BYTES`]).

use crate::backend::gpu::offload::prefetch::{self, HostPrefill};
use crate::backend::gpu::vendor_gemm::{
    weight_block_values, PrefillPath, LIBRARY_WORKSPACE_BYTES, VENDOR_GEMM_MIN_ROWS,
};
use crate::backend::gpu::{GpuConfig, KvType, MatvecPath, DEFAULT_MAX_BATCH, INT8_MAX_ROWS};
use crate::context::ContextOptions;
use crate::error::{DecodeError, Result};
use crate::model::ModelSpec;
use gguf_loader::GgufFile;
use offload::{
    device_footprint, LinkModel, PlanRequest, PlanTag, ResidentNeeds, TensorKind, WeightTensor,
};
use rocm_alloc::size_class::{LARGE_SEGMENT, SMALL_SEGMENT};
use rocm_kernels::ops::attention::{decode_workspace_floats, AttentionShape};
use rocm_kernels::ops::{matvec_q8, sampling};

/// Device memory the run takes that no allocator tag holds: instantiated decode graphs, kernel
/// modules and the runtime's own buffers. The H200 runs measured 4–6 MiB "outside the
/// allocator" on every model (docs/benchmark_results/gpu-speed-2026-11-30.md); 8 MiB is that
/// with room. The runtime's context, created before the first reading, is not in it.
pub const GRAPH_AND_RUNTIME_BYTES: u64 = 8 << 20;

/// Device memory the runtime takes, outside the allocator, to map `host_bytes` of pinned host
/// memory into the device's address space: its page tables, 8 bytes per 4 KiB page (1/512),
/// rounded up to a MiB. The H200 showed 30 MiB outside the allocator with 12.0 GiB of weights
/// mapped, against 4–8 MiB with none: 22–26 MiB, and 12 GiB / 512 is 24 MiB.
pub fn host_mapping_bytes(host_bytes: u64) -> u64 {
    host_bytes.div_ceil(512).next_multiple_of(1 << 20)
}

/// The allocator's partly used shared segments: one 20 MiB large-pool segment and one 2 MiB
/// small-pool segment whose tails nothing fills (at most that much per pool after a load that
/// allocates in one pass; the Gemma 3 270M run held 17 MiB of cache).
pub const POOL_TAIL_BYTES: u64 = LARGE_SEGMENT + SMALL_SEGMENT;

/// The settings that size the resident buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResidentOptions {
    /// Positions the KV cache holds (clamped to the model's trained context, as the load does).
    pub context: usize,
    /// Most tokens one step carries (the prefill chunk); sizes activations and workspace.
    pub max_batch: usize,
    /// The KV cache's element type (`HIPDECODE_KV_TYPE`).
    pub kv_type: KvType,
    /// Whether decode products read 8-bit copies of their inputs (`HIPDECODE_GPU_MATVEC`).
    pub int8_matvec: bool,
    /// Whether the vendor GEMM's prefill buffers are reserved (`HIPDECODE_GPU_PREFILL`; taken
    /// as present unless `kernels` is asked for, the larger estimate).
    pub vendor_gemm: bool,
    /// Tokens the backend's step block is sized for.
    pub step_block_batch: usize,
    /// Whether prefill streams weights left in host memory through device slots
    /// (`HIPDECODE_OFFLOAD_PREFILL`), which the needs then hold.
    pub stream_prefill: bool,
}

impl Default for ResidentOptions {
    /// The GPU backend's defaults, with a context of 2048 (`hipdecode run`'s).
    fn default() -> Self {
        ResidentOptions {
            context: 2048,
            max_batch: ContextOptions::default().max_batch,
            kv_type: KvType::F16,
            int8_matvec: true,
            vendor_gemm: true,
            step_block_batch: DEFAULT_MAX_BATCH,
            stream_prefill: true,
        }
    }
}

impl ResidentOptions {
    /// The defaults for `context`, with the KV type, the matrix-vector path and the prefill
    /// path taken from the variables the GPU backend reads.
    pub fn from_env(context: usize) -> Result<ResidentOptions> {
        Ok(Self::for_config(context, &GpuConfig::from_process()?))
    }

    /// The defaults for `context`, with the KV type, the matrix-vector path and the prefill
    /// path of `config`, as a GPU backend opened with it allocates.
    pub fn for_config(context: usize, config: &GpuConfig) -> ResidentOptions {
        ResidentOptions {
            context,
            kv_type: config.kv_type,
            int8_matvec: config.matvec_path == MatvecPath::Int8,
            vendor_gemm: config.prefill_path != PrefillPath::Kernels,
            stream_prefill: config.host_prefill == HostPrefill::Stream,
            ..ResidentOptions::default()
        }
    }
}

/// One buffer behind the resident needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResidentBuffer {
    /// The tag it is counted under.
    pub tag: PlanTag,
    /// What it is for.
    pub what: String,
    /// Bytes asked of the allocator.
    pub bytes: u64,
}

/// A model's weights and resident needs, ready for the planner.
#[derive(Clone, Debug)]
pub struct Residency {
    /// The model's description.
    pub spec: ModelSpec,
    /// The KV cache's positions after clamping to the model's context.
    pub context: usize,
    /// Every weight tensor the load uploads, as the GPU backend stores it.
    pub tensors: Vec<WeightTensor>,
    /// Bytes per tag that must be resident.
    pub needs: ResidentNeeds,
    /// KV cache bytes a decode token reads on average over a run that fills the context.
    pub kv_read_per_token: u64,
    /// The buffers behind `needs`.
    pub buffers: Vec<ResidentBuffer>,
}

impl Residency {
    /// The planner's request for this model under `budget` bytes.
    pub fn plan_request(&self, budget: u64, link: LinkModel) -> PlanRequest<'_> {
        PlanRequest {
            tensors: &self.tensors,
            needs: self.needs,
            budget,
            link,
            other_device_reads_per_token: self.kv_read_per_token,
            allow_streamed: true,
        }
    }
}

fn overflow(what: &str) -> DecodeError {
    DecodeError::Allocation {
        what: what.to_string(),
        reason: "the byte count overflows".into(),
    }
}

/// `a * b * c` bytes, or an error naming `what`.
fn product(what: &str, factors: &[usize]) -> Result<u64> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f as u64))
        .ok_or_else(|| overflow(what))
}

/// Bytes of an 8-bit copy of `values` values with their scales (the backend's `Q8Shadow`
/// layout: values, 16-byte aligned, then one f32 scale per group).
fn q8_bytes(values: usize) -> u64 {
    (values.next_multiple_of(16) + values / matvec_q8::GROUP * 4) as u64
}

/// The expert-slot padding of the grouped MoE prefill (mirrors the backend's rule: the
/// smallest slot count that keeps every row block of f16 and f32 rows 256-byte aligned).
fn moe_slot_alignment(n_embd: usize, n_ff: usize) -> usize {
    let aligned = |p: usize| {
        [n_embd * 2, n_embd * 4, n_ff * 2, n_ff * 4]
            .iter()
            .all(|b| p * b % 256 == 0)
    };
    (1..=256).find(|&p| aligned(p)).unwrap_or(256)
}

/// Collects the buffers and their totals.
struct Needs {
    buffers: Vec<ResidentBuffer>,
    /// Buffers the load frees again (replaced by larger ones): they stay in the allocator's
    /// cache, so they count as slack.
    freed: u64,
}

impl Needs {
    fn add(&mut self, tag: PlanTag, what: impl Into<String>, bytes: u64) {
        self.buffers.push(ResidentBuffer {
            tag,
            what: what.into(),
            // The backend asks for at least one byte.
            bytes: bytes.max(1),
        });
    }

    fn total(&self, tag: PlanTag) -> Result<u64> {
        self.buffers
            .iter()
            .filter(|b| b.tag == tag)
            .try_fold(0u64, |a, b| a.checked_add(b.bytes))
            .ok_or_else(|| overflow(tag.name()))
    }
}

/// The weights of `file` and what must be resident beside them under `options` (see the
/// module documentation: estimates, to be checked against the allocator's report).
pub fn estimate(file: &GgufFile, options: &ResidentOptions) -> Result<Residency> {
    let s = ModelSpec::from_gguf(file)?;
    if options.max_batch == 0 || options.context == 0 {
        return Err(DecodeError::InvalidArgument(
            "context and batch size must be at least 1".into(),
        ));
    }
    let (tensors, matrices) = weight_tensors(file, &s)?;
    let largest_matrix = matrices.iter().fold((0usize, 0usize), |(v, c), m| {
        (v.max(m.0.saturating_mul(m.1)), c.max(m.1))
    });
    let mb = options.max_batch;
    let (e, qd, kd, vd) = (s.n_embd, s.widths.q, s.widths.k, s.widths.v);
    let mut needs = Needs {
        buffers: Vec::new(),
        freed: 0,
    };

    // KV cache: as `Model::load` sizes it.
    let context = options.context.min(s.context_length.max(1));
    let slots: Vec<usize> = s
        .layers
        .iter()
        .map(|l| match l.window {
            Some(w) => context.min(w.saturating_add(mb - 1)),
            None => context,
        })
        .collect();
    let elem = match options.kv_type {
        KvType::F16 => 2,
        KvType::F32 => 4,
    };
    for (il, &n) in slots.iter().enumerate() {
        for (dim, what) in [(kd, "keys"), (vd, "values")] {
            let bytes = product("the KV cache", &[n, dim, elem])?.next_multiple_of(4);
            needs.add(PlanTag::KvCache, format!("layer {il} {what}"), bytes);
        }
    }
    let kv_read_per_token = kv_reads(&s, &slots, context, (kd + vd) * elem)?;

    // Activations: `Model::load`'s buffers, f32, and the 8-bit copies of the ones products
    // read.
    let ff = if s.is_moe() { s.n_ff_expert } else { s.n_ff };
    let logit_rows = 1;
    let widths = [
        ("residual", mb, e),
        ("normalized", mb, e.max(qd)),
        ("query", mb, qd),
        ("key", mb, kd),
        ("value", mb, vd),
        ("attention", mb, s.widths.o),
        ("projection", mb, e),
        ("FFN gate", mb, ff),
        ("FFN up", mb, ff),
        ("router", mb, s.n_expert.max(1)),
        ("logits", logit_rows, s.vocab),
    ];
    for (what, rows, width) in widths {
        needs.add(
            PlanTag::Activations,
            what,
            product("the activations", &[rows, width, 4])?,
        );
    }
    let int8_rows = mb.min(INT8_MAX_ROWS);
    if options.int8_matvec {
        let mut inputs = vec![("normalized", e.max(qd)), ("attention", s.widths.o)];
        if !s.is_moe() {
            inputs.push(("FFN gate", ff));
        }
        for (what, width) in inputs {
            let values = (int8_rows * width).min(mb * width);
            let capacity = values - values % matvec_q8::GROUP;
            needs.add(
                PlanTag::Activations,
                format!("8-bit {what}"),
                q8_bytes(capacity),
            );
        }
    }

    // Workspace: what `GpuBackend::new` and `reserve_workspace` take.
    needs.add(
        PlanTag::Workspace,
        "step block",
        ((2 * options.step_block_batch + 1) * 4) as u64,
    );
    let mut attention = 0usize;
    for (l, &slots) in s.layers.iter().zip(&slots) {
        let shape = AttentionShape {
            n_tokens: 1,
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim_k: s.head_dim_k,
            head_dim_v: s.head_dim_v,
            scale: s.attn_scale,
            window: l.window,
            slots,
        };
        let floats = decode_workspace_floats(&shape)
            .map_err(|e| DecodeError::InvalidArgument(format!("decode attention: {e}")))?;
        attention = attention.max(floats);
    }
    needs.add(
        PlanTag::Workspace,
        "split-attention partials",
        (attention.max(1) * 4) as u64,
    );
    needs.add(
        PlanTag::Workspace,
        "argmax",
        (sampling::ARGMAX_WORKSPACE * 8) as u64,
    );
    needs.add(PlanTag::Workspace, "sampling draw", 4);
    let vendor = options.int8_matvec && options.vendor_gemm && mb >= VENDOR_GEMM_MIN_ROWS;
    if s.is_moe() {
        let (k, nf) = (s.n_expert_used, s.n_ff_expert);
        let pairs = mb * k;
        needs.add(PlanTag::Workspace, "MoE expert ids", (pairs * 4) as u64);
        needs.add(PlanTag::Workspace, "MoE weights", (pairs * 4) as u64);
        let rows = product("the MoE scratch", &[pairs, nf, 4])?;
        if vendor {
            // The grouped prefill replaces the gate and up scratch with larger buffers; the
            // first ones stay in the allocator's cache.
            needs.freed += 2 * rows;
            let slots = pairs + s.n_expert * (moe_slot_alignment(e, nf) - 1);
            let padded = product("the MoE prefill scratch", &[slots, nf, 4])?;
            needs.add(PlanTag::Workspace, "MoE gate (prefill slots)", padded);
            needs.add(PlanTag::Workspace, "MoE up (prefill slots)", padded);
            needs.add(
                PlanTag::Workspace,
                "MoE prefill index",
                ((slots + pairs) * 4) as u64,
            );
            needs.add(
                PlanTag::Workspace,
                "MoE prefill rows",
                product("the MoE prefill rows", &[slots, e, 4])?,
            );
            needs.add(
                PlanTag::Workspace,
                "MoE prefill f16 rows",
                product("the MoE prefill rows", &[slots, e, 2])?,
            );
            needs.add(
                PlanTag::Workspace,
                "MoE prefill f16 hidden",
                product("the MoE prefill rows", &[slots, nf, 2])?,
            );
        } else {
            needs.add(PlanTag::Workspace, "MoE gate", rows);
            needs.add(PlanTag::Workspace, "MoE up", rows);
        }
        needs.add(
            PlanTag::Workspace,
            "MoE out",
            product("the MoE scratch", &[pairs, e, 4])?,
        );
        if options.int8_matvec {
            needs.add(
                PlanTag::Workspace,
                "MoE 8-bit activations",
                q8_bytes(int8_rows * k * nf),
            );
        }
    }
    if vendor {
        let (values, cols) = largest_matrix;
        let block = weight_block_values(values, cols);
        needs.add(
            PlanTag::Workspace,
            "vendor GEMM f16 weight block",
            (block * 2) as u64,
        );
        needs.add(
            PlanTag::Workspace,
            "vendor GEMM f16 activations",
            product("the vendor GEMM activations", &[mb, cols, 2])?,
        );
        needs.add(
            PlanTag::Workspace,
            "vendor GEMM library workspace",
            LIBRARY_WORKSPACE_BYTES as u64,
        );
        if options.stream_prefill {
            // Sized for any matrix, since the plan decides later which stay on the host.
            let slot = prefetch::slot_bytes(&matrices, block) as u64;
            for which in ["first", "second"] {
                needs.add(
                    PlanTag::OffloadStaging,
                    format!("streamed-prefetch slot, {which}"),
                    device_footprint(slot).ok_or_else(|| overflow("the prefetch slots"))?,
                );
            }
        }
    }

    needs.add(
        PlanTag::Graph,
        "graphs and runtime",
        GRAPH_AND_RUNTIME_BYTES,
    );
    // Counted for every weight, since the plan decides later which stay on the host: a
    // mapped page costs the device page-table memory outside the allocator.
    let weight_bytes = tensors
        .iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t.bytes))
        .ok_or_else(|| overflow("the weights' bytes"))?;
    needs.add(
        PlanTag::Graph,
        "page tables of host-mapped weights",
        host_mapping_bytes(weight_bytes),
    );
    let rounding = needs
        .buffers
        .iter()
        // The staging is counted at its footprint already (the plan leaves it out whole when
        // every weight fits).
        .filter(|b| b.tag != PlanTag::Graph && b.tag != PlanTag::OffloadStaging)
        .try_fold(0u64, |acc, b| {
            acc.checked_add(device_footprint(b.bytes)? - b.bytes)
        })
        .ok_or_else(|| overflow("the allocator's rounding"))?;
    needs.add(
        PlanTag::AllocatorSlack,
        "rounding of the buffers above",
        rounding,
    );
    needs.add(
        PlanTag::AllocatorSlack,
        "shared segment tails",
        POOL_TAIL_BYTES,
    );
    if needs.freed > 0 {
        let freed = needs.freed;
        needs.add(
            PlanTag::AllocatorSlack,
            "buffers freed at load, cached",
            freed,
        );
    }
    let total = ResidentNeeds {
        kv_cache: needs.total(PlanTag::KvCache)?,
        activations: needs.total(PlanTag::Activations)?,
        workspace: needs.total(PlanTag::Workspace)?,
        graph: needs.total(PlanTag::Graph)?,
        allocator_slack: needs.total(PlanTag::AllocatorSlack)?,
        offload_staging: needs.total(PlanTag::OffloadStaging)?,
    };
    Ok(Residency {
        spec: s,
        context,
        tensors,
        needs: total,
        kv_read_per_token,
        buffers: needs.buffers,
    })
}

/// KV bytes a decode token reads, averaged over positions `0..context`: a full layer reads
/// every position so far, a sliding-window layer at most its window (and its ring).
fn kv_reads(s: &ModelSpec, slots: &[usize], context: usize, row_bytes: usize) -> Result<u64> {
    let c = context as u128;
    let mut sum = 0u128;
    for (l, &n) in s.layers.iter().zip(slots) {
        let w = l.window.map_or(n, |w| w.min(n)) as u128;
        // Σ_{p=0}^{c-1} min(p + 1, w)
        let reads = if w >= c {
            c * (c + 1) / 2
        } else {
            w * (w + 1) / 2 + (c - w) * w
        };
        sum += reads * row_bytes as u128;
    }
    u64::try_from(sum / c.max(1)).map_err(|_| overflow("the KV reads"))
}

/// A matrix's (rows one product covers, columns, bytes per row): a product covers one expert
/// of a stacked MoE tensor.
type MatrixShape = (usize, usize, usize);

/// The tensors `Model::load` uploads, in its order, with the bytes the GPU backend stores
/// (vectors as f32, matrices in their file format); and each matrix's shape, which sizes the
/// vendor GEMM's weight block and the streamed prefetch's slots.
fn weight_tensors(file: &GgufFile, s: &ModelSpec) -> Result<(Vec<WeightTensor>, Vec<MatrixShape>)> {
    let mut out = Vec::new();
    let mut matrices = Vec::new();
    let tied = file.tensor("output.weight").is_none();
    let mut add = |name: &str, layer: Option<u32>, kind: TensorKind, required: bool| {
        let Some(info) = file.tensor(name) else {
            return if required {
                Err(DecodeError::MissingTensor {
                    name: name.to_string(),
                })
            } else {
                Ok(false)
            };
        };
        let dim = |i: usize| info.dims.get(i).copied().unwrap_or(1) as usize;
        let (cols, rows, mats) = (dim(0), dim(1), dim(2));
        let bytes = if rows == 1 && mats == 1 {
            product(name, &[cols, 4])?
        } else {
            let row_bytes = usize::try_from(info.n_bytes).map_err(|_| overflow(name))?
                / rows.saturating_mul(mats).max(1);
            matrices.push((rows, cols, row_bytes));
            info.n_bytes
        };
        out.push(WeightTensor {
            name: name.to_string(),
            bytes,
            layer,
            kind,
        });
        Ok(true)
    };
    let embed_kind = if tied {
        TensorKind::Shared
    } else {
        TensorKind::Lookup {
            rows: s.vocab as u64,
        }
    };
    add("token_embd.weight", None, embed_kind, true)?;
    add("output_norm.weight", None, TensorKind::Shared, true)?;
    add("output.weight", None, TensorKind::Shared, false)?;
    add("rope_freqs.weight", None, TensorKind::Shared, false)?;
    let experts = TensorKind::Experts {
        n_expert: u32::try_from(s.n_expert).map_err(|_| overflow("the expert count"))?,
        n_used: u32::try_from(s.n_expert_used).map_err(|_| overflow("the expert count"))?,
    };
    for il in 0..s.n_layers {
        let layer = Some(u32::try_from(il).map_err(|_| overflow("the layer count"))?);
        let n = |t: &str| format!("blk.{il}.{t}.weight");
        let b = |t: &str| format!("blk.{il}.{t}.bias");
        let dense = TensorKind::Dense;
        if add(&b("attn_q"), layer, dense, false)? {
            add(&b("attn_k"), layer, dense, true)?;
            add(&b("attn_v"), layer, dense, true)?;
        }
        if s.qk_norm {
            add(&n("attn_q_norm"), layer, dense, true)?;
            add(&n("attn_k_norm"), layer, dense, true)?;
        }
        if s.sandwich_norms {
            add(&n("post_attention_norm"), layer, dense, true)?;
            add(&n("post_ffw_norm"), layer, dense, true)?;
        }
        for t in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
        ] {
            add(&n(t), layer, dense, true)?;
        }
        if s.is_moe() {
            add(&n("ffn_gate_inp"), layer, dense, true)?;
            for t in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                add(&n(t), layer, experts, true)?;
            }
        } else {
            for t in ["ffn_gate", "ffn_up", "ffn_down"] {
                add(&n(t), layer, dense, true)?;
            }
        }
    }
    Ok((out, matrices))
}

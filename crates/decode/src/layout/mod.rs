//! One layout for loading and estimating: every buffer a model needs on a backend, by tag,
//! with what it is for, for given bounds ([`LayoutOptions`]).
//!
//! The allocating code reads its sizes from this module's functions: `Context::new` sizes the
//! KV cache and the activations with [`context`], and the GPU backend sizes its step block and
//! every workspace buffer with [`workspace`]. [`ModelLayout::new`] lists the same figures from
//! the model file alone, with no device, for the offload planner and `hipdecode plan`, so
//! the estimate and the allocation cannot drift apart. What the allocator adds (its rounding,
//! segment tails, buffers freed and cached during the load) comes from replaying the buffers
//! on rocm-alloc itself ([`allocator`]); what the runtime takes outside the allocator, which
//! nothing can know before the run, is a named line with its measured size ([`runtime`]).
//!
//! - [`weights`]: the tensors the load uploads, in its order;
//! - [`context`]: the KV cache and the activations of a context;
//! - [`workspace`]: the GPU backend's workspace and the activations' 8-bit copies;
//! - [`runtime`]: costs outside the allocator;
//! - [`allocator`]: the buffers replayed on the allocator.

pub mod allocator;
mod bytes;
pub mod context;
pub mod kv_fit;
pub mod runtime;
pub mod weights;
pub mod workspace;

use crate::backend::gpu::offload::prefetch::HostPrefill;
use crate::backend::gpu::vendor_gemm::PrefillPath;
use crate::backend::gpu::{
    EmbedTable, GpuConfig, KvPool, KvType, MatvecPath, DEFAULT_MAX_BATCH, INT8_MMA_ROWS_DEFAULT,
};
use crate::backend::Attention;
use crate::context::ContextOptions;
use crate::error::{DecodeError, Result};
use crate::memory::MemoryTag;
use crate::model::{ModelSpec, Shard};
use allocator::{AllocatorView, Request};
use bytes::{overflow, sum};
use context::Activation;
use gguf_loader::GgufFile;
use offload::{
    device_footprint, LinkModel, PlanRequest, PlanTag, ResidentNeeds, TensorKind, WeightTensor,
};

/// The backend a layout is for: the CPU backend books f32 buffers and the file's bytes, the
/// GPU backend allocates from rocm-alloc with its own element types and workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Gpu,
    Cpu,
}

/// The bounds and settings that size a model's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutOptions {
    /// The context's bounds: positions per sequence (clamped to the model's trained context,
    /// as the load does), rows per step, sequences, and whether every row keeps logits.
    pub bounds: ContextOptions,
    /// The backend.
    pub target: Target,
    /// The KV cache's type (`-ctk` / `-ctv`); the CPU books f32 rows for every type.
    pub kv_type: KvType,
    /// Whether decode products read 8-bit copies of their inputs (`HIPDECODE_GPU_MATVEC`).
    pub int8_matvec: bool,
    /// Most token rows of a product on the int8 matrix-core kernel
    /// (`HIPDECODE_GPU_INT8_MMA_ROWS`), which reads 8-bit copies of that many rows.
    pub int8_mma_rows: usize,
    /// Whether the vendor GEMM's prefill buffers are reserved (`HIPDECODE_GPU_PREFILL`; taken
    /// as present unless `kernels` is asked for, since whether the library opens is only known
    /// on the GPU: the larger estimate).
    pub vendor_gemm: bool,
    /// Tokens the GPU backend's step block is sized for.
    pub step_block_batch: usize,
    /// Whether prefill streams weights left in host memory through device slots
    /// (`HIPDECODE_OFFLOAD_PREFILL`), which the needs then hold.
    pub stream_prefill: bool,
    /// Whether the GPU backend keeps an embedding table that is only looked up in pinned host
    /// memory (`HIPDECODE_GPU_EMBED_TABLE=host`): never on the device, whatever the budget.
    pub lookup_on_host: bool,
    /// Whether the GPU backend maps a shared KV pool's memory as it grows
    /// (`HIPDECODE_GPU_KV_POOL=grow`), so its layers are priced in the device's mapped pieces.
    pub kv_pool_grows: bool,
    /// The rank of a tensor-parallel split whose part is laid out (the whole model on one
    /// rank by default): its weights' parts, and the KV cache and activations of its heads
    /// and width.
    pub shard: Shard,
}

impl Default for LayoutOptions {
    /// The GPU backend's defaults, with a context of 2048 (`hipdecode run`'s).
    fn default() -> Self {
        LayoutOptions {
            bounds: ContextOptions {
                context: 2048,
                ..ContextOptions::default()
            },
            target: Target::Gpu,
            kv_type: KvType::F16,
            int8_matvec: true,
            int8_mma_rows: INT8_MMA_ROWS_DEFAULT,
            vendor_gemm: true,
            step_block_batch: DEFAULT_MAX_BATCH,
            stream_prefill: true,
            lookup_on_host: true,
            kv_pool_grows: true,
            shard: Shard::whole(),
        }
    }
}

impl LayoutOptions {
    /// The GPU defaults for `context`, with the KV type, the matrix-vector path and the prefill
    /// path of `config`, as a GPU backend opened with it allocates.
    pub fn for_config(context: usize, config: &GpuConfig) -> LayoutOptions {
        LayoutOptions {
            bounds: ContextOptions {
                context,
                ..ContextOptions::default()
            },
            kv_type: config.kv_type,
            int8_matvec: config.matvec_path == MatvecPath::Int8,
            int8_mma_rows: config.int8_mma_max_rows,
            vendor_gemm: config.prefill_path != PrefillPath::Kernels,
            stream_prefill: config.host_prefill == HostPrefill::Stream,
            lookup_on_host: config.embed_table == EmbedTable::Host,
            kv_pool_grows: config.kv_pool == KvPool::Grow,
            ..LayoutOptions::default()
        }
    }

    /// What the CPU backend allocates for a context made with `options`.
    pub fn cpu(options: &ContextOptions) -> LayoutOptions {
        LayoutOptions {
            bounds: *options,
            target: Target::Cpu,
            kv_type: KvType::F32,
            int8_matvec: false,
            vendor_gemm: false,
            stream_prefill: false,
            lookup_on_host: false,
            kv_pool_grows: false,
            ..LayoutOptions::default()
        }
    }

    /// The GPU defaults for a context made with `options` on a backend opened with `config`
    /// and a step block of `step_block_batch` tokens.
    pub fn gpu(options: &ContextOptions, config: &GpuConfig, step_block_batch: usize) -> Self {
        LayoutOptions {
            bounds: *options,
            step_block_batch,
            ..Self::for_config(options.context, config)
        }
    }
}

/// When a buffer holds device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// From the load on, whatever the plan places where.
    Always,
    /// A weight: on the device unless the plan keeps it in host memory.
    Weight,
    /// A weight the backend keeps in pinned host memory whatever the plan: an embedding table
    /// that is only looked up, under [`LayoutOptions::lookup_on_host`].
    HostWeight,
    /// Freed during the load, replaced by the buffer at this index of the list (which is
    /// allocated right after); its memory stays in the allocator's cache.
    ReplacedBy(usize),
    /// Only when a weight stays in host memory (the streamed prefetch's slots).
    WithHostWeights,
    /// Device memory the runtime takes outside the allocator (tag `graph`): a measured size.
    OutsideAllocator,
    /// What the allocator reserves beyond its blocks (tag `allocator_slack`).
    Slack,
    /// From the load on, in a region whose memory is mapped as it is used (a shared KV pool's
    /// layer on the GPU): the bytes are its size grown whole, in the device's pieces.
    Grows,
}

/// One line of the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutBuffer {
    /// The tag it is counted under.
    pub tag: PlanTag,
    /// What it is for.
    pub what: String,
    /// Bytes asked of the allocator (or, outside it, taken).
    pub bytes: u64,
    pub presence: Presence,
}

/// A model's buffers on one backend under [`LayoutOptions`], and its weights as the offload
/// planner sees them.
#[derive(Clone, Debug)]
pub struct ModelLayout {
    /// The model's description.
    pub spec: ModelSpec,
    /// The options it was made for.
    pub options: LayoutOptions,
    /// The KV cache's positions per sequence after clamping to the model's context.
    pub context: usize,
    /// Every weight tensor the load uploads, in its order, as the GPU backend stores it.
    pub tensors: Vec<WeightTensor>,
    /// Every buffer, in the order the load allocates them, then the lines outside the
    /// allocator and the allocator's slack.
    pub buffers: Vec<LayoutBuffer>,
    /// Bytes per tag that must be resident whatever the plan (the weights aside).
    pub needs: ResidentNeeds,
    /// KV cache bytes a decode token reads on average over a run that fills the context.
    pub kv_read_per_token: u64,
}

/// Collects the buffers in allocation order.
struct Lines(Vec<LayoutBuffer>);

impl Lines {
    fn add(&mut self, tag: PlanTag, what: impl Into<String>, bytes: usize) -> usize {
        self.add_as(tag, what, bytes as u64, Presence::Always)
    }

    fn add_as(&mut self, tag: PlanTag, what: impl Into<String>, bytes: u64, p: Presence) -> usize {
        self.0.push(LayoutBuffer {
            tag,
            what: what.into(),
            bytes,
            presence: p,
        });
        self.0.len() - 1
    }

    /// `what` replacing the buffer at `old`.
    fn replace(&mut self, old: usize, what: impl Into<String>, bytes: usize) {
        let next = self.0.len();
        self.0[old].presence = Presence::ReplacedBy(next);
        self.add(PlanTag::Workspace, what, bytes);
    }
}

impl ModelLayout {
    /// The layout of `file` under `options`.
    pub fn new(file: &GgufFile, options: &LayoutOptions) -> Result<ModelLayout> {
        let whole = ModelSpec::from_gguf(file)?;
        let o = options;
        // A rank's spec has its heads and width (the whole model's on one rank).
        let s = crate::model::tensor_parallel::shard_spec(&whole, o.shard)?;
        if o.bounds.max_batch == 0 || o.bounds.context == 0 || o.bounds.sequences == 0 {
            return Err(DecodeError::InvalidArgument(
                "context, batch size and sequences must be at least 1".into(),
            ));
        }
        let gpu = o.target == Target::Gpu;
        let (weights, matrices) = weights::loaded_weights(file, &whole, o.shard)?;
        let mb = o.bounds.max_batch;
        let (kd, vd) = (s.widths.k, s.widths.v);
        let mut lines = Lines(Vec::new());

        // `GpuBackend::new`: the step block, before any weight.
        if gpu {
            let bytes = workspace::step_block_bytes(o.step_block_batch.max(1))?;
            lines.add(PlanTag::Workspace, "step block", bytes);
        }
        for w in &weights {
            let bytes = if gpu { w.tensor.bytes } else { w.cpu_bytes() };
            let lookup = matches!(w.tensor.kind, TensorKind::Lookup { .. });
            let presence = match gpu && o.lookup_on_host && lookup {
                true => Presence::HostWeight,
                false => Presence::Weight,
            };
            lines.add_as(PlanTag::Weights, &w.tensor.name, bytes, presence);
        }

        // `Context::new`: the KV cache, then the activations.
        let context = context::clamp_context(&s, o.bounds.context);
        let kv = context::kv_plan(
            &s,
            context,
            mb,
            o.bounds.sequences,
            crate::kv::block_positions(),
            o.bounds.kv_blocks,
        )?;
        let slots = &kv.slots;
        // The CPU holds every type's values in f32 rows.
        let stored = if gpu { o.kv_type } else { KvType::F32 };
        for il in 0..slots.len() {
            let bytes = kv.layer_bytes(il, (kd, vd), stored)?;
            // A shared pool grows on the GPU (`KvCache`); the host's pages come as written.
            let grows = gpu
                && o.kv_pool_grows
                && kv.pool_is_shared()
                && kv.groups[il] == crate::kv::KvGroup::POOL;
            let presence = if grows {
                Presence::Grows
            } else {
                Presence::Always
            };
            for (bytes, what) in bytes.into_iter().zip(["keys", "values"]) {
                let what = format!("layer {il} {what}");
                lines.add_as(PlanTag::KvCache, what, bytes as u64, presence);
            }
        }
        let kv_read_per_token = context::kv_reads(
            &s,
            slots,
            context,
            context::kv_row_bytes(stored, kd)? + context::kv_row_bytes(stored, vd)?,
        )?;
        let act = context::activations(&s, mb, o.bounds.sequences, o.bounds.all_logits)?;
        for which in Activation::ALL {
            // `activations` checked that the bytes fit.
            lines.add(PlanTag::Activations, which.name(), act.values(which) * 4);
        }
        if gpu {
            let bounds = context::step_bounds(&s, &kv, mb);
            let (attention, tables) = (&bounds.decode_attention, bounds.table_entries);
            gpu_workspace(&mut lines, &s, o, attention, tables, &matrices, &act)?;
        }

        // Outside the allocator, and the allocator's own.
        if gpu {
            let outside = [
                (
                    "the runtime at start (modules, streams, BLAS handle)",
                    runtime::RUNTIME_AT_START_BYTES,
                ),
                ("instantiated decode graphs", runtime::DECODE_GRAPH_BYTES),
                (
                    "untraced runtime page (prefill)",
                    runtime::UNTRACED_RUNTIME_BYTES,
                ),
            ];
            for (what, bytes) in outside {
                lines.add_as(PlanTag::Graph, what, bytes, Presence::OutsideAllocator);
            }
            // Counted for every weight, since the plan decides later which stay on the host: a
            // mapped page costs the device page-table memory outside the allocator.
            let weight_bytes = sum("the weights' bytes", weights.iter().map(|w| w.tensor.bytes))?;
            lines.add_as(
                PlanTag::Graph,
                "page tables of host-mapped weights",
                runtime::host_mapping_bytes(weight_bytes),
                Presence::OutsideAllocator,
            );
        }
        let mut layout = ModelLayout {
            spec: s,
            options: *o,
            context,
            tensors: weights.into_iter().map(|w| w.tensor).collect(),
            buffers: lines.0,
            needs: ResidentNeeds::default(),
            kv_read_per_token,
        };
        if gpu {
            // The needs leave the weights to the planner: replayed without them, as a run with
            // every weight on the host allocates, so the staging is in.
            let view = layout.replay(false)?;
            let asked = [PlanTag::KvCache, PlanTag::Activations, PlanTag::Workspace]
                .into_iter()
                .map(|t| layout.tag_bytes(t));
            let asked = sum("the resident needs", asked.chain([layout.staging()?]))?;
            layout.buffers.push(LayoutBuffer {
                tag: PlanTag::AllocatorSlack,
                what: "rounding, segment tails and buffers freed at load (the buffers above \
                       replayed on the allocator)"
                    .into(),
                bytes: view.peak_reserved.saturating_sub(asked),
                presence: Presence::Slack,
            });
            layout.buffers.push(LayoutBuffer {
                tag: PlanTag::AllocatorSlack,
                what: "a device-weight block under 10 MiB sharing the segments".into(),
                bytes: runtime::SMALL_WEIGHT_BLOCK_BYTES,
                presence: Presence::Slack,
            });
        }
        layout.needs = ResidentNeeds {
            kv_cache: layout.tag_bytes(PlanTag::KvCache),
            activations: layout.tag_bytes(PlanTag::Activations),
            workspace: layout.tag_bytes(PlanTag::Workspace),
            graph: layout.tag_bytes(PlanTag::Graph),
            allocator_slack: layout.tag_bytes(PlanTag::AllocatorSlack),
            offload_staging: layout.staging()?,
        };
        // Every sum above is checked once here: the list's total fits.
        sum("the layout", layout.buffers.iter().map(|b| b.bytes))?;
        Ok(layout)
    }

    /// Bytes of the buffers of `tag` present in every run (the weights' own under
    /// `PlanTag::Weights`: every tensor on the device); 0 for a tag that has none. Sums are
    /// within the total checked by [`ModelLayout::new`].
    pub fn tag_bytes(&self, tag: PlanTag) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.tag == tag)
            .filter(|b| {
                !matches!(
                    b.presence,
                    Presence::ReplacedBy(_) | Presence::WithHostWeights | Presence::HostWeight
                )
            })
            .map(|b| b.bytes)
            .sum()
    }

    /// The streamed-prefetch slots at their allocator footprint (the planner leaves them out
    /// of a plan that keeps every weight on the device).
    fn staging(&self) -> Result<u64> {
        let slots = self
            .buffers
            .iter()
            .filter(|b| b.presence == Presence::WithHostWeights)
            .map(|b| device_footprint(b.bytes).ok_or_else(|| overflow("the prefetch slots")));
        sum("the prefetch slots", slots.collect::<Result<Vec<_>>>()?)
    }

    /// Bytes the backend books per tag after the load with every weight on the device: what
    /// the CPU backend's `memory()` reports (the GPU's is [`ModelLayout::replay`]).
    pub fn requested(&self, tag: MemoryTag) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.tag.alloc_tag() == Some(tag))
            .filter(|b| {
                matches!(
                    b.presence,
                    Presence::Always | Presence::Weight | Presence::Grows
                )
            })
            .map(|b| b.bytes)
            .sum()
    }

    /// The allocator's figures for this layout's buffers, replayed in the load's order: with
    /// every weight on the device and no staging (`weights_on_device`), or with every weight
    /// in host memory and the staging in. The GPU backend holds its device weights as one
    /// block ([`crate::backend::Backend::reserve_weights`]), and a KV cache's buffers that do
    /// not grow as another ([`crate::backend::Backend::alloc_together`]), each taken at the
    /// first of its buffers.
    pub fn replay(&self, weights_on_device: bool) -> Result<AllocatorView> {
        let mut requests: Vec<Request> = Vec::new();
        // Where each buffer of the list landed in the replay.
        let mut at = vec![None; self.buffers.len()];
        let mut replaced: Vec<(usize, usize)> = Vec::new();
        // The GPU takes each of these groups as one block, at the first of its buffers.
        let gpu = self.options.target == Target::Gpu;
        let is_weight = |b: &LayoutBuffer| weights_on_device && b.presence == Presence::Weight;
        let is_fixed_kv =
            |b: &LayoutBuffer| b.tag == PlanTag::KvCache && b.presence == Presence::Always;
        let block = |member: &dyn Fn(&LayoutBuffer) -> bool| -> (u64, usize) {
            let members = self.buffers.iter().filter(|b| member(b));
            members.fold((0, 0), |(bytes, n), b| {
                (
                    bytes + crate::backend::gpu::weight_piece_bytes(b.bytes),
                    n + 1,
                )
            })
        };
        let blocks = [
            (MemoryTag::Weights, block(&is_weight)),
            (MemoryTag::KvCache, block(&is_fixed_kv)),
        ];
        let mut taken = [false; 2];
        for (i, b) in self.buffers.iter().enumerate() {
            let group = match (gpu, is_weight(b), is_fixed_kv(b)) {
                (true, true, _) => Some(0),
                // One buffer alone is taken as itself (`Backend::alloc_together`).
                (true, _, true) if blocks[1].1 .1 > 1 => Some(1),
                _ => None,
            };
            if let Some(g) = group {
                if !taken[g] {
                    taken[g] = true;
                    let (tag, (bytes, _)) = blocks[g];
                    requests.push(Request {
                        tag,
                        bytes,
                        frees: None,
                        grows: false,
                    });
                }
                continue;
            }
            let Some(tag) = b.tag.alloc_tag() else {
                continue;
            };
            let include = match b.presence {
                Presence::Always | Presence::Grows => true,
                Presence::ReplacedBy(by) => {
                    replaced.push((i, by));
                    true
                }
                Presence::Weight => weights_on_device,
                Presence::HostWeight => false,
                Presence::WithHostWeights => !weights_on_device,
                Presence::OutsideAllocator | Presence::Slack => false,
            };
            if !include {
                continue;
            }
            let frees = replaced
                .iter()
                .find(|&&(_, by)| by == i)
                .and_then(|&(old, _)| at[old]);
            at[i] = Some(requests.len());
            requests.push(Request {
                tag,
                bytes: b.bytes,
                frees,
                grows: b.presence == Presence::Grows,
            });
        }
        allocator::replay(&requests)
    }

    /// The planner's request for this model under `budget` bytes (decode streaming allowed).
    pub fn plan_request(&self, budget: u64, link: LinkModel) -> PlanRequest<'_> {
        PlanRequest {
            tensors: &self.tensors,
            needs: self.needs,
            budget,
            link,
            other_device_reads_per_token: self.kv_read_per_token,
            allow_streamed: true,
            lookups_on_host: self.options.target == Target::Gpu && self.options.lookup_on_host,
        }
    }
}

/// The GPU backend's workspace and 8-bit copies, in `reserve_workspace`'s order.
fn gpu_workspace(
    lines: &mut Lines,
    s: &ModelSpec,
    o: &LayoutOptions,
    decode_attention: &[Attention],
    table_entries: usize,
    matrices: &[weights::MatrixShape],
    act: &context::ActivationSizes,
) -> Result<()> {
    use workspace as w;
    let mb = o.bounds.max_batch;
    let ws = PlanTag::Workspace;
    let attention = w::attention_partials_floats(decode_attention)?;
    lines.add(ws, "split-attention partials", attention.max(1) * 4);
    let tables = w::block_table_ints(mb, table_entries)?.max(1);
    lines.add(ws, "KV block tables", tables * 4);
    lines.add(ws, "argmax", w::ARGMAX_BYTES);
    lines.add(ws, "sampling draw", w::DRAW_BYTES);
    let vendor = w::vendor_gemm_applies(o.int8_matvec, o.vendor_gemm, mb);
    if s.is_moe() {
        let (e, nf) = (s.n_embd, s.n_ff_expert);
        let m = w::moe_scratch(mb, e, nf, s.n_expert_used)?;
        lines.add(ws, "MoE expert ids", w::moe_ids_bytes(m.pairs));
        lines.add(ws, "MoE weights", m.pairs.max(1) * 4);
        let gate = lines.add(ws, "MoE gate", m.hidden_floats.max(1) * 4);
        let up = lines.add(ws, "MoE up", m.hidden_floats.max(1) * 4);
        lines.add(ws, "MoE out", m.out_floats.max(1) * 4);
        if o.int8_matvec {
            let bytes = w::q8_shadow_bytes(m.q8_values);
            lines.add(ws, "MoE 8-bit activations", bytes);
        }
        if vendor {
            let p = w::moe_prefill(m.pairs, s.n_expert, e, nf)?;
            lines.replace(gate, "MoE gate (prefill slots)", p.hidden_floats.max(1) * 4);
            lines.replace(up, "MoE up (prefill slots)", p.hidden_floats.max(1) * 4);
            lines.add(ws, "MoE prefill index", p.index_bytes);
            lines.add(ws, "MoE prefill rows", p.rows_bytes);
            lines.add(ws, "MoE prefill f16 rows", p.f16_rows_bytes);
            lines.add(ws, "MoE prefill f16 hidden", p.f16_hidden_bytes);
        }
    }
    if vendor {
        let (values, cols) = matrices.iter().fold((0usize, 0usize), |(v, c), m| {
            (v.max(m.0.saturating_mul(m.1)), c.max(m.1))
        });
        let v = w::vendor_gemm_buffers(mb, values, cols)?;
        // The matrix-core kernel borrows the same block for its split partials.
        lines.add(ws, "vendor GEMM f16 weight block", v.weight_bytes());
        lines.add(ws, "vendor GEMM f16 activations", v.activation_bytes());
        lines.add(ws, "vendor GEMM library workspace", v.library_bytes);
        // Sized for any matrix, since the plan decides later which stay on the host.
        let slot = w::prefetch_slot_bytes(matrices, v.weight_values) as u64;
        if o.stream_prefill && slot > 0 {
            for which in ["first", "second"] {
                lines.add_as(
                    PlanTag::OffloadStaging,
                    format!("streamed-prefetch slot, {which}"),
                    slot,
                    Presence::WithHostWeights,
                );
            }
        }
    }
    if o.int8_matvec {
        for &(which, width) in &act.matmul_inputs {
            let capacity = w::q8_input_capacity(mb, o.int8_mma_rows, width, act.values(which));
            let bytes = w::q8_shadow_bytes(capacity);
            lines.add(
                PlanTag::Activations,
                format!("8-bit {}", which.name()),
                bytes,
            );
        }
    }
    Ok(())
}

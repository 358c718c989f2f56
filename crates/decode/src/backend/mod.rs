//! The compute interface a model runs on, and its CPU implementation.
//!
//! A backend owns every buffer the model touches. Buffers are allocated once, tagged with a
//! [`MemoryTag`], before the first step: the GPU backend draws them from rocm-alloc (weights,
//! KV cache, activations, workspace pools) and the CPU backend from the heap, keeping the same
//! books. A step then runs a fixed sequence of ops over those same buffers, so a GPU backend
//! can capture one decode step as a graph and replay it: the only values that change between
//! decode steps are the token id and the position, which reach the backend through
//! [`Backend::begin_step`] (a GPU backend writes them into a device-side step block that the
//! captured kernels read). Shapes are plain integers known when the model is built.
//!
//! Buffers hold f32 rows. Ops address rows by count from the start of a buffer, which is
//! sized for the largest batch.

pub mod cpu;
pub mod gpu;
pub mod host;

use crate::error::{DecodeError, Result};
use crate::memory::{DeviceMemory, MemoryReport, MemoryTag};

pub use crate::batch::{Phase, StepBatch};
pub use crate::kv::{BlockTables, KvGroup, KvType};
use crate::quant;
use gguf_loader::{GgmlType, GgufFile, TensorInfo};
use std::sync::Arc;

pub use cpu::kernels::Precision;

/// A tensor from the model file, as handed to [`Backend::load_weight`].
pub struct WeightSource<'a> {
    pub name: &'a str,
    /// The stored type; backends read the types of [`quant::SUPPORTED`].
    pub format: GgmlType,
    /// GGML order: `dims[0]` is the row length, `dims[1]` the number of rows, `dims[2]` the
    /// number of matrices (experts); missing trailing dims are 1.
    pub dims: [usize; 3],
    pub bytes: &'a [u8],
    /// The file the bytes live in, for a backend that can read weights in place (the CPU
    /// backend keeps a reference instead of a copy). `None` for bytes from elsewhere.
    pub mapped: Option<MappedTensor<'a>>,
    /// Whether the model only looks rows of this matrix up by token id and never multiplies
    /// by it (an embedding table not tied to the output), so a backend may keep it where
    /// whole reads would be slow (the GPU backend's host memory).
    pub lookup_only: bool,
}

impl WeightSource<'_> {
    /// Checks that the format is one the backends read and that the bytes are exactly what it
    /// and the dims need (checked products), so every backend refuses an unsupported type or a
    /// short or long tensor the same way, before any kernel sees it.
    pub fn check_bytes(&self) -> Result<()> {
        quant::check_supported(self.name, self.format)?;
        let [cols, rows, mats] = self.dims;
        let expected = quant::row_bytes(self.format, cols)
            .and_then(|rb| rb.checked_mul(rows)?.checked_mul(mats))
            .ok_or_else(|| DecodeError::TensorShape {
                name: self.name.to_string(),
                expected: vec![cols.next_multiple_of(self.format.block_size()), rows, mats],
                found: vec![cols, rows, mats],
            })?;
        if self.bytes.len() != expected {
            return Err(DecodeError::InvalidArgument(format!(
                "tensor '{}' holds {} bytes but {} {:?} needs {expected}",
                self.name,
                self.bytes.len(),
                self.format.name(),
                self.dims
            )));
        }
        Ok(())
    }
}

/// A tensor inside a memory-mapped GGUF file that stays open as long as the `Arc` lives.
#[derive(Clone, Copy)]
pub struct MappedTensor<'a> {
    pub file: &'a Arc<GgufFile>,
    pub info: &'a TensorInfo,
}

/// Rotary embedding parameters of one layer, shape of one attention call, and the gate
/// activation of a feed-forward block: rocm-kernels' own types, which its kernels and CPU
/// references take as they are (a sliding-window layer's cache is a ring of `slots` rows;
/// position p is in slot `p % slots`, see [`Backend::store_rows`]).
pub use rocm_kernels::ops::attention::AttentionShape as Attention;
pub use rocm_kernels::ops::elementwise::GateActivation;
pub use rocm_kernels::ops::rope::RopeParams as Rope;

/// One routed expert of one token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertChoice {
    pub expert: usize,
    pub weight: f32,
}

/// The error of an all-reduce on a backend that was given no collective.
pub(crate) fn no_collective() -> DecodeError {
    DecodeError::InvalidArgument(
        "a model split over ranks needs a backend with a collective \
         (CpuBackend::with_collective, GpuBackend::with_host_collective)"
            .into(),
    )
}

/// [`Backend::all_gather_cols`] over host memory: `x` starts with this rank's `rows` x `cols`
/// values and holds at least `rows` x (`ranks` x `cols`); after, each row holds every rank's
/// columns, rank 0's first.
pub(crate) fn gather_cols_on_host(
    comm: &mut dyn collective::Collective,
    x: &mut [f32],
    rows: usize,
    cols: usize,
) -> Result<()> {
    let ranks = comm.ranks();
    let part = rows * cols;
    if x.len() < part * ranks {
        return Err(DecodeError::InvalidArgument(format!(
            "all_gather_cols of {rows} rows of {cols} columns over {ranks} ranks needs {} \
             values; the buffer holds {}",
            part * ranks,
            x.len()
        )));
    }
    let mut gathered = vec![0.0f32; part * ranks];
    comm.all_gather(&x[..part], &mut gathered)?;
    // Gathered rank-major (each rank's rows whole); the rows take every rank's columns.
    for (k, block) in gathered.chunks_exact(part).enumerate() {
        for (r, values) in block.chunks_exact(cols).enumerate() {
            let at = r * ranks * cols + k * cols;
            x[at..at + cols].copy_from_slice(values);
        }
    }
    Ok(())
}

/// What makes two steps' op sequences the same: a captured step replays only for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepKey {
    /// The batch's phase, as stated by it ([`StepBatch::phase`]).
    pub phase: Phase,
    /// Rows in the step.
    pub n_tokens: usize,
    /// Rows whose logits the step computes.
    pub n_outputs: usize,
}

/// Shape of one [`Backend::moe`] call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeShape {
    pub rows: usize,
    pub n_embd: usize,
    /// Hidden size of one expert.
    pub n_ff: usize,
    pub n_expert: usize,
    /// Experts used per token.
    pub k: usize,
    pub act: GateActivation,
}

/// The largest step a model runs, so a backend can take its per-step workspace once, before
/// the first step (see [`Backend::reserve_workspace`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepBounds {
    /// Tokens in the longest step (a prefill chunk).
    pub max_tokens: usize,
    /// The largest decode step's attention call (a row per sequence) of every layer.
    pub decode_attention: Vec<Attention>,
    /// The MoE call of the longest step, for MoE models.
    pub moe: Option<MoeShape>,
    /// Entries of the context's block tables, every group's together.
    pub table_entries: usize,
}

/// [`Backend::rope_qk_store_kv`] as two ops: [`Backend::rope_qk`], then [`Backend::store_kv`]
/// (the default, and a backend's way when it cannot fuse them).
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_then_store_kv<B: Backend + ?Sized>(
    be: &mut B,
    q: &mut B::Buffer,
    k: &mut B::Buffer,
    v: &B::Buffer,
    rows: usize,
    (n_head, n_head_kv, head_dim): (usize, usize, usize),
    rope: &Rope,
    freq_factors: Option<&B::Weight>,
    kv: KvDestination<'_, B::Buffer>,
) -> Result<()> {
    be.rope_qk(q, k, rows, n_head, n_head_kv, head_dim, rope, freq_factors)?;
    let KvDestination {
        k_cache,
        v_cache,
        k_dim,
        v_dim,
        layer,
    } = kv;
    be.store_kv(k, v, k_cache, v_cache, rows, k_dim, v_dim, layer)
}

/// Where a layer's sequences keep their KV rows: `slots` per sequence, through the block
/// tables of `group` ([`BlockTables`]): slot s of sequence q is row `table[s / block] * block
/// + s % block` of the layer's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayer {
    /// Slots per sequence; position p is in slot `p % slots` (a ring on a sliding-window
    /// layer, never wrapped on a full one).
    pub slots: usize,
    pub group: KvGroup,
}

/// Where [`Backend::rope_qk_store_kv`] stores a layer's new K and V rows.
pub struct KvDestination<'a, B> {
    /// The layer's K cache.
    pub k_cache: &'a mut B,
    /// The layer's V cache.
    pub v_cache: &'a mut B,
    /// Values per key row (all KV heads).
    pub k_dim: usize,
    /// Values per value row.
    pub v_dim: usize,
    /// The layer's slots and block tables.
    pub layer: KvLayer,
}

/// The compute interface. Every op takes its shapes explicitly and works on the leading rows
/// of its buffers.
pub trait Backend: Send {
    /// A device array of f32.
    type Buffer: Send;
    /// A resident weight tensor in its stored (possibly quantized) format.
    type Weight: Send + Sync;

    /// Human-readable name, e.g. "cpu (2 threads, fast)".
    fn describe(&self) -> String;
    /// A zeroed buffer of `len` f32, accounted under `tag`.
    fn alloc(&mut self, tag: MemoryTag, len: usize) -> Result<Self::Buffer>;
    /// Zeroed buffers of `lens[i]` f32 each, accounted under `tag`, in that order: a KV cache's
    /// layers, made together and dropped together. Where the backend can, they are pieces of
    /// one allocation, so no allocator rounding sits between them (on the GPU, 2 MiB segments
    /// around each of the 8B shape's 62.6 MiB layers at 32k context left 88 MiB unusable).
    /// The default takes each on its own.
    fn alloc_together(&mut self, tag: MemoryTag, lens: &[usize]) -> Result<Vec<Self::Buffer>> {
        lens.iter().map(|&len| self.alloc(tag, len)).collect()
    }
    /// A zeroed buffer of `len` f32 whose memory is taken as [`Backend::commit`] asks, at an
    /// address that never changes (a paged KV pool that grows with its sequences). Where the
    /// backend cannot grow a buffer in place, the whole buffer now: the default.
    fn alloc_growable(&mut self, tag: MemoryTag, len: usize) -> Result<Self::Buffer> {
        self.alloc(tag, len)
    }
    /// Backs at least the first `len` values of a buffer from [`Backend::alloc_growable`],
    /// zeroed where new; values already backed keep theirs. The default has nothing to do.
    fn commit(&mut self, buffer: &mut Self::Buffer, len: usize) -> Result<()> {
        let _ = (buffer, len);
        Ok(())
    }
    /// Gives back what backs a buffer from [`Backend::alloc_growable`] beyond its first `len`
    /// values, in the backend's pieces (so a little more may stay backed); a later
    /// [`Backend::commit`] backs it again, zeroed. The default has nothing to do.
    fn release_beyond(&mut self, buffer: &mut Self::Buffer, len: usize) -> Result<()> {
        let _ = (buffer, len);
        Ok(())
    }
    /// Told, before a model's weights load, every weight the load will make resident, in its
    /// order ([`crate::layout::weights::loaded_weights`]), so the backend can hold them as one
    /// allocation rather than one each. The default has nothing to do.
    fn reserve_weights(&mut self, weights: &[crate::layout::weights::LoadedWeight]) -> Result<()> {
        let _ = weights;
        Ok(())
    }
    /// Makes a weight resident (accounted under [`MemoryTag::Weights`]).
    fn load_weight(&mut self, src: &WeightSource<'_>) -> Result<Self::Weight>;
    /// Bytes in use per tag.
    fn memory(&self) -> MemoryReport;
    /// The type of the KV cache's values: what attention reads back (f32 unless it says).
    fn kv_type(&self) -> KvType {
        KvType::F32
    }
    /// The type whose bytes a KV buffer takes here: [`Backend::kv_type`] where the backend
    /// stores the values as they are (the CPU holds every type's values in f32 rows).
    fn kv_storage(&self) -> KvType {
        self.kv_type()
    }
    /// The most bytes a new KV cache can take here, and what that limit is (for the error
    /// that refuses a larger one before allocating); `None` where no limit is known.
    fn kv_room(&self) -> Option<(u64, String)> {
        None
    }
    /// What the backend can still take from its device now, for a KV pool sized to it
    /// (`crate::layout::kv_fit`); `None` where it has no device (on the host, every whole
    /// context, bounded by [`Backend::kv_room`]).
    fn device_room(&self) -> Option<Result<crate::memory::DeviceRoom>> {
        None
    }
    /// A device-side memory report (allocator reserved, cached, peaks, bytes outside the
    /// allocator), for backends that have a device.
    fn device_report(&self) -> Option<Result<String>> {
        None
    }
    /// The same in numbers, for tools that compare phases.
    fn device_memory(&self) -> Option<Result<DeviceMemory>> {
        None
    }
    /// Starts a new window for every peak counter (a benchmark phase).
    fn reset_device_peaks(&mut self) {}
    /// Times every op of the following steps (eagerly: a GPU backend stops replaying graphs).
    /// `false` where the backend cannot.
    fn enable_profiling(&mut self) -> bool {
        false
    }
    /// The per-op table of the profiled steps so far.
    fn profile_report(&mut self) -> Option<Result<String>> {
        None
    }

    /// Takes, now, every per-step workspace a step within `bounds` needs, so that no step
    /// allocates: the first one included, and a captured step never finds the pool short.
    /// `matmul_inputs` are the activation buffers matrix products read, each with its row
    /// width (a backend may keep a converted copy of them). The default has nothing to take.
    fn reserve_workspace(
        &mut self,
        _bounds: &StepBounds,
        _matmul_inputs: &[(&Self::Buffer, usize)],
    ) -> Result<()> {
        Ok(())
    }

    /// Called before each step with its batch (each row's token, sequence and position, and
    /// the step's phase; see the module docs) and the context's block tables. Ops read them
    /// from here (a GPU backend writes them into device memory its kernels read), so none of
    /// them takes a position, a token id or a table. A backend refuses a batch it cannot run
    /// here, before any op.
    fn begin_step(&mut self, batch: &StepBatch, tables: &BlockTables) -> Result<()>;
    /// The rows a step of `key` should run as: `key.n_tokens` (the default), or more where
    /// the backend replays graphs captured for a few row counts only (buckets), so that a
    /// server whose row count changes every step replays a handful of graphs rather than
    /// capturing one per count. The model then pads a decode batch up to it
    /// ([`StepBatch::padded_to`]); a backend that answers more than `key.n_tokens` must skip
    /// the keys and values of padding rows ([`StepBatch::padding`]) in `begin_step`'s step.
    fn bucket_rows(&self, key: StepKey) -> usize {
        key.n_tokens
    }
    /// Sums `x[..len]` over the ranks of a tensor-parallel run, so every rank holds the whole
    /// (`crate::model::tensor_parallel`). A backend without a collective refuses: a model
    /// split over ranks cannot run on it.
    fn all_reduce_sum(&mut self, _x: &mut Self::Buffer, _len: usize) -> Result<()> {
        Err(no_collective())
    }
    /// Joins the ranks' column blocks of a row-major matrix: before, `x` starts with this
    /// rank's `rows` x `cols` values; after, it starts with `rows` x (`ranks` x `cols`), rank
    /// k's block at columns `k * cols..` of every row (the logits of a vocabulary split,
    /// `crate::model::tensor_parallel`). A backend without a collective refuses.
    fn all_gather_cols(&mut self, _x: &mut Self::Buffer, _rows: usize, _cols: usize) -> Result<()> {
        Err(no_collective())
    }
    /// How many step graphs the backend holds (one per [`StepKey`] captured); 0 for a backend
    /// that captures none.
    fn graphs_captured(&self) -> usize {
        0
    }
    /// Runs one step's ops. The default runs them at once. A GPU backend may capture them into
    /// a graph the first time a warm step of this `key` runs and replay the graph afterwards,
    /// so the ops must depend on nothing but the key, the buffers' contents and the step
    /// block: the same calls with the same shapes at every position.
    fn run_step(
        &mut self,
        _key: StepKey,
        ops: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()>
    where
        Self: Sized,
    {
        ops(self)
    }
    /// Copies `dst.len()` values from the start of `src` to the host.
    fn read(&mut self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<()>;
    /// `src`'s values where they already are in host memory (the CPU backend's buffers), so
    /// a caller can look at them without a copy; `None` where reading them is a copy from a
    /// device. Each step's logits are checked for NaN and infinity through it.
    fn host_values<'a>(&'a self, _src: &'a Self::Buffer) -> Option<&'a [f32]> {
        None
    }
    /// Copies `src` into `dst` starting at value `offset` (test inputs, host-computed rows).
    /// A range past the end of `dst` is an `InvalidArgument` error and writes nothing.
    fn write(&mut self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<()>;

    /// `out[t] = table[tokens[t]] * scale` for the step's `n_tokens` tokens.
    fn embed(
        &mut self,
        table: &Self::Weight,
        n_tokens: usize,
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// `out[r] = x[r] / rms(x[r]) * weight` for `rows` rows of `dim`.
    fn rms_norm(
        &mut self,
        x: &Self::Buffer,
        weight: &Self::Weight,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// `x += y` when `y` is given, then `out = rms_norm(x) * weight` over `rows` rows of
    /// `dim`: a block's residual add and the next norm. The default runs the two ops; a GPU
    /// backend runs one kernel, which also leaves `out` quantized for the products that read
    /// it next.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &mut self,
        x: &mut Self::Buffer,
        y: Option<&Self::Buffer>,
        weight: &Self::Weight,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        if let Some(y) = y {
            self.add(x, y, rows * dim)?;
        }
        self.rms_norm(x, weight, out, rows, dim, eps)
    }
    /// [`Backend::add_rms_norm`] after a block whose output `y` has its own norm (Gemma 3's
    /// post-attention and post-feed-forward norms): `y = rms_norm(y, y_norm)` in place, then
    /// `x += y` and `out = rms_norm(x, weight)`. The default runs the two; a GPU backend one
    /// launch.
    #[allow(clippy::too_many_arguments)]
    fn add_normed_rms_norm(
        &mut self,
        x: &mut Self::Buffer,
        (y, y_norm): (&mut Self::Buffer, &Self::Weight),
        weight: &Self::Weight,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm_inplace(y, y_norm, rows, dim, eps)?;
        self.add_rms_norm(x, Some(y), weight, out, rows, dim, eps)
    }
    /// In-place RMSNorm of `rows` consecutive vectors of `dim` (per-head Q/K norm).
    fn rms_norm_inplace(
        &mut self,
        x: &mut Self::Buffer,
        weight: &Self::Weight,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// The per-head Q and K norms of a layer: [`Backend::rms_norm_inplace`] of `q` (`q_rows`
    /// vectors, weight `q_norm`) and of `k` (`k_rows`, `k_norm`), both of `dim`. The default
    /// runs two; a GPU backend one launch.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_inplace_qk(
        &mut self,
        (q, q_norm, q_rows): (&mut Self::Buffer, &Self::Weight, usize),
        (k, k_norm, k_rows): (&mut Self::Buffer, &Self::Weight, usize),
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm_inplace(q, q_norm, q_rows, dim, eps)?;
        self.rms_norm_inplace(k, k_norm, k_rows, dim, eps)
    }
    /// `out[r] = W · x[r]` for `rows` rows; W is `[n_out][n_in]` in its stored format.
    fn matmul(
        &mut self,
        w: &Self::Weight,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
    ) -> Result<()>;
    /// Two products over the same input: `out[r] = w · x[r]` and `out2[r] = w2 · x[r]` (gate
    /// and up; Q and K). The default runs two `matmul`s; a GPU backend one launch where it can.
    #[allow(clippy::too_many_arguments)]
    fn matmul_pair(
        &mut self,
        w: &Self::Weight,
        w2: &Self::Weight,
        x: &Self::Buffer,
        out: &mut Self::Buffer,
        out2: &mut Self::Buffer,
        rows: usize,
    ) -> Result<()> {
        self.matmul(w, x, out, rows)?;
        self.matmul(w2, x, out2, rows)
    }
    /// Mixture-of-experts feed-forward over `rows` rows of `x` (`[rows][n_embd]`): each row goes
    /// to the `k` experts with the largest `router_logits` (`[rows][n_expert]`; ties to the lower
    /// index), weighted by a softmax over those `k` logits; each expert computes
    /// `down · (act(gate · x) * (up · x))`; `out` (`[rows][n_embd]`) receives the weighted sum.
    /// The routing stays on the backend: a GPU backend keeps expert ids and weights in device
    /// memory and runs the selected experts without a host round trip (like ggml's
    /// `mul_mat_id`), so the launch sequence does not depend on the data.
    #[allow(clippy::too_many_arguments)]
    fn moe(
        &mut self,
        x: &Self::Buffer,
        router_logits: &Self::Buffer,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        out: &mut Self::Buffer,
        shape: &MoeShape,
    ) -> Result<()>;
    /// `x[r] += bias` for `rows` rows.
    fn add_bias(&mut self, x: &mut Self::Buffer, bias: &Self::Weight, rows: usize) -> Result<()>;
    /// Rotates `rows` rows of `n_heads` heads of `head_dim`, row r at the position of the
    /// step's row r.
    fn rope(
        &mut self,
        x: &mut Self::Buffer,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope: &Rope,
        freq_factors: Option<&Self::Weight>,
    ) -> Result<()>;
    /// [`Backend::rope`] of a layer's queries `q` (`n_head` heads per row) and keys `k`
    /// (`n_head_kv`) at the same positions; the default runs the two, a GPU backend one kernel.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &mut self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        rows: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        rope: &Rope,
        freq_factors: Option<&Self::Weight>,
    ) -> Result<()> {
        self.rope(q, rows, n_head, head_dim, rope, freq_factors)?;
        self.rope(k, rows, n_head_kv, head_dim, rope, freq_factors)
    }
    /// [`Backend::store_rows`] of a layer's keys (`k_dim` per row) and values (`v_dim`) into
    /// their caches; the default runs the two, a GPU backend one kernel.
    #[allow(clippy::too_many_arguments)]
    fn store_kv(
        &mut self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &mut Self::Buffer,
        v_cache: &mut Self::Buffer,
        rows: usize,
        k_dim: usize,
        v_dim: usize,
        layer: KvLayer,
    ) -> Result<()> {
        self.store_rows(k, k_cache, rows, k_dim, layer)?;
        self.store_rows(v, v_cache, rows, v_dim, layer)
    }
    /// A layer's [`Backend::rope_qk`] followed by its [`Backend::store_kv`]: `q` and `k`
    /// rotated in place, then the rotated keys and the values `v` stored in `kv`'s caches.
    /// The default runs the two; a GPU backend one kernel.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk_store_kv(
        &mut self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &Self::Buffer,
        rows: usize,
        (n_head, n_head_kv, head_dim): (usize, usize, usize),
        rope: &Rope,
        freq_factors: Option<&Self::Weight>,
        kv: KvDestination<'_, Self::Buffer>,
    ) -> Result<()> {
        let heads = (n_head, n_head_kv, head_dim);
        rope_qk_then_store_kv(self, q, k, v, rows, heads, rope, freq_factors, kv)
    }
    /// Writes `rows` rows of `dim` from `src` into `cache` at the step's rows' sequences and
    /// positions: position p of a sequence to its slot `p % layer.slots`, which is the cache row
    /// its block table in `layer.group` gives (the step's tables, from `begin_step`).
    fn store_rows(
        &mut self,
        src: &Self::Buffer,
        cache: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        layer: KvLayer,
    ) -> Result<()>;
    /// Causal attention of `q` against the cached keys and values (GQA when
    /// `n_head_kv < n_head`): each row against its own sequence's slots, up to its position,
    /// through that sequence's block table in `group`; writes `[n_tokens][n_head *
    /// head_dim_v]` to `out`.
    fn attention(
        &mut self,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: &Attention,
        group: KvGroup,
    ) -> Result<()>;
    /// Copies whole blocks of `block_values` values inside `cache`: for each `(from, to)`,
    /// block `to` becomes a copy of block `from` (a shared block copied before a sequence
    /// writes into it).
    fn copy_blocks(
        &mut self,
        cache: &mut Self::Buffer,
        copies: &[(usize, usize)],
        block_values: usize,
    ) -> Result<()>;
    /// `gate = act(gate) * up` over `len` values.
    fn gated(
        &mut self,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        act: GateActivation,
    ) -> Result<()>;
    /// `x += y` over `len` values (the residual add).
    fn add(&mut self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<()>;
    /// `x = cap * tanh(x / cap)` over `len` values (Gemma 2's final logits); `cap` is finite
    /// and positive.
    fn softcap(&mut self, x: &mut Self::Buffer, len: usize, cap: f32) -> Result<()>;
    /// Copies row `src_row` of `src` to row `dst_row` of `dst`.
    fn copy_row(
        &mut self,
        src: &Self::Buffer,
        src_row: usize,
        dst: &mut Self::Buffer,
        dst_row: usize,
        dim: usize,
    ) -> Result<()>;
    /// Zeroes the first `len` values.
    fn zero(&mut self, x: &mut Self::Buffer, len: usize) -> Result<()>;
    /// Index of the largest of `n` values in row `row` (greedy decoding without a copy of the
    /// logits to the host).
    fn argmax(&mut self, x: &Self::Buffer, row: usize, n: usize) -> Result<u32>;
    /// [`Backend::argmax`] of each of the `n_rows` rows `first_row..first_row + n_rows`, in
    /// row order (a batched step's greedy rows). The GPU backend picks them all with one launch
    /// and reads them back with one copy; by default, one `argmax` per row.
    fn argmax_rows(
        &mut self,
        x: &Self::Buffer,
        first_row: usize,
        n_rows: usize,
        n: usize,
    ) -> Result<Vec<u32>> {
        let end = first_row.checked_add(n_rows).ok_or_else(|| {
            DecodeError::InvalidArgument(format!("argmax of {n_rows} rows from row {first_row}"))
        })?;
        (first_row..end).map(|row| self.argmax(x, row, n)).collect()
    }
    /// Samples a token from `n` logits of row `row` with `config`'s rule and the uniform
    /// `draw` (from [`crate::sampler::Sampler::next_draw`]), on the backend, so the logits do
    /// not come back to the host. `None` where the backend does not sample (the caller then
    /// reads the logits and samples on the host with the same draw).
    fn sample(
        &mut self,
        _x: &Self::Buffer,
        _row: usize,
        _n: usize,
        _config: &crate::sampler::SamplerConfig,
        _draw: f64,
    ) -> Result<Option<u32>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks of three rows: rank k's values are 100 k + 10 row + column; after the gather
    /// every row holds rank 0's two columns, then rank 1's.
    #[test]
    fn gathered_columns_land_in_their_rows() {
        let (rows, cols) = (3, 2);
        let threads: Vec<_> = collective::in_process::group(2)
            .into_iter()
            .enumerate()
            .map(|(k, mut comm)| {
                std::thread::spawn(move || {
                    let mut x = vec![f32::NAN; rows * cols * 2];
                    for r in 0..rows {
                        for c in 0..cols {
                            x[r * cols + c] = (100 * k + 10 * r + c) as f32;
                        }
                    }
                    gather_cols_on_host(&mut comm, &mut x, rows, cols).map(|()| x)
                })
            })
            .collect();
        let want: Vec<f32> = (0..rows)
            .flat_map(|r| (0..2).flat_map(move |k| (0..cols).map(move |c| 100 * k + 10 * r + c)))
            .map(|v| v as f32)
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap().unwrap(), want);
        }
        // A buffer too short for every rank's columns is refused by size.
        let mut comm = collective::in_process::group(1).pop().unwrap();
        let e = gather_cols_on_host(&mut comm, &mut [0.0; 5], 3, 2).unwrap_err();
        assert!(e.to_string().contains("needs 6 values"), "{e}");
    }
}

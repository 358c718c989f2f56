//! The GPU backend: every device byte from rocm-alloc under its tag, every op a rocm-kernels
//! kernel queued on one stream.
//!
//! Per-step values (positions, token ids, the next token) live in a device-side step
//! block that the kernels read, so the sequence of launches of a decode step is the same at
//! every position and can be captured into a graph and replayed. The host writes the step block
//! through a small pinned staging buffer with one stream-ordered copy per step. The per-step
//! workspace is reserved when the model is loaded ([`Backend::reserve_workspace`]), so no step
//! allocates. A decode step is captured into a graph on its first run and replayed from then
//! on; the capture goes through rocm-alloc's graph pool, so a step that did allocate would do
//! so in a pool of its own, never in memory an eager step frees.
//!
//! Memory: weights, KV cache, activations and workspace are rocm-alloc allocations on the
//! backend's stream, tagged like the CPU backend's books. [`Backend::device_report`] adds
//! what the allocator reserved and cached and what the process holds outside it (context,
//! module code), from `mem_get_info` before load and now.

pub mod capture_stream;
mod host_weights;
mod hybrid;
mod moe_prefill;
mod weight_block;

pub use host_weights::{HostPlacement, WeightMemory};
pub use hybrid::{CpuShare, CPU_SHARE, MAX_CPU_SHARE};
pub use weight_block::piece_bytes as weight_piece_bytes;

use super::prefetch::{self, HostPrefill, Prefetch};
use super::profile::{self, OpProfile};
use super::vendor_gemm::{
    weight_block_values, PrefillPath, VendorGemm, GPU_PREFILL, VENDOR_GEMM_MIN_ROWS,
};
use super::{
    Attention, Backend, GateActivation, KvDestination, MoeShape, Rope, StepBounds, StepKey,
    WeightSource,
};
use crate::error::{DecodeError, Result};
use crate::memory::{DeviceMemory, MemoryReport, MemoryTag};
use gguf_loader::GgmlType;
use hip_ffi::{Device, DevicePtr, Event, GraphExec, MemInfo, PinnedHostBuffer, Stream};
use knobs::{Knob, Scope};
use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{fmt_bytes, Allocation, Allocator, AllocatorConfig, GraphPool, StreamId, Tag};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::ops::{
    attention as attn, elementwise, embed, kv_cache, matmul,
    matvec::{QuantMatrix, MAX_TOKENS},
    matvec_q8::{self, Q8ActivationsMut},
    moe, norm, rope, sampling,
};
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// Tokens per step the step block and the per-step scratch are sized for (prefill runs in
/// chunks of at most this many tokens).
pub const DEFAULT_MAX_BATCH: usize = 512;

/// A device array drawn from the allocator: f32, or f16 for a KV cache that stores half
/// precision (see [`KvType`]).
pub struct GpuBuffer {
    mem: Allocation,
    len: usize,
    elem: Elem,
    /// This buffer among all the backend's buffers.
    id: u64,
    /// Bumped by every mutable view, so a copy derived from the contents knows when it is
    /// stale.
    version: u64,
    /// The 8-bit copy the integer matrix-vector kernels read (see [`Q8Shadow`]).
    q8: RefCell<Option<Q8Shadow>>,
}

impl GpuBuffer {
    fn new(mem: Allocation, len: usize) -> GpuBuffer {
        GpuBuffer::with_elem(mem, len, Elem::F32)
    }

    fn with_elem(mem: Allocation, len: usize, elem: Elem) -> GpuBuffer {
        // Unique for the process's life, unlike the address, which a later buffer may reuse.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        GpuBuffer {
            mem,
            len,
            elem,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            version: 0,
            q8: RefCell::new(None),
        }
    }

    /// Values it holds.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Which buffer it is (with [`Self::version`], what a copy derived from it was made from).
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    pub(super) fn version(&self) -> u64 {
        self.version
    }

    pub(super) fn view(&self) -> DeviceSlice<f32> {
        // Only KV caches are f16, and only the KV ops take them (through `kv_view`).
        assert_eq!(self.elem, Elem::F32, "an f16 KV buffer used as f32");
        // SAFETY: the allocation holds `len` f32 and lives as long as `self`; kernels using the
        // view are queued on the backend's one stream, and the allocation returns to the
        // allocator on that same stream, so its memory is not reused before they run.
        unsafe { DeviceSlice::from_raw(self.mem.ptr(), self.len) }
    }

    pub(super) fn view_mut(&mut self) -> DeviceSliceMut<f32> {
        assert_eq!(self.elem, Elem::F32, "an f16 KV buffer used as f32");
        self.version += 1;
        // SAFETY: as in `view`; `&mut self` guarantees no other host-side view of this buffer
        // is handed to the same launch.
        unsafe { DeviceSliceMut::from_raw(self.mem.ptr(), self.len) }
    }
}

impl GpuBuffer {
    /// Records that the 8-bit copy now holds the buffer's first `values` values as they are.
    fn mark_q8_fresh(&self, values: usize) {
        if let Some(s) = self.q8.borrow_mut().as_mut() {
            s.made_from = Some((self.version, values));
        }
    }

    fn kv_view(&self) -> kv_cache::KvSlice {
        // SAFETY: the allocation holds `len` elements of `elem` (see `view`).
        unsafe {
            match self.elem {
                Elem::F32 => {
                    kv_cache::KvSlice::F32(DeviceSlice::from_raw(self.mem.ptr(), self.len))
                }
                Elem::F16 => {
                    kv_cache::KvSlice::F16(DeviceSlice::from_raw(self.mem.ptr(), self.len))
                }
            }
        }
    }

    fn kv_view_mut(&mut self) -> kv_cache::KvSliceMut {
        self.version += 1;
        // SAFETY: as in `kv_view`, with `&mut self` as in `view_mut`.
        unsafe {
            match self.elem {
                Elem::F32 => {
                    kv_cache::KvSliceMut::F32(DeviceSliceMut::from_raw(self.mem.ptr(), self.len))
                }
                Elem::F16 => {
                    kv_cache::KvSliceMut::F16(DeviceSliceMut::from_raw(self.mem.ptr(), self.len))
                }
            }
        }
    }
}

/// Element type of a [`GpuBuffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    F32,
    F16,
}

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

/// A buffer's leading rows quantized to 8 bits (`matvec_q8::quantize`), made when a matrix-vector
/// product first reads the buffer after it changed and shared by every product that reads the
/// same contents (Q, K and V; gate and up). Host-side bookkeeping decides whether it is fresh;
/// a step's ops run in the same order at every position, so a captured step re-quantizes
/// exactly where the eager step did.
struct Q8Shadow {
    mem: Allocation,
    /// Values it has room for (the scales follow them, 16-byte aligned).
    capacity: usize,
    /// The buffer version and the count of leading values it was made from.
    made_from: Option<(u64, usize)>,
}

impl Q8Shadow {
    fn scales_offset(capacity: usize) -> usize {
        capacity.next_multiple_of(16)
    }

    fn bytes_for(capacity: usize) -> usize {
        Self::scales_offset(capacity) + capacity / matvec_q8::GROUP * 4
    }

    /// Views of the first `values` values and their scales.
    fn views(&self, values: usize) -> Q8ActivationsMut {
        debug_assert!(values <= self.capacity);
        // SAFETY: the allocation is `bytes_for(capacity)` bytes and lives as long as the buffer
        // that owns the shadow.
        unsafe { q8_views(self.mem.ptr(), self.capacity, values) }
    }
}

/// Views of the first `values` values and their scales in memory laid out for `capacity`
/// values: the values, then from the 16-byte aligned `Q8Shadow::scales_offset(capacity)`
/// their f32 scales, one per 32 values.
///
/// # Safety
/// `base` must point to at least `Q8Shadow::bytes_for(capacity)` bytes that outlive the views,
/// and `values <= capacity`.
unsafe fn q8_views(base: u64, capacity: usize, values: usize) -> Q8ActivationsMut {
    // SAFETY: both views lie inside the `bytes_for(capacity)` bytes the caller vouches for.
    unsafe {
        Q8ActivationsMut {
            values: DeviceSliceMut::from_raw(base, values),
            scales: DeviceSliceMut::from_raw(
                base + Q8Shadow::scales_offset(capacity) as u64,
                values / matvec_q8::GROUP,
            ),
        }
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

/// A resident weight: a (stacked) matrix in its stored format, or a vector converted to f32.
pub enum GpuWeight {
    /// `[mats][rows][cols]` raw GGUF blocks.
    Matrix {
        mem: WeightMemory,
        format: GgmlType,
        dims: [usize; 3],
        name: String,
    },
    /// Norm weights, biases, frequency factors: f32.
    Vector { mem: WeightMemory, len: usize },
}

impl GpuWeight {
    fn matrix(&self, op: &str) -> Result<(QuantMatrix, [usize; 3])> {
        match self {
            GpuWeight::Matrix {
                mem,
                format,
                dims,
                name,
            } => {
                let [cols, rows, mats] = *dims;
                // SAFETY: the allocation holds the tensor's bytes and lives as long as `self`
                // (see `GpuBuffer::view`).
                let data = unsafe { DeviceSlice::from_raw(mem.ptr(), mem.size() as usize) };
                let m = QuantMatrix::new(data, *format, rows * mats, cols).map_err(|e| {
                    DecodeError::InvalidArgument(format!("{op}: weight '{name}': {e}"))
                })?;
                Ok((m, *dims))
            }
            GpuWeight::Vector { .. } => Err(DecodeError::InvalidArgument(format!(
                "{op}: expected a matrix weight, got a vector"
            ))),
        }
    }

    fn vector(&self, op: &str) -> Result<DeviceSlice<f32>> {
        match self {
            // SAFETY: the allocation holds `len` f32 and lives as long as `self`.
            GpuWeight::Vector { mem, len } => Ok(unsafe { DeviceSlice::from_raw(mem.ptr(), *len) }),
            GpuWeight::Matrix { name, .. } => Err(DecodeError::InvalidArgument(format!(
                "{op}: weight '{name}' is a matrix where a vector was expected"
            ))),
        }
    }
}

/// The device-side step block and its pinned staging.
struct StepBlock {
    /// `positions[max_batch]`, `tokens[max_batch]`, `next_token`: i32 ([`StepBlock::ints_len`]).
    ints: Allocation,
    staging: PinnedHostBuffer,
    /// Recorded after the copy out of `staging`; waited on before `staging` is written again.
    copied: Event,
    max_batch: usize,
}

impl StepBlock {
    fn positions(&self) -> DeviceSlice<i32> {
        // SAFETY: `ints` holds `ints_len(max_batch)` i32 and lives as long as the backend.
        unsafe { DeviceSlice::from_raw(self.ints.ptr(), self.max_batch) }
    }
    fn tokens(&self) -> DeviceSlice<i32> {
        // SAFETY: as above; the tokens follow the positions.
        unsafe {
            DeviceSlice::from_raw(self.ints.ptr() + 4 * self.max_batch as u64, self.max_batch)
        }
    }
    fn next_token(&self) -> DeviceSliceMut<i32> {
        // SAFETY: as above; one i32 after the tokens.
        unsafe { DeviceSliceMut::from_raw(self.ints.ptr() + 8 * self.max_batch as u64, 1) }
    }

    /// i32 values in the block for steps of up to `max_batch` tokens.
    fn ints_len(max_batch: usize) -> usize {
        2 * max_batch + 1
    }
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
    moe_prefill: moe_prefill::MoePrefillScratch,
    /// The CPU's slots of a hybrid MoE, uploaded to be added to the GPU's (`[n_embd]`).
    hybrid_moe: Option<GpuBuffer>,
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
    /// The prefill attention kernel.
    attn_prefill: attn::PrefillKernel,
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
    /// The current step's first position (for the profile's byte counts) and token count.
    step_pos0: usize,
    step_tokens: usize,
    /// Per-op timing, when profiling (steps then run eagerly).
    profile: Option<OpProfile>,
    /// Captured steps by key.
    graphs: HashMap<StepKey, GraphExec>,
    /// The private pool a capture allocates from (empty when a warm step allocates nothing).
    graph_pool: GraphPool,
    /// The capture stream and pool, and the books of what graphs took.
    capture: capture_stream::CaptureState,
    /// Weights placed in pinned host memory (none unless a placement was set).
    host_weights: host_weights::HostWeights,
    /// The block of a budget run's device weights, once the first device weight made it.
    weight_block: Option<weight_block::WeightBlock>,
    /// How offloaded decode products are split with the host's cores.
    hybrid: hybrid::Hybrid,
}

fn gpu_err(what: &str, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Gpu(format!("{what}: {e}"))
}

impl GpuBackend {
    /// Opens `device`, creates the allocator (limits from the environment, as documented in
    /// docs/memory.md), compiles or loads the kernels, and reserves the step block.
    pub fn new(device: Device, max_batch: usize, use_graphs: bool) -> Result<GpuBackend> {
        Self::with_memory_limit(device, max_batch, use_graphs, None)
    }

    /// [`GpuBackend::new`] with the allocator's memory limit set to `memory_limit` bytes
    /// instead of from `HIPDECODE_MEMORY_LIMIT` or the default (a GPU budget's run).
    pub fn with_memory_limit(
        device: Device,
        max_batch: usize,
        use_graphs: bool,
        memory_limit: Option<u64>,
    ) -> Result<GpuBackend> {
        let mem_before = device
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let hip = Arc::new(HipDevice::new(device));
        let config = AllocatorConfig {
            memory_limit: memory_limit.map(rocm_alloc::limits::LimitSpec::Bytes),
            ..AllocatorConfig::default()
        };
        let alloc = Arc::new(
            Allocator::new(hip.clone(), config)
                .map_err(|e| gpu_err("creating the allocator", e))?,
        );
        let (stream_id, stream) = hip
            .create_stream()
            .map_err(|e| gpu_err("creating a stream", e))?;
        let cache = KernelCache::from_env().map_err(|e| gpu_err("kernel cache", e))?;
        let kernels = Kernels::load(&device, &cache).map_err(|e| gpu_err("loading kernels", e))?;
        let max_batch = max_batch.max(1);
        let ints = alloc
            .alloc(
                (StepBlock::ints_len(max_batch) * 4) as u64,
                stream_id,
                Tag::Workspace,
            )
            .map_err(|e| gpu_err("step block", e))?;
        let staging = PinnedHostBuffer::alloc(&device, 2 * max_batch * 4)
            .map_err(|e| gpu_err("pinned staging for the step block", e))?;
        let copied = Event::new_without_timing(&device).map_err(|e| gpu_err("event", e))?;
        copied
            .record(&stream)
            .map_err(|e| gpu_err("recording an event", e))?;
        let graph_pool = alloc.new_graph_pool();
        let capture = capture_stream::CaptureState::new(&hip, &device, &alloc, stream_id)?;
        let step = StepBlock {
            ints,
            staging,
            copied,
            max_batch,
        };
        let (vendor_gemm, vendor_gemm_absent) = match PrefillPath::from_env()? {
            PrefillPath::Kernels => (None, Some(format!("{}=kernels", GPU_PREFILL.name))),
            path => match VendorGemm::open(&kernels) {
                Ok(v) => (Some(v), None),
                // Reported by `describe`, which the CLI and bench-decode print.
                Err(reason) if path == PrefillPath::Auto => (None, Some(reason)),
                Err(reason) => {
                    return Err(gpu_err(
                        &format!("{}=vendor", GPU_PREFILL.name),
                        format!("{reason}; install it, or set {}=kernels", GPU_PREFILL.name),
                    ))
                }
            },
        };
        let mut backend = GpuBackend {
            hip,
            alloc,
            stream_id,
            stream,
            kernels,
            step,
            scratch: Scratch::default(),
            mem_before,
            use_graphs,
            matvec_path: MatvecPath::from_env()?,
            attn_prefill: ATTN_PREFILL.read()?,
            kv_type: KvType::from_env()?,
            vendor_gemm,
            vendor_gemm_absent,
            largest_matrix: (0, 0),
            host_matrices: Vec::new(),
            host_prefill: HostPrefill::from_env()?,
            prefetch: None,
            step_pos0: 0,
            step_tokens: 0,
            profile: None,
            graphs: HashMap::new(),
            graph_pool,
            capture,
            host_weights: Default::default(),
            weight_block: None,
            hybrid: hybrid::Hybrid::new(CpuShare::from_env()?),
        };
        // No stale ints a kernel could read before the first step.
        let mut ints = backend.step_ints_mut(StepBlock::ints_len(max_batch));
        elementwise_zero_i32(&mut backend, &mut ints)?;
        backend.note_runtime_at_start()?;
        Ok(backend)
    }

    /// Keeps the named weights in mapped pinned host memory, read by the kernels in place
    /// (the offload plan's zero-copy placement). Call before the model is loaded.
    pub fn set_host_placement(&mut self, placement: HostPlacement) -> Result<()> {
        self.host_weights.set_placement(placement)
    }

    /// Device memory for a weight of `len` bytes: a piece of the budget run's weight block
    /// (made on the first call) when the plan sized one and the weight fits in what is left,
    /// else an allocation of its own.
    fn device_weight(&mut self, len: usize, name: &str) -> Result<WeightMemory> {
        let block_bytes = self.host_weights.device_weight_bytes();
        if self.weight_block.is_none() && block_bytes > 0 {
            let bytes = usize::try_from(block_bytes).map_err(|_| {
                DecodeError::InvalidArgument("the weight block does not fit this host".into())
            })?;
            let block = self.device_alloc(Tag::Weights, bytes, "the device weights' block")?;
            self.weight_block = Some(weight_block::WeightBlock::new(block));
        }
        if let Some((block, offset)) = self.weight_block.as_mut().and_then(|b| b.take(len as u64)) {
            let len = len as u64;
            return Ok(WeightMemory::Block { block, offset, len });
        }
        Ok(WeightMemory::Device(self.device_alloc(
            Tag::Weights,
            len,
            name,
        )?))
    }

    /// Bytes of weights pinned in host memory.
    pub fn pinned_weight_bytes(&self) -> u64 {
        self.host_weights.pinned_bytes()
    }

    /// Switches how matrix-vector products read activations (tests run both paths; users set
    /// [`MATVEC_PATH`]).
    pub fn set_matvec_path(&mut self, path: MatvecPath) {
        self.matvec_path = path;
    }

    /// Sets how prefill reads weights in pinned host memory (before the model loads; tests and
    /// A/B runs, users set [`prefetch::OFFLOAD_PREFILL`]).
    pub fn set_host_prefill(&mut self, mode: HostPrefill) {
        self.host_prefill = mode;
    }

    /// The matrix-vector path in use.
    pub fn matvec_path(&self) -> MatvecPath {
        self.matvec_path
    }

    /// Sets the element type of KV caches allocated from now on (before a model is loaded).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv_type = kv;
    }

    /// The KV cache element type for new caches.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Marks the end of an op for the profile (nothing when not profiling).
    fn op_done(&mut self, label: impl FnOnce() -> String, bytes: u64) -> Result<()> {
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        let device = *self.kernels.device();
        p.op_done(&device, &self.stream, label(), bytes)
            .map_err(|e| gpu_err("profiling", e))
    }

    fn step_ints_mut(&self, len: usize) -> DeviceSliceMut<i32> {
        // SAFETY: the step block holds `ints_len(max_batch)` i32 and lives as long as `self`.
        unsafe { DeviceSliceMut::from_raw(self.step.ints.ptr(), len) }
    }

    /// The allocator, for reports and tests.
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.alloc
    }

    /// The stream every op is queued on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The stream's id in the allocator.
    pub fn stream_id(&self) -> StreamId {
        self.stream_id
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &Device {
        self.hip.device()
    }

    fn device_alloc(&self, tag: Tag, bytes: usize, what: &str) -> Result<Allocation> {
        self.alloc
            .alloc(bytes.max(1) as u64, self.stream_id, tag)
            .map_err(|e| DecodeError::Allocation {
                what: what.to_string(),
                reason: e.to_string(),
            })
    }

    /// Copies host values to device memory, ordered on the backend's stream, and waits.
    fn upload<T: hip_ffi::DeviceCopy>(&self, dst: u64, src: &[T]) -> Result<()> {
        // SAFETY: callers pass an allocation of at least `size_of_val(src)` bytes; the stream is
        // synchronized before returning, so `src` outlives the copy.
        unsafe { self.stream.copy_from_host_raw(DevicePtr(dst), src) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("copying to the device", e))
    }

    /// Writes the step's positions and token ids into the step block with one copy, ordered on
    /// the stream.
    fn write_step(&mut self, pos0: usize, tokens: &[u32]) -> Result<()> {
        let (n, max) = (tokens.len(), self.step.max_batch);
        if n > max {
            return Err(DecodeError::InvalidArgument(format!(
                "a step of {n} tokens is more than the {max} the GPU backend was sized for"
            )));
        }
        let last = pos0 + n;
        if i32::try_from(last).is_err() {
            return Err(DecodeError::InvalidArgument(format!(
                "position {last} does not fit the step block's i32"
            )));
        }
        // The previous copy out of the staging buffer must be done before it is overwritten.
        self.step
            .copied
            .synchronize()
            .map_err(|e| gpu_err("waiting for the step copy", e))?;
        let staging = self.step.staging.as_mut_slice::<i32>();
        for (i, slot) in staging[..n].iter_mut().enumerate() {
            *slot = (pos0 + i) as i32;
        }
        for (slot, &t) in staging[max..max + n].iter_mut().zip(tokens) {
            *slot = t as i32;
        }
        let src = &self.step.staging.as_slice::<i32>()[..max + n];
        // SAFETY: the copy covers the positions and tokens of the step block (2 * max_batch
        // i32, of which max + n are written); the staging buffer is pinned and not written
        // again before `copied` completes.
        unsafe {
            self.stream
                .copy_from_host_raw(DevicePtr(self.step.ints.ptr()), src)
        }
        .and_then(|()| self.step.copied.record(&self.stream))
        .map_err(|e| gpu_err("writing the step block", e))
    }

    fn read_i32(&self, src: u64) -> Result<i32> {
        let mut out = [0i32; 1];
        self.read_i32s(src, &mut out)?;
        Ok(out[0])
    }

    /// Copies `out.len()` i32 from device address `src` once the stream's work is done.
    fn read_i32s(&self, src: u64, out: &mut [i32]) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("waiting for the stream", e))?;
        // SAFETY: callers pass an address inside one of the backend's allocations that holds
        // `out.len()` i32 (the step block, the MoE ids scratch); the stream is idle, and the
        // copy is synchronized before `out` is read.
        unsafe { self.stream.copy_to_host_raw(out, DevicePtr(src)) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("reading from the device", e))
    }

    fn scratch_buffer(
        slot: &mut Option<GpuBuffer>,
        alloc: &Allocator,
        stream: StreamId,
        len: usize,
        what: &str,
    ) -> Result<DeviceSliceMut<f32>> {
        if let Some(buffer) = slot.as_mut().filter(|b| b.len >= len) {
            return Ok(buffer.view_mut());
        }
        // The old buffer goes back to the allocator before the larger one is taken.
        *slot = None;
        let mem = alloc
            .alloc((len.max(1) * 4) as u64, stream, Tag::Workspace)
            .map_err(|e| DecodeError::Allocation {
                what: what.to_string(),
                reason: e.to_string(),
            })?;
        Ok(slot.insert(GpuBuffer::new(mem, len)).view_mut())
    }

    /// The views of `buf`'s 8-bit shadow for its first `values` values, made (or grown) first
    /// where needed; the shadow is not marked as made from anything.
    fn q8_shadow(&self, buf: &GpuBuffer, values: usize) -> Result<Q8ActivationsMut> {
        // Room for the most tokens a product takes (`reserve_workspace` has usually made it
        // so already).
        self.reserve_q8_shadow(buf, (INT8_MAX_ROWS * values).min(buf.len).max(values))?;
        let slot = buf.q8.borrow();
        Ok(slot.as_ref().expect("reserved above").views(values))
    }

    /// Gives `buf` an 8-bit shadow of at least `values` values (rounded down to whole groups),
    /// replacing a smaller one.
    fn reserve_q8_shadow(&self, buf: &GpuBuffer, values: usize) -> Result<()> {
        let capacity = values - values % matvec_q8::GROUP;
        let mut slot = buf.q8.borrow_mut();
        if slot.as_ref().is_some_and(|s| s.capacity >= capacity) {
            return Ok(());
        }
        // The smaller shadow goes back to the allocator before the larger one is taken.
        *slot = None;
        let mem = self.device_alloc(
            Tag::Activations,
            Q8Shadow::bytes_for(capacity),
            "8-bit activations",
        )?;
        *slot = Some(Q8Shadow {
            mem,
            capacity,
            made_from: None,
        });
        Ok(())
    }

    /// The MoE's `[pairs]` expert ids (grown, never shrunk).
    fn moe_ids_scratch(&mut self, pairs: usize) -> Result<DeviceSliceMut<i32>> {
        if self
            .scratch
            .moe_ids
            .as_ref()
            .is_none_or(|a| (a.size() as usize) < pairs * 4)
        {
            self.scratch.moe_ids = None;
            self.scratch.moe_ids =
                Some(self.device_alloc(Tag::Workspace, pairs.max(1) * 4, "moe expert ids")?);
        }
        let base = self
            .scratch
            .moe_ids
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // SAFETY: the scratch holds at least `pairs` i32, lives as long as `self` and is only
        // used on the backend's stream.
        Ok(unsafe { DeviceSliceMut::<i32>::from_raw(base, pairs) })
    }

    /// The MoE's scratch for `values` quantized gated activations (grown, never shrunk, so a
    /// warm step allocates nothing).
    fn moe_q8_scratch(&mut self, values: usize) -> Result<Q8ActivationsMut> {
        let need = Q8Shadow::bytes_for(values);
        if self
            .scratch
            .moe_q8
            .as_ref()
            .is_none_or(|a| (a.size() as usize) < need)
        {
            self.scratch.moe_q8 = None;
            self.scratch.moe_q8 =
                Some(self.device_alloc(Tag::Workspace, need, "moe int8 activations")?);
        }
        let base = self
            .scratch
            .moe_q8
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // SAFETY: the scratch holds `Q8Shadow::bytes_for(values)` bytes, the layout `q8_views`
        // expects; it lives as long as `self` and is only used on the backend's stream.
        Ok(unsafe { q8_views(base, values, values) })
    }

    /// `x`'s first `n_tokens` rows of `cols` quantized to 8 bits: the buffer's shadow, made
    /// (or re-made) only when `x` changed since, or was quantized for fewer values. Groups of
    /// 32 never straddle rows (`cols` is a multiple of 32), so the shadow of `n * cols` values
    /// is the same whatever the split into rows.
    fn q8_activations(
        &mut self,
        x: &GpuBuffer,
        n_tokens: usize,
        cols: usize,
    ) -> Result<Q8ActivationsMut> {
        let values = n_tokens * cols;
        if values > x.len || cols % matvec_q8::GROUP != 0 {
            return Err(DecodeError::InvalidArgument(format!(
                "matmul: {n_tokens} rows of {cols} from a buffer of {} values",
                x.len
            )));
        }
        let mut q = self.q8_shadow(x, values)?;
        let fresh =
            x.q8.borrow()
                .as_ref()
                .and_then(|s| s.made_from)
                .is_some_and(|(version, made)| version == x.version && made >= values);
        if !fresh {
            matvec_q8::quantize(
                &self.kernels,
                &self.stream,
                x.view(),
                n_tokens,
                cols,
                &mut q,
            )
            .map_err(kerr("quantizing activations"))?;
            x.mark_q8_fresh(values);
            self.op_done(|| "quantize_q8".into(), (values * 5) as u64)?;
        }
        Ok(q)
    }

    fn device_memory_now(&self) -> Result<DeviceMemory> {
        let stats = self.alloc.stats();
        let now = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let process_used = self.mem_before.free.saturating_sub(now.free);
        let snap = self.alloc.snapshot();
        Ok(DeviceMemory {
            outside_allocator: process_used.saturating_sub(stats.reserved_bytes),
            process_used,
            stats,
            breakdown: snap.breakdown(),
            runtime_at_start: self.capture.runtime_at_start,
            graph: self.capture.books,
            stranded: snap
                .stranded_bytes_by_stream()
                .into_iter()
                .map(|(s, b)| (s.value(), b))
                .collect(),
        })
    }

    /// The memory report a user reads: per tag the bytes held, then the allocator's reserved,
    /// cached and peaks, and the device memory the process holds outside the allocator.
    fn device_report_text(&self) -> Result<String> {
        let DeviceMemory {
            stats,
            process_used,
            outside_allocator,
            ..
        } = self.device_memory_now()?;
        let mut out = String::new();
        out.push_str(&format!("device memory ({}):\n", self.alloc.device_name()));
        for (tag, usage) in &stats.per_tag {
            if usage.current == 0 && usage.peak == 0 {
                continue;
            }
            out.push_str(&format!(
                "  {:<16} {:>12}   peak {:>12}\n",
                tag.name(),
                fmt_bytes(usage.current),
                fmt_bytes(usage.peak)
            ));
        }
        out.push_str(&format!(
            "  allocated {:>12}   peak {:>12}\n  reserved  {:>12}   peak {:>12}\n  cached    {:>12}\n",
            fmt_bytes(stats.active_bytes),
            fmt_bytes(stats.peak_active_bytes),
            fmt_bytes(stats.reserved_bytes),
            fmt_bytes(stats.peak_reserved_bytes),
            fmt_bytes(stats.cached_bytes),
        ));
        out.push_str(&format!(
            "  process device usage {} (free {} before load)\n  outside the allocator {} (kernel modules, graphs, runtime; the context predates the first reading)\n",
            fmt_bytes(process_used),
            fmt_bytes(self.mem_before.free),
            fmt_bytes(outside_allocator),
        ));
        out.push_str(&self.host_weights.report_line());
        if let Some(line) = self.hybrid.report_line() {
            out.push_str(&line);
        }
        if let Some(p) = &self.prefetch {
            out.push_str(&format!("  {}\n", p.report_line()));
        }
        Ok(out)
    }

    /// The next token as written on the device by [`GpuBackend::argmax_to_step`].
    pub fn read_next_token(&self) -> Result<u32> {
        let id = self.read_i32(self.step.next_token().addr())?;
        u32::try_from(id).map_err(|_| gpu_err("argmax", format!("negative token id {id}")))
    }
}

impl GpuBackend {
    /// The host bytes of `w` when the plan streams it for decode.
    fn streamed_bytes<'w>(&self, w: &'w GpuWeight) -> Option<&'w [u8]> {
        match w {
            GpuWeight::Matrix { name, .. } if self.host_weights.streamed(name) => {
                hybrid::host_bytes(w)
            }
            _ => None,
        }
    }

    /// Copies a streamed weight whole into the next prefetch slot, ahead of the stream's use.
    fn stage_whole(&mut self, host: &[u8]) -> Result<prefetch::Staged> {
        let Some(p) = self.prefetch.as_mut() else {
            return Err(DecodeError::InvalidArgument(
                "a weight is planned to stream, but the prefetch slots are not reserved".into(),
            ));
        };
        // SAFETY: `host` is a model weight's pinned memory, alive as long as the backend (whose
        // drop waits for the device).
        unsafe { p.stage(&self.stream, host) }
    }
}

fn elementwise_zero_i32(backend: &mut GpuBackend, ints: &mut DeviceSliceMut<i32>) -> Result<()> {
    // SAFETY: the same memory as `ints` (the step block), viewed as f32 bit patterns: zero is
    // zero in both types.
    let mut as_f32 = unsafe { DeviceSliceMut::<f32>::from_raw(ints.addr(), ints.len()) };
    elementwise::zero(&backend.kernels, &backend.stream, &mut as_f32, ints.len())
        .map_err(|e| gpu_err("zeroing the step block", e))
}

/// Maps a kernel's or a runtime's error to the decode error that names the failed step.
pub(super) fn kerr<E: std::fmt::Display>(op: &str) -> impl Fn(E) -> DecodeError + '_ {
    move |e| gpu_err(op, e)
}

impl Backend for GpuBackend {
    type Buffer = GpuBuffer;
    type Weight = GpuWeight;

    fn describe(&self) -> String {
        format!(
            "gpu ({}, wave {}, {} matvec, prefill on {})",
            self.alloc.device_name(),
            self.kernels.wave_size(),
            match self.matvec_path {
                MatvecPath::Int8 => "int8",
                MatvecPath::Exact => "exact f32",
            },
            match (&self.vendor_gemm, &self.vendor_gemm_absent) {
                (Some(v), _) if self.matvec_path == MatvecPath::Int8 => v.describe(),
                (Some(_), _) => "kernels (exact path)".into(),
                (None, Some(why)) => format!("kernels ({why})"),
                (None, None) => "kernels".into(),
            }
        )
    }

    fn alloc(&mut self, tag: MemoryTag, len: usize) -> Result<GpuBuffer> {
        let elem = if tag == MemoryTag::KvCache && self.kv_type == KvType::F16 {
            Elem::F16
        } else {
            Elem::F32
        };
        let size = if elem == Elem::F16 { 2 } else { 4 };
        // Whole f32 words, so the zeroing kernel covers an odd count of f16 values too.
        let bytes = len
            .checked_mul(size)
            .map(|b| b.next_multiple_of(4))
            .ok_or_else(|| DecodeError::Allocation {
                what: format!("{len} values of {}", tag.name()),
                reason: "the byte count overflows".into(),
            })?;
        let mem = self.device_alloc(tag, bytes, &format!("{len} values of {}", tag.name()))?;
        // SAFETY: the allocation holds `bytes / 4` f32 words and lives until the buffer made
        // from it below is dropped; zeroing queues on the backend's stream before any use.
        let mut words = unsafe { DeviceSliceMut::<f32>::from_raw(mem.ptr(), bytes / 4) };
        elementwise::zero(&self.kernels, &self.stream, &mut words, bytes / 4)
            .map_err(kerr("zeroing a new buffer"))?;
        Ok(GpuBuffer::with_elem(mem, len, elem))
    }

    fn load_weight(&mut self, src: &WeightSource<'_>) -> Result<GpuWeight> {
        src.check_bytes()?;
        let [cols, rows, mats] = src.dims;
        if self.host_weights.streamed(src.name) && (rows == 1 || mats > 1) {
            return Err(DecodeError::InvalidArgument(format!(
                "the placement streams '{}', but decode streams whole 2-D matrices only (this \
                 one is {cols} x {rows} x {mats}); plan it to be read in place",
                src.name
            )));
        }
        if rows == 1 && mats == 1 {
            let mut v = vec![0.0f32; cols];
            crate::quant::row_to_f32(src.format, src.bytes, &mut v);
            let bytes = host_weights::f32_bytes(&v);
            if let Some(mem) = self.host_weights.place(self.hip.device(), src, &bytes)? {
                return Ok(GpuWeight::Vector { mem, len: cols });
            }
            let mem = self.device_weight(cols * 4, src.name)?;
            self.upload(mem.ptr(), &v)?;
            return Ok(GpuWeight::Vector { mem, len: cols });
        }
        let mem = match self.host_weights.place(self.hip.device(), src, src.bytes)? {
            Some(pinned) => {
                // A product covers the whole matrix, or one expert of a stacked one.
                self.host_matrices
                    .push((rows, cols, src.bytes.len() / (rows * mats).max(1)));
                pinned
            }
            None => {
                let mem = self.device_weight(src.bytes.len(), src.name)?;
                self.upload(mem.ptr(), src.bytes)?;
                mem
            }
        };
        // One expert of a stacked MoE tensor is the unit the vendor GEMM multiplies.
        let (values, widest) = self.largest_matrix;
        self.largest_matrix = (values.max(rows * cols), widest.max(cols));
        Ok(GpuWeight::Matrix {
            mem,
            format: src.format,
            dims: src.dims,
            name: src.name.to_string(),
        })
    }

    fn device_report(&self) -> Option<Result<String>> {
        Some(self.device_report_text())
    }

    fn device_memory(&self) -> Option<Result<DeviceMemory>> {
        Some(self.device_memory_now())
    }

    fn reset_device_peaks(&mut self) {
        self.alloc.reset_peak();
    }

    fn memory(&self) -> MemoryReport {
        let stats = self.alloc.stats();
        let mut report = MemoryReport {
            location: self.alloc.device_name().to_string(),
            ..MemoryReport::default()
        };
        for (tag, usage) in &stats.per_tag {
            report.add(*tag, usage.current);
        }
        report
    }

    fn reserve_workspace(
        &mut self,
        bounds: &StepBounds,
        matmul_inputs: &[(&GpuBuffer, usize)],
    ) -> Result<()> {
        // Loading is over: the allocator records the weights' bytes for its traces and
        // reports (the cache limit no longer follows them; docs/memory.md).
        let stats = self.alloc.stats();
        let weights = stats
            .per_tag
            .iter()
            .find(|(tag, _)| *tag == Tag::Weights)
            .map_or(0, |(_, u)| u.current);
        self.alloc.set_weight_bytes(weights);
        let alloc = Arc::clone(&self.alloc);
        let (a, st) = (&*alloc, self.stream_id);
        let mut attention = 0;
        for shape in &bounds.decode_attention {
            let need = attn::decode_workspace_floats(&attention_shape(shape))
                .map_err(kerr("attention"))?;
            attention = attention.max(need);
        }
        Self::scratch_buffer(
            &mut self.scratch.attention,
            a,
            st,
            attention,
            "attention workspace",
        )?;
        self.argmax_workspace()?;
        self.reserve_draw()?;
        let int8 = self.matvec_path == MatvecPath::Int8;
        let int8_rows = bounds.max_tokens.min(INT8_MAX_ROWS);
        if let Some(moe) = &bounds.moe {
            let pairs = bounds.max_tokens * moe.k;
            self.moe_ids_scratch(pairs)?;
            let s = &mut self.scratch;
            Self::scratch_buffer(&mut s.moe_weights, a, st, pairs, "moe weights")?;
            Self::scratch_buffer(&mut s.moe_gate, a, st, pairs * moe.n_ff, "moe gate")?;
            Self::scratch_buffer(&mut s.moe_up, a, st, pairs * moe.n_ff, "moe up")?;
            Self::scratch_buffer(&mut s.moe_out, a, st, pairs * moe.n_embd, "moe out")?;
            if int8 {
                self.moe_q8_scratch(int8_rows * moe.k * moe.n_ff)?;
            }
            if int8 && self.vendor_gemm.is_some() && bounds.max_tokens >= VENDOR_GEMM_MIN_ROWS {
                self.reserve_moe_prefill(&MoeShape {
                    rows: bounds.max_tokens,
                    ..*moe
                })?;
            }
        }
        let mut slot = self.host_weights.stream_slot_bytes() as usize;
        if let Some(v) = self.vendor_gemm.as_mut().filter(|_| int8) {
            if bounds.max_tokens >= VENDOR_GEMM_MIN_ROWS {
                let (values, cols) = self.largest_matrix;
                v.reserve(a, st, bounds.max_tokens, values, cols)?;
                if self.host_prefill == HostPrefill::Stream {
                    let block = weight_block_values(values, cols);
                    slot = slot.max(prefetch::slot_bytes(&self.host_matrices, block));
                }
            }
        }
        if slot > 0 && self.prefetch.as_ref().is_none_or(|p| p.slot_bytes() < slot) {
            // The smaller slots go back first, so the budget never holds both pairs.
            self.prefetch = None;
            self.prefetch = Some(Prefetch::new(a, st, &self.stream, slot)?);
        }
        if int8 {
            for &(buf, width) in matmul_inputs {
                self.reserve_q8_shadow(buf, (int8_rows * width).min(buf.len))?;
            }
        }
        Ok(())
    }

    fn begin_step(&mut self, pos0: usize, tokens: &[u32]) -> Result<()> {
        if let Some(p) = &mut self.profile {
            // The previous step's events are read before its staging is reused.
            p.finish_step().map_err(|e| gpu_err("profiling", e))?;
        }
        self.write_step(pos0, tokens)?;
        self.step_pos0 = pos0;
        self.step_tokens = tokens.len();
        if let Some(p) = &mut self.profile {
            elementwise::spin(&self.kernels, &self.stream, profile::HEAD_START_CYCLES)
                .map_err(kerr("profiling head start"))?;
            let device = *self.kernels.device();
            p.begin_step(&device, &self.stream)
                .map_err(|e| gpu_err("profiling", e))?;
        }
        Ok(())
    }

    fn enable_profiling(&mut self) -> bool {
        self.use_graphs = false;
        self.profile = Some(OpProfile::default());
        true
    }

    fn profile_report(&mut self) -> Option<Result<String>> {
        let p = self.profile.as_mut()?;
        Some(p.report().map_err(|e| gpu_err("profiling", e)))
    }

    fn run_step(
        &mut self,
        key: StepKey,
        ops: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        // Only decode steps are captured: prefill chunks vary in length and run once each. A
        // step that splits offloaded products with the host waits on the device mid-step, so
        // it cannot be a graph; nor can one that streams weights through the copy stream (its
        // cross-stream waits are not captured).
        if !self.use_graphs
            || key.n_tokens != 1
            || self.hybrid_active()
            || self.host_weights.stream_slot_bytes() > 0
        {
            return ops(self);
        }
        if let Some(exec) = self.graphs.get(&key) {
            // SAFETY: the graph was captured from this backend's stream over buffers that the
            // model and this backend own for their whole lives (weights, KV cache, activations,
            // the step block, scratch kept in `self.scratch`); none has been freed or moved,
            // and the step block holds this step's values (written by `begin_step` before).
            return unsafe { self.replay_step(exec) };
        }
        let exec = self.capture_step(ops)?;
        self.graphs.insert(key, exec);
        Ok(())
    }

    fn read(&mut self, src: &GpuBuffer, offset: usize, dst: &mut [f32]) -> Result<()> {
        if offset + dst.len() > src.len {
            return Err(DecodeError::InvalidArgument(format!(
                "read of {} values at {offset} from a buffer of {}",
                dst.len(),
                src.len
            )));
        }
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("waiting for the stream", e))?;
        if src.elem == Elem::F16 {
            let mut halves = vec![0u16; dst.len()];
            // SAFETY: as below, for `dst.len()` f16 values at `offset`.
            unsafe {
                self.stream
                    .copy_to_host_raw(&mut halves, DevicePtr(src.mem.ptr() + 2 * offset as u64))
            }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("reading from the device", e))?;
            for (d, h) in dst.iter_mut().zip(halves) {
                *d = half::f16::from_bits(h).to_f32();
            }
            return Ok(());
        }
        // SAFETY: the range lies inside the buffer (checked above); the stream is idle and the
        // copy is synchronized before `dst` is used.
        unsafe {
            self.stream
                .copy_to_host_raw(dst, DevicePtr(src.mem.ptr() + 4 * offset as u64))
        }
        .and_then(|()| self.stream.synchronize())
        .map_err(|e| gpu_err("reading from the device", e))
    }

    fn write(&mut self, dst: &mut GpuBuffer, offset: usize, src: &[f32]) -> Result<()> {
        if offset
            .checked_add(src.len())
            .is_none_or(|end| end > dst.len)
        {
            return Err(DecodeError::InvalidArgument(format!(
                "write of {} values at {offset} into a buffer of {}",
                src.len(),
                dst.len
            )));
        }
        // SAFETY: the range lies inside the buffer (checked above); the copy is ordered on the
        // backend's stream after the work already queued, and the stream is synchronized before
        // returning, so `src` outlives the copy.
        unsafe {
            self.stream
                .copy_from_host_raw(DevicePtr(dst.view_mut().addr() + 4 * offset as u64), src)
        }
        .and_then(|()| self.stream.synchronize())
        .map_err(|e| gpu_err("writing to the device", e))
    }

    fn embed(
        &mut self,
        table: &GpuWeight,
        n_tokens: usize,
        scale: f32,
        out: &mut GpuBuffer,
    ) -> Result<()> {
        let (m, _) = table.matrix("embed")?;
        // No device error flag: `Model::step` refuses out-of-range ids before the step starts.
        embed::embed(
            &self.kernels,
            &self.stream,
            &m,
            self.step.tokens(),
            n_tokens,
            scale,
            &mut out.view_mut(),
            None,
        )
        .map_err(kerr("embed"))?;
        self.op_done(|| "embed".into(), (n_tokens * m.cols() * 8) as u64)
    }

    fn rms_norm(
        &mut self,
        x: &GpuBuffer,
        weight: &GpuWeight,
        out: &mut GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = weight.vector("rms_norm")?;
        norm::rms_norm(
            &self.kernels,
            &self.stream,
            x.view(),
            w,
            &mut out.view_mut(),
            rows,
            dim,
            eps,
        )
        .map_err(kerr("rms_norm"))?;
        self.op_done(|| "rms_norm".into(), (2 * rows * dim * 4) as u64)
    }

    fn add_rms_norm(
        &mut self,
        x: &mut GpuBuffer,
        y: Option<&GpuBuffer>,
        weight: &GpuWeight,
        out: &mut GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let residual = y.map(|y| norm::Residual::Add(y.view()));
        self.add_rms_norm_with(x, residual, weight, out, rows, dim, eps)
    }

    fn add_normed_rms_norm(
        &mut self,
        x: &mut GpuBuffer,
        (y, y_norm): (&mut GpuBuffer, &GpuWeight),
        weight: &GpuWeight,
        out: &mut GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let weight_y = y_norm.vector("add_rms_norm (the residual's norm)")?;
        let y = &mut y.view_mut();
        let residual = Some(norm::Residual::NormAdd {
            y,
            weight: weight_y,
        });
        self.add_rms_norm_with(x, residual, weight, out, rows, dim, eps)
    }
    fn rms_norm_inplace(
        &mut self,
        x: &mut GpuBuffer,
        weight: &GpuWeight,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = weight.vector("rms_norm_inplace")?;
        norm::rms_norm_inplace(
            &self.kernels,
            &self.stream,
            &mut x.view_mut(),
            w,
            rows,
            dim,
            eps,
        )
        .map_err(kerr("rms_norm_inplace"))?;
        self.op_done(|| "rms_norm_inplace".into(), (2 * rows * dim * 4) as u64)
    }

    fn rms_norm_inplace_qk(
        &mut self,
        (q, q_norm, q_rows): (&mut GpuBuffer, &GpuWeight, usize),
        (k, k_norm, k_rows): (&mut GpuBuffer, &GpuWeight, usize),
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let (qw, kw) = (q_norm.vector("q norm")?, k_norm.vector("k norm")?);
        norm::rms_norm_inplace_pair(
            &self.kernels,
            &self.stream,
            (&mut q.view_mut(), qw, q_rows),
            (&mut k.view_mut(), kw, k_rows),
            dim,
            eps,
        )
        .map_err(kerr("rms_norm_inplace q+k"))?;
        let bytes = 2 * (q_rows + k_rows) * dim * 4;
        self.op_done(|| "rms_norm_inplace q+k".into(), bytes as u64)
    }

    fn matmul(
        &mut self,
        w: &GpuWeight,
        x: &GpuBuffer,
        out: &mut GpuBuffer,
        rows: usize,
    ) -> Result<()> {
        let (m, _) = w.matrix("matmul")?;
        let streamed = self.streamed_bytes(w);
        if let Some(host) = hybrid::host_bytes(w).filter(|_| {
            streamed.is_none()
                && rows == 1
                && self.matvec_path == MatvecPath::Int8
                && matvec_q8::supports(m.format())
        }) {
            if self.matvec_split(&m, host, x, out)? {
                return Ok(());
            }
        }
        if self.matvec_path == MatvecPath::Int8 {
            if let Some(v) = self.vendor_gemm.as_mut().filter(|v| v.takes(&m, rows)) {
                let host = hybrid::host_bytes(w)
                    .filter(|_| self.host_prefill == HostPrefill::Stream)
                    .zip(self.prefetch.as_mut());
                v.matmul(&self.kernels, &self.stream, &m, host, x, out, rows)?;
                return self.op_done(
                    || {
                        format!(
                            "gemm vendor {} {}x{}",
                            m.format().name(),
                            m.rows(),
                            m.cols()
                        )
                    },
                    (m.data().len()
                        + m.rows() * m.cols() * 4
                        + rows * (m.rows() * 4 + m.cols() * 2)) as u64,
                );
            }
        }
        // A weight the plan streams is copied whole into a slot first, and read there.
        let staged = match streamed {
            Some(host) => Some(self.stage_whole(host)?),
            None => None,
        };
        // Released below, after the product that reads it.
        let m = match &staged {
            Some(s) => s.matrix(m.format(), m.rows(), m.cols())?,
            None => m,
        };
        let int8 = self.matvec_path == MatvecPath::Int8
            && rows <= INT8_MAX_ROWS
            && matvec_q8::supports(m.format());
        if int8 {
            let q = self.q8_activations(x, rows, m.cols())?;
            matvec_q8::matvec(
                &self.kernels,
                &self.stream,
                &m,
                q.as_const(),
                &mut out.view_mut(),
                rows,
            )
            .map_err(kerr("matmul (int8)"))?;
        } else {
            matmul::linear(
                &self.kernels,
                &self.stream,
                &m,
                x.view(),
                &mut out.view_mut(),
                rows,
            )
            .map_err(kerr("matmul"))?;
        }
        if let (Some(s), Some(p)) = (staged, self.prefetch.as_mut()) {
            p.release(&self.stream, s)?;
        }
        let kind = match (int8, rows <= MAX_TOKENS) {
            (true, _) => "matvec int8",
            (false, true) => "matvec f32",
            (false, false) => "matmul f32",
        };
        self.op_done(
            || format!("{kind} {} {}x{}", m.format().name(), m.rows(), m.cols()),
            (m.data().len() + rows * (m.rows() + m.cols()) * 4) as u64,
        )
    }

    fn matmul_pair(
        &mut self,
        w: &GpuWeight,
        w2: &GpuWeight,
        x: &GpuBuffer,
        out: &mut GpuBuffer,
        out2: &mut GpuBuffer,
        rows: usize,
    ) -> Result<()> {
        let (m, _) = w.matrix("matmul")?;
        let (m2, _) = w2.matrix("matmul")?;
        // An offloaded weight is split with the host product by product.
        let offloaded = (self.hybrid_active()
            && (hybrid::host_bytes(w).is_some() || hybrid::host_bytes(w2).is_some()))
            || self.streamed_bytes(w).is_some()
            || self.streamed_bytes(w2).is_some();
        let one_launch = !offloaded
            && self.matvec_path == MatvecPath::Int8
            && rows <= INT8_MAX_ROWS
            && matvec_q8::supports(m.format())
            && m.format() == m2.format()
            && m.cols() == m2.cols();
        if !one_launch {
            self.matmul(w, x, out, rows)?;
            return self.matmul(w2, x, out2, rows);
        }
        let q = self.q8_activations(x, rows, m.cols())?;
        matvec_q8::matvec_pair(
            &self.kernels,
            &self.stream,
            &m,
            &mut out.view_mut(),
            &m2,
            &mut out2.view_mut(),
            q.as_const(),
            rows,
        )
        .map_err(kerr("matmul pair (int8)"))?;
        self.op_done(
            || {
                format!(
                    "matvec int8 pair {} {}+{}x{}",
                    m.format().name(),
                    m.rows(),
                    m2.rows(),
                    m.cols()
                )
            },
            (m.data().len() + m2.data().len()) as u64,
        )
    }

    fn moe(
        &mut self,
        x: &GpuBuffer,
        router_logits: &GpuBuffer,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        out: &mut GpuBuffer,
        shape: &MoeShape,
    ) -> Result<()> {
        let experts = |w: &GpuWeight, what: &str| -> Result<moe::QuantExperts> {
            let (m, dims) = w.matrix(what)?;
            moe::QuantExperts::new(m.data(), m.format(), dims[2], dims[1], dims[0])
                .map_err(kerr("moe"))
        };
        if self.moe_prefill_applies(shape) {
            let (g, _) = gate.matrix("moe gate")?;
            let (u, _) = up.matrix("moe up")?;
            let (d, _) = down.matrix("moe down")?;
            let format = g.format().name();
            let hosts = [gate, up, down].map(hybrid::host_bytes);
            self.moe_prefill(x, router_logits, [&g, &u, &d], hosts, out, shape)?;
            let bytes = g.data().len() + u.data().len() + d.data().len();
            return self.op_done(|| format!("moe vendor gemm {format}"), bytes as u64);
        }
        let hosts = [gate, up, down].map(hybrid::host_bytes);
        let expert_bytes = [gate, up, down]
            .iter()
            .map(|w| w.matrix("moe").map(|(m, d)| m.data().len() / d[2].max(1)))
            .sum::<Result<usize>>()?;
        let (gate, up, down) = (
            experts(gate, "moe gate")?,
            experts(up, "moe up")?,
            experts(down, "moe down")?,
        );
        let MoeShape {
            rows,
            n_embd,
            n_ff,
            n_expert,
            k,
            act,
        } = *shape;
        let pairs = rows * k;
        // Scratch: reserved before the first step (`reserve_workspace`), grown here only for a
        // caller that skipped that.
        let mut ids = self.moe_ids_scratch(pairs)?;
        let (a, s) = (&*self.alloc, self.stream_id);
        let mut weights =
            Self::scratch_buffer(&mut self.scratch.moe_weights, a, s, pairs, "moe weights")?;
        let mut g =
            Self::scratch_buffer(&mut self.scratch.moe_gate, a, s, pairs * n_ff, "moe gate")?;
        let mut u = Self::scratch_buffer(&mut self.scratch.moe_up, a, s, pairs * n_ff, "moe up")?;
        let mut y =
            Self::scratch_buffer(&mut self.scratch.moe_out, a, s, pairs * n_embd, "moe out")?;
        // Decode on the int8 path: the token rows come quantized (the norm before left them
        // so), and the gated activations are quantized for the down projection by the kernel
        // that computes them.
        let int8 = self.matvec_path == MatvecPath::Int8
            && rows <= INT8_MAX_ROWS
            && [gate.format(), up.format(), down.format()]
                .iter()
                .all(|&f| matvec_q8::supports(f))
            && n_embd % matvec_q8::GROUP == 0
            && n_ff % matvec_q8::GROUP == 0;
        let quantized = if int8 {
            let xq = self.q8_activations(x, rows, n_embd)?.as_const();
            Some((xq, self.moe_q8_scratch(pairs * n_ff)?))
        } else {
            None
        };
        // On the int8 path the down projection adds the routing-weighted slots itself, so no
        // weighted sum follows it.
        let down_adds_slots = quantized.is_some() && k <= matvec_q8::MOE_DOWN_MAX_K;
        let (kn, st) = (&self.kernels, &*self.stream);
        moe::route_top_k(
            kn,
            st,
            router_logits.view(),
            rows,
            n_expert,
            k,
            &mut ids,
            &mut weights,
        )
        .map_err(kerr("moe routing"))?;
        let ids = ids.as_const();
        if let (Some((xq, _)), [Some(hg), Some(hu), Some(hd)]) = (&quantized, hosts) {
            if down_adds_slots && self.hybrid_active() {
                let routing = (ids, weights.as_const());
                let experts = [&gate, &up, &down];
                let (xq, gated) = (*xq, (&mut g, &mut u));
                if self.moe_split(experts, [hg, hu, hd], xq, routing, shape, gated, out)? {
                    let selected = k.min(n_expert);
                    return self.op_done(
                        || format!("moe hybrid ({selected} experts of {n_expert}, {k} per token)"),
                        (selected * expert_bytes) as u64,
                    );
                }
            }
        }
        let (kn, st) = (&self.kernels, &*self.stream);
        match quantized {
            Some((xq, mut gq)) => {
                let input = moe::ExpertInput::PerToken;
                let (gate_out, up_out) = ((&gate, &mut g), (&up, &mut u));
                if gate.format() == up.format() {
                    matvec_q8::matvec_id_pair(kn, st, gate_out, up_out, ids, rows, k, xq, input)
                        .map_err(kerr("moe gate+up"))?;
                } else {
                    for (w, dst) in [gate_out, up_out] {
                        matvec_q8::matvec_id(kn, st, w, ids, rows, k, xq, input, dst)
                            .map_err(kerr("moe gate/up"))?;
                    }
                }
                let act = gate_activation(act);
                elementwise::gated_q8(kn, st, &mut g, u.as_const(), pairs * n_ff, act, &mut gq)
                    .map_err(kerr("moe activation"))?;
                if down_adds_slots {
                    let (w, dst) = (weights.as_const(), &mut out.view_mut());
                    matvec_q8::moe_down(kn, st, &down, ids, w, rows, k, gq.as_const(), dst)
                        .map_err(kerr("moe down"))?;
                } else {
                    let input = moe::ExpertInput::PerSlot;
                    let x = gq.as_const();
                    matvec_q8::matvec_id(kn, st, &down, ids, rows, k, x, input, &mut y)
                        .map_err(kerr("moe down"))?;
                }
            }
            None => {
                for (w, dst, what) in [(&gate, &mut g, "moe gate"), (&up, &mut u, "moe up")] {
                    let input = moe::ExpertInput::PerToken;
                    moe::matvec_id(kn, st, w, ids, rows, k, x.view(), input, dst)
                        .map_err(kerr(what))?;
                }
                let act = gate_activation(act);
                elementwise::gated(kn, st, &mut g, u.as_const(), pairs * n_ff, act)
                    .map_err(kerr("moe activation"))?;
                let input = moe::ExpertInput::PerSlot;
                moe::matvec_id(kn, st, &down, ids, rows, k, g.as_const(), input, &mut y)
                    .map_err(kerr("moe down"))?;
            }
        }
        if !down_adds_slots {
            moe::weighted_sum(
                kn,
                st,
                y.as_const(),
                weights.as_const(),
                rows,
                k,
                n_embd,
                &mut out.view_mut(),
                moe::Accumulate::Store,
            )
            .map_err(kerr("moe weighted sum"))?;
        }
        // Weights read: the selected experts' rows (at most rows * k distinct experts).
        let selected = (rows * k).min(n_expert);
        let path = if int8 { "int8" } else { "f32" };
        self.op_done(
            || format!("moe {path} ({selected} experts of {n_expert}, {k} per token)"),
            (selected * expert_bytes) as u64,
        )
    }

    fn add_bias(&mut self, x: &mut GpuBuffer, bias: &GpuWeight, rows: usize) -> Result<()> {
        let b = bias.vector("add_bias")?;
        let dim = b.len();
        elementwise::add_bias(&self.kernels, &self.stream, &mut x.view_mut(), b, rows, dim)
            .map_err(kerr("add_bias"))?;
        self.op_done(|| "add_bias".into(), (2 * rows * dim * 4) as u64)
    }

    fn rope_qk(
        &mut self,
        q: &mut GpuBuffer,
        k: &mut GpuBuffer,
        rows: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        rope_params: &Rope,
        freq_factors: Option<&GpuWeight>,
    ) -> Result<()> {
        let heads = (n_head, n_head_kv, head_dim);
        self.rope_pair_queued(q, k, rows, heads, rope_params, freq_factors, None)?;
        let values = rows * (n_head + n_head_kv) * head_dim;
        self.op_done(|| "rope q+k".into(), (2 * values * 4) as u64)
    }

    fn rope_qk_store_kv(
        &mut self,
        q: &mut GpuBuffer,
        k: &mut GpuBuffer,
        v: &GpuBuffer,
        rows: usize,
        (n_head, n_head_kv, head_dim): (usize, usize, usize),
        rope_params: &Rope,
        freq_factors: Option<&GpuWeight>,
        kv: KvDestination<'_, GpuBuffer>,
    ) -> Result<()> {
        // The fused kernel writes keys of the rotated layout only (k_dim = n_head_kv *
        // head_dim) into caches of one element type; anything else takes the two ops.
        let fused = kv.k_cache.elem == kv.v_cache.elem && kv.k_dim == n_head_kv * head_dim;
        if !fused {
            let heads = (n_head, n_head_kv, head_dim);
            return super::rope_qk_then_store_kv(
                self,
                q,
                k,
                v,
                rows,
                heads,
                rope_params,
                freq_factors,
                kv,
            );
        }
        let (v_dim, slots) = (kv.v_dim, kv.slots);
        let store = rope::KvStore {
            v: &v.view(),
            dim_v: v_dim,
            k_cache: &mut kv.k_cache.kv_view_mut(),
            v_cache: &mut kv.v_cache.kv_view_mut(),
            slots,
        };
        let heads = (n_head, n_head_kv, head_dim);
        self.rope_pair_queued(q, k, rows, heads, rope_params, freq_factors, Some(store))?;
        let values = rows * (n_head + n_head_kv) * head_dim;
        let stored = rows * (n_head_kv * head_dim + v_dim);
        self.op_done(
            || "rope q+k + kv store".into(),
            ((2 * values + 2 * stored) * 4) as u64,
        )
    }

    fn store_kv(
        &mut self,
        k: &GpuBuffer,
        v: &GpuBuffer,
        k_cache: &mut GpuBuffer,
        v_cache: &mut GpuBuffer,
        rows: usize,
        k_dim: usize,
        v_dim: usize,
        slots: usize,
    ) -> Result<()> {
        if k_cache.elem != v_cache.elem {
            self.store_rows(k, k_cache, rows, k_dim, slots)?;
            return self.store_rows(v, v_cache, rows, v_dim, slots);
        }
        let positions = self.step.positions();
        kv_cache::store_kv(
            &self.kernels,
            &self.stream,
            &k.view(),
            &v.view(),
            &mut k_cache.kv_view_mut(),
            &mut v_cache.kv_view_mut(),
            &positions,
            kv_cache::KvStoreShape {
                rows,
                dim_k: k_dim,
                dim_v: v_dim,
                slots,
            },
        )
        .map_err(kerr("kv store"))?;
        self.op_done(
            || "kv store k+v".into(),
            (2 * rows * (k_dim + v_dim) * 4) as u64,
        )
    }

    fn rope(
        &mut self,
        x: &mut GpuBuffer,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope_params: &Rope,
        freq_factors: Option<&GpuWeight>,
    ) -> Result<()> {
        let factors = freq_factors.map(|w| w.vector("rope")).transpose()?;
        let positions = self.step.positions();
        rope::rope(
            &self.kernels,
            &self.stream,
            &mut x.view_mut(),
            &positions,
            factors.as_ref(),
            rope::RopeShape {
                rows,
                n_heads,
                head_dim,
            },
            &rope_kernel_params(rope_params),
        )
        .map_err(kerr("rope"))?;
        self.op_done(|| "rope".into(), (2 * rows * n_heads * head_dim * 4) as u64)
    }

    fn store_rows(
        &mut self,
        src: &GpuBuffer,
        cache: &mut GpuBuffer,
        rows: usize,
        dim: usize,
        slots: usize,
    ) -> Result<()> {
        let positions = self.step.positions();
        kv_cache::store_rows(
            &self.kernels,
            &self.stream,
            &src.view(),
            &mut cache.kv_view_mut(),
            &positions,
            rows,
            dim,
            slots,
        )
        .map_err(kerr("kv store"))?;
        self.op_done(|| "kv store".into(), (2 * rows * dim * 4) as u64)
    }

    fn attention(
        &mut self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        out: &mut GpuBuffer,
        shape: &Attention,
    ) -> Result<()> {
        self.attention_queued(q, k_cache, v_cache, out, shape)?;
        // Keys and values read: every cached position the step's last token sees.
        let seen = (self.step_pos0 + shape.n_tokens)
            .min(shape.kv_slots)
            .min(shape.window.unwrap_or(usize::MAX));
        let elem_bytes = if k_cache.elem == Elem::F16 { 2 } else { 4 };
        let kv_bytes = seen * shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v) * elem_bytes;
        let kind = if shape.n_tokens == 1 {
            "decode"
        } else {
            "prefill"
        };
        self.op_done(|| format!("attention {kind}"), kv_bytes as u64)
    }

    fn gated(
        &mut self,
        gate: &mut GpuBuffer,
        up: &GpuBuffer,
        len: usize,
        act: GateActivation,
    ) -> Result<()> {
        // Decode: leave the result quantized for the down projection.
        if self.matvec_path == MatvecPath::Int8
            && len % matvec_q8::GROUP == 0
            && self.step_tokens <= INT8_MAX_ROWS
            && len <= gate.len
        {
            let mut q8 = self.q8_shadow(gate, len)?;
            elementwise::gated_q8(
                &self.kernels,
                &self.stream,
                &mut gate.view_mut(),
                up.view(),
                len,
                gate_activation(act),
                &mut q8,
            )
            .map_err(kerr("gated (int8)"))?;
            gate.mark_q8_fresh(len);
            return self.op_done(|| "gated + int8".into(), (4 * len * 4) as u64);
        }
        elementwise::gated(
            &self.kernels,
            &self.stream,
            &mut gate.view_mut(),
            up.view(),
            len,
            gate_activation(act),
        )
        .map_err(kerr("gated"))?;
        self.op_done(|| "gated".into(), (3 * len * 4) as u64)
    }

    fn add(&mut self, x: &mut GpuBuffer, y: &GpuBuffer, len: usize) -> Result<()> {
        elementwise::add(
            &self.kernels,
            &self.stream,
            &mut x.view_mut(),
            y.view(),
            len,
        )
        .map_err(kerr("add"))?;
        self.op_done(|| "add".into(), (3 * len * 4) as u64)
    }

    fn copy_row(
        &mut self,
        src: &GpuBuffer,
        src_row: usize,
        dst: &mut GpuBuffer,
        dst_row: usize,
        dim: usize,
    ) -> Result<()> {
        elementwise::copy_rows(
            &self.kernels,
            &self.stream,
            src.view(),
            src_row,
            &mut dst.view_mut(),
            dst_row,
            1,
            dim,
        )
        .map_err(kerr("copy_row"))?;
        self.op_done(|| "copy_row".into(), (2 * dim * 4) as u64)
    }

    fn zero(&mut self, x: &mut GpuBuffer, len: usize) -> Result<()> {
        elementwise::zero(&self.kernels, &self.stream, &mut x.view_mut(), len)
            .map_err(kerr("zero"))?;
        self.op_done(|| "zero".into(), (len * 4) as u64)
    }

    fn argmax(&mut self, x: &GpuBuffer, row: usize, n: usize) -> Result<u32> {
        self.argmax_to_step(x, row, n)?;
        self.read_next_token()
    }

    fn sample(
        &mut self,
        x: &GpuBuffer,
        row: usize,
        n: usize,
        config: &crate::sampler::SamplerConfig,
        draw: f64,
    ) -> Result<Option<u32>> {
        if n > sampling::MAX_SAMPLE_VOCAB {
            return Ok(None); // the host samples rows longer than the kernel takes
        }
        let logits = x.view().slice(row * n, n).ok_or_else(|| {
            DecodeError::InvalidArgument(format!("sample row {row} of {n} is out of range"))
        })?;
        let mut ws = self.argmax_workspace()?;
        self.reserve_draw()?;
        let draw_ptr = self
            .scratch
            .draw
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // The f64 draw rounded down to f32, so it stays below 1 (see rocm-kernels' sampling).
        let mut u = draw as f32;
        if f64::from(u) > draw {
            u = f32::from_bits(u.to_bits().saturating_sub(1));
        }
        self.upload(draw_ptr, &[u])?;
        // SAFETY: the draw allocation holds one f32 and lives as long as `self`.
        let draw_view = unsafe { DeviceSlice::<f32>::from_raw(draw_ptr, 1) };
        let params = sampling::SamplingParams {
            temperature: config.temperature,
            top_k: config.top_k,
            top_p: config.top_p,
        };
        let mut out = self.step.next_token();
        sampling::sample(
            &self.kernels,
            &self.stream,
            logits,
            n,
            &params,
            draw_view,
            &mut ws,
            &mut out,
        )
        .map_err(kerr("sample"))?;
        self.read_next_token().map(Some)
    }
}

impl GpuBackend {
    /// The rope of a layer's queries and keys at the step's positions, with the new K and V
    /// rows stored by the same kernel when `store` is given.
    #[allow(clippy::too_many_arguments)]
    fn rope_pair_queued(
        &self,
        q: &mut GpuBuffer,
        k: &mut GpuBuffer,
        rows: usize,
        (n_head, n_head_kv, head_dim): (usize, usize, usize),
        rope_params: &Rope,
        freq_factors: Option<&GpuWeight>,
        store: Option<rope::KvStore<'_>>,
    ) -> Result<()> {
        let factors = freq_factors.map(|w| w.vector("rope")).transpose()?;
        let what = if store.is_some() {
            "rope + kv store"
        } else {
            "rope"
        };
        rope::rope_pair_store(
            &self.kernels,
            &self.stream,
            &mut q.view_mut(),
            &mut k.view_mut(),
            n_head_kv,
            &self.step.positions(),
            factors.as_ref(),
            rope::RopeShape {
                rows,
                n_heads: n_head,
                head_dim,
            },
            &rope_kernel_params(rope_params),
            store,
        )
        .map_err(kerr(what))
    }

    /// [`Backend::add_rms_norm`] with the residual as the kernel takes it: added as it is, or
    /// normalized first.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_with(
        &mut self,
        x: &mut GpuBuffer,
        residual: Option<norm::Residual<'_>>,
        weight: &GpuWeight,
        out: &mut GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = weight.vector("add_rms_norm")?;
        let values = rows * dim;
        // Leave `out` quantized when the int8 products will read it.
        let quantize = self.matvec_path == MatvecPath::Int8
            && rows <= INT8_MAX_ROWS
            && dim % matvec_q8::GROUP == 0
            && values <= out.len;
        let mut q8 = if quantize {
            Some(self.q8_shadow(out, values)?)
        } else {
            None
        };
        let adds = residual.is_some();
        let normed = matches!(residual, Some(norm::Residual::NormAdd { .. }));
        norm::add_rms_norm(
            &self.kernels,
            &self.stream,
            &mut x.view_mut(),
            residual,
            w,
            &mut out.view_mut(),
            q8.as_mut(),
            rows,
            dim,
            eps,
        )
        .map_err(kerr("add_rms_norm"))?;
        if quantize {
            out.mark_q8_fresh(values);
        }
        // Values moved: x read and written, out written, y read (and written when normed).
        let moved = 3 + usize::from(adds) * 2 + usize::from(normed);
        self.op_done(
            || {
                let norm = if normed {
                    "norm + add_rms_norm"
                } else {
                    "add_rms_norm"
                };
                let int8 = if quantize { " + int8" } else { "" };
                format!("{norm}{int8}")
            },
            (moved * values * 4) as u64,
        )
    }

    fn attention_queued(
        &mut self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        out: &mut GpuBuffer,
        shape: &Attention,
    ) -> Result<()> {
        let s = attention_shape(shape);
        let positions = self.step.positions();
        let k = k_cache.kv_view();
        let v = v_cache.kv_view();
        if shape.n_tokens == 1 {
            let need = attn::decode_workspace_floats(&s).map_err(kerr("attention"))?;
            let (a, st) = (&*self.alloc, self.stream_id);
            let mut ws = Self::scratch_buffer(
                &mut self.scratch.attention,
                a,
                st,
                need,
                "attention workspace",
            )?;
            // On the int8 path the output projection reads the attention output quantized: the
            // combine step leaves it so where it can, and the projection then skips its own
            // quantizing launch.
            let values = s.n_tokens * s.n_head * s.head_dim_v;
            let quantize = self.matvec_path == MatvecPath::Int8
                && s.head_dim_v % matvec_q8::GROUP == 0
                && values <= out.len;
            let mut q8 = if quantize {
                Some(self.q8_shadow(out, values)?)
            } else {
                None
            };
            let quantized = attn::attention_decode_q8(
                &self.kernels,
                &self.stream,
                &q.view(),
                &k,
                &v,
                &positions,
                &mut out.view_mut(),
                &mut ws,
                &s,
                q8.as_mut(),
            )
            .map_err(kerr("attention (decode)"))?;
            if quantized {
                out.mark_q8_fresh(values);
            }
            Ok(())
        } else {
            attn::attention_prefill_on(
                &self.kernels,
                &self.stream,
                self.attn_prefill,
                &q.view(),
                &k,
                &v,
                &positions,
                &mut out.view_mut(),
                &s,
            )
            .map_err(kerr("attention (prefill)"))
        }
    }

    /// The sampler's one-value uniform draw on the device.
    fn reserve_draw(&mut self) -> Result<()> {
        if self.scratch.draw.is_none() {
            self.scratch.draw = Some(self.device_alloc(Tag::Workspace, 4, "sampling draw")?);
        }
        Ok(())
    }

    /// The workspace argmax and sampling share (made on first use, kept).
    fn argmax_workspace(&mut self) -> Result<DeviceSliceMut<u64>> {
        if self.scratch.argmax.is_none() {
            self.scratch.argmax = Some(self.device_alloc(
                Tag::Workspace,
                sampling::ARGMAX_WORKSPACE * 8,
                "argmax workspace",
            )?);
        }
        let ptr = self
            .scratch
            .argmax
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // SAFETY: the workspace holds ARGMAX_WORKSPACE u64 and lives as long as `self`; its
        // users run on the backend's one stream, one after another.
        Ok(unsafe { DeviceSliceMut::<u64>::from_raw(ptr, sampling::ARGMAX_WORKSPACE) })
    }

    /// Writes the index of the largest of `n` values of row `row` into the step block's
    /// next-token slot, on the device.
    pub fn argmax_to_step(&mut self, x: &GpuBuffer, row: usize, n: usize) -> Result<()> {
        let logits = x.view().slice(row * n, n).ok_or_else(|| {
            DecodeError::InvalidArgument(format!("argmax row {row} of {n} is out of range"))
        })?;
        let mut ws = self.argmax_workspace()?;
        let mut out = self.step.next_token();
        sampling::argmax(&self.kernels, &self.stream, logits, n, &mut ws, &mut out)
            .map_err(kerr("argmax"))?;
        self.op_done(|| "argmax".into(), (n * 4) as u64)
    }
}

/// A layer's rope as the kernels take it.
fn rope_kernel_params(rope: &Rope) -> rope::RopeParams {
    rope::RopeParams {
        neox: rope.neox,
        freq_base: rope.freq_base,
        position_scale: rope.position_scale,
        n_rot: rope.n_rot,
    }
}

/// The kernel's view of an attention call's shape.
fn attention_shape(shape: &Attention) -> attn::AttentionShape {
    attn::AttentionShape {
        n_tokens: shape.n_tokens,
        n_head: shape.n_head,
        n_head_kv: shape.n_head_kv,
        head_dim_k: shape.head_dim_k,
        head_dim_v: shape.head_dim_v,
        scale: shape.scale,
        window: shape.window,
        slots: shape.kv_slots,
    }
}

fn gate_activation(act: GateActivation) -> elementwise::GateActivation {
    match act {
        GateActivation::Silu => elementwise::GateActivation::Silu,
        GateActivation::GeluTanh => elementwise::GateActivation::GeluTanh,
    }
}

//! The GPU backend: every device byte from rocm-alloc under its tag, every op a rocm-kernels
//! kernel queued on one stream.
//!
//! Per-step values (positions, token ids, the next token) live in a device-side step
//! block that the kernels read, so the sequence of launches of a decode step is the same at
//! every position and can be captured into a graph and replayed. The host writes the step block
//! through a small pinned staging buffer with one stream-ordered copy per step. A decode step is
//! captured into a graph on its second run (the first sizes every scratch buffer) and replayed
//! from then on; the capture goes through rocm-alloc's graph pool, so a step that did allocate
//! would do so in a pool of its own.
//!
//! Memory: weights, KV cache, activations and workspace are rocm-alloc allocations on the
//! backend's stream, tagged like the CPU backend's books. [`Backend::device_report`] adds
//! what the allocator reserved and cached and what the process holds outside it (context,
//! module code), from `mem_get_info` before load and now.

use super::{Attention, Backend, GateActivation, MoeShape, Rope, StepKey, WeightSource};
use crate::error::{DecodeError, Result};
use crate::memory::{DeviceMemory, MemoryReport, MemoryTag};
use gguf_loader::GgmlType;
use hip_ffi::{Device, DevicePtr, Event, GraphExec, MemInfo, PinnedHostBuffer, Stream};
use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{
    fmt_bytes, Allocation, Allocator, AllocatorConfig, CaptureTarget, GraphPool, StreamId, Tag,
};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::ops::{
    attention as attn, elementwise, embed, kv_cache, matmul, matvec::QuantMatrix, moe, norm, rope,
    sampling,
};
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};
use std::collections::HashMap;
use std::sync::Arc;

/// Tokens per step the step block and the per-step scratch are sized for (prefill runs in
/// chunks of at most this many tokens).
pub const DEFAULT_MAX_BATCH: usize = 512;

/// An f32 device array drawn from the allocator.
pub struct GpuBuffer {
    mem: Allocation,
    len: usize,
}

impl GpuBuffer {
    fn view(&self) -> DeviceSlice<f32> {
        // SAFETY: the allocation holds `len` f32 and lives as long as `self`; kernels using the
        // view are queued on the backend's one stream, and the allocation returns to the
        // allocator on that same stream, so its memory is not reused before they run.
        unsafe { DeviceSlice::from_raw(self.mem.ptr(), self.len) }
    }

    fn view_mut(&mut self) -> DeviceSliceMut<f32> {
        // SAFETY: as in `view`; `&mut self` guarantees no other host-side view of this buffer
        // is handed to the same launch.
        unsafe { DeviceSliceMut::from_raw(self.mem.ptr(), self.len) }
    }
}

/// A resident weight: a (stacked) matrix in its stored format, or a vector converted to f32.
pub enum GpuWeight {
    /// `[mats][rows][cols]` raw GGUF blocks.
    Matrix {
        mem: Allocation,
        format: GgmlType,
        dims: [usize; 3],
        name: String,
    },
    /// Norm weights, biases, frequency factors: f32.
    Vector { mem: Allocation, len: usize },
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
    /// Captured steps by key, and how many eager runs each key has had (a step is captured
    /// on its second run, once the first has sized every scratch buffer).
    graphs: HashMap<StepKey, GraphExec>,
    eager_runs: HashMap<StepKey, usize>,
    /// The private pool a capture allocates from (empty when a warm step allocates nothing).
    graph_pool: GraphPool,
}

fn gpu_err(what: &str, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Gpu(format!("{what}: {e}"))
}

impl GpuBackend {
    /// Opens `device`, creates the allocator (limits from the environment, as documented in
    /// docs/memory.md), compiles or loads the kernels, and reserves the step block.
    pub fn new(device: Device, max_batch: usize, use_graphs: bool) -> Result<GpuBackend> {
        let mem_before = device
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let hip = Arc::new(HipDevice::new(device));
        let alloc = Arc::new(
            Allocator::new(hip.clone(), AllocatorConfig::default())
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
        let step = StepBlock {
            ints,
            staging,
            copied,
            max_batch,
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
            graphs: HashMap::new(),
            eager_runs: HashMap::new(),
            graph_pool,
        };
        // No stale ints a kernel could read before the first step.
        let mut ints = backend.step_ints_mut(StepBlock::ints_len(max_batch));
        elementwise_zero_i32(&mut backend, &mut ints)?;
        Ok(backend)
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
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("waiting for the stream", e))?;
        // SAFETY: `src` is an i32 inside the step block; the stream is idle, and the copy is
        // synchronized before `out` is read.
        unsafe { self.stream.copy_to_host_raw(&mut out, DevicePtr(src)) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("reading from the device", e))?;
        Ok(out[0])
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
        Ok(slot.insert(GpuBuffer { mem, len }).view_mut())
    }

    fn device_memory_now(&self) -> Result<DeviceMemory> {
        let stats = self.alloc.stats();
        let now = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let process_used = self.mem_before.free.saturating_sub(now.free);
        Ok(DeviceMemory {
            outside_allocator: process_used.saturating_sub(stats.reserved_bytes),
            process_used,
            stats,
        })
    }

    /// The memory report a user reads: per tag the bytes held, then the allocator's reserved,
    /// cached and peaks, and the device memory the process holds outside the allocator.
    fn device_report_text(&self) -> Result<String> {
        let stats = self.alloc.stats();
        let now = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let used_by_process = self.mem_before.free.saturating_sub(now.free);
        let outside = used_by_process.saturating_sub(stats.reserved_bytes);
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
            "  process device usage {} (free {} before load, {} now)\n  outside the allocator {} (kernel modules, graphs, runtime; the context predates the first reading)\n",
            fmt_bytes(used_by_process),
            fmt_bytes(self.mem_before.free),
            fmt_bytes(now.free),
            fmt_bytes(outside),
        ));
        Ok(out)
    }

    /// The next token as written on the device by [`GpuBackend::argmax_to_step`].
    pub fn read_next_token(&self) -> Result<u32> {
        let id = self.read_i32(self.step.next_token().addr())?;
        u32::try_from(id).map_err(|_| gpu_err("argmax", format!("negative token id {id}")))
    }
}

fn elementwise_zero_i32(backend: &mut GpuBackend, ints: &mut DeviceSliceMut<i32>) -> Result<()> {
    // SAFETY: the same memory as `ints` (the step block), viewed as f32 bit patterns: zero is
    // zero in both types.
    let mut as_f32 = unsafe { DeviceSliceMut::<f32>::from_raw(ints.addr(), ints.len()) };
    elementwise::zero(&backend.kernels, &backend.stream, &mut as_f32, ints.len())
        .map_err(|e| gpu_err("zeroing the step block", e))
}

fn kerr(op: &str) -> impl Fn(rocm_kernels::KernelError) -> DecodeError + '_ {
    move |e| gpu_err(op, e)
}

impl Backend for GpuBackend {
    type Buffer = GpuBuffer;
    type Weight = GpuWeight;

    fn describe(&self) -> String {
        format!(
            "gpu ({}, wave {}, f32 activations)",
            self.alloc.device_name(),
            self.kernels.wave_size()
        )
    }

    fn alloc(&mut self, tag: MemoryTag, len: usize) -> Result<GpuBuffer> {
        let bytes = len.checked_mul(4).ok_or_else(|| DecodeError::Allocation {
            what: format!("{len} f32 values of {}", tag.name()),
            reason: "the byte count overflows".into(),
        })?;
        let mem = self.device_alloc(tag, bytes, &format!("{len} f32 of {}", tag.name()))?;
        let mut buffer = GpuBuffer { mem, len };
        elementwise::zero(&self.kernels, &self.stream, &mut buffer.view_mut(), len)
            .map_err(kerr("zeroing a new buffer"))?;
        Ok(buffer)
    }

    fn load_weight(&mut self, src: &WeightSource<'_>) -> Result<GpuWeight> {
        src.check_bytes()?;
        let [cols, rows, mats] = src.dims;
        if rows == 1 && mats == 1 {
            let mut v = vec![0.0f32; cols];
            crate::quant::row_to_f32(src.format, src.bytes, &mut v);
            let mem = self.device_alloc(Tag::Weights, cols * 4, src.name)?;
            self.upload(mem.ptr(), &v)?;
            return Ok(GpuWeight::Vector { mem, len: cols });
        }
        let mem = self.device_alloc(Tag::Weights, src.bytes.len(), src.name)?;
        self.upload(mem.ptr(), src.bytes)?;
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

    fn begin_step(&mut self, pos0: usize, tokens: &[u32]) -> Result<()> {
        self.write_step(pos0, tokens)
    }

    fn run_step(
        &mut self,
        key: StepKey,
        ops: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        // Only decode steps are captured: prefill chunks vary in length and run once each.
        if !self.use_graphs || key.n_tokens != 1 {
            return ops(self);
        }
        if let Some(exec) = self.graphs.get(&key) {
            // SAFETY: the graph was captured from this backend's stream over buffers that the
            // model and this backend own for their whole lives (weights, KV cache, activations,
            // the step block, scratch kept in `self.scratch`); none has been freed or moved,
            // and the step block holds this step's values (written by `begin_step` before).
            return unsafe { exec.launch(&self.stream) }
                .map_err(|e| gpu_err("replaying the step", e));
        }
        let runs = self.eager_runs.entry(key).or_insert(0);
        if *runs == 0 {
            // The first run sizes every scratch buffer, so the captured run allocates nothing.
            *runs += 1;
            return ops(self);
        }
        let guard = self
            .alloc
            .begin_capture(self.stream_id, CaptureTarget::Private(&self.graph_pool))
            .map_err(|e| gpu_err("starting a capture in the allocator", e))?;
        self.stream
            .begin_capture()
            .map_err(|e| gpu_err("starting a stream capture", e))?;
        let recorded = ops(self);
        // The capture must end whatever the ops did, or the stream stays unusable.
        let graph = self.stream.end_capture();
        drop(guard);
        recorded?;
        let graph = graph.map_err(|e| gpu_err("ending the stream capture", e))?;
        let exec = graph
            .instantiate()
            .map_err(|e| gpu_err("instantiating the captured step", e))?;
        // SAFETY: as for the replay above; the capture recorded this step's work without
        // running it, so it runs now.
        unsafe { exec.launch(&self.stream) }
            .map_err(|e| gpu_err("running the captured step", e))?;
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
                .copy_from_host_raw(DevicePtr(dst.mem.ptr() + 4 * offset as u64), src)
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
        .map_err(kerr("embed"))
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
        .map_err(kerr("rms_norm"))
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
        .map_err(kerr("rms_norm_inplace"))
    }

    fn matmul(
        &mut self,
        w: &GpuWeight,
        x: &GpuBuffer,
        out: &mut GpuBuffer,
        rows: usize,
    ) -> Result<()> {
        let (m, _) = w.matrix("matmul")?;
        matmul::linear(
            &self.kernels,
            &self.stream,
            &m,
            x.view(),
            &mut out.view_mut(),
            rows,
        )
        .map_err(kerr("matmul"))
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
        // Scratch, sized on first use for the largest step seen.
        if self
            .scratch
            .moe_ids
            .as_ref()
            .is_none_or(|a| (a.size() as usize) < pairs * 4)
        {
            self.scratch.moe_ids = None;
            self.scratch.moe_ids =
                Some(self.device_alloc(Tag::Workspace, pairs * 4, "moe expert ids")?);
        }
        let ids_mem = self
            .scratch
            .moe_ids
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // SAFETY: the ids scratch holds at least `pairs` i32 and lives as long as `self`.
        let mut ids = unsafe { DeviceSliceMut::<i32>::from_raw(ids_mem, pairs) };
        let (a, s) = (&*self.alloc, self.stream_id);
        let mut weights =
            Self::scratch_buffer(&mut self.scratch.moe_weights, a, s, pairs, "moe weights")?;
        let mut g =
            Self::scratch_buffer(&mut self.scratch.moe_gate, a, s, pairs * n_ff, "moe gate")?;
        let mut u = Self::scratch_buffer(&mut self.scratch.moe_up, a, s, pairs * n_ff, "moe up")?;
        let mut y =
            Self::scratch_buffer(&mut self.scratch.moe_out, a, s, pairs * n_embd, "moe out")?;
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
        moe::matvec_id(
            kn,
            st,
            &gate,
            ids,
            rows,
            k,
            x.view(),
            moe::ExpertInput::PerToken,
            &mut g,
        )
        .map_err(kerr("moe gate"))?;
        moe::matvec_id(
            kn,
            st,
            &up,
            ids,
            rows,
            k,
            x.view(),
            moe::ExpertInput::PerToken,
            &mut u,
        )
        .map_err(kerr("moe up"))?;
        elementwise::gated(
            kn,
            st,
            &mut g,
            u.as_const(),
            pairs * n_ff,
            gate_activation(act),
        )
        .map_err(kerr("moe activation"))?;
        moe::matvec_id(
            kn,
            st,
            &down,
            ids,
            rows,
            k,
            g.as_const(),
            moe::ExpertInput::PerSlot,
            &mut y,
        )
        .map_err(kerr("moe down"))?;
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
        .map_err(kerr("moe weighted sum"))
    }

    fn add_bias(&mut self, x: &mut GpuBuffer, bias: &GpuWeight, rows: usize) -> Result<()> {
        let b = bias.vector("add_bias")?;
        let dim = b.len();
        elementwise::add_bias(&self.kernels, &self.stream, &mut x.view_mut(), b, rows, dim)
            .map_err(kerr("add_bias"))
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
            &rope::RopeParams {
                neox: rope_params.neox,
                freq_base: rope_params.freq_base,
                position_scale: rope_params.position_scale,
                n_rot: rope_params.n_rot,
            },
        )
        .map_err(kerr("rope"))
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
            &mut kv_cache::KvSliceMut::F32(cache.view_mut()),
            &positions,
            rows,
            dim,
            slots,
        )
        .map_err(kerr("kv store"))
    }

    fn attention(
        &mut self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        out: &mut GpuBuffer,
        shape: &Attention,
    ) -> Result<()> {
        let s = attn::AttentionShape {
            n_tokens: shape.n_tokens,
            n_head: shape.n_head,
            n_head_kv: shape.n_head_kv,
            head_dim_k: shape.head_dim_k,
            head_dim_v: shape.head_dim_v,
            scale: shape.scale,
            window: shape.window,
            slots: shape.kv_slots,
        };
        let positions = self.step.positions();
        let k = kv_cache::KvSlice::F32(k_cache.view());
        let v = kv_cache::KvSlice::F32(v_cache.view());
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
            attn::attention_decode(
                &self.kernels,
                &self.stream,
                &q.view(),
                &k,
                &v,
                &positions,
                &mut out.view_mut(),
                &mut ws,
                &s,
            )
            .map_err(kerr("attention (decode)"))
        } else {
            attn::attention_prefill(
                &self.kernels,
                &self.stream,
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

    fn gated(
        &mut self,
        gate: &mut GpuBuffer,
        up: &GpuBuffer,
        len: usize,
        act: GateActivation,
    ) -> Result<()> {
        elementwise::gated(
            &self.kernels,
            &self.stream,
            &mut gate.view_mut(),
            up.view(),
            len,
            gate_activation(act),
        )
        .map_err(kerr("gated"))
    }

    fn add(&mut self, x: &mut GpuBuffer, y: &GpuBuffer, len: usize) -> Result<()> {
        elementwise::add(
            &self.kernels,
            &self.stream,
            &mut x.view_mut(),
            y.view(),
            len,
        )
        .map_err(kerr("add"))
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
        .map_err(kerr("copy_row"))
    }

    fn zero(&mut self, x: &mut GpuBuffer, len: usize) -> Result<()> {
        elementwise::zero(&self.kernels, &self.stream, &mut x.view_mut(), len).map_err(kerr("zero"))
    }

    fn argmax(&mut self, x: &GpuBuffer, row: usize, n: usize) -> Result<u32> {
        self.argmax_to_step(x, row, n)?;
        self.read_next_token()
    }
}

impl GpuBackend {
    /// Writes the index of the largest of `n` values of row `row` into the step block's
    /// next-token slot, on the device.
    pub fn argmax_to_step(&mut self, x: &GpuBuffer, row: usize, n: usize) -> Result<()> {
        let logits = x.view().slice(row * n, n).ok_or_else(|| {
            DecodeError::InvalidArgument(format!("argmax row {row} of {n} is out of range"))
        })?;
        if self.scratch.argmax.is_none() {
            self.scratch.argmax = Some(self.device_alloc(
                Tag::Workspace,
                sampling::ARGMAX_WORKSPACE * 8,
                "argmax workspace",
            )?);
        }
        let ws_ptr = self
            .scratch
            .argmax
            .as_ref()
            .map(|a| a.ptr())
            .unwrap_or_default();
        // SAFETY: the workspace holds ARGMAX_WORKSPACE u64 and lives as long as `self`.
        let mut ws = unsafe { DeviceSliceMut::<u64>::from_raw(ws_ptr, sampling::ARGMAX_WORKSPACE) };
        let mut out = self.step.next_token();
        sampling::argmax(&self.kernels, &self.stream, logits, n, &mut ws, &mut out)
            .map_err(kerr("argmax"))
    }
}

fn gate_activation(act: GateActivation) -> elementwise::GateActivation {
    match act {
        GateActivation::Silu => elementwise::GateActivation::Silu,
        GateActivation::GeluTanh => elementwise::GateActivation::GeluTanh,
    }
}

//! Opening the backend on a device, and its settings and handles.

use crate::backend::gpu::offload::hybrid;
use crate::backend::gpu::offload::prefetch::HostPrefill;
use crate::backend::gpu::vendor_gemm::{PrefillPath, VendorGemm, GPU_PREFILL};
use crate::backend::gpu::{
    capture_stream, error::gpu_err, launch::elementwise_zero_i32, weight_block, EmbedTable,
    GpuBackend, GpuConfig, HostPlacement, KvType, MatvecPath, MoeGrouped, MoeIndex, Scratch,
    StepBlock, WeightMemory,
};
use crate::backend::Phase;
use crate::error::{DecodeError, Result};
use crate::layout::workspace;
use gguf_loader::GgmlType;
use hip_ffi::{Device, Event, PinnedHostBuffer, Stream};
use offload::Placement;
use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{Allocator, AllocatorConfig, StreamId, Tag};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::ops::matmul_q8_mma;
use rocm_kernels::Kernels;
use std::collections::HashMap;
use std::sync::Arc;

impl GpuBackend {
    /// Opens `device`, creates the allocator (limits from the environment, as documented in
    /// docs/memory.md), compiles or loads the kernels, and reserves the step block; the
    /// settings are the process environment's ([`GpuConfig::from_process`]).
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
        let config = GpuConfig::from_process()?;
        Self::with_config(device, max_batch, use_graphs, memory_limit, &config)
    }

    /// [`GpuBackend::with_memory_limit`] with the settings given (read once by the program).
    pub fn with_config(
        device: Device,
        max_batch: usize,
        use_graphs: bool,
        memory_limit: Option<u64>,
        config: &GpuConfig,
    ) -> Result<GpuBackend> {
        let mem_before = device
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let hip = Arc::new(HipDevice::new(device));
        let alloc_config = AllocatorConfig {
            memory_limit: memory_limit.map(rocm_alloc::limits::LimitSpec::Bytes),
            ..AllocatorConfig::default()
        };
        let alloc = Arc::new(
            Allocator::new(hip.clone(), alloc_config)
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
                crate::layout::workspace::step_block_bytes(max_batch)? as u64,
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
        let capture = capture_stream::CaptureState::with(
            &hip,
            &device,
            &alloc,
            stream_id,
            config.capture_stream,
            config.graph_pool,
        )?;
        let step = StepBlock {
            ints,
            staging,
            copied,
            max_batch,
        };
        let (vendor_gemm, vendor_gemm_absent) = match config.prefill_path {
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
            matvec_path: config.matvec_path,
            mma_max_rows: config.mma_max_rows,
            int8_mma_max_rows: config.int8_mma_max_rows,
            moe_grouped: config.moe_grouped,
            moe_index: config.moe_index,
            embed_table: config.embed_table,
            kv_pool: config.kv_pool,
            attn_prefill: config.attn_prefill,
            attn_decode: config.attn_decode,
            kv_type: config.kv_type,
            vendor_gemm,
            vendor_gemm_absent,
            largest_matrix: (0, 0),
            host_matrices: Vec::new(),
            host_prefill: config.host_prefill,
            prefetch: None,
            step_runs: Vec::new(),
            step_tokens: 0,
            tables: None,
            moe_shape: None,
            step_phase: Phase::Prefill,
            profile: None,
            graphs: HashMap::new(),
            graph_rows: config.graph_rows,
            collective: None,
            graph_pool,
            capture,
            host_weights: Default::default(),
            weight_block: None,
            reserved_weight_bytes: 0,
            hybrid: hybrid::Hybrid::new(config.cpu_share),
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

    /// Sizes the block for the device weights of a model about to load: the pieces of every
    /// weight that `load_weight` will put in device memory. A budget run's plan has sized the
    /// block already and keeps it. Each load starts a block of its own: the last one's pieces
    /// keep theirs alive, and only as long as its model holds them.
    pub(super) fn size_weight_block(
        &mut self,
        weights: &[crate::layout::weights::LoadedWeight],
    ) -> Result<()> {
        if self.host_weights.device_weight_bytes() > 0 {
            return Ok(());
        }
        let mut bytes = 0u64;
        for w in weights {
            let lookup_on_host = matches!(w.tensor.kind, offload::TensorKind::Lookup { .. })
                && self.embed_table == EmbedTable::Host;
            if !lookup_on_host
                && self.host_weights.placement_of(&w.tensor.name) == Placement::Device
            {
                bytes = bytes.saturating_add(weight_block::piece_bytes(w.tensor.bytes));
            }
        }
        self.weight_block = None;
        self.reserved_weight_bytes = bytes;
        Ok(())
    }

    /// Device memory for a weight of `len` bytes: a piece of the weight block (made on the
    /// first call) when a budget run's plan or [`GpuBackend::size_weight_block`] sized one and
    /// the weight fits in what is left, else an allocation of its own. One block leaves no
    /// segment tails between weights: tensors under 10 MiB share 20 MiB segments and larger
    /// ones are rounded to 2 MiB, which left 70 MiB of the 8B shape's weights unusable.
    pub(super) fn device_weight(&mut self, len: usize, name: &str) -> Result<WeightMemory> {
        let block_bytes = match self.host_weights.device_weight_bytes() {
            0 => self.reserved_weight_bytes,
            planned => planned,
        };
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

    /// Bytes of the placement's weights pinned in host memory (lookup tables apart:
    /// [`GpuBackend::pinned_lookup_bytes`]).
    pub fn pinned_weight_bytes(&self) -> u64 {
        self.host_weights.pinned_bytes()
    }

    /// Bytes of lookup tables (an untied embedding) kept in pinned host memory whatever the
    /// placement (`HIPDECODE_GPU_EMBED_TABLE=host`).
    pub fn pinned_lookup_bytes(&self) -> u64 {
        self.host_weights.lookup_bytes()
    }

    /// Switches how matrix-vector products read activations (tests run both paths; users set
    /// `MATVEC_PATH`).
    pub fn set_matvec_path(&mut self, path: MatvecPath) {
        self.matvec_path = path;
    }

    /// Switches the products of the grouped MoE prefill (tests run both; users set
    /// `HIPDECODE_GPU_MOE_GROUPED`).
    pub fn set_moe_grouped(&mut self, products: MoeGrouped) {
        self.moe_grouped = products;
    }

    /// Switches where the grouped MoE prefill builds its index (tests run both; users set
    /// `HIPDECODE_GPU_MOE_INDEX`).
    pub fn set_moe_index(&mut self, index: MoeIndex) {
        self.moe_index = index;
    }

    /// Whether the grouped MoE prefill runs experts of these gate, up and down formats in
    /// place, on the int8 matrix-core kernel (else on the vendor GEMM): asked for, the int8
    /// path, native matrix cores and a kernel for each format. (The prefill also needs the
    /// matrices in device memory and aligned, as GGUF tensors are.)
    pub fn moe_grouped_in_place(&self, formats: [GgmlType; 3]) -> bool {
        self.moe_grouped == MoeGrouped::Int8
            && self.matvec_path == MatvecPath::Int8
            && self.kernels.mma_variant().is_native()
            && formats.iter().all(|f| matmul_q8_mma::FORMATS.contains(f))
    }

    /// Sets how prefill reads weights in pinned host memory (before the model loads; tests and
    /// A/B runs, users set `prefetch::OFFLOAD_PREFILL`).
    pub fn set_host_prefill(&mut self, mode: HostPrefill) {
        self.host_prefill = mode;
    }

    /// The matrix-vector path in use.
    pub fn matvec_path(&self) -> MatvecPath {
        self.matvec_path
    }

    /// Whether a product of `rows` token rows by a device-resident matrix of `format` runs on
    /// the int8 matrix-core kernel (8-bit activations; `HIPDECODE_GPU_INT8_MMA_ROWS`), given the
    /// alignment GGUF files keep.
    pub fn int8_matrix_cores_take(&self, rows: usize, format: GgmlType) -> bool {
        self.matvec_path == MatvecPath::Int8
            && workspace::int8_matrix_cores_take(
                rows,
                self.int8_mma_max_rows,
                self.kernels.mma_variant().is_native(),
            )
            && matmul_q8_mma::FORMATS.contains(&format)
    }

    /// This backend as one rank of a tensor-parallel group whose all-reduces go through host
    /// memory (the in-process collective): each one waits for the stream, reads the partial
    /// sums back, adds them with the other ranks' and writes the whole back. Slow, and never
    /// in a captured graph, but it runs a split model's GPU kernels on one device, as the
    /// tests do; NCCL or RCCL on the device is what a multi-GPU run needs.
    pub fn with_host_collective(mut self, collective: Box<dyn collective::Collective>) -> Self {
        self.collective = Some(collective);
        self
    }

    /// Stops this rank's tensor-parallel group with `reason`; nothing without a collective.
    pub fn abort_collective(&mut self, reason: &str) {
        if let Some(c) = self.collective.as_mut() {
            c.abort(reason);
        }
    }

    /// Switches which row counts decode graphs are captured for (tests run both; users set
    /// `HIPDECODE_GPU_GRAPH_ROWS`).
    pub fn set_graph_rows(&mut self, rows: crate::backend::gpu::GraphRows) {
        self.graph_rows = rows;
    }

    /// Sets the element type of KV caches allocated from now on (before a model is loaded).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv_type = kv;
    }

    /// Whether the vendor GEMM's library opened (so prefill reserves its buffers; the layout
    /// assumes it does unless `HIPDECODE_GPU_PREFILL=kernels`).
    pub fn has_vendor_gemm(&self) -> bool {
        self.vendor_gemm.is_some()
    }

    /// The KV cache element type for new caches.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
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
}

//! The [`Backend`] trait on the GPU: each op a rocm-kernels kernel queued on the backend's
//! stream.

use crate::backend::gpu::offload::host_weights;
use crate::backend::gpu::offload::prefetch::{HostPrefill, Prefetch};
use crate::backend::gpu::profile::{self, OpProfile};
use crate::backend::gpu::{
    buffer::{BufferMemory, Elem},
    error::{gpu_err, kerr},
    graph_rows, CpuShare, EmbedTable, GpuBackend, GpuBuffer, GpuWeight, GraphRows, KvType,
    MatvecPath, ReadPath, StepRun, INT8_MAX_ROWS,
};
use crate::backend::{
    Attention, Backend, BlockTables, GateActivation, KvDestination, KvGroup, KvLayer, MoeShape,
    Phase, Rope, StepBatch, StepBounds, StepKey, WeightSource,
};
use crate::error::{DecodeError, Result};
use crate::layout::workspace;
use crate::memory::{DeviceMemory, MemoryReport, MemoryTag};
use hip_ffi::DevicePtr;
use offload::Placement;
use rocm_alloc::Tag;
use rocm_kernels::ops::{
    elementwise, embed, kv_cache, matmul, matmul_mma, matmul_q8_mma,
    matvec::MAX_TOKENS,
    matvec_q8::{self},
    moe, norm, rope, sampling,
};
use rocm_kernels::{DeviceSlice, DeviceSliceMut};
use std::sync::Arc;

impl Backend for GpuBackend {
    type Buffer = GpuBuffer;
    type Weight = GpuWeight;

    fn describe(&self) -> String {
        format!(
            "gpu ({}, wave {}, {} matvec, {} KV, prefill on {})",
            self.alloc.device_name(),
            self.kernels.wave_size(),
            match self.matvec_path {
                MatvecPath::Int8 => "int8",
                MatvecPath::Exact => "exact f32",
            },
            self.kv_type,
            match (&self.vendor_gemm, &self.vendor_gemm_absent) {
                (Some(v), _) if self.matvec_path == MatvecPath::Int8 => v.describe(),
                (Some(_), _) => "kernels (exact path)".into(),
                (None, Some(why)) => format!("kernels ({why})"),
                (None, None) => "kernels".into(),
            }
        )
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    fn alloc(&mut self, tag: MemoryTag, len: usize) -> Result<GpuBuffer> {
        let (kv, bytes, what) = self.buffer_bytes(tag, len)?;
        let mem = self.device_alloc(tag, bytes, &what)?;
        self.zero_bytes(mem.ptr(), 0, bytes as u64, &what)?;
        Ok(GpuBuffer::with_elem(
            BufferMemory::Pooled(mem),
            len,
            Elem::of(kv),
        ))
    }

    fn alloc_together(&mut self, tag: MemoryTag, lens: &[usize]) -> Result<Vec<GpuBuffer>> {
        if lens.len() < 2 {
            return lens.iter().map(|&len| self.alloc(tag, len)).collect();
        }
        // Each piece rounded as the weight block's are: the allocator's granularity, which
        // keeps every buffer 256-byte aligned for the vector loads.
        let mut pieces = Vec::with_capacity(lens.len());
        let mut total = 0u64;
        for &len in lens {
            let (kv, bytes, _) = self.buffer_bytes(tag, len)?;
            pieces.push((total, kv, len));
            total = total.saturating_add(crate::backend::gpu::weight_piece_bytes(bytes as u64));
        }
        let what = format!("{} buffers of {} together", lens.len(), tag.name());
        let bytes = usize::try_from(total).map_err(|_| DecodeError::Allocation {
            what: what.clone(),
            reason: "the byte count overflows".into(),
        })?;
        let mem = self.device_alloc(tag, bytes, &what)?;
        self.zero_bytes(mem.ptr(), 0, total, &what)?;
        let block = Arc::new(mem);
        Ok(pieces
            .into_iter()
            .map(|(offset, kv, len)| {
                let piece = BufferMemory::Piece {
                    block: Arc::clone(&block),
                    offset,
                };
                GpuBuffer::with_elem(piece, len, Elem::of(kv))
            })
            .collect())
    }

    fn alloc_growable(&mut self, tag: MemoryTag, len: usize) -> Result<GpuBuffer> {
        if self.kv_pool == crate::backend::gpu::KvPool::Whole {
            return self.alloc(tag, len);
        }
        let (kv, bytes, what) = self.buffer_bytes(tag, len)?;
        let region = self
            .alloc
            .reserve_growable(bytes.max(1) as u64, self.stream_id, tag)
            .map_err(|e| DecodeError::Allocation {
                what: what.clone(),
                reason: e.to_string(),
            })?;
        if !region.grows() {
            // Taken whole: zeroed whole, as `alloc` does.
            self.zero_bytes(region.ptr(), 0, region.capacity(), &what)?;
        }
        Ok(GpuBuffer::with_elem(
            BufferMemory::Region(region),
            len,
            Elem::of(kv),
        ))
    }

    fn commit(&mut self, buffer: &mut GpuBuffer, len: usize) -> Result<()> {
        let what = format!("{len} of {} values of a growing buffer", buffer.len);
        let Some((region, bytes)) = growing_prefix(buffer, len, &what)? else {
            return Ok(());
        };
        let before = region.committed();
        let grown =
            region
                .commit(bytes.min(region.capacity()))
                .map_err(|e| DecodeError::Allocation {
                    what: what.clone(),
                    reason: e.to_string(),
                })?;
        if grown > 0 {
            let base = region.ptr();
            self.zero_bytes(base, before, grown, &what)?;
        }
        Ok(())
    }

    fn release_beyond(&mut self, buffer: &mut GpuBuffer, len: usize) -> Result<()> {
        let what = format!("the growing buffer beyond {len} of {} values", buffer.len);
        let Some((region, bytes)) = growing_prefix(buffer, len, &what)? else {
            return Ok(());
        };
        region
            .shrink_to(bytes)
            .map(drop)
            .map_err(|e| DecodeError::Allocation {
                what,
                reason: e.to_string(),
            })
    }

    fn reserve_weights(&mut self, weights: &[crate::layout::weights::LoadedWeight]) -> Result<()> {
        self.size_weight_block(weights)
    }

    fn load_weight(&mut self, src: &WeightSource<'_>) -> Result<GpuWeight> {
        src.check_bytes()?;
        let [cols, rows, mats] = src.dims;
        let placement = self.host_weights.placement_of(src.name);
        if placement == Placement::Streamed && (rows == 1 || mats > 1) {
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
        if src.lookup_only && self.embed_table == EmbedTable::Host {
            // No product reads it, so it neither joins `host_matrices` (the prefetch slots'
            // sizes) nor splits with the host's cores: the lookup kernel reads a row a token.
            let mem = self.host_weights.place_lookup(
                self.hip.device(),
                src,
                crate::budget_run::unflagged_host_budget,
            )?;
            return Ok(GpuWeight::Matrix {
                mem,
                format: src.format,
                dims: src.dims,
                name: src.name.to_string(),
                read: ReadPath::ZeroCopy,
            });
        }
        let (mem, read) = match self.host_weights.place(self.hip.device(), src, src.bytes)? {
            Some(pinned) => {
                // A product covers the whole matrix, or one expert of a stacked one.
                self.host_matrices
                    .push((rows, cols, src.bytes.len() / (rows * mats).max(1)));
                let read = match placement {
                    Placement::Streamed => ReadPath::Streamed,
                    _ if self.hybrid.setting() != CpuShare::Off => ReadPath::Split,
                    _ => ReadPath::ZeroCopy,
                };
                (pinned, read)
            }
            None => {
                let mem = self.device_weight(src.bytes.len(), src.name)?;
                self.upload(mem.ptr(), src.bytes)?;
                (mem, ReadPath::Resident)
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
            read,
        })
    }

    fn device_report(&self) -> Option<Result<String>> {
        Some(self.device_report_text())
    }

    fn device_room(&self) -> Option<Result<crate::memory::DeviceRoom>> {
        Some(self.device_room_now())
    }

    fn kv_room(&self) -> Option<(u64, String)> {
        // A cache larger than the device has free, or than the allocator's limit still allows,
        // can never be allocated (or, for a growing pool, never grow whole): refused by name
        // before the allocator's OOM report. A failed query leaves that report to speak.
        let room = self.device_room_now().ok()?;
        // The allocator releases its idle cache (a load's freed staging buffers) before it
        // would fail, so those bytes count as room on both sides.
        let idle = self.alloc.stats().releasable_bytes;
        let free = room.free.saturating_add(idle);
        Some(
            match room.allocator_headroom.map(|h| h.saturating_add(idle)) {
                Some(headroom) if headroom < free => (
                    headroom,
                    "that the allocator's memory limit still allows (HIPDECODE_MEMORY_LIMIT or a \
                 GPU budget)"
                        .to_string(),
                ),
                _ => (free, "free on the device".to_string()),
            },
        )
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
        // Every size below is the layout's (`crate::layout::workspace`), which `ModelLayout`
        // lists in this same order.
        let attention = workspace::attention_partials_floats(&bounds.decode_attention)?;
        Self::scratch_buffer(
            &mut self.scratch.attention,
            a,
            st,
            attention,
            "attention workspace",
        )?;
        self.reserve_block_tables(bounds.max_tokens, bounds.table_entries)?;
        self.argmax_workspace()?;
        self.reserve_draw()?;
        let int8 = self.matvec_path == MatvecPath::Int8;
        let vendor =
            workspace::vendor_gemm_applies(int8, self.vendor_gemm.is_some(), bounds.max_tokens);
        self.moe_shape = bounds.moe;
        if let Some(moe) = &bounds.moe {
            let m = workspace::moe_scratch(bounds.max_tokens, moe.n_embd, moe.n_ff, moe.k)?;
            self.moe_ids_scratch(m.pairs)?;
            let s = &mut self.scratch;
            Self::scratch_buffer(&mut s.moe_weights, a, st, m.pairs, "moe weights")?;
            Self::scratch_buffer(&mut s.moe_gate, a, st, m.hidden_floats, "moe gate")?;
            Self::scratch_buffer(&mut s.moe_up, a, st, m.hidden_floats, "moe up")?;
            Self::scratch_buffer(&mut s.moe_out, a, st, m.out_floats, "moe out")?;
            if int8 {
                self.moe_q8_scratch(m.q8_values)?;
            }
            if vendor {
                self.reserve_moe_prefill(&MoeShape {
                    rows: bounds.max_tokens,
                    ..*moe
                })?;
            }
        }
        let mut slot = self.host_weights.stream_slot_bytes() as usize;
        if let Some(v) = self.vendor_gemm.as_mut().filter(|_| vendor) {
            let (values, cols) = self.largest_matrix;
            v.reserve(a, st, bounds.max_tokens, values, cols)?;
            if self.host_prefill == HostPrefill::Stream {
                let block = workspace::weight_block_values(values, cols);
                slot = slot.max(workspace::prefetch_slot_bytes(&self.host_matrices, block));
            }
        }
        if slot > 0 && self.prefetch.as_ref().is_none_or(|p| p.slot_bytes() < slot) {
            // The smaller slots go back first, so the budget never holds both pairs.
            self.prefetch = None;
            self.prefetch = Some(Prefetch::new(a, st, &self.stream, slot)?);
        }
        if int8 {
            for &(buf, width) in matmul_inputs {
                let capacity = workspace::q8_input_capacity(
                    bounds.max_tokens,
                    self.int8_mma_max_rows,
                    width,
                    buf.len,
                );
                self.reserve_q8_shadow(buf, capacity)?;
            }
        }
        Ok(())
    }

    fn begin_step(&mut self, batch: &StepBatch, tables: &BlockTables) -> Result<()> {
        if batch.is_empty() {
            return Err(DecodeError::InvalidArgument(
                "an empty step batch: give at least one row".into(),
            ));
        }
        let tokens = batch.tokens();
        if let Some(p) = &mut self.profile {
            // The previous step's events are read before its staging is reused.
            p.finish_step().map_err(|e| gpu_err("profiling", e))?;
        }
        self.write_step(batch.positions(), tokens)?;
        self.write_block_tables(batch.sequences(), batch.padding(), tables)?;
        // Runs of one sequence's consecutive rows: prefill attention takes each apart.
        self.step_runs.clear();
        for (i, (&seq, &pos)) in batch.sequences().iter().zip(batch.positions()).enumerate() {
            match self.step_runs.last_mut() {
                Some(run) if batch.sequences()[run.start] == seq && run.last + 1 == pos => {
                    run.rows += 1;
                    run.last = pos;
                }
                _ => self.step_runs.push(StepRun {
                    start: i,
                    rows: 1,
                    last: pos,
                }),
            }
        }
        self.step_tokens = tokens.len();
        self.step_phase = batch.phase();
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

    fn bucket_rows(&self, key: StepKey) -> usize {
        let rows = graph_rows::bucket(key.n_tokens).min(self.step.max_batch);
        let padded = StepKey {
            n_tokens: rows,
            n_outputs: rows,
            ..key
        };
        match self.graph_rows == GraphRows::Buckets && self.captures(padded) {
            true => rows.max(key.n_tokens),
            false => key.n_tokens,
        }
    }

    fn all_reduce_sum(&mut self, x: &mut GpuBuffer, len: usize) -> Result<()> {
        if x.elem != Elem::F32 {
            return Err(DecodeError::InvalidArgument(format!(
                "all_reduce_sum of a {:?} buffer; the sums are of f32 activations",
                x.elem
            )));
        }
        let Some(mut comm) = self.collective.take() else {
            return Err(crate::backend::no_collective());
        };
        let mut host = vec![0.0f32; len];
        let summed = self
            .read(x, 0, &mut host)
            .and_then(|()| comm.all_reduce_sum(&mut host).map_err(DecodeError::from))
            .and_then(|()| self.write(x, 0, &host));
        if let Err(e) = &summed {
            comm.abort(&e.to_string());
        }
        self.collective = Some(comm);
        summed
    }

    fn all_gather_cols(&mut self, x: &mut GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        let Some(mut comm) = self.collective.take() else {
            return Err(crate::backend::no_collective());
        };
        let mut host = vec![0.0f32; rows * cols * comm.ranks()];
        let joined = self
            .read(x, 0, &mut host[..rows * cols])
            .and_then(|()| {
                crate::backend::gather_cols_on_host(comm.as_mut(), &mut host, rows, cols)
            })
            .and_then(|()| self.write(x, 0, &host));
        if let Err(e) = &joined {
            comm.abort(&e.to_string());
        }
        self.collective = Some(comm);
        joined
    }

    fn graphs_captured(&self) -> usize {
        self.graphs.len()
    }

    fn run_step(
        &mut self,
        key: StepKey,
        ops: &mut dyn FnMut(&mut Self) -> Result<()>,
    ) -> Result<()> {
        if !self.captures(key) {
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
        if src.elem == Elem::Q8_0 {
            // Whole blocks around the range, dequantized on the host (tests read caches).
            let block = rocm_kernels::reference::kv_q8::Q8_0_BLOCK;
            let first = offset / block;
            let end = (offset + dst.len()).div_ceil(block);
            let mut blocks = vec![0u8; src.elem.bytes((end - first) * block)];
            let at = src.elem.bytes(first * block) as u64;
            // SAFETY: blocks `first..end` lie inside the buffer (the range is, and the buffer
            // is whole blocks); the stream is idle and the copy is synchronized before use.
            unsafe {
                self.stream
                    .copy_to_host_raw(&mut blocks, DevicePtr(src.mem.ptr() + at))
            }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("reading from the device", e))?;
            let skip = offset - first * block;
            for (i, d) in dst.iter_mut().enumerate() {
                *d = rocm_kernels::reference::kv_q8::q8_0_value(&blocks, skip + i);
            }
            return Ok(());
        }
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
        let streamed = w.host_bytes_for(ReadPath::Streamed);
        if let Some(host) = w.host_bytes_for(ReadPath::Split).filter(|_| {
            rows == 1 && self.matvec_path == MatvecPath::Int8 && matvec_q8::supports(m.format())
        }) {
            if self.matvec_split(&m, host, x, out)? {
                return Ok(());
            }
        }
        // Weights in host memory stay on the vendor GEMM, which streams them to the device
        // block by block; the matrix-core kernels would read them over the link per row tile.
        if w.host_bytes().is_none()
            && self.int8_matrix_cores_take(rows, m.format())
            && matmul_q8_mma::takes(&m)
        {
            return self.matmul_int8_mma(&m, x, out, rows);
        }
        let on_matrix_cores = self.matvec_path == MatvecPath::Int8
            && w.host_bytes().is_none()
            && workspace::matrix_cores_take(
                rows,
                self.mma_max_rows,
                self.kernels.mma_variant().is_native(),
            );
        if self.matvec_path == MatvecPath::Int8 && !on_matrix_cores {
            if let Some(v) = self.vendor_gemm.as_mut().filter(|v| v.takes(&m, rows)) {
                let host = w
                    .host_bytes()
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
        } else if on_matrix_cores {
            // The split partials borrow the vendor GEMM's weight block, idle during this product.
            let mut partials = self
                .vendor_gemm
                .as_ref()
                .and_then(|v| v.weight_block_as_f32());
            let (x, mut o) = (x.view(), out.view_mut());
            match partials.as_mut() {
                Some(p) => matmul_mma::matmul_mma_split(
                    &self.kernels,
                    &self.stream,
                    &m,
                    x,
                    &mut o,
                    rows,
                    p,
                )
                .map(|_| ()),
                None => matmul_mma::matmul_mma(&self.kernels, &self.stream, &m, x, &mut o, rows),
            }
            .map_err(kerr("matmul (matrix cores)"))?;
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
        let kind = match (int8, on_matrix_cores, rows <= MAX_TOKENS) {
            (true, _, _) => "matvec int8",
            (false, true, _) => "matmul mma",
            (false, false, true) => "matvec f32",
            (false, false, false) => "matmul f32",
        };
        // The matrix-core kernel reads the weights once per tile of token rows.
        let weight_reads = if on_matrix_cores {
            rows.div_ceil(matmul_mma::TILE_TOKENS)
        } else {
            1
        };
        self.op_done(
            || format!("{kind} {} {}x{}", m.format().name(), m.rows(), m.cols()),
            (weight_reads * m.data().len() + rows * (m.rows() + m.cols()) * 4) as u64,
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
        let offloaded = [w, w2]
            .iter()
            .any(|w| matches!(w.read_path(), ReadPath::Split | ReadPath::Streamed));
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
            let hosts = [gate, up, down].map(GpuWeight::host_bytes);
            self.moe_prefill(x, router_logits, [&g, &u, &d], hosts, out, shape)?;
            let bytes = g.data().len() + u.data().len() + d.data().len();
            return self.op_done(|| format!("moe vendor gemm {format}"), bytes as u64);
        }
        let hosts = [gate, up, down].map(GpuWeight::host_bytes);
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
        let ids = self.route_moe_rows(router_logits, shape, &mut weights)?;
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
        // head_dim) into float caches of one element type; anything else (a q8_0 cache, whose
        // blocks need a reduction over 32 values the rope kernel does not do) takes the two
        // ops.
        let fused = kv.k_cache.elem == kv.v_cache.elem
            && kv.k_cache.elem != Elem::Q8_0
            && kv.k_dim == n_head_kv * head_dim;
        if !fused {
            let heads = (n_head, n_head_kv, head_dim);
            return crate::backend::rope_qk_then_store_kv(
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
        let (v_dim, layer) = (kv.v_dim, kv.layer);
        let pages = self.kv_pages(layer.group, 0, rows)?;
        let store = rope::KvStore {
            v: &v.view(),
            dim_v: v_dim,
            k_cache: &mut kv.k_cache.kv_view_mut(),
            v_cache: &mut kv.v_cache.kv_view_mut(),
            slots: layer.slots,
            pages: Some(pages),
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
        layer: KvLayer,
    ) -> Result<()> {
        if k_cache.elem != v_cache.elem {
            self.store_rows(k, k_cache, rows, k_dim, layer)?;
            return self.store_rows(v, v_cache, rows, v_dim, layer);
        }
        let positions = self.step.positions();
        let pages = self.kv_pages(layer.group, 0, rows)?;
        kv_cache::store_kv(
            &self.kernels,
            &self.stream,
            &k.view(),
            &v.view(),
            &mut k_cache.kv_view_mut(),
            &mut v_cache.kv_view_mut(),
            &positions,
            Some(&pages),
            kv_cache::KvStoreShape {
                rows,
                dim_k: k_dim,
                dim_v: v_dim,
                slots: layer.slots,
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
            rope_params,
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
        layer: KvLayer,
    ) -> Result<()> {
        let positions = self.step.positions();
        let pages = self.kv_pages(layer.group, 0, rows)?;
        kv_cache::store_rows(
            &self.kernels,
            &self.stream,
            &src.view(),
            &mut cache.kv_view_mut(),
            &positions,
            Some(&pages),
            rows,
            dim,
            layer.slots,
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
        group: KvGroup,
    ) -> Result<()> {
        self.attention_queued(q, k_cache, v_cache, out, shape, group)?;
        // Keys and values read: every cached position each run's last row sees.
        let seen: usize = (self.step_runs.iter())
            .map(|r| {
                (r.last + 1)
                    .min(shape.slots)
                    .min(shape.window.unwrap_or(usize::MAX))
            })
            .sum();
        let row_values = shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v);
        let kv_bytes = seen * k_cache.elem.bytes(row_values);
        let kind = match self.step_phase {
            Phase::Decode => "decode",
            Phase::Prefill => "prefill",
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
            && len.is_multiple_of(matvec_q8::GROUP)
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
                act,
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
            act,
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

    fn softcap(&mut self, x: &mut GpuBuffer, len: usize, cap: f32) -> Result<()> {
        elementwise::softcap(&self.kernels, &self.stream, &mut x.view_mut(), len, cap)
            .map_err(kerr("softcap"))?;
        self.op_done(|| "softcap".into(), (2 * len * 4) as u64)
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

    fn copy_blocks(
        &mut self,
        cache: &mut GpuBuffer,
        copies: &[(usize, usize)],
        block_values: usize,
    ) -> Result<()> {
        // Copied as 32-bit words: an f16 block of an even number of values is half as many,
        // a q8_0 block of an even number of 34-byte blocks a whole number too.
        let block_bytes = cache.elem.kv_type().bytes(block_values);
        let Some(block_bytes) = block_bytes.filter(|b| b % 4 == 0) else {
            return Err(DecodeError::InvalidArgument(format!(
                "a KV block of {block_values} {:?} values is not whole 32-bit words",
                cache.elem
            )));
        };
        let (words, total) = (block_bytes / 4, cache.elem.bytes(cache.len) / 4);
        for &(from, to) in copies {
            let end = from.max(to).saturating_add(1).saturating_mul(words);
            if end > total || from == to {
                return Err(DecodeError::InvalidArgument(format!(
                    "a copy of KV block {from} to {to} outside a cache of {} blocks",
                    total / words.max(1)
                )));
            }
            // SAFETY: both views cover the cache's own memory (`total` words, its `len`
            // elements), which lives as long as `cache`; the copy reads block `from` and writes
            // block `to`, which differ, so the ranges do not overlap, and the kernel runs on the
            // backend's one stream like every other use of the cache.
            let (src, mut dst) = unsafe {
                (
                    DeviceSlice::<f32>::from_raw(cache.mem.ptr(), total),
                    DeviceSliceMut::<f32>::from_raw(cache.mem.ptr(), total),
                )
            };
            elementwise::copy_rows(
                &self.kernels,
                &self.stream,
                src,
                from,
                &mut dst,
                to,
                1,
                words,
            )
            .map_err(kerr("copy KV block"))?;
        }
        cache.version += 1;
        self.op_done(
            || "copy KV blocks".into(),
            (2 * copies.len() * block_bytes) as u64,
        )
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

    fn argmax_rows(
        &mut self,
        x: &GpuBuffer,
        first_row: usize,
        n_rows: usize,
        n: usize,
    ) -> Result<Vec<u32>> {
        match n_rows {
            0 => Ok(Vec::new()),
            // A lone row is read faster by the two-pass argmax's many blocks.
            1 => Ok(vec![self.argmax(x, first_row, n)?]),
            _ => {
                self.argmax_rows_to_step(x, first_row, n_rows, n)?;
                self.read_next_tokens(n_rows)
            }
        }
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
            // The device kernel knows greedy as 0; the chain's greedy threshold is the host's.
            temperature: if config.is_greedy() {
                0.0
            } else {
                config.temperature
            },
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

/// The region behind a growing buffer and the bytes of its first `len` values, in whole blocks
/// of its element type (`None` for a buffer that does not grow); `what` names it in errors.
fn growing_prefix<'a>(
    buffer: &'a mut GpuBuffer,
    len: usize,
    what: &str,
) -> Result<Option<(&'a mut rocm_alloc::GrowableRegion, u64)>> {
    let total = buffer.len;
    let len = len.min(total);
    let kv = buffer.elem.kv_type();
    let BufferMemory::Region(region) = &mut buffer.mem else {
        return Ok(None);
    };
    let bytes = kv
        .bytes(len.next_multiple_of(kv.block_values()).min(total))
        .ok_or_else(|| DecodeError::Allocation {
            what: what.to_string(),
            reason: "the byte count overflows".into(),
        })?;
    Ok(Some((region, bytes as u64)))
}

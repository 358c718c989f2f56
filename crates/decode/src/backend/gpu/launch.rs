//! Launch helpers shared by the ops: profiling marks, copies, and the fused rope, norm and
//! attention launches.

use crate::backend::gpu::{
    error::{gpu_err, kerr},
    GpuBackend, GpuBuffer, GpuWeight, MatvecPath, INT8_MAX_ROWS,
};
use crate::backend::{Attention, KvGroup, Phase, Rope};
use crate::error::{DecodeError, Result};
use hip_ffi::DevicePtr;
use rocm_alloc::{Allocation, Tag};
use rocm_kernels::ops::{
    attention as attn, elementwise,
    matvec_q8::{self},
    norm, rope, sampling,
};
use rocm_kernels::DeviceSliceMut;

impl GpuBackend {
    /// Marks the end of an op for the profile (nothing when not profiling).
    pub(super) fn op_done(&mut self, label: impl FnOnce() -> String, bytes: u64) -> Result<()> {
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        let device = *self.kernels.device();
        p.op_done(&device, &self.stream, label(), bytes)
            .map_err(|e| gpu_err("profiling", e))
    }

    pub(super) fn device_alloc(&self, tag: Tag, bytes: usize, what: &str) -> Result<Allocation> {
        self.alloc
            .alloc(bytes.max(1) as u64, self.stream_id, tag)
            .map_err(|e| DecodeError::Allocation {
                what: what.to_string(),
                reason: e.to_string(),
            })
    }

    /// A new buffer of `len` values under `tag`: the type it stores (a KV cache's, else f32),
    /// its bytes, and what to call it in an error.
    pub(super) fn buffer_bytes(
        &self,
        tag: Tag,
        len: usize,
    ) -> Result<(crate::backend::gpu::KvType, usize, String)> {
        let kv = match tag {
            Tag::KvCache => self.kv_type,
            _ => crate::backend::gpu::KvType::F32,
        };
        let what = format!("{len} values of {}", tag.name());
        let bytes = crate::layout::context::kv_buffer_bytes(len, kv).map_err(|_| {
            DecodeError::Allocation {
                what: what.clone(),
                reason: format!(
                    "the byte count overflows, or {len} is not whole {}-value {kv} blocks",
                    kv.block_values()
                ),
            }
        })?;
        Ok((kv, bytes, what))
    }

    /// Zeroes `bytes` (whole words) at `base + offset`, ordered on the backend's stream.
    pub(super) fn zero_bytes(&self, base: u64, offset: u64, bytes: u64, what: &str) -> Result<()> {
        let words = (bytes / 4) as usize;
        if words == 0 {
            return Ok(());
        }
        // SAFETY: callers pass memory of theirs that is backed for `bytes` from `base + offset`
        // and outlives the stream's work; the zeroing is queued on the stream every later use
        // of it follows.
        let mut view = unsafe { DeviceSliceMut::<f32>::from_raw(base + offset, words) };
        elementwise::zero(&self.kernels, &self.stream, &mut view, words).map_err(|e| {
            DecodeError::Allocation {
                what: what.to_string(),
                reason: format!("zeroing new memory: {e}"),
            }
        })
    }

    /// Copies host values to device memory, ordered on the backend's stream, and waits.
    pub(super) fn upload<T: hip_ffi::DeviceCopy>(&self, dst: u64, src: &[T]) -> Result<()> {
        // SAFETY: callers pass an allocation of at least `size_of_val(src)` bytes; the stream is
        // synchronized before returning, so `src` outlives the copy.
        unsafe { self.stream.copy_from_host_raw(DevicePtr(dst), src) }
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| gpu_err("copying to the device", e))
    }

    pub(super) fn read_i32(&self, src: u64) -> Result<i32> {
        let mut out = [0i32; 1];
        self.read_i32s(src, &mut out)?;
        Ok(out[0])
    }

    /// Copies `out.len()` i32 from device address `src` once the stream's work is done.
    pub(super) fn read_i32s(&self, src: u64, out: &mut [i32]) -> Result<()> {
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
}

impl GpuBackend {
    /// The rope of a layer's queries and keys at the step's positions, with the new K and V
    /// rows stored by the same kernel when `store` is given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_pair_queued(
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
            rope_params,
            store,
        )
        .map_err(kerr(what))
    }

    /// [`Backend::add_rms_norm`] with the residual as the kernel takes it: added as it is, or
    /// normalized first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_rms_norm_with(
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
            && dim.is_multiple_of(matvec_q8::GROUP)
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

    pub(super) fn attention_queued(
        &mut self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        out: &mut GpuBuffer,
        shape: &Attention,
        group: KvGroup,
    ) -> Result<()> {
        let s = *shape;
        let positions = self.step.positions();
        let k = k_cache.kv_view();
        let v = v_cache.kv_view();
        // A decode step (a row per sequence) takes the split decode kernel for all its rows at
        // once; a prefill step the prefill kernel, one launch per run of one sequence's rows
        // (the tiled kernel reads a tile of rows through one table).
        if self.step_phase == Phase::Decode {
            let pages = self.kv_pages(group, 0, s.n_tokens)?;
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
                && s.n_tokens <= INT8_MAX_ROWS
                && s.head_dim_v.is_multiple_of(matvec_q8::GROUP)
                && values <= out.len;
            let mut q8 = if quantize {
                Some(self.q8_shadow(out, values)?)
            } else {
                None
            };
            let quantized = attn::attention_decode_on(
                &self.kernels,
                &self.stream,
                self.attn_decode,
                &q.view(),
                &k,
                &v,
                &positions,
                Some(&pages),
                &mut out.view_mut(),
                &mut ws,
                &s,
                q8.as_mut(),
            )
            .map_err(kerr("attention (decode)"))?;
            if quantized {
                out.mark_q8_fresh(values);
            }
            return Ok(());
        }
        let (q_row, out_row) = (s.n_head * s.head_dim_k, s.n_head * s.head_dim_v);
        let short = || gpu_err("attention (prefill)", "a run of rows past the buffers");
        let (qv, mut ov) = (q.view(), out.view_mut());
        for i in 0..self.step_runs.len() {
            let run = self.step_runs[i];
            if run.start >= s.n_tokens {
                continue;
            }
            let rows = run.rows.min(s.n_tokens - run.start);
            let pages = self.kv_pages(group, run.start, rows)?;
            let run_q = qv
                .slice(run.start * q_row, rows * q_row)
                .ok_or_else(short)?;
            let mut run_out = ov
                .slice_mut(run.start * out_row, rows * out_row)
                .ok_or_else(short)?;
            let run_pos = positions.slice(run.start, rows).ok_or_else(short)?;
            let run_shape = Attention {
                n_tokens: rows,
                ..s
            };
            attn::attention_prefill_on(
                &self.kernels,
                &self.stream,
                self.attn_prefill,
                &run_q,
                &k,
                &v,
                &run_pos,
                Some(&pages),
                &mut run_out,
                &run_shape,
            )
            .map_err(kerr("attention (prefill)"))?;
        }
        Ok(())
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

    /// Writes the index of the largest of `n` values of each of rows `first_row..first_row +
    /// n_rows` into the step block's next-token slots `0..n_rows`, on the device, with one
    /// launch.
    pub fn argmax_rows_to_step(
        &mut self,
        x: &GpuBuffer,
        first_row: usize,
        n_rows: usize,
        n: usize,
    ) -> Result<()> {
        let out_of_range = || {
            DecodeError::InvalidArgument(format!(
                "argmax rows {first_row}..{} of {n} are out of range",
                first_row.saturating_add(n_rows)
            ))
        };
        let start = first_row.checked_mul(n).ok_or_else(out_of_range)?;
        let len = n_rows.checked_mul(n).ok_or_else(out_of_range)?;
        let logits = x.view().slice(start, len).ok_or_else(out_of_range)?;
        let mut out = self.step.next_tokens(n_rows)?;
        sampling::argmax_rows(&self.kernels, &self.stream, logits, n, n_rows, &mut out)
            .map_err(kerr("argmax rows"))?;
        self.op_done(|| "argmax rows".into(), (len * 4) as u64)
    }
}

pub(super) fn elementwise_zero_i32(
    backend: &mut GpuBackend,
    ints: &mut DeviceSliceMut<i32>,
) -> Result<()> {
    // SAFETY: the same memory as `ints` (the step block), viewed as f32 bit patterns: zero is
    // zero in both types.
    let mut as_f32 = unsafe { DeviceSliceMut::<f32>::from_raw(ints.addr(), ints.len()) };
    elementwise::zero(&backend.kernels, &backend.stream, &mut as_f32, ints.len())
        .map_err(|e| gpu_err("zeroing the step block", e))
}

//! Per-step scratch: taken once at the largest step, reused by every later one.

use crate::backend::gpu::{
    buffer::{q8_views, Q8Shadow},
    error::kerr,
    GpuBackend, GpuBuffer, INT8_MAX_ROWS,
};
use crate::backend::MoeShape;
use crate::error::{DecodeError, Result};
use crate::layout::workspace;
use rocm_alloc::{Allocator, StreamId, Tag};
use rocm_kernels::ops::{
    matvec_q8::{self, Q8ActivationsMut},
    moe, sampling,
};
use rocm_kernels::DeviceSliceMut;

impl GpuBackend {
    pub(super) fn scratch_buffer(
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
    pub(super) fn q8_shadow(&self, buf: &GpuBuffer, values: usize) -> Result<Q8ActivationsMut> {
        // Room for the most tokens a product takes (`reserve_workspace` has usually made it
        // so already).
        self.reserve_q8_shadow(buf, (INT8_MAX_ROWS * values).min(buf.len).max(values))?;
        let slot = buf.q8.borrow();
        Ok(slot.as_ref().expect("reserved above").views(values))
    }

    /// Gives `buf` an 8-bit shadow of at least `values` values (rounded down to whole groups),
    /// replacing a smaller one.
    pub(super) fn reserve_q8_shadow(&self, buf: &GpuBuffer, values: usize) -> Result<()> {
        let capacity = workspace::q8_capacity(values);
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
    pub(super) fn moe_ids_scratch(&mut self, pairs: usize) -> Result<DeviceSliceMut<i32>> {
        if self
            .scratch
            .moe_ids
            .as_ref()
            .is_none_or(|a| (a.size() as usize) < pairs * 4)
        {
            self.scratch.moe_ids = None;
            let bytes = workspace::moe_ids_bytes(pairs);
            self.scratch.moe_ids =
                Some(self.device_alloc(Tag::Workspace, bytes, "moe expert ids")?);
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

    /// Routes `shape.rows` rows from their router logits (`[rows][n_expert]`): each pair's
    /// expert id into the ids scratch, which is returned, and its weight into `weights`. The
    /// one routing launch of both MoE paths (decode's `moe` and `moe_prefill`).
    pub(super) fn route_moe_rows(
        &mut self,
        router_logits: &GpuBuffer,
        shape: &MoeShape,
        weights: &mut DeviceSliceMut<f32>,
    ) -> Result<DeviceSliceMut<i32>> {
        let mut ids = self.moe_ids_scratch(shape.rows * shape.k)?;
        moe::route_top_k(
            &self.kernels,
            &self.stream,
            router_logits.view(),
            shape.rows,
            shape.n_expert,
            shape.k,
            &mut ids,
            weights,
        )
        .map_err(kerr("moe routing"))?;
        Ok(ids)
    }

    /// The MoE's scratch for `values` quantized gated activations (grown, never shrunk, so a
    /// warm step allocates nothing).
    pub(super) fn moe_q8_scratch(&mut self, values: usize) -> Result<Q8ActivationsMut> {
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
    pub(super) fn q8_activations(
        &mut self,
        x: &GpuBuffer,
        n_tokens: usize,
        cols: usize,
    ) -> Result<Q8ActivationsMut> {
        let values = n_tokens * cols;
        if values > x.len || !cols.is_multiple_of(matvec_q8::GROUP) {
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
}

impl GpuBackend {
    /// The sampler's one-value uniform draw on the device.
    pub(super) fn reserve_draw(&mut self) -> Result<()> {
        if self.scratch.draw.is_none() {
            self.scratch.draw =
                Some(self.device_alloc(Tag::Workspace, workspace::DRAW_BYTES, "sampling draw")?);
        }
        Ok(())
    }

    /// The workspace argmax and sampling share (made on first use, kept).
    pub(super) fn argmax_workspace(&mut self) -> Result<DeviceSliceMut<u64>> {
        if self.scratch.argmax.is_none() {
            self.scratch.argmax = Some(self.device_alloc(
                Tag::Workspace,
                workspace::ARGMAX_BYTES,
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
}

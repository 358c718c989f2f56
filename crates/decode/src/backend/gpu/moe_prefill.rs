//! Mixture-of-experts prefill: token rows grouped by expert, each expert's projections run as
//! products over its rows.
//!
//! Decode reads each selected expert's rows once per token (`matvec_id`), which is right for
//! one token. A prefill chunk sends every token to `k` experts, so most experts serve dozens of
//! tokens, and reading an expert once per token would move its weights that many times. Here
//! the token rows are gathered in expert order, and each expert's gate, up and down
//! projections run as products over its rows:
//! - by default (`HIPDECODE_GPU_MOE_GROUPED=int8`), on the int8 matrix-core kernel, one launch
//!   per projection for all experts over a table of (expert, first row, rows) tiles, reading
//!   the weights in their GGUF blocks against 8-bit copies of the rows (the int8 path's
//!   rounding), where the device has native matrix cores, the three formats have a kernel and
//!   the weights are in device memory. The slots and the tile table are built from the routing
//!   on the device (`matmul_q8_mma::group_pairs`), so the layer queues its launches without
//!   waiting, or with `HIPDECODE_GPU_MOE_INDEX=host` on the host (read back: one
//!   synchronization per layer, in prefill only, which is never captured), the fallback;
//! - else on the vendor GEMM, one product per expert and projection over f16 rows, each
//!   expert's weight rows dequantized to f16 for it. The host launches those per expert, so it
//!   reads the routing back and sorts the pairs itself.
//!
//! The expert outputs are put back in token order and combined with the routing weights by the
//! decode path's kernel.

use crate::backend::gpu::buffer::{q8_views, Q8Shadow};
use crate::backend::gpu::offload::prefetch::HostPrefill;
use crate::backend::gpu::{
    error::{gpu_err, kerr},
    GpuBackend, GpuBuffer, MatvecPath, MoeIndex, MoePrefillScratch,
};
use crate::backend::MoeShape;
use crate::error::{DecodeError, Result};
use crate::layout::workspace::MOE_GROUPED_MIN_ROWS;
// Each expert's slots are padded so every row block starts 256-byte aligned; the rule and the
// buffers' sizes are the layout's (`layout::workspace::moe_prefill`).
use crate::layout::workspace::{moe_prefill_slots as slots_for, moe_slot_alignment};
use gguf_loader::GgmlType;
use hip_ffi::DevicePtr;
use rocm_alloc::Tag;
use rocm_kernels::ops::matvec_q8::{self, Q8Activations};
use rocm_kernels::ops::{dequant, elementwise, embed, matmul_q8_mma, matvec::QuantMatrix, moe};
use rocm_kernels::{DeviceSlice, DeviceSliceMut};
use std::sync::Arc;

impl GpuBackend {
    /// Takes the grouped prefill's buffers for MoE steps of up to `shape.rows` tokens, and
    /// grows the gate and up scratch to its padded slots.
    pub(super) fn reserve_moe_prefill(&mut self, shape: &MoeShape) -> Result<()> {
        let (n_embd, n_ff) = (shape.n_embd, shape.n_ff);
        let pairs = shape.rows * shape.k;
        let sizes = crate::layout::workspace::moe_prefill(pairs, shape.n_expert, n_embd, n_ff)?;
        let slots = sizes.slots;
        let s = &self.scratch.moe_prefill;
        if s.pairs >= pairs && s.slots >= slots && s.n_embd >= n_embd && s.n_ff >= n_ff {
            return Ok(());
        }
        self.scratch.moe_prefill = MoePrefillScratch::default();
        let alloc = Arc::clone(&self.alloc);
        let (a, st) = (&*alloc, self.stream_id);
        let hidden = sizes.hidden_floats;
        Self::scratch_buffer(&mut self.scratch.moe_gate, a, st, hidden, "moe gate")?;
        Self::scratch_buffer(&mut self.scratch.moe_up, a, st, hidden, "moe up")?;
        let ws = Tag::Workspace;
        let index = self.device_alloc(ws, sizes.index_bytes, "moe prefill index")?;
        let sorted = self.device_alloc(ws, sizes.rows_bytes, "moe prefill rows")?;
        let tokens_f16 = self.device_alloc(ws, sizes.f16_rows_bytes, "moe prefill f16 rows")?;
        let hidden_f16 = self.device_alloc(ws, sizes.f16_hidden_bytes, "moe prefill f16 hidden")?;
        self.scratch.moe_prefill = MoePrefillScratch {
            index: Some(index),
            sorted: Some(sorted),
            tokens_f16: Some(tokens_f16),
            hidden_f16: Some(hidden_f16),
            pairs,
            slots,
            n_embd,
            n_ff,
        };
        Ok(())
    }

    /// Whether [`Self::moe_prefill`] runs a step of `shape`: the int8 path with the vendor GEMM,
    /// a long enough chunk, and buffers reserved for it.
    pub(super) fn moe_prefill_applies(&self, shape: &MoeShape) -> bool {
        let s = &self.scratch.moe_prefill;
        self.matvec_path == MatvecPath::Int8
            && self.vendor_gemm.is_some()
            && shape.rows >= MOE_GROUPED_MIN_ROWS
            && s.pairs >= shape.rows * shape.k
            && s.slots
                >= slots_for(
                    shape.rows * shape.k,
                    shape.n_expert,
                    shape.n_embd,
                    shape.n_ff,
                )
            && s.n_embd >= shape.n_embd
            && s.n_ff >= shape.n_ff
            && self.scratch.moe_ids.is_some()
            && self.scratch.moe_weights.is_some()
            && self.scratch.moe_gate.is_some()
            && self.scratch.moe_up.is_some()
            && self.scratch.moe_out.is_some()
    }

    /// The MoE FFN of a prefill chunk, grouped by expert (see the module docs). The caller
    /// checked [`Self::moe_prefill_applies`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_prefill(
        &mut self,
        x: &GpuBuffer,
        router_logits: &GpuBuffer,
        [gate, up, down]: [&QuantMatrix; 3],
        [gate_host, up_host, down_host]: [Option<&[u8]>; 3],
        out: &mut GpuBuffer,
        shape: &MoeShape,
    ) -> Result<()> {
        let MoeShape {
            rows,
            n_embd,
            n_ff,
            n_expert,
            k,
            act,
        } = *shape;
        let pairs = rows * k;
        let align = moe_slot_alignment(n_embd, n_ff);
        let slots = slots_for(pairs, n_expert, n_embd, n_ff);
        if x.len < rows * n_embd || out.len < rows * n_embd {
            return Err(DecodeError::InvalidArgument(format!(
                "moe: {rows} rows of {n_embd} do not fit the input or output buffer"
            )));
        }
        let not_reserved =
            || DecodeError::InvalidArgument("moe: the prefill scratch is not reserved".into());
        let f32_ptr = |b: &Option<GpuBuffer>| b.as_ref().map(|b| b.mem.ptr());
        let s = &self.scratch;
        let p = &s.moe_prefill;
        let (Some(weights_ptr), Some(g_ptr), Some(u_ptr), Some(y_ptr)) = (
            f32_ptr(&s.moe_weights),
            f32_ptr(&s.moe_gate),
            f32_ptr(&s.moe_up),
            f32_ptr(&s.moe_out),
        ) else {
            return Err(not_reserved());
        };
        let p_index_bytes = p.index.as_ref().map_or(0, |a| a.size() as usize);
        let (Some(index_ptr), Some(sorted_ptr), Some(tokens_ptr), Some(hidden_ptr)) = (
            p.index.as_ref().map(|a| a.ptr()),
            p.sorted.as_ref().map(|a| a.ptr()),
            p.tokens_f16.as_ref().map(|a| a.ptr()),
            p.hidden_f16.as_ref().map(|a| a.ptr()),
        ) else {
            return Err(not_reserved());
        };
        // SAFETY: every view lies inside the scratch allocation it is made from: the MoE
        // scratch and the prefill scratch were reserved for at least `pairs` pairs of these
        // widths (`moe_prefill_applies`), live as long as `self` and are not replaced during
        // this call, and only the backend's stream uses them.
        let (mut weights, mut g, mut u, mut y) = unsafe {
            (
                DeviceSliceMut::<f32>::from_raw(weights_ptr, pairs),
                DeviceSliceMut::<f32>::from_raw(g_ptr, slots * n_ff),
                DeviceSliceMut::<f32>::from_raw(u_ptr, slots * n_ff),
                DeviceSliceMut::<f32>::from_raw(y_ptr, pairs * n_embd),
            )
        };
        // SAFETY: as above, for the prefill scratch (index: slots + pairs i32).
        let (slot_token, pair_slot, mut sorted_rows, mut tokens_h, mut hidden_h) = unsafe {
            (
                DeviceSlice::<i32>::from_raw(index_ptr, slots),
                DeviceSlice::<i32>::from_raw(index_ptr + (slots * 4) as u64, pairs),
                DeviceSliceMut::<f32>::from_raw(sorted_ptr, slots * n_embd),
                DeviceSliceMut::<u16>::from_raw(tokens_ptr, slots * n_embd),
                DeviceSliceMut::<u16>::from_raw(hidden_ptr, slots * n_ff),
            )
        };
        // Routing, as in decode.
        let ids = self.route_moe_rows(router_logits, shape, &mut weights)?;
        // The experts' products: in place on the int8 matrix-core kernel, one launch per
        // projection over a tile table, or on the vendor GEMM, one product per expert.
        let in_place = self.moe_grouped_in_place([gate, up, down].map(QuantMatrix::format))
            && [gate, up, down].iter().all(|w| matmul_q8_mma::takes(w))
            && [gate_host, up_host, down_host].iter().all(Option::is_none);
        let on_device = in_place
            && self.moe_index == MoeIndex::Device
            && n_expert <= matmul_q8_mma::GROUP_MAX_EXPERTS;
        let index_room = p_index_bytes / 4;
        let (counts, starts, n_tiles) = if on_device {
            // The index and the tile table are built on the device from the routing, so the
            // layer never waits for the host; the table is as long as any routing's, and the
            // kernel skips its empty tail.
            let groups = matmul_q8_mma::PairGroups {
                pairs,
                k,
                n_expert,
                align,
                slots,
            };
            let entries = groups.tile_entries();
            if slots + pairs + entries > index_room {
                return Err(DecodeError::InvalidArgument(format!(
                    "moe: {} tiles do not fit the prefill index's {index_room} i32",
                    entries / 3
                )));
            }
            // SAFETY: slot_token, pair_slot and the tile table lie one after the other in the
            // prefill index (room checked above), which nothing else uses in this call.
            let (mut slot_token, mut pair_slot, mut table) = unsafe {
                (
                    DeviceSliceMut::<i32>::from_raw(index_ptr, slots),
                    DeviceSliceMut::<i32>::from_raw(index_ptr + (slots * 4) as u64, pairs),
                    DeviceSliceMut::<i32>::from_raw(
                        index_ptr + ((slots + pairs) * 4) as u64,
                        entries,
                    ),
                )
            };
            let ids = ids.as_const();
            let (kn, st) = (&self.kernels, &*self.stream);
            matmul_q8_mma::group_pairs(
                kn,
                st,
                ids,
                groups,
                &mut slot_token,
                &mut pair_slot,
                &mut table,
            )
            .map_err(kerr("moe grouping"))?;
            (Vec::new(), Vec::new(), entries / 3)
        } else {
            // Read the choices back and put the pairs in expert order on the host.
            let mut chosen = vec![0i32; pairs];
            self.read_i32s(ids.ptr().0, &mut chosen)?;
            // counts[e]: the pairs routed to expert e. Its slots start at starts[e], padded
            // to `align`; the padding slots gather token 0 and are never read back.
            let mut counts = vec![0usize; n_expert];
            for &e in &chosen {
                let e = usize::try_from(e)
                    .ok()
                    .filter(|&e| e < n_expert)
                    .ok_or_else(|| {
                        gpu_err(
                            "moe routing",
                            format!("expert id {e} outside 0..{n_expert}"),
                        )
                    })?;
                counts[e] += 1;
            }
            let mut starts = Vec::with_capacity(n_expert);
            let mut end = 0;
            for &count in &counts {
                starts.push(end);
                end = (end + count).next_multiple_of(align);
            }
            // The int8 kernel's tile table goes up with the index.
            let tiles = match in_place {
                true => matmul_q8_mma::group_tiles(&starts, &counts).ok_or_else(|| {
                    DecodeError::InvalidArgument(format!("moe: {slots} slots do not fit an i32"))
                })?,
                false => Vec::new(),
            };
            let n_tiles = tiles.len() / 3;
            if slots + pairs + tiles.len() > index_room {
                return Err(DecodeError::InvalidArgument(format!(
                    "moe: {n_tiles} tiles do not fit the prefill index's {index_room} i32"
                )));
            }
            let mut index = vec![0i32; slots + pairs];
            let mut next = starts.clone();
            for (pair, &e) in chosen.iter().enumerate() {
                let slot = next[e as usize];
                next[e as usize] += 1;
                index[slot] = (pair / k) as i32;
                index[slots + pair] = slot as i32;
            }
            index.extend_from_slice(&tiles);
            self.upload(index_ptr, &index)?;
            (counts, starts, n_tiles)
        };
        let rows_of = |base: u64, n: usize, width: usize| -> Result<QuantMatrix> {
            // SAFETY: `base` holds `n` rows of `width` f32 (the input buffer, checked above, or
            // the prefill scratch), read as bytes while this call runs.
            let bytes = unsafe { DeviceSlice::<u8>::from_raw(base, n * width * 4) };
            QuantMatrix::new(bytes, GgmlType::F32, n, width).map_err(kerr("moe rows"))
        };
        let (kn, st) = (&self.kernels, &*self.stream);
        // Token rows in slot order.
        let x_rows = rows_of(x.mem.ptr(), rows, n_embd)?;
        embed::embed(
            kn,
            st,
            &x_rows,
            slot_token,
            slots,
            1.0,
            &mut sorted_rows,
            None,
        )
        .map_err(kerr("moe gather"))?;
        if in_place {
            // The rows' 8-bit copies go where the vendor path keeps their f16 ones: 1.125
            // bytes a value against 2.
            let (q_rows, q_hidden) = (slots * n_embd, slots * n_ff);
            if Q8Shadow::bytes_for(q_rows) > tokens_h.len() * 2
                || Q8Shadow::bytes_for(q_hidden) > hidden_h.len() * 2
            {
                return Err(not_reserved());
            }
            // SAFETY: the f16 row and hidden buffers hold slots * n_embd and slots * n_ff u16,
            // at least `bytes_for` of each count (checked above); nothing else uses them in
            // this call.
            let (mut xq, mut hq) = unsafe {
                (
                    q8_views(tokens_ptr, q_rows, q_rows),
                    q8_views(hidden_ptr, q_hidden, q_hidden),
                )
            };
            // SAFETY: the tile table follows the index in its allocation (room checked above).
            let table = unsafe {
                DeviceSlice::<i32>::from_raw(index_ptr + ((slots + pairs) * 4) as u64, 3 * n_tiles)
            };
            let grouped =
                |w: &QuantMatrix, per: usize, x: Q8Activations, out: &mut DeviceSliceMut<f32>| {
                    matmul_q8_mma::matmul_grouped(kn, st, w, per, table, n_tiles, x, out, slots)
                        .map_err(kerr("moe expert products (int8)"))
                };
            matvec_q8::quantize(kn, st, sorted_rows.as_const(), slots, n_embd, &mut xq)
                .map_err(kerr("moe rows to int8"))?;
            grouped(gate, n_ff, xq.as_const(), &mut g)?;
            grouped(up, n_ff, xq.as_const(), &mut u)?;
            elementwise::gated(kn, st, &mut g, u.as_const(), slots * n_ff, act)
                .map_err(kerr("moe activation"))?;
            matvec_q8::quantize(kn, st, g.as_const(), slots, n_ff, &mut hq)
                .map_err(kerr("moe hidden to int8"))?;
            grouped(down, n_embd, hq.as_const(), &mut sorted_rows)?;
        } else {
            dequant::f32_to_f16(
                kn,
                st,
                sorted_rows.as_const(),
                slots * n_embd,
                &mut tokens_h,
            )
            .map_err(kerr("moe rows to f16"))?;
            // The vendor GEMM takes f16 rows; each expert's weight rows are dequantized to f16
            // for its products.
            let stream_prefill = self.host_prefill == HostPrefill::Stream;
            let mut prefetch = self.prefetch.as_mut().filter(|_| stream_prefill);
            let vendor = self.vendor_gemm.as_mut().ok_or_else(not_reserved)?;
            let experts = || {
                (0..n_expert)
                    .map(|e| (e, starts[e], counts[e]))
                    .filter(|&(_, _, n)| n > 0)
            };
            for (e, start, count) in experts() {
                let input = DevicePtr(tokens_ptr + (start * n_embd * 2) as u64);
                for (w, host, dst) in [(gate, gate_host, g_ptr), (up, up_host, u_ptr)] {
                    let out_at = DevicePtr(dst + (start * n_ff * 4) as u64);
                    // SAFETY: `input` holds this expert's `count` f16 token rows and `out_at` room
                    // for `count` rows of `n_ff` f32 (slots `start..start + count` of the gate/up
                    // scratch); the expert's rows `e * n_ff..` lie inside the stacked matrix; a
                    // host copy is the model's pinned weight, alive as long as the backend.
                    unsafe {
                        vendor.product(
                            kn,
                            st,
                            w,
                            host.zip(prefetch.as_deref_mut()),
                            e * n_ff..(e + 1) * n_ff,
                            input,
                            count,
                            out_at,
                            n_ff,
                        )
                    }?;
                }
            }
            elementwise::gated(kn, st, &mut g, u.as_const(), slots * n_ff, act)
                .map_err(kerr("moe activation"))?;
            dequant::f32_to_f16(kn, st, g.as_const(), slots * n_ff, &mut hidden_h)
                .map_err(kerr("moe hidden to f16"))?;
            for (e, start, count) in experts() {
                let input = DevicePtr(hidden_ptr + (start * n_ff * 2) as u64);
                let out_at = DevicePtr(sorted_ptr + (start * n_embd * 4) as u64);
                let rows_e = e * n_embd..(e + 1) * n_embd;
                // SAFETY: as above, for the down projection: `count` f16 rows of `n_ff` in, `count`
                // f32 rows of `n_embd` out (the gathered token rows are no longer needed).
                unsafe {
                    vendor.product(
                        kn,
                        st,
                        down,
                        down_host.zip(prefetch.as_deref_mut()),
                        rows_e,
                        input,
                        count,
                        out_at,
                        n_embd,
                    )
                }?;
            }
        }
        // Expert outputs back in (token, choice) order, then combined.
        let sorted_out = rows_of(sorted_ptr, slots, n_embd)?;
        embed::embed(kn, st, &sorted_out, pair_slot, pairs, 1.0, &mut y, None)
            .map_err(kerr("moe scatter"))?;
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
}

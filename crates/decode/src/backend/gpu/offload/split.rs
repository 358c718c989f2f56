//! The hybrid offload's split product on the backend: for a decode product over a weight in
//! pinned host memory, the GPU's kernel reads its share of the rows in place while the host's
//! cores compute the rest from the same memory; the shares come from [`super::hybrid::Hybrid`].

use crate::backend::gpu::offload::hybrid::*;
use crate::backend::gpu::{
    error::{gpu_err, kerr},
    CpuShare, GpuBackend, GpuBuffer,
};
use crate::backend::host::q8::{self as host_q8, HostActivations};
use crate::error::{DecodeError, Result};
use crate::quant;
use gguf_loader::GgmlType;
use hip_ffi::{DevicePtr, Event};
use rocm_kernels::ops::matvec_q8::Q8Activations;
use rocm_kernels::ops::moe::{ExpertInput, QuantExperts};
use rocm_kernels::ops::{
    elementwise,
    matvec::QuantMatrix,
    matvec_q8::{self},
};
use rocm_kernels::{DeviceSlice, DeviceSliceMut};
use std::time::Instant;

impl GpuBackend {
    /// Whether decode steps may split products with the host (and so run eagerly).
    pub(crate) fn hybrid_active(&self) -> bool {
        self.hybrid.setting() != CpuShare::Off && self.host_weights.pinned_bytes() > 0
    }

    /// Sets how offloaded decode products are split (tests and A/B runs; users set
    /// [`CPU_SHARE`]). Refused once a host weight is loaded: each weight's read path, split
    /// or in place, was chosen then.
    pub fn set_cpu_share(&mut self, setting: CpuShare) -> Result<()> {
        if self.host_weights.tensors > 0 {
            return Err(DecodeError::InvalidArgument(
                "the hybrid split must be set before the model's weights are loaded (each \
                 weight's read path is chosen when it loads)"
                    .into(),
            ));
        }
        self.hybrid.set_setting(setting);
        Ok(())
    }

    /// Copies one token's quantized activations back to the staging, queued on the stream.
    fn stage_activations(
        &mut self,
        q: &Q8Activations,
        cols: usize,
        k: usize,
        rows: usize,
    ) -> Result<()> {
        let device = *self.hip.device();
        let staging = self
            .hybrid
            .staging(&device, &self.stream, (cols, k, rows))?;
        // SAFETY: `q` holds at least `cols` values and `cols / 32` scales in device memory
        // that the backend keeps allocated (its activations' 8-bit shadow); the staging lives in
        // `self.hybrid` and is read only after `ready`, recorded next, has been reached.
        unsafe {
            self.stream
                .copy_to_host_raw(
                    &mut staging.values.as_mut_slice::<i8>()[..cols],
                    q.values.ptr(),
                )
                .and_then(|()| {
                    self.stream.copy_to_host_raw(
                        &mut staging.scales.as_mut_slice::<f32>()[..cols / matvec_q8::GROUP],
                        q.scales.ptr(),
                    )
                })
        }
        .map_err(|e| gpu_err("copying activations to the host", e))
    }

    fn record(&self, which: fn(&Staging) -> &Event, what: &str) -> Result<()> {
        let staging = self.hybrid.staging.as_ref().expect("staged before");
        which(staging)
            .record(&self.stream)
            .map_err(|e| gpu_err(what, e))
    }

    /// The host's half of a split product, once the GPU's half is queued: marks the end of
    /// the GPU's half, waits for the staged activations, runs `compute` (over the activations,
    /// the experts' scratch, the staged routing and the output staging; it returns the weight
    /// bytes it read), and moves `work`'s share by which half finished first. The caller then
    /// queues the upload of the outputs.
    fn host_half(
        &mut self,
        cols: usize,
        work: Work,
        compute: impl FnOnce(
            &HostActivations,
            &mut Vec<HostActivations>,
            &[i32],
            &mut [f32],
        ) -> Result<u64>,
    ) -> Result<()> {
        self.record(|s| &s.gpu_done, "recording the GPU's share")?;
        let Hybrid {
            acts,
            hidden,
            staging,
            cpu_bytes,
            cpu_time,
            wait_time,
            ..
        } = &mut self.hybrid;
        let staging = staging.as_mut().expect("staged before");
        let t = Instant::now();
        staging
            .ready
            .synchronize()
            .map_err(|e| gpu_err("waiting for the activations", e))?;
        *wait_time += t.elapsed();
        acts.set(
            &staging.values.as_slice::<i8>()[..cols],
            &staging.scales.as_slice::<f32>()[..cols / matvec_q8::GROUP],
        )?;
        let t = Instant::now();
        let routing = staging.routing.as_slice::<i32>();
        *cpu_bytes += compute(acts, hidden, routing, staging.out.as_mut_slice::<f32>())?;
        *cpu_time += t.elapsed();
        let cpu_first = !staging
            .gpu_done
            .query()
            .map_err(|e| gpu_err("querying the GPU's share", e))?;
        self.hybrid.observe(work, cpu_first);
        Ok(())
    }

    /// Queues the upload of the staging's first `len` outputs to `dst`.
    fn upload_cpu_share(&self, dst: u64, len: usize) -> Result<()> {
        let staging = self.hybrid.staging.as_ref().expect("staged before");
        // SAFETY: `dst` is the device address of `len` f32 inside an output the caller holds
        // (and the backend keeps allocated); the staging is not written again before a later
        // `ready` is reached, and that event follows this copy on the same stream.
        unsafe {
            self.stream
                .copy_from_host_raw(DevicePtr(dst), &staging.out.as_slice::<f32>()[..len])
        }
        .map_err(|e| gpu_err("copying the CPU's share to the device", e))
    }

    /// `out = W · x` for one token with W offloaded (`host` its bytes), split between the GPU
    /// and the CPU. `Ok(false)`: not split (the CPU's share is no rows), nothing queued.
    pub(crate) fn matvec_split(
        &mut self,
        m: &QuantMatrix,
        host: &[u8],
        x: &GpuBuffer,
        out: &mut GpuBuffer,
    ) -> Result<bool> {
        let (n, cols, format) = (m.rows(), m.cols(), m.format());
        let work = Work::Rows(format);
        let on_cpu = cpu_rows(n, self.hybrid.share(work));
        if on_cpu == 0 || out.len < n {
            return Ok(false);
        }
        let on_gpu = n - on_cpu;
        let row_bytes = quant::row_bytes(format, cols)
            .ok_or_else(|| DecodeError::InvalidArgument(format!("{cols} columns of {format}")))?;
        let q = self.q8_activations(x, 1, cols)?.as_const();
        self.stage_activations(&q, cols, 0, on_cpu)?;
        self.record(|s| &s.ready, "recording the activations' copy")?;
        let sub = gpu_rows(m, on_gpu, row_bytes)?;
        let mut head = out
            .view_mut()
            .slice_mut(0, on_gpu)
            .expect("the output holds n values (checked above)");
        matvec_q8::matvec(&self.kernels, &self.stream, &sub, q, &mut head, 1)
            .map_err(kerr("matmul (hybrid, GPU share)"))?;
        self.host_half(cols, work, |acts, _, _, out| {
            host_q8::matvec_rows(format, host, cols, on_gpu..n, acts, &mut out[..on_cpu])?;
            Ok((on_cpu * row_bytes) as u64)
        })?;
        self.upload_cpu_share(head.addr() + 4 * on_gpu as u64, on_cpu)?;
        self.op_done(
            || format!("matvec hybrid {} {on_gpu}+{on_cpu}x{cols}", format.name()),
            (n * row_bytes) as u64,
        )?;
        Ok(true)
    }

    /// The experts of one decode token's MoE with offloaded expert weights, split by slot: the
    /// GPU runs the first slots (reading those experts' rows across the link), the CPU the
    /// rest, and the CPU's weighted sum is added to the GPU's. `ids` and `weights` hold the
    /// token's `k` routed slots (already on the device); `hosts` are the gate, up and down
    /// tensors' bytes. `Ok(false)`: not split, nothing queued.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_split(
        &mut self,
        experts: [&QuantExperts; 3],
        hosts: [&[u8]; 3],
        xq: Q8Activations,
        (ids, weights): (DeviceSlice<i32>, DeviceSlice<f32>),
        shape: &super::MoeShape,
        gated: (&mut DeviceSliceMut<f32>, &mut DeviceSliceMut<f32>),
        out: &mut GpuBuffer,
    ) -> Result<bool> {
        let super::MoeShape {
            rows,
            n_embd,
            n_ff,
            k,
            act,
            ..
        } = *shape;
        let work = Work::ExpertSlots;
        let on_cpu = ((k as f64 * self.hybrid.share(work)).round() as usize).min(k);
        if rows != 1 || on_cpu == 0 || k > matvec_q8::MOE_DOWN_MAX_K {
            return Ok(false);
        }
        let on_gpu = k - on_cpu;
        let [gate, up, down] = experts;
        self.stage_activations(&xq, n_embd, k, n_embd)?;
        {
            let staging = self.hybrid.staging.as_mut().expect("staged above");
            let routing = staging.routing.as_mut_slice::<i32>();
            let (id_slots, weight_slots) = routing.split_at_mut(k);
            // SAFETY: `ids` and `weights` hold the token's `k` slots on the device, written by
            // the routing kernel queued before; the staging is read after `ready`.
            unsafe {
                self.stream
                    .copy_to_host_raw(&mut id_slots[..k], ids.ptr())
                    .and_then(|()| {
                        let w: &mut [f32] = bytemuck_f32(&mut weight_slots[..k]);
                        self.stream.copy_to_host_raw(w, weights.ptr())
                    })
            }
            .map_err(|e| gpu_err("copying the routing to the host", e))?;
        }
        self.record(|s| &s.ready, "recording the routing's copy")?;
        let (g, u) = gated;
        if on_gpu > 0 {
            let mut gq = self.moe_q8_scratch(on_gpu * n_ff)?;
            let (kn, st) = (&self.kernels, &*self.stream);
            matvec_q8::matvec_id_pair(
                kn,
                st,
                (gate, &mut *g),
                (up, &mut *u),
                ids,
                1,
                on_gpu,
                xq,
                ExpertInput::PerToken,
            )
            .map_err(kerr("moe gate+up (hybrid, GPU share)"))?;
            elementwise::gated_q8(kn, st, g, u.as_const(), on_gpu * n_ff, act, &mut gq)
                .map_err(kerr("moe activation (hybrid, GPU share)"))?;
            matvec_q8::moe_down(
                kn,
                st,
                down,
                ids,
                weights,
                1,
                on_gpu,
                gq.as_const(),
                &mut out.view_mut(),
            )
            .map_err(kerr("moe down (hybrid, GPU share)"))?;
        }
        let formats = [gate.format(), up.format(), down.format()];
        let dims = (n_embd, n_ff, shape.n_expert);
        self.host_half(n_embd, work, |acts, hidden, routing, out| {
            let slots: Vec<(i32, f32)> = (on_gpu..k)
                .map(|s| (routing[s], f32::from_bits(routing[k + s] as u32)))
                .collect();
            let sum = &mut out[..n_embd];
            cpu_experts(&slots, hosts, formats, dims, act, (acts, hidden), sum)
        })?;
        if on_gpu == 0 {
            self.upload_cpu_share(out.view_mut().addr(), n_embd)?;
        } else {
            let (a, s) = (&*self.alloc, self.stream_id);
            let part =
                Self::scratch_buffer(&mut self.scratch.hybrid_moe, a, s, n_embd, "hybrid moe")?;
            self.upload_cpu_share(part.addr(), n_embd)?;
            let part = part.as_const();
            elementwise::add(
                &self.kernels,
                &self.stream,
                &mut out.view_mut(),
                part,
                n_embd,
            )
            .map_err(kerr("moe (adding the CPU's slots)"))?;
        }
        Ok(true)
    }
}

/// The first `rows` rows of `m` (`row_bytes` each), the GPU's half of a split product.
fn gpu_rows(m: &QuantMatrix, rows: usize, row_bytes: usize) -> Result<QuantMatrix> {
    m.data()
        .slice(0, rows * row_bytes)
        .ok_or_else(|| DecodeError::InvalidArgument("hybrid split past the weight".into()))
        .and_then(|d| {
            QuantMatrix::new(d, m.format(), rows, m.cols())
                .map_err(|e| DecodeError::InvalidArgument(e.to_string()))
        })
}

/// The weights' f32 slots of the routing staging, which holds i32 ids then f32 weights.
fn bytemuck_f32(slots: &mut [i32]) -> &mut [f32] {
    // SAFETY: i32 and f32 have the same size and alignment, and every bit pattern is a valid
    // f32; the borrow is carried over.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<f32>(), slots.len()) }
}

/// Expert `e`'s bytes of a stacked tensor of experts of `per_expert` bytes each.
fn expert_bytes(all: &[u8], e: usize, per_expert: usize) -> Result<&[u8]> {
    all.get(e * per_expert..(e + 1) * per_expert)
        .ok_or_else(|| {
            DecodeError::InvalidArgument(format!("expert {e} lies past its tensor's bytes"))
        })
}

/// The CPU's MoE slots for one token: for each `(expert, weight)`,
/// `sum += weight * down_e · (act(gate_e · x) * (up_e · x))`, the gated values quantized in
/// groups of 32 as the GPU quantizes them. An id outside the experts adds nothing (as on the
/// GPU). Every slot's gate and up products run in one parallel region, and every down product
/// in a second: the experts are small, and waking the pool per product would cost more than
/// reading them. Returns the weight bytes read.
fn cpu_experts(
    slots: &[(i32, f32)],
    [gate, up, down]: [&[u8]; 3],
    [gate_f, up_f, down_f]: [GgmlType; 3],
    (n_embd, n_ff, n_expert): (usize, usize, usize),
    act: elementwise::GateActivation,
    (x, hidden): (&HostActivations, &mut Vec<HostActivations>),
    sum: &mut [f32],
) -> Result<u64> {
    let bytes = |f: GgmlType, cols: usize, rows: usize| {
        quant::row_bytes(f, cols)
            .map(|b| b * rows)
            .ok_or_else(|| DecodeError::InvalidArgument(format!("{cols} columns of {f}")))
    };
    let (gate_b, up_b, down_b) = (
        bytes(gate_f, n_embd, n_ff)?,
        bytes(up_f, n_embd, n_ff)?,
        bytes(down_f, n_ff, n_embd)?,
    );
    let experts: Vec<(usize, f32)> = slots
        .iter()
        .filter_map(|&(id, w)| Some((usize::try_from(id).ok().filter(|&e| e < n_expert)?, w)))
        .collect();
    sum.fill(0.0);
    if experts.is_empty() {
        return Ok(0);
    }
    let s = experts.len();
    let (mut g, mut u) = (vec![0f32; s * n_ff], vec![0f32; s * n_ff]);
    let mut tasks = Vec::with_capacity(2 * s);
    for ((&(e, _), g), u) in experts
        .iter()
        .zip(g.chunks_exact_mut(n_ff))
        .zip(u.chunks_exact_mut(n_ff))
    {
        for (format, all, b, out) in [(gate_f, gate, gate_b, g), (up_f, up, up_b, u)] {
            let matrix = expert_bytes(all, e, b)?;
            tasks.push(host_q8::RowTask {
                format,
                matrix,
                cols: n_embd,
                first: 0,
                x,
                out,
            });
        }
    }
    host_q8::matvec_batch(tasks)?;
    hidden.resize_with(s, HostActivations::default);
    for (h, (g, u)) in hidden
        .iter_mut()
        .zip(g.chunks_exact_mut(n_ff).zip(u.chunks_exact(n_ff)))
    {
        for (gv, &uv) in g.iter_mut().zip(u) {
            *gv = act.apply(*gv) * uv;
        }
        h.quantize(g)?;
    }
    let mut y = vec![0f32; s * n_embd];
    let mut tasks = Vec::with_capacity(s);
    for ((&(e, _), x), out) in experts
        .iter()
        .zip(hidden.iter())
        .zip(y.chunks_exact_mut(n_embd))
    {
        let matrix = expert_bytes(down, e, down_b)?;
        tasks.push(host_q8::RowTask {
            format: down_f,
            matrix,
            cols: n_ff,
            first: 0,
            x,
            out,
        });
    }
    host_q8::matvec_batch(tasks)?;
    for (&(_, weight), y) in experts.iter().zip(y.chunks_exact(n_embd)) {
        for (s, &v) in sum.iter_mut().zip(y) {
            *s += weight * v;
        }
    }
    Ok((s * (gate_b + up_b + down_b)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_experts_add_the_weighted_slots_and_skip_bad_ids() {
        use crate::backend::cpu::kernels::tests::random_row;
        use rand::Rng;
        use test_support::rng::StdRng;
        let mut rng = test_support::rng::seeded(7);
        let (n_embd, n_ff, n_expert) = (256, 256, 3);
        let tensor = |rows: usize, cols: usize, rng: &mut StdRng| -> Vec<u8> {
            (0..n_expert * rows)
                .flat_map(|_| random_row(GgmlType::Q4K, cols, rng))
                .collect()
        };
        let gate = tensor(n_ff, n_embd, &mut rng);
        let up = tensor(n_ff, n_embd, &mut rng);
        let down = tensor(n_embd, n_ff, &mut rng);
        let x: Vec<f32> = (0..n_embd).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut acts = HostActivations::default();
        acts.quantize(&x).unwrap();
        let formats = [GgmlType::Q4K; 3];
        let act = elementwise::GateActivation::Silu;
        let run = |slots: &[(i32, f32)]| {
            let (mut hidden, mut sum) = (Vec::new(), vec![f32::NAN; n_embd]);
            cpu_experts(
                slots,
                [&gate, &up, &down],
                formats,
                (n_embd, n_ff, n_expert),
                act,
                (&acts, &mut hidden),
                &mut sum,
            )
            .unwrap();
            sum
        };
        let one = run(&[(1, 1.0)]);
        let two = run(&[(2, 1.0)]);
        let both = run(&[(1, 0.25), (2, 0.75), (7, 1.0), (-1, 1.0)]);
        assert!(
            one.iter().any(|v| v.abs() > 1e-3),
            "the expert computed nothing"
        );
        for i in 0..n_embd {
            let want = 0.25 * one[i] + 0.75 * two[i];
            assert!(
                (both[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{i}: {} against {want}",
                both[i]
            );
        }
        // Expert 1 alone, by the reference: down · quantized(silu(gate · x) * (up · x)).
        let q = rocm_kernels::reference::matvec_q8::quantize(&x).unwrap();
        let expert1 = |bytes: &[u8]| {
            let per = bytes.len() / n_expert;
            bytes[per..2 * per].to_vec()
        };
        let (gb, ub, db) = (expert1(&gate), expert1(&up), expert1(&down));
        fn m(
            b: &[u8],
            rows: usize,
            cols: usize,
        ) -> rocm_kernels::reference::matvec::HostMatrix<'_> {
            rocm_kernels::reference::matvec::HostMatrix::new(b, GgmlType::Q4K, rows, cols).unwrap()
        }
        let g = rocm_kernels::reference::matvec_q8::matvec(&m(&gb, n_ff, n_embd), &q, 1).unwrap();
        let u = rocm_kernels::reference::matvec_q8::matvec(&m(&ub, n_ff, n_embd), &q, 1).unwrap();
        let h: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| act.apply(g) * u).collect();
        let hq = rocm_kernels::reference::matvec_q8::quantize(&h).unwrap();
        let want =
            rocm_kernels::reference::matvec_q8::matvec(&m(&db, n_embd, n_ff), &hq, 1).unwrap();
        let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        for (i, (&o, &w)) in one.iter().zip(&want).enumerate() {
            assert!((o - w).abs() <= 1e-3 * scale, "{i}: {o} against {w}");
        }
    }
}

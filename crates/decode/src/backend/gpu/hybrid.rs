//! The hybrid offload: a decode product over a weight kept in pinned host memory is split
//! between the GPU, whose kernel reads its share of the rows across the host link (zero-copy),
//! and the host's cores, which read the other share from the same memory
//! ([`crate::backend::host_q8`]). Both run at once, so their bandwidths add: zero-copy alone is
//! capped by the link (about 50 GB/s on PCIe Gen5), and host memory feeds the cores besides.
//!
//! Per product: the quantized activations (and, for an MoE, the routing) are copied back to
//! pinned staging, the GPU part is queued, the host waits for the activations, computes its
//! rows, and queues their upload behind the GPU part. The host waits on the device once per
//! offloaded product, so a step with hybrid products runs eagerly instead of from a graph.
//!
//! The split is measured, not assumed. Under `auto` (the default) each kind of work (a weight
//! format's rows, or MoE expert slots) keeps its own CPU share: when the host finishes its part
//! and the GPU has not, the CPU's share grows a step; when the GPU was done first, it shrinks.
//! The shares settle where both sides finish together, under whatever contention the two put
//! on host memory.
//!
//! Graph capture and the split do not mix well, measured on the H200: the host half as a
//! host function in a captured graph (on the runtime's callback thread, forked and joined with
//! events) was 5-12 % slower than this eager hand-over with rayon, and far slower with the
//! spinning host pool, whose threads then compete with the runtime's; the eager path won at
//! every budget tried (docs/benchmark_results/offload-hybrid-2026-12-01.md).
//!
//! Only decode (one token) splits: prefill products read each weight once for many tokens,
//! which the GPU does from the link at full rate.

use super::{gate_activation, gpu_err, kerr, GpuBackend, GpuBuffer};
use crate::backend::host_q8::{self, HostActivations};
use crate::error::{DecodeError, Result};
use crate::quant;
use gguf_loader::GgmlType;
use hip_ffi::{Device, DevicePtr, Event, PinnedHostBuffer, Stream};
use rocm_kernels::ops::elementwise;
use rocm_kernels::ops::matvec::QuantMatrix;
use rocm_kernels::ops::matvec_q8::{self, Q8Activations};
use rocm_kernels::ops::moe::{ExpertInput, QuantExperts};
use rocm_kernels::{DeviceSlice, DeviceSliceMut};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub static CPU_SHARE: knobs::Knob<CpuShare> = knobs::Knob {
    name: "HIPDECODE_OFFLOAD_CPU_SHARE",
    default: "auto",
    doc: "how offloaded decode products split between GPU and host cores: `auto` (balanced by \
          measurement), `off` (the GPU reads every offloaded byte) or a host share from 0 to \
          0.95",
    scope: knobs::Scope::Run,
    parse: CpuShare::parse,
};

/// The largest CPU share: the GPU keeps some rows, so its half of the product keeps the
/// activations' copy and the upload in order.
pub const MAX_CPU_SHARE: f64 = 0.95;
/// Where `auto` starts each kind of work, and how far one measurement moves it.
const AUTO_START: f64 = 0.5;
const AUTO_STEP: f64 = 0.01;
/// Rows are split in multiples of this (a GPU block's rows; keeps the host's chunks whole).
const ROW_QUANTUM: usize = 16;

/// How offloaded decode products are split between GPU and CPU, from [`CPU_SHARE`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CpuShare {
    /// The GPU reads every offloaded byte (zero-copy only).
    Off,
    /// Balanced per kind of work by measurement.
    Auto,
    /// This fraction of each offloaded product's rows (or MoE slots) on the CPU.
    Fixed(f64),
}

impl CpuShare {
    /// Parses a value of [`CPU_SHARE`].
    fn parse(value: &str) -> std::result::Result<CpuShare, String> {
        let v = value.trim();
        match v {
            "auto" => return Ok(CpuShare::Auto),
            "off" => return Ok(CpuShare::Off),
            _ => {}
        }
        match v.parse::<f64>() {
            Ok(f) if (0.0..=MAX_CPU_SHARE).contains(&f) => Ok(if f == 0.0 {
                CpuShare::Off
            } else {
                CpuShare::Fixed(f)
            }),
            _ => Err(format!(
                "accepted: auto (the split balances itself), off (zero-copy only), or a CPU \
                 share from 0 to {MAX_CPU_SHARE} such as 0.4"
            )),
        }
    }

    /// The setting of [`CPU_SHARE`].
    pub fn from_env() -> Result<CpuShare> {
        Ok(CPU_SHARE.read()?)
    }
}

/// What one share is kept for: the rows of products over one weight format, or MoE slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    Rows(GgmlType),
    ExpertSlots,
}

impl Work {
    fn label(self) -> String {
        match self {
            Work::Rows(f) => format!("{} rows", f.name()),
            Work::ExpertSlots => "expert slots".into(),
        }
    }
}

/// One kind of work's share and what the balance saw.
#[derive(Clone, Copy, Debug)]
struct Balance {
    share: f64,
    products: u64,
    /// Products where the CPU finished while the GPU was still busy.
    cpu_first: u64,
}

/// Pinned staging and the two events of a split product. Grown on demand, never shrunk.
struct Staging {
    values: PinnedHostBuffer,
    scales: PinnedHostBuffer,
    routing: PinnedHostBuffer,
    out: PinnedHostBuffer,
    /// Recorded after the copies back: the host may read the staging.
    ready: Event,
    /// Recorded after the GPU's share: its query says who finished first.
    gpu_done: Event,
}

impl Staging {
    fn new(device: &Device, cols: usize, k: usize, rows: usize) -> Result<Staging> {
        let pin = |bytes: usize| {
            PinnedHostBuffer::alloc(device, bytes.max(64))
                .map_err(|e| gpu_err("pinning the hybrid offload's staging", e))
        };
        let event =
            || Event::new_without_timing(device).map_err(|e| gpu_err("creating an event", e));
        Ok(Staging {
            values: pin(cols)?,
            scales: pin(cols / matvec_q8::GROUP * 4)?,
            routing: pin(2 * k * 4)?,
            out: pin(rows * 4)?,
            ready: event()?,
            gpu_done: event()?,
        })
    }

    fn fits(&self, cols: usize, k: usize, rows: usize) -> bool {
        self.values.len_bytes() >= cols
            && self.scales.len_bytes() >= cols / matvec_q8::GROUP * 4
            && self.routing.len_bytes() >= 2 * k * 4
            && self.out.len_bytes() >= rows * 4
    }

    fn bytes(&self) -> usize {
        [&self.values, &self.scales, &self.routing, &self.out]
            .iter()
            .map(|b| b.len_bytes())
            .sum()
    }
}

/// The hybrid offload's state in a [`GpuBackend`].
pub(super) struct Hybrid {
    setting: CpuShare,
    balance: BTreeMap<Work, Balance>,
    acts: HostActivations,
    /// The gated activations of the CPU's experts, quantized for their down projections.
    hidden: Vec<HostActivations>,
    staging: Option<Staging>,
    /// What the host's side did: weight bytes it multiplied, time it spent on them, and time it
    /// waited for the device to hand over activations.
    cpu_bytes: u64,
    cpu_time: Duration,
    wait_time: Duration,
}

impl Hybrid {
    pub(super) fn new(setting: CpuShare) -> Hybrid {
        Hybrid {
            setting,
            balance: BTreeMap::new(),
            acts: HostActivations::default(),
            hidden: Vec::new(),
            staging: None,
            cpu_bytes: 0,
            cpu_time: Duration::ZERO,
            wait_time: Duration::ZERO,
        }
    }

    pub(super) fn setting(&self) -> CpuShare {
        self.setting
    }

    /// Sets how products are split from now on (the shares learnt so far are forgotten).
    pub(super) fn set_setting(&mut self, setting: CpuShare) {
        self.setting = setting;
        self.balance.clear();
    }

    /// The CPU's current share of `work`.
    fn share(&mut self, work: Work) -> f64 {
        let start = match self.setting {
            CpuShare::Off => return 0.0,
            CpuShare::Auto => AUTO_START,
            CpuShare::Fixed(f) => f,
        };
        self.balance
            .entry(work)
            .or_insert(Balance {
                share: start,
                products: 0,
                cpu_first: 0,
            })
            .share
    }

    /// Records who finished first and, under `auto`, moves the share towards the balance.
    fn observe(&mut self, work: Work, cpu_first: bool) {
        let auto = self.setting == CpuShare::Auto;
        if let Some(b) = self.balance.get_mut(&work) {
            b.products += 1;
            b.cpu_first += u64::from(cpu_first);
            if auto {
                let step = if cpu_first { AUTO_STEP } else { -AUTO_STEP };
                b.share = (b.share + step).clamp(0.0, MAX_CPU_SHARE);
            }
        }
    }

    /// The staging, grown first when it is too small for `cols` activations, `k` routing
    /// slots and `rows` outputs.
    fn staging(
        &mut self,
        device: &Device,
        stream: &Stream,
        (cols, k, rows): (usize, usize, usize),
    ) -> Result<&mut Staging> {
        if !self.staging.as_ref().is_some_and(|s| s.fits(cols, k, rows)) {
            // The previous product's upload out of the old staging must have finished before
            // it is freed (a few times per model, while the sizes settle).
            stream
                .synchronize()
                .map_err(|e| gpu_err("waiting before growing the hybrid staging", e))?;
            let (c, kk, r) = match &self.staging {
                // Grown to the largest of each size seen, so it settles after a layer or two.
                Some(s) => (
                    cols.max(s.values.len_bytes()),
                    k.max(s.routing.len_bytes() / 8),
                    rows.max(s.out.len_bytes() / 4),
                ),
                None => (cols, k, rows),
            };
            self.staging = None;
            self.staging = Some(Staging::new(device, c, kk, r)?);
        }
        Ok(self.staging.as_mut().expect("made above"))
    }

    /// One line for the device report: the shares and who finished first how often.
    pub(super) fn report_line(&self) -> Option<String> {
        if self.balance.is_empty() {
            return None;
        }
        let setting = match self.setting {
            CpuShare::Off => "off".to_string(),
            CpuShare::Auto => "auto".to_string(),
            CpuShare::Fixed(f) => format!("fixed {f}"),
        };
        let parts: Vec<String> = self
            .balance
            .iter()
            .map(|(w, b)| {
                format!(
                    "{} {:.0}% on the CPU ({} products, CPU first in {})",
                    w.label(),
                    100.0 * b.share,
                    b.products,
                    b.cpu_first
                )
            })
            .collect();
        let staging = self.staging.as_ref().map_or(0, Staging::bytes);
        let cpu_s = self.cpu_time.as_secs_f64();
        let rate = if cpu_s > 0.0 {
            self.cpu_bytes as f64 / cpu_s / 1e9
        } else {
            0.0
        };
        Some(format!(
            "  hybrid offload ({}={setting}): {}; host cores {:.1} GB/s ({:.2} GB \
             in {:.0} ms), {:.0} ms waiting for the device's activations; staging {:.1} KiB \
             pinned\n",
            CPU_SHARE.name,
            parts.join(", "),
            rate,
            self.cpu_bytes as f64 / 1e9,
            cpu_s * 1e3,
            self.wait_time.as_secs_f64() * 1e3,
            staging as f64 / 1024.0
        ))
    }
}

/// Rows for the CPU out of `rows`, at `share`, in whole quanta, leaving the GPU at least one
/// quantum.
fn cpu_rows(rows: usize, share: f64) -> usize {
    if rows <= ROW_QUANTUM {
        return 0;
    }
    let want = (rows as f64 * share / ROW_QUANTUM as f64).round() as usize * ROW_QUANTUM;
    want.min(rows - ROW_QUANTUM)
}

/// The host bytes of an offloaded weight, when it is one.
pub(super) fn host_bytes(w: &super::GpuWeight) -> Option<&[u8]> {
    match w {
        super::GpuWeight::Matrix {
            mem: super::WeightMemory::Host(p),
            ..
        } => Some(p.as_slice::<u8>()),
        _ => None,
    }
}

impl GpuBackend {
    /// Whether decode steps may split products with the host (and so run eagerly).
    pub(super) fn hybrid_active(&self) -> bool {
        self.hybrid.setting() != CpuShare::Off && self.host_weights.pinned_bytes() > 0
    }

    /// Sets how offloaded decode products are split (tests and A/B runs; users set
    /// [`CPU_SHARE`]).
    pub fn set_cpu_share(&mut self, setting: CpuShare) {
        self.hybrid.set_setting(setting);
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
    pub(super) fn matvec_split(
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
    pub(super) fn moe_split(
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
            let act = gate_activation(act);
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
            let act = gate_activation(act);
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
    fn the_setting_parses_strictly() {
        let share = |v| CPU_SHARE.value(&knobs::Env::from_pairs([(CPU_SHARE.name, v)]));
        assert_eq!(share(""), Ok(CpuShare::Auto));
        assert_eq!(share("auto"), Ok(CpuShare::Auto));
        assert_eq!(share("off"), Ok(CpuShare::Off));
        assert_eq!(share("0"), Ok(CpuShare::Off));
        assert_eq!(share("0.4"), Ok(CpuShare::Fixed(0.4)));
        for bad in ["1", "0.96", "-0.1", "half", "NaN"] {
            let e = share(bad).unwrap_err().to_string();
            assert!(
                e.contains(CPU_SHARE.name) && e.contains(bad) && e.contains("accepted"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn rows_split_in_whole_quanta_and_leave_the_gpu_some() {
        assert_eq!(cpu_rows(4096, 0.5), 2048);
        assert_eq!(cpu_rows(4096, 0.0), 0);
        assert_eq!(cpu_rows(4096, 0.95) % ROW_QUANTUM, 0);
        assert!(cpu_rows(4096, 0.95) <= 4096 - ROW_QUANTUM);
        assert_eq!(cpu_rows(16, 0.9), 0, "too small to split");
        assert_eq!(cpu_rows(100, 0.3), 32);
    }

    #[test]
    fn auto_moves_towards_the_side_that_finished_first() {
        let mut h = Hybrid::new(CpuShare::Auto);
        let w = Work::Rows(GgmlType::Q4K);
        assert_eq!(h.share(w), AUTO_START);
        h.observe(w, true);
        h.observe(w, true);
        assert!((h.share(w) - (AUTO_START + 2.0 * AUTO_STEP)).abs() < 1e-12);
        for _ in 0..1000 {
            h.observe(w, false);
        }
        assert_eq!(h.share(w), 0.0);
        for _ in 0..1000 {
            h.observe(w, true);
        }
        assert_eq!(h.share(w), MAX_CPU_SHARE);
        // A fixed share stays where it was set; off gives the CPU nothing.
        let mut f = Hybrid::new(CpuShare::Fixed(0.3));
        f.share(w);
        f.observe(w, true);
        assert_eq!(f.share(w), 0.3);
        assert_eq!(Hybrid::new(CpuShare::Off).share(w), 0.0);
        assert!(h
            .report_line()
            .unwrap()
            .contains("Q4_K rows 95% on the CPU"));
    }

    #[test]
    fn cpu_experts_add_the_weighted_slots_and_skip_bad_ids() {
        use crate::backend::kernels::tests::random_row;
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

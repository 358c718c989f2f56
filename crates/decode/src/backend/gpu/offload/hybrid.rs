//! The hybrid offload: a decode product over a weight kept in pinned host memory is split
//! between the GPU, whose kernel reads its share of the rows across the host link (zero-copy),
//! and the host's cores, which read the other share from the same memory
//! ([`crate::backend::host::q8`]). Both run at once, so their bandwidths add: zero-copy alone is
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

use crate::backend::gpu::error::gpu_err;
use crate::backend::host::q8::HostActivations;
use crate::error::Result;
use gguf_loader::GgmlType;
use hip_ffi::{Device, Event, PinnedHostBuffer, Stream};
use rocm_kernels::ops::matvec_q8::{self};
use std::collections::BTreeMap;
use std::time::Duration;

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
    pub(crate) fn parse(value: &str) -> std::result::Result<CpuShare, String> {
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
}

/// What one share is kept for: the rows of products over one weight format, or MoE slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Work {
    Rows(GgmlType),
    ExpertSlots,
}

impl Work {
    pub(crate) fn label(self) -> String {
        match self {
            Work::Rows(f) => format!("{} rows", f.name()),
            Work::ExpertSlots => "expert slots".into(),
        }
    }
}

/// One kind of work's share and what the balance saw.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Balance {
    pub(crate) share: f64,
    pub(crate) products: u64,
    /// Products where the CPU finished while the GPU was still busy.
    pub(crate) cpu_first: u64,
}

/// Pinned staging and the two events of a split product. Grown on demand, never shrunk.
pub(crate) struct Staging {
    pub(crate) values: PinnedHostBuffer,
    pub(crate) scales: PinnedHostBuffer,
    pub(crate) routing: PinnedHostBuffer,
    pub(crate) out: PinnedHostBuffer,
    /// Recorded after the copies back: the host may read the staging.
    pub(crate) ready: Event,
    /// Recorded after the GPU's share: its query says who finished first.
    pub(crate) gpu_done: Event,
}

impl Staging {
    pub(crate) fn new(device: &Device, cols: usize, k: usize, rows: usize) -> Result<Staging> {
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

    pub(crate) fn fits(&self, cols: usize, k: usize, rows: usize) -> bool {
        self.values.len_bytes() >= cols
            && self.scales.len_bytes() >= cols / matvec_q8::GROUP * 4
            && self.routing.len_bytes() >= 2 * k * 4
            && self.out.len_bytes() >= rows * 4
    }

    pub(crate) fn bytes(&self) -> usize {
        [&self.values, &self.scales, &self.routing, &self.out]
            .iter()
            .map(|b| b.len_bytes())
            .sum()
    }
}

/// The hybrid offload's state in a [`GpuBackend`].
pub(crate) struct Hybrid {
    pub(crate) setting: CpuShare,
    pub(crate) balance: BTreeMap<Work, Balance>,
    pub(crate) acts: HostActivations,
    /// The gated activations of the CPU's experts, quantized for their down projections.
    pub(crate) hidden: Vec<HostActivations>,
    pub(crate) staging: Option<Staging>,
    /// What the host's side did: weight bytes it multiplied, time it spent on them, and time it
    /// waited for the device to hand over activations.
    pub(crate) cpu_bytes: u64,
    pub(crate) cpu_time: Duration,
    pub(crate) wait_time: Duration,
}

impl Hybrid {
    pub(crate) fn new(setting: CpuShare) -> Hybrid {
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

    pub(crate) fn setting(&self) -> CpuShare {
        self.setting
    }

    /// Sets how products are split from now on (the shares learnt so far are forgotten).
    pub(crate) fn set_setting(&mut self, setting: CpuShare) {
        self.setting = setting;
        self.balance.clear();
    }

    /// The CPU's current share of `work`.
    pub(crate) fn share(&mut self, work: Work) -> f64 {
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
    pub(crate) fn observe(&mut self, work: Work, cpu_first: bool) {
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
    pub(crate) fn staging(
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
    pub(crate) fn report_line(&self) -> Option<String> {
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
pub(crate) fn cpu_rows(rows: usize, share: f64) -> usize {
    if rows <= ROW_QUANTUM {
        return 0;
    }
    let want = (rows as f64 * share / ROW_QUANTUM as f64).round() as usize * ROW_QUANTUM;
    want.min(rows - ROW_QUANTUM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_parses_strictly() {
        let share = |v| CPU_SHARE.value_of(v);
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
}

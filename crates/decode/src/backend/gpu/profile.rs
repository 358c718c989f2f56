//! Per-op time of a GPU step, from events recorded between consecutive ops.
//!
//! Timing kernels with events is only honest when the device never waits for the host between
//! them; otherwise an event pair measures how fast the host enqueues. So a profiled step starts
//! with a kernel that busy-waits a few milliseconds: the host queues the whole step meanwhile,
//! and the device then runs it back to back. Profiling runs steps eagerly (no graph), so the sum
//! of the ops is the step's kernel time without graph-launch savings; the difference to a
//! replayed step is launch overhead.

use hip_ffi::{Device, Event, Stream};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Busy-wait at the head of a profiled step, in device clock ticks (about 50 ms at 2 GHz: the
/// host queues a launch and an event per op, some 10 us each in eager mode, so a step of a
/// thousand ops needs about 10 ms; the first measurements showed 5 ms was too short).
pub const HEAD_START_CYCLES: u64 = 100_000_000;

#[derive(Clone, Debug, Default)]
struct OpTotal {
    calls: u64,
    ms: f64,
    bytes: u64,
}

/// Event pairs of the current step and totals of the finished ones.
#[derive(Default)]
pub struct OpProfile {
    /// Boundary events, reused from step to step; `events[i]..events[i + 1]` is op `i`.
    events: Vec<Event>,
    /// Boundaries recorded in the current step.
    recorded: usize,
    /// Label and bytes moved of each op of the current step.
    ops: Vec<(String, u64)>,
    totals: BTreeMap<String, OpTotal>,
    steps: u64,
    /// Steps whose head start ran out before the host had queued them: their op times include
    /// gaps where the device waited for the host.
    host_bound_steps: u64,
    /// The current step's head start has run out while ops were still being queued.
    caught_up: bool,
}

impl OpProfile {
    fn record(&mut self, device: &Device, stream: &Stream) -> hip_ffi::Result<()> {
        if self.recorded == self.events.len() {
            self.events.push(Event::new(device)?);
        }
        self.events[self.recorded].record(stream)?;
        self.recorded += 1;
        Ok(())
    }

    /// Opens a step: the first boundary (call after the head-start kernel is queued).
    pub fn begin_step(&mut self, device: &Device, stream: &Stream) -> hip_ffi::Result<()> {
        self.finish_step()?;
        self.record(device, stream)
    }

    /// Closes the op queued since the last boundary.
    pub fn op_done(
        &mut self,
        device: &Device,
        stream: &Stream,
        label: String,
        bytes: u64,
    ) -> hip_ffi::Result<()> {
        if self.recorded == 0 {
            return Ok(()); // an op outside a step (loading, tests)
        }
        // If the device is already past the head start while the host still queues ops, it
        // may wait for the host between them.
        if !self.caught_up && self.events[0].query()? {
            self.caught_up = true;
        }
        self.record(device, stream)?;
        self.ops.push((label, bytes));
        Ok(())
    }

    /// Waits for the current step's last boundary and adds its ops to the totals.
    pub fn finish_step(&mut self) -> hip_ffi::Result<()> {
        if self.recorded == 0 {
            return Ok(());
        }
        if self.caught_up {
            self.host_bound_steps += 1;
            self.caught_up = false;
        }
        self.events[self.recorded - 1].synchronize()?;
        for (i, (label, bytes)) in self.ops.drain(..).enumerate() {
            let ms = self.events[i + 1].elapsed_ms_since(&self.events[i])?;
            let total = self.totals.entry(label).or_default();
            total.calls += 1;
            total.ms += f64::from(ms);
            total.bytes += bytes;
        }
        self.recorded = 0;
        self.steps += 1;
        Ok(())
    }

    /// The table: one row per op label, slowest first, per step.
    pub fn report(&mut self) -> hip_ffi::Result<String> {
        self.finish_step()?;
        let steps = self.steps.max(1) as f64;
        let total_ms: f64 = self.totals.values().map(|t| t.ms).sum();
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "per-op profile: {} steps, {:.1} us of kernels per step (eager, after a head-start wait)",
            self.steps,
            total_ms * 1e3 / steps
        );
        if self.host_bound_steps > 0 {
            let _ = writeln!(
                out,
                "warning: in {} of {} steps the device caught up with the host; those op times \
                 include waits for the host",
                self.host_bound_steps, self.steps
            );
        }
        let _ = writeln!(
            out,
            "| op | calls/step | us/step | share | GB/s |\n| --- | ---: | ---: | ---: | ---: |"
        );
        for (label, t) in rows {
            let gbs = if t.ms > 0.0 {
                t.bytes as f64 / (t.ms * 1e-3) / 1e9
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "| {label} | {:.0} | {:.1} | {:.1}% | {gbs:.0} |",
                t.calls as f64 / steps,
                t.ms * 1e3 / steps,
                100.0 * t.ms / total_ms.max(f64::MIN_POSITIVE),
            );
        }
        Ok(out)
    }
}

//! Capturing decode steps into graphs and replaying them, on the stream and pool that
//! [`super::capture_stream`] chose.

use crate::backend::gpu::capture_stream::*;
use crate::backend::gpu::{error::gpu_err, GpuBackend};
use crate::backend::{MoeShape, Phase, StepKey};
use crate::error::Result;
use hip_ffi::{GraphExec, Stream};
use std::sync::Arc;

impl GpuBackend {
    /// Whether a step of `key` is captured into a graph (and replayed from then on).
    ///
    /// Only decode steps are: prefill chunks vary in length and run once each. A step that
    /// splits offloaded products with the host waits on the device mid-step, so it cannot be a
    /// graph; nor can one that streams weights through the copy stream (its cross-stream waits
    /// are not captured). Nor can a decode step of so many rows that its MoE takes the grouped
    /// prefill path, which reads the experts' row counts back to the host. Nor can a step whose
    /// all-reduces go through host memory.
    pub(super) fn captures(&self, key: StepKey) -> bool {
        let moe_syncs = self.moe_shape.is_some_and(|m| {
            self.moe_prefill_applies(&MoeShape {
                rows: key.n_tokens,
                ..m
            })
        });
        self.use_graphs
            && self.collective.is_none()
            && key.phase == Phase::Decode
            && !moe_syncs
            && !self.hybrid_active()
            && self.host_weights.stream_slot_bytes() == 0
    }

    /// Sets where decode graphs are captured and which pool a capture allocates from, as
    /// [`CAPTURE_STREAM`] and [`GRAPH_POOL`] do at start-up. Refused once a graph has
    /// been captured: it would replay on the stream it was captured for, without the events
    /// that order the other one.
    pub fn set_capture(&mut self, stream: CaptureStream, pool: GraphPoolMode) -> Result<()> {
        if !self.graphs.is_empty() {
            return Err(crate::error::DecodeError::InvalidArgument(
                "the capture stream and pool can only change before the first decode graph is \
                 captured; set them right after creating the backend"
                    .into(),
            ));
        }
        let books = self.capture.books;
        let runtime_at_start = self.capture.runtime_at_start;
        let (hip, device) = (Arc::clone(&self.hip), *self.device());
        self.capture =
            CaptureState::with(&hip, &device, &self.alloc, self.stream_id, stream, pool)?;
        self.capture.books = books;
        self.capture.runtime_at_start = runtime_at_start;
        Ok(())
    }

    fn probe(&self) -> Result<Probe> {
        let free = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?
            .free;
        let snap = self.alloc.snapshot();
        Ok(Probe {
            free,
            reserved: snap.stats.reserved_bytes,
            graph_pools: snap.breakdown().graph_pools,
        })
    }

    /// Records what the process holds outside the allocator now that the backend has started.
    pub(super) fn note_runtime_at_start(&mut self) -> Result<()> {
        let p = self.probe()?;
        let used = self.mem_before.free.saturating_sub(p.free);
        self.capture.runtime_at_start = used.saturating_sub(p.reserved);
        Ok(())
    }

    /// Queues one replay of `exec` on the capture stream, ordered after the main stream's
    /// queued work and before its later work.
    ///
    /// # Safety
    /// As [`GraphExec::launch`]: every buffer the graph was captured over is still allocated
    /// at the same address and owned by the model or this backend.
    pub(super) unsafe fn replay_step(&self, exec: &GraphExec) -> Result<()> {
        let launch = |stream: &Stream| {
            // SAFETY: the caller's guarantee; a graph captured on the side stream is replayed
            // there, ordered by the events around it.
            unsafe { exec.launch(stream) }.map_err(|e| gpu_err("replaying the step", e))
        };
        match &self.capture.side {
            None => launch(&self.stream),
            Some(side) => {
                side.enter(&self.stream)?;
                launch(&side.stream)?;
                side.leave(&self.stream)
            }
        }
    }

    /// Captures `ops` into a graph on the capture stream, instantiates it, runs it once and
    /// adds its memory to the books.
    pub(super) fn capture_step(
        &mut self,
        ops: &mut dyn FnMut(&mut GpuBackend) -> Result<()>,
    ) -> Result<GraphExec> {
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("waiting for the stream before a capture", e))?;
        let before = self.probe()?;
        // With a side stream, the ops queue on it: the backend's stream and its id are
        // swapped for the side stream's for the capture, and swapped back whatever happens.
        self.swap_capture_stream();
        let captured = self.capture_on_current(ops);
        self.swap_capture_stream();
        let graph = captured?;
        let nodes = graph.kernel_nodes();
        let estimate = estimate_graph_bytes(nodes);
        let exec = graph
            .instantiate()
            .map_err(|e| gpu_err("instantiating the captured step", e))?;
        drop(graph);
        // SAFETY: the capture recorded this step's work over buffers the model and this
        // backend own for their whole lives, without running it, so it runs now.
        unsafe { self.replay_step(&exec) }?;
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("running the captured step", e))?;
        let after = self.probe()?;
        let used = before.free.saturating_sub(after.free);
        let grown = after.reserved.saturating_sub(before.reserved);
        let b = &mut self.capture.books;
        b.captures += 1;
        b.kernel_nodes += nodes;
        b.estimate += estimate;
        b.measured_outside += used.saturating_sub(grown);
        b.measured_pool += after.graph_pools.saturating_sub(before.graph_pools);
        Ok(exec)
    }

    /// The capture itself, on whatever `self.stream` is now.
    fn capture_on_current(
        &mut self,
        ops: &mut dyn FnMut(&mut GpuBackend) -> Result<()>,
    ) -> Result<hip_ffi::Graph> {
        let alloc = Arc::clone(&self.alloc);
        let guard = alloc
            .begin_capture(self.stream_id, self.capture.target(&self.graph_pool))
            .map_err(|e| gpu_err("starting a capture in the allocator", e))?;
        self.stream
            .begin_capture()
            .map_err(|e| gpu_err("starting a stream capture", e))?;
        let recorded = ops(self);
        // The capture must end whatever the ops did, or the stream stays unusable.
        let graph = self.stream.end_capture();
        drop(guard);
        recorded?;
        graph.map_err(|e| gpu_err("ending the stream capture", e))
    }

    fn swap_capture_stream(&mut self) {
        if let Some(side) = &mut self.capture.side {
            std::mem::swap(&mut self.stream, &mut side.stream);
            std::mem::swap(&mut self.stream_id, &mut side.id);
        }
    }
}

//! Where a decode step's graph is captured and replayed, and what it costs in device memory.
//!
//! - `HIPDECODE_CAPTURE_STREAM=current|side`: capture and replay on the backend's own stream
//!   (the default), or on a side stream of its own. The side stream waits for the main stream's
//!   work before each replay (an event) and the main stream waits for the replay after it, so
//!   the order of work is the same; what differs is the stream (and so the allocator pool) that
//!   owns the capture's memory, and two event records and waits per step.
//! - `HIPDECODE_GRAPH_POOL=private|shared`: a capture allocates from the graph's private pool
//!   (the default) or from the capturing stream's ordinary pool. Both are correct here because
//!   the backend reserves every buffer a decode step uses before the first capture.
//!
//! The graph-memory books: before a graph is instantiated (when the driver takes its device
//! memory) its kernel nodes give an estimate; after its first replay the device's free memory
//! and the allocator's graph pools give the measured bytes. docs/memory.md says how rough the
//! estimate is.

use crate::backend::gpu::error::gpu_err;
use crate::error::Result;
use crate::memory::GraphMemory;
use hip_ffi::{Device, Event, Stream};
use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{Allocator, CaptureTarget, GraphPool, StreamId};
use std::sync::Arc;

pub static CAPTURE_STREAM: knobs::Knob<CaptureStream> = knobs::Knob {
    name: "HIPDECODE_CAPTURE_STREAM",
    default: "current",
    doc: "the stream decode graphs are captured and replayed on: `current` (the backend's) or \
          `side` (one of their own; the memory study's stranded-workspace case)",
    scope: knobs::Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("current", CaptureStream::Current),
                ("side", CaptureStream::Side),
            ],
        )
    },
};

pub static GRAPH_POOL: knobs::Knob<GraphPoolMode> = knobs::Knob {
    name: "HIPDECODE_GRAPH_POOL",
    default: "private",
    doc: "the pool a capture allocates from: `private` (the graphs' own) or `shared` (the \
          capturing stream's)",
    scope: knobs::Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("private", GraphPoolMode::Private),
                ("shared", GraphPoolMode::Shared),
            ],
        )
    },
};

/// The stream decode graphs run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureStream {
    /// The backend's own stream, the one every other op uses.
    Current,
    /// A stream of its own, ordered against the main one by events.
    Side,
}

/// The pool a capture allocates from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphPoolMode {
    /// The graphs' private pool ([`CaptureTarget::Private`]).
    Private,
    /// The capturing stream's ordinary pool ([`CaptureTarget::StreamPool`]).
    Shared,
}

/// Device bytes assumed per kernel node of an instantiated graph (its launch parameters and
/// the node's descriptor). Not a driver figure: a round guess, to be replaced by what the
/// H200 measures (bench-decode prints both).
pub const ASSUMED_BYTES_PER_KERNEL_NODE: u64 = 4096;
/// The runtime hands out device memory in pages of this size, and reports free memory in them.
pub const DRIVER_GRANULE: u64 = 2 << 20;

/// The estimate of a graph's device memory outside the allocator: its kernel nodes at
/// [`ASSUMED_BYTES_PER_KERNEL_NODE`], rounded up to the driver's granule. The pool part is
/// expected to be 0, since every buffer a step uses is reserved before the first capture.
pub fn estimate_graph_bytes(kernel_nodes: u64) -> u64 {
    kernel_nodes
        .saturating_mul(ASSUMED_BYTES_PER_KERNEL_NODE)
        .next_multiple_of(DRIVER_GRANULE)
}

/// The side stream and the two events that order it against the main stream.
pub(crate) struct SideStream {
    pub(crate) id: StreamId,
    pub(crate) stream: Arc<Stream>,
    /// Recorded on the main stream; the side stream waits for it before a replay.
    pub(crate) ready: Event,
    /// Recorded on the side stream after a replay; the main stream waits for it.
    pub(crate) done: Event,
}

impl SideStream {
    pub(crate) fn enter(&self, main: &Stream) -> Result<()> {
        self.ready
            .record(main)
            .and_then(|()| self.stream.wait_event(&self.ready))
            .map_err(|e| gpu_err("ordering the side stream after the main stream", e))
    }

    pub(crate) fn leave(&self, main: &Stream) -> Result<()> {
        self.done
            .record(&self.stream)
            .and_then(|()| main.wait_event(&self.done))
            .map_err(|e| gpu_err("ordering the main stream after the side stream", e))
    }
}

/// The capture settings and the books of what graphs took.
pub(crate) struct CaptureState {
    pub(super) pool: GraphPoolMode,
    pub(crate) side: Option<SideStream>,
    pub(super) books: GraphMemory,
    /// Outside-the-allocator bytes when the backend had started (set at the end of `new`).
    pub(super) runtime_at_start: u64,
}

impl CaptureState {
    /// The given settings. With a side stream the allocator is told which stream is the main
    /// one, so its snapshot lists the side stream's cached blocks as stranded.
    pub(crate) fn with(
        hip: &HipDevice,
        device: &Device,
        alloc: &Allocator,
        main: StreamId,
        stream: CaptureStream,
        pool: GraphPoolMode,
    ) -> Result<CaptureState> {
        let side = match stream {
            CaptureStream::Current => None,
            CaptureStream::Side => {
                let (id, stream) = hip
                    .create_stream()
                    .map_err(|e| gpu_err("creating the capture side stream", e))?;
                let event = || Event::new_without_timing(device).map_err(|e| gpu_err("event", e));
                alloc.set_main_stream(main);
                Some(SideStream {
                    id,
                    stream,
                    ready: event()?,
                    done: event()?,
                })
            }
        };
        Ok(CaptureState {
            pool,
            side,
            books: GraphMemory::default(),
            runtime_at_start: 0,
        })
    }

    pub(crate) fn target<'a>(&self, graph_pool: &'a GraphPool) -> CaptureTarget<'a> {
        match self.pool {
            GraphPoolMode::Private => CaptureTarget::Private(graph_pool),
            GraphPoolMode::Shared => CaptureTarget::StreamPool,
        }
    }
}

/// Free device bytes and the allocator's reserved and graph-pool bytes, read together.
pub(crate) struct Probe {
    pub(crate) free: u64,
    pub(crate) reserved: u64,
    pub(crate) graph_pools: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_variables_are_parsed_strictly_with_the_accepted_words() {
        let stream = |v| CAPTURE_STREAM.value_of(v);
        assert_eq!(stream("side"), Ok(CaptureStream::Side));
        assert_eq!(stream(" current "), Ok(CaptureStream::Current));
        assert_eq!(stream(""), Ok(CaptureStream::Current));
        let e = stream("sidecar").unwrap_err().to_string();
        assert!(
            e.contains(CAPTURE_STREAM.name) && e.contains("'current'") && e.contains("'side'"),
            "{e}"
        );
        let pool = |v| GRAPH_POOL.value_of(v);
        assert_eq!(pool("shared"), Ok(GraphPoolMode::Shared));
        let e = pool("Private").unwrap_err().to_string();
        assert!(
            e.contains(GRAPH_POOL.name) && e.contains("'private'"),
            "{e}"
        );
    }

    #[test]
    fn the_estimate_rounds_nodes_up_to_the_driver_granule() {
        assert_eq!(estimate_graph_bytes(0), 0);
        assert_eq!(estimate_graph_bytes(1), DRIVER_GRANULE);
        let per_granule = DRIVER_GRANULE / ASSUMED_BYTES_PER_KERNEL_NODE;
        assert_eq!(estimate_graph_bytes(per_granule), DRIVER_GRANULE);
        assert_eq!(estimate_graph_bytes(per_granule + 1), 2 * DRIVER_GRANULE);
    }
}

//! Graph-capture pools.
//!
//! While a stream captures a graph, its allocations come from a private pool that belongs to
//! the graph: replays reuse the captured addresses, so that memory must not be handed to anyone
//! else until the graph is gone. The pool lives as long as a [`GraphPool`] handle does (the
//! graph keeps one); dropping the last handle releases its idle segments at once and the rest
//! as their blocks are freed. [`CaptureTarget::StreamPool`] instead lets a capture use the
//! stream's ordinary pool, for captures whose buffers are all made before capture begins.
//!
//! The allocator learns of captures only through [`crate::Allocator::begin_capture`], so every
//! driver capture on the device must be bracketed by one. While any capture is active (a single
//! flag: the list of capturing streams is not empty) the allocator makes no call a capture
//! forbids: it does not free device memory, and it does not record, query or wait on events.
//! Cross-stream frees made meanwhile wait for the end of the last capture, when their events
//! are recorded and the cache is trimmed back to its limit.

use std::sync::Arc;

use crate::allocator::Allocator;
use crate::block_pool::{GraphPoolId, PoolOwner};
use crate::device::StreamId;

/// Where allocations made on a capturing stream come from.
#[derive(Clone, Copy, Debug)]
pub enum CaptureTarget<'a> {
    /// The given graph pool (create one with [`Allocator::new_graph_pool`]; pass the same pool
    /// to several captures to let their graphs share memory).
    Private(&'a GraphPool),
    /// The capturing stream's ordinary pool.
    StreamPool,
}

struct PoolHandle {
    id: GraphPoolId,
    allocator: Allocator,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.allocator.release_graph_pool(self.id);
    }
}

/// A graph's private memory pool. Cloning shares the pool; memory is released when the last
/// clone is dropped.
#[derive(Clone)]
pub struct GraphPool {
    handle: Arc<PoolHandle>,
}

impl GraphPool {
    pub(crate) fn new(id: GraphPoolId, allocator: Allocator) -> GraphPool {
        GraphPool {
            handle: Arc::new(PoolHandle { id, allocator }),
        }
    }

    /// The pool's identifier, as shown in snapshots.
    pub fn id(&self) -> GraphPoolId {
        self.handle.id
    }
}

impl std::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphPool")
            .field("id", &self.handle.id)
            .finish()
    }
}

/// An active capture; allocations on its stream follow its [`CaptureTarget`] until it is
/// ended or dropped. End the driver's capture first, then this guard: the deferred work done
/// when the last guard goes (recording events, trimming) is illegal inside a capture.
pub struct CaptureGuard {
    pub(crate) allocator: Allocator,
    pub(crate) stream: StreamId,
    /// Keeps the pool alive while capturing even if the caller drops its handle.
    pub(crate) _pool: Option<GraphPool>,
}

impl CaptureGuard {
    /// Ends the capture (same as dropping the guard).
    pub fn end(self) {}

    /// The capturing stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        self.allocator.end_capture(self.stream);
    }
}

/// Which streams are capturing, and into which pool. Few streams capture at once, so a vector
/// beats a map; an empty vector costs the allocation path one length check.
#[derive(Debug, Default)]
pub(crate) struct Captures {
    active: Vec<(StreamId, PoolOwner)>,
    live_pools: Vec<GraphPoolId>,
    next_pool: u64,
}

impl Captures {
    #[inline]
    pub fn owner_for(&self, stream: StreamId) -> PoolOwner {
        if self.active.is_empty() {
            return PoolOwner::Default;
        }
        self.active
            .iter()
            .find(|(s, _)| *s == stream)
            .map_or(PoolOwner::Default, |(_, o)| *o)
    }

    pub fn is_capturing(&self, stream: StreamId) -> bool {
        self.active.iter().any(|(s, _)| *s == stream)
    }

    /// Whether any stream is capturing: the one flag every capture rule checks.
    #[inline]
    pub fn any_active(&self) -> bool {
        !self.active.is_empty()
    }

    pub fn begin(&mut self, stream: StreamId, owner: PoolOwner) {
        self.active.push((stream, owner));
    }

    /// Ends the capture on `stream`; returns whether that was the last active one.
    pub fn end(&mut self, stream: StreamId) -> bool {
        let before = self.active.len();
        self.active.retain(|(s, _)| *s != stream);
        before > 0 && self.active.is_empty()
    }

    pub fn new_pool(&mut self) -> GraphPoolId {
        self.next_pool += 1;
        let id = GraphPoolId(self.next_pool);
        self.live_pools.push(id);
        id
    }

    pub fn release_pool(&mut self, id: GraphPoolId) {
        self.live_pools.retain(|p| *p != id);
    }

    /// Whether segments of this owner should be returned to the device as soon as they idle.
    pub fn is_dead(&self, owner: PoolOwner) -> bool {
        match owner {
            PoolOwner::Default => false,
            PoolOwner::Graph(id) => !self.live_pools.contains(&id),
        }
    }
}

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
use crate::error::AllocError;

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
    fn new(id: GraphPoolId, allocator: Allocator) -> GraphPool {
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
    allocator: Allocator,
    stream: StreamId,
    /// Keeps the pool alive while capturing even if the caller drops its handle.
    _pool: Option<GraphPool>,
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

impl Allocator {
    /// Creates a private pool for graph captures.
    pub fn new_graph_pool(&self) -> GraphPool {
        let id = self.register_graph_pool();
        GraphPool::new(id, self.clone())
    }

    /// Routes allocations on `stream` to `target` until the returned guard is dropped, and
    /// keeps the allocator from every call a capture forbids meanwhile. Call it before the
    /// driver's capture begins (`hip_ffi::Stream::begin_capture`) and drop the guard after the
    /// driver's capture ends.
    pub fn begin_capture(
        &self,
        stream: StreamId,
        target: CaptureTarget<'_>,
    ) -> Result<CaptureGuard, AllocError> {
        let (owner, pool) = match target {
            CaptureTarget::Private(p) => (PoolOwner::Graph(p.id()), Some(p.clone())),
            CaptureTarget::StreamPool => (PoolOwner::Default, None),
        };
        self.register_capture(stream, owner)?;
        Ok(CaptureGuard {
            allocator: self.clone(),
            stream,
            _pool: pool,
        })
    }
}

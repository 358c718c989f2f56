//! Which streams are capturing a graph, and which graph pools are still alive. Allocator state,
//! kept apart from the handles of [`crate::graph_pool`] (which hold the allocator), so that the
//! allocator's state does not depend on its handles.

use crate::block_pool::{GraphPoolId, PoolOwner};
use crate::device::StreamId;

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

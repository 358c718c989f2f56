//! Where every reserved byte is, at one moment: a partition of `reserved_bytes` into active
//! bytes per tag, graph pools, the releasable cache, fragmentation slack and pending frees.
//! The parts sum to the reserved bytes exactly, so nothing the allocator holds is left
//! unexplained; what the process holds outside the allocator is the runtime's to explain.

use serde::Serialize;

use crate::block::BlockState;
use crate::snapshot::{PoolName, Snapshot};
use crate::tag::Tag;

/// `reserved_bytes` split into parts that do not overlap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReservedBreakdown {
    /// Active blocks of the ordinary (stream) pools and memory mapped into growable regions,
    /// per tag in [`Tag::ALL`] order.
    pub active_by_tag: Vec<(Tag, u64)>,
    /// Every byte of graph-pool segments, active or free: memory that belongs to captured
    /// graphs and that no trim releases.
    pub graph_pools: u64,
    /// Ordinary-pool segments with no active or pending block: the cache a trim can release
    /// (what the cache limit bounds).
    pub releasable: u64,
    /// Free blocks inside ordinary-pool segments that also hold an active or pending block:
    /// cached bytes no trim can release until their neighbours are freed (fragmentation
    /// slack).
    pub fragmentation: u64,
    /// Blocks freed by their user that wait for other streams' events (or are stuck).
    pub pending: u64,
    /// Of the active bytes, those held by decode arenas (already inside `active_by_tag`).
    pub arena: u64,
    /// Of the active bytes, those mapped into growable regions (already inside
    /// `active_by_tag`).
    pub mapped: u64,
    /// The reserved bytes these parts add up to.
    pub reserved: u64,
}

impl ReservedBreakdown {
    /// Active bytes of one tag in the ordinary pools.
    pub fn active(&self, tag: Tag) -> u64 {
        self.active_by_tag
            .iter()
            .find(|(t, _)| *t == tag)
            .map_or(0, |(_, b)| *b)
    }

    /// The sum of the non-overlapping parts (equals `reserved` by construction).
    pub fn sum(&self) -> u64 {
        self.active_by_tag.iter().map(|(_, b)| b).sum::<u64>()
            + self.graph_pools
            + self.releasable
            + self.fragmentation
            + self.pending
    }
}

impl Snapshot {
    /// The partition of this snapshot's reserved bytes.
    pub fn breakdown(&self) -> ReservedBreakdown {
        let mut by_tag = [0u64; Tag::COUNT];
        let mut b = ReservedBreakdown {
            arena: self.stats.arena_bytes,
            ..ReservedBreakdown::default()
        };
        for seg in &self.segments {
            b.reserved += seg.size;
            if matches!(seg.pool, PoolName::Graph(_)) {
                b.graph_pools += seg.size;
                continue;
            }
            let idle = seg.blocks.iter().all(|x| x.state == BlockState::Free);
            if idle {
                b.releasable += seg.size;
                continue;
            }
            for blk in &seg.blocks {
                match (blk.state, blk.tag) {
                    (BlockState::Active, Some(tag)) => by_tag[tag.index()] += blk.size,
                    // An active block always carries its tag; count one without under other.
                    (BlockState::Active, None) => by_tag[Tag::Other.index()] += blk.size,
                    (BlockState::Free, _) => b.fragmentation += blk.size,
                    (BlockState::PendingFree, _) => b.pending += blk.size,
                }
            }
        }
        for &(tag, bytes) in &self.mapped_by_tag {
            by_tag[tag.index()] += bytes;
            b.mapped += bytes;
            b.reserved += bytes;
        }
        b.active_by_tag = Tag::ALL.iter().map(|&t| (t, by_tag[t.index()])).collect();
        b
    }
}

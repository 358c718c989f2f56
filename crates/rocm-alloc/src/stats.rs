//! Counters: active bytes per tag with their peaks, reserved and cached bytes, device calls,
//! cache hits and misses, and OOM retries.

use serde::Serialize;

use crate::tag::Tag;

/// Current and peak active bytes of one tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TagUsage {
    /// Bytes currently handed out under this tag (rounded block sizes).
    pub current: u64,
    /// Highest `current` since creation or the last `reset_peak`.
    pub peak: u64,
}

/// A consistent copy of the allocator's counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Bytes handed out to users (block sizes; a block waiting for other streams after its free
    /// is no longer active, it is counted in `cached_bytes`).
    pub active_bytes: u64,
    /// Highest `active_bytes` since creation or the last `reset_peak`.
    pub peak_active_bytes: u64,
    /// Per tag, in [`Tag::ALL`] order.
    pub per_tag: Vec<(Tag, TagUsage)>,
    /// Bytes obtained from the device and not yet returned.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` since creation or the last `reset_peak`.
    pub peak_reserved_bytes: u64,
    /// `reserved_bytes - active_bytes`: free bytes held by the cache, including free space
    /// inside segments that also hold active blocks.
    pub cached_bytes: u64,
    /// Bytes of ordinary-pool segments with no active block: what a trim can release, and what
    /// the cache limit bounds.
    pub releasable_bytes: u64,
    /// Blocks freed by their user but not reusable yet: waiting for other streams' events, for
    /// the end of a graph capture, or stuck (below).
    pub pending_free_blocks: u64,
    /// Blocks kept out of reuse for good because an event call for them failed (see
    /// [`crate::Snapshot::stuck_blocks`] for which block and stream).
    pub stuck_blocks: u64,
    /// Device allocations made.
    pub device_allocs: u64,
    /// Device frees made.
    pub device_frees: u64,
    /// Device frees the driver reported as failed (should stay 0).
    pub device_free_failures: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that needed a new segment.
    pub cache_misses: u64,
    /// Times an allocation failed, the cache was flushed and the allocation retried.
    pub oom_retries: u64,
    /// The memory limit in force (`None` = unbounded).
    pub memory_limit: Option<u64>,
    /// The cache limit in force (`None` = unbounded).
    pub cache_limit: Option<u64>,
    /// Bytes held by live decode arenas ([`crate::Allocator::new_arena`]); a part of
    /// `active_bytes`, also counted under each arena's tag.
    pub arena_bytes: u64,
    /// Bytes mapped into growable regions ([`crate::Allocator::reserve_growable`]): a part of
    /// both `reserved_bytes` and `active_bytes`, also counted under each region's tag.
    pub mapped_bytes: u64,
}

impl Stats {
    /// Usage of one tag.
    pub fn tag(&self, tag: Tag) -> TagUsage {
        self.per_tag[tag.index()].1
    }
}

/// The mutable counters kept under the allocator's lock.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub active: u64,
    pub peak_active: u64,
    pub per_tag: [TagUsage; Tag::COUNT],
    pub peak_reserved: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub device_free_failures: u64,
    pub hits: u64,
    pub misses: u64,
    pub oom_retries: u64,
}

impl Counters {
    #[inline]
    pub fn on_alloc(&mut self, tag: Tag, bytes: u64) {
        self.active += bytes;
        if self.active > self.peak_active {
            self.peak_active = self.active;
        }
        let t = &mut self.per_tag[tag.index()];
        t.current += bytes;
        if t.current > t.peak {
            t.peak = t.current;
        }
    }

    #[inline]
    pub fn on_free(&mut self, tag: Tag, bytes: u64) {
        self.active -= bytes;
        self.per_tag[tag.index()].current -= bytes;
    }

    pub fn on_reserve(&mut self, reserved: u64) {
        self.device_allocs += 1;
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
        }
    }

    pub fn reset_peak(&mut self, reserved: u64) {
        self.peak_active = self.active;
        for t in &mut self.per_tag {
            t.peak = t.current;
        }
        self.peak_reserved = reserved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_follow_and_reset() {
        let mut c = Counters::default();
        c.on_alloc(Tag::KvCache, 100);
        c.on_alloc(Tag::Weights, 50);
        c.on_free(Tag::KvCache, 100);
        assert_eq!(c.active, 50);
        assert_eq!(c.peak_active, 150);
        assert_eq!(
            c.per_tag[Tag::KvCache.index()],
            TagUsage {
                current: 0,
                peak: 100
            }
        );
        c.reset_peak(0);
        assert_eq!(c.peak_active, 50);
        assert_eq!(c.per_tag[Tag::KvCache.index()].peak, 0);
        assert_eq!(c.per_tag[Tag::Weights.index()].peak, 50);
    }
}

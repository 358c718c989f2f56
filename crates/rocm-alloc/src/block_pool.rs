//! Segments, the blocks they are split into, and the free lists that find a block for a
//! request. Pure bookkeeping: this module never talks to a device.
//!
//! Blocks live in a slab indexed by [`BlockId`]; each segment's blocks form a doubly linked list
//! in address order so that a freed block can merge with free neighbours in O(1). Free blocks
//! sit in one free list per [`PoolKey`] (see [`crate::free_list`]): exact best fit,
//! deterministic, one binary search per lookup.

use crate::block::{Block, BlockId, BlockState, SegmentId, NIL};
use crate::device::StreamId;
use crate::free_list::FreeList;
use crate::size_class::{should_split, SizeKind};
use crate::tag::Tag;

/// Identifies a graph's private pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct GraphPoolId(pub u64);

/// Who owns a segment: the ordinary per-stream cache, or a graph's private pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PoolOwner {
    Default,
    Graph(GraphPoolId),
}

/// One free list: blocks of one owner, one stream and one size kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    pub owner: PoolOwner,
    pub stream: StreamId,
    pub kind: SizeKind,
}

#[derive(Debug)]
pub(crate) struct Segment {
    pub addr: u64,
    pub size: u64,
    pub pool: PoolKey,
    first: BlockId,
    /// Blocks that are Active or PendingFree.
    busy: u32,
    /// Logical time (allocation count) of the segment's last allocation or free, for LRU
    /// trimming and for sparing recently used segments from automatic trims.
    pub last_used: u64,
    live: bool,
}

/// A segment that has no busy block and could be returned to the device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdleSegment {
    pub id: SegmentId,
    pub size: u64,
    pub last_used: u64,
    pub owner: PoolOwner,
}

#[derive(Default)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    free_block_slots: Vec<BlockId>,
    segments: Vec<Segment>,
    free_segment_slots: Vec<SegmentId>,
    free_lists: Vec<(PoolKey, FreeList)>,
    /// Idle bytes of segments owned by the default pools (what the cache limit bounds).
    idle_default_bytes: u64,
    reserved: u64,
    clock: u64,
}

impl BlockPool {
    pub fn block(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }

    pub fn block_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    pub fn segment(&self, id: SegmentId) -> &Segment {
        &self.segments[id as usize]
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Logical time: the number of blocks taken so far.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    pub fn idle_default_bytes(&self) -> u64 {
        self.idle_default_bytes
    }

    fn list_index(&mut self, key: PoolKey) -> usize {
        if let Some(i) = self.free_lists.iter().position(|(k, _)| *k == key) {
            return i;
        }
        self.free_lists.push((key, FreeList::new()));
        self.free_lists.len() - 1
    }

    fn list_insert(&mut self, id: BlockId) {
        let pool = self.segments[self.blocks[id as usize].segment as usize].pool;
        let i = self.list_index(pool);
        self.free_lists[i].1.insert(&self.blocks, id);
    }

    fn list_remove(&mut self, id: BlockId) {
        let pool = self.segments[self.blocks[id as usize].segment as usize].pool;
        let i = self.list_index(pool);
        self.free_lists[i].1.remove(&self.blocks, id);
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.free_block_slots.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as BlockId
        }
    }

    fn drop_block(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.live = false;
        b.stream_uses = Vec::new();
        self.free_block_slots.push(id);
    }

    /// Finds the best-fitting free block of at least `rounded` bytes in `pool` and removes it
    /// from the free list. The block stays `Free` until [`BlockPool::take`].
    pub fn find_free(&mut self, pool: PoolKey, rounded: u64) -> Option<BlockId> {
        let i = self.free_lists.iter().position(|(k, _)| *k == pool)?;
        self.free_lists[i].1.take(rounded)
    }

    /// Registers a new segment obtained from the device and returns its single free block,
    /// which is not in any free list (the caller takes it at once).
    pub fn add_segment(&mut self, addr: u64, size: u64, pool: PoolKey) -> BlockId {
        let seg = Segment {
            addr,
            size,
            pool,
            first: NIL,
            busy: 0,
            last_used: self.clock,
            live: true,
        };
        let sid = if let Some(s) = self.free_segment_slots.pop() {
            self.segments[s as usize] = seg;
            s
        } else {
            self.segments.push(seg);
            (self.segments.len() - 1) as SegmentId
        };
        let bid = self.new_block(Block {
            addr,
            size,
            segment: sid,
            prev: NIL,
            next: NIL,
            state: BlockState::Free,
            tag: Tag::Other,
            stream_uses: Vec::new(),
            live: true,
        });
        self.segments[sid as usize].first = bid;
        self.reserved += size;
        self.add_idle(sid);
        bid
    }

    fn add_idle(&mut self, sid: SegmentId) {
        let s = &self.segments[sid as usize];
        if s.pool.owner == PoolOwner::Default {
            self.idle_default_bytes += s.size;
        }
    }

    fn remove_idle(&mut self, sid: SegmentId) {
        let s = &self.segments[sid as usize];
        if s.pool.owner == PoolOwner::Default {
            self.idle_default_bytes -= s.size;
        }
    }

    /// Marks a free block (already out of its free list) active for `rounded` bytes, splitting
    /// off the remainder when worthwhile. Returns the block's address.
    pub fn take(&mut self, id: BlockId, rounded: u64, tag: Tag) -> u64 {
        let (size, sid, addr, next) = {
            let b = &self.blocks[id as usize];
            debug_assert_eq!(b.state, BlockState::Free);
            (b.size, b.segment, b.addr, b.next)
        };
        let kind = self.segments[sid as usize].pool.kind;
        if should_split(kind, size, rounded) {
            let rest = self.new_block(Block {
                addr: addr + rounded,
                size: size - rounded,
                segment: sid,
                prev: id,
                next,
                state: BlockState::Free,
                tag: Tag::Other,
                stream_uses: Vec::new(),
                live: true,
            });
            if next != NIL {
                self.blocks[next as usize].prev = rest;
            }
            let b = &mut self.blocks[id as usize];
            b.next = rest;
            b.size = rounded;
            self.list_insert(rest);
        }
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Active;
        b.tag = tag;
        self.clock += 1;
        let seg = &mut self.segments[sid as usize];
        seg.last_used = self.clock;
        seg.busy += 1;
        if seg.busy == 1 {
            self.remove_idle(sid);
        }
        addr
    }

    /// Marks an active block as freed by its user but still awaiting other streams.
    pub fn mark_pending(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        debug_assert_eq!(b.state, BlockState::Active);
        b.state = BlockState::PendingFree;
    }

    /// Merges the block after `left` (free, in the same segment, already off its free list)
    /// into `left`, and retires its id.
    fn absorb_next(&mut self, left: BlockId) {
        let right = self.blocks[left as usize].next;
        let (size, after) = {
            let r = &self.blocks[right as usize];
            (r.size, r.next)
        };
        let l = &mut self.blocks[left as usize];
        l.size += size;
        l.next = after;
        if after != NIL {
            self.blocks[after as usize].prev = left;
        }
        self.drop_block(right);
    }

    /// Returns an active or pending block to its free list, merging it with free neighbours.
    /// Returns the segment if it became fully free.
    pub fn release(&mut self, id: BlockId) -> Option<SegmentId> {
        let (sid, prev, next) = {
            let b = &mut self.blocks[id as usize];
            debug_assert_ne!(b.state, BlockState::Free);
            b.state = BlockState::Free;
            b.stream_uses.clear();
            (b.segment, b.prev, b.next)
        };
        let mut head = id;
        if next != NIL && self.blocks[next as usize].state == BlockState::Free {
            self.list_remove(next);
            self.absorb_next(id);
        }
        if prev != NIL && self.blocks[prev as usize].state == BlockState::Free {
            self.list_remove(prev);
            self.absorb_next(prev);
            head = prev;
        }
        self.list_insert(head);
        let seg = &mut self.segments[sid as usize];
        seg.busy -= 1;
        seg.last_used = self.clock;
        if seg.busy == 0 {
            self.add_idle(sid);
            Some(sid)
        } else {
            None
        }
    }

    /// Segments with no busy block, oldest-idle first.
    pub fn idle_segments(&self) -> Vec<IdleSegment> {
        let mut v: Vec<IdleSegment> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && s.busy == 0)
            .map(|(i, s)| IdleSegment {
                id: i as SegmentId,
                size: s.size,
                last_used: s.last_used,
                owner: s.pool.owner,
            })
            .collect();
        v.sort_by_key(|s| s.last_used);
        v
    }

    /// Forgets an idle segment and returns its device address for freeing.
    pub fn remove_segment(&mut self, sid: SegmentId) -> u64 {
        let (first, addr, size) = {
            let s = &self.segments[sid as usize];
            debug_assert!(s.live && s.busy == 0);
            (s.first, s.addr, s.size)
        };
        debug_assert_eq!(self.blocks[first as usize].size, size);
        self.list_remove(first);
        self.drop_block(first);
        self.remove_idle(sid);
        self.reserved -= size;
        self.segments[sid as usize].live = false;
        self.free_segment_slots.push(sid);
        let key = self.segments[sid as usize].pool;
        if let Some(i) = self.free_lists.iter().position(|(k, _)| *k == key) {
            if self.free_lists[i].1.is_empty() && key.owner != PoolOwner::Default {
                self.free_lists.swap_remove(i);
            }
        }
        addr
    }

    /// Live segments in address order, each with its blocks in address order.
    pub fn walk(&self) -> Vec<(SegmentId, Vec<BlockId>)> {
        let mut segs: Vec<SegmentId> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, _)| i as SegmentId)
            .collect();
        segs.sort_by_key(|&s| self.segments[s as usize].addr);
        segs.into_iter()
            .map(|sid| {
                let mut blocks = Vec::new();
                let mut b = self.segments[sid as usize].first;
                while b != NIL {
                    blocks.push(b);
                    b = self.blocks[b as usize].next;
                }
                (sid, blocks)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: SizeKind) -> PoolKey {
        PoolKey {
            owner: PoolOwner::Default,
            stream: StreamId::DEFAULT,
            kind,
        }
    }

    #[test]
    fn split_then_merge_restores_one_block() {
        let mut p = BlockPool::default();
        let b = p.add_segment(0x1000_0000, 2 << 20, key(SizeKind::Small));
        assert_eq!(p.idle_default_bytes(), 2 << 20);
        let a = p.take(b, 4096, Tag::Other);
        assert_eq!(a, 0x1000_0000);
        assert_eq!(p.idle_default_bytes(), 0);
        let c = p
            .find_free(key(SizeKind::Small), 1024)
            .expect("remainder is free");
        let ca = p.take(c, 1024, Tag::Other);
        assert_eq!(
            ca,
            0x1000_0000 + 4096,
            "best fit takes the lowest address remainder"
        );
        assert_eq!(p.walk()[0].1.len(), 3);
        assert_eq!(p.release(b), None);
        assert_eq!(p.release(c), Some(0));
        let walk = p.walk();
        assert_eq!(walk[0].1.len(), 1, "all three blocks merged back");
        assert_eq!(p.block(walk[0].1[0]).size, 2 << 20);
        assert_eq!(p.idle_default_bytes(), 2 << 20);
        let addr = p.remove_segment(0);
        assert_eq!(addr, 0x1000_0000);
        assert_eq!(p.reserved(), 0);
    }

    #[test]
    fn best_fit_prefers_smallest_adequate_block() {
        let mut p = BlockPool::default();
        let k = key(SizeKind::Large);
        let big = p.add_segment(0x1_0000_0000, 20 << 20, k);
        p.take(big, 20 << 20, Tag::Other);
        let small = p.add_segment(0x2_0000_0000, 4 << 20, k);
        p.take(small, 4 << 20, Tag::Other);
        p.release(big);
        p.release(small);
        let got = p.find_free(k, 3 << 20).unwrap();
        assert_eq!(p.block(got).addr, 0x2_0000_0000);
    }

    #[test]
    fn free_lists_are_separated_by_stream() {
        let mut p = BlockPool::default();
        let k1 = key(SizeKind::Small);
        let k2 = PoolKey {
            stream: StreamId::fresh(),
            ..k1
        };
        let b = p.add_segment(0x1000_0000, 2 << 20, k1);
        p.take(b, 512, Tag::Other);
        p.release(b);
        assert!(p.find_free(k2, 512).is_none());
        assert!(p.find_free(k1, 512).is_some());
    }
}

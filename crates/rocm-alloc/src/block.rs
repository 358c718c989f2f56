//! A block: one piece of a segment, with its state and tag, and the slab indices that name blocks
//! and segments. Its own module because both the pool that owns the blocks
//! ([`crate::block_pool`]) and the free lists that index them ([`crate::free_list`]) read it.

use crate::device::StreamId;
use crate::tag::Tag;

/// Index of a block in the slab.
pub(crate) type BlockId = u32;
/// Index of a segment in the slab.
pub(crate) type SegmentId = u32;
/// "No block": the end of a segment's block list.
pub(crate) const NIL: BlockId = BlockId::MAX;

/// Life-cycle state of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a user.
    Active,
    /// In a free list, ready for reuse.
    Free,
    /// Freed by its user but still in use by another stream; reusable once the recorded
    /// events complete.
    PendingFree,
}

#[derive(Debug)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    pub segment: SegmentId,
    /// The neighbours in the segment's address-ordered block list ([`NIL`] at either end),
    /// kept by [`crate::block_pool::BlockPool`] as it splits and merges blocks.
    pub prev: BlockId,
    pub next: BlockId,
    pub state: BlockState,
    pub tag: Tag,
    /// Streams other than the allocating one that used this block (`record_stream`).
    pub stream_uses: Vec<StreamId>,
    /// False once the slab slot is retired and waiting for reuse.
    pub live: bool,
}

#[cfg(test)]
impl Block {
    /// A lone free block, for free-list tests.
    pub(crate) fn for_test(addr: u64, size: u64) -> Block {
        Block {
            addr,
            size,
            segment: 0,
            prev: NIL,
            next: NIL,
            state: BlockState::Free,
            tag: Tag::Other,
            stream_uses: Vec::new(),
            live: true,
        }
    }
}

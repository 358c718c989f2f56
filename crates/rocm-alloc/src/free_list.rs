//! The free blocks of one pool, ordered by (size, address): best fit in O(log n).
//!
//! A request takes the smallest free block of at least its size, and among blocks of that size
//! the one at the lowest address, so placement is deterministic and every fitting block is
//! found however many smaller ones there are. Insert, remove and lookup are each one B-tree
//! operation, O(log n) in the number of free blocks of the pool. (An earlier segregated-list
//! design examined only the first 16 blocks of a size class and could miss a fitting block
//! behind them, then report out-of-memory while it existed.)

use std::collections::BTreeSet;

use crate::block_pool::{Block, BlockId};

/// The free blocks of one pool.
#[derive(Debug, Default)]
pub(crate) struct FreeList {
    /// (size, address, id): sizes first for best fit, then address for determinism.
    by_size: BTreeSet<(u64, u64, BlockId)>,
}

impl FreeList {
    pub fn new() -> FreeList {
        FreeList::default()
    }

    pub fn is_empty(&self) -> bool {
        self.by_size.is_empty()
    }

    /// Adds a free block. Its size and address must not change until it is removed.
    pub fn insert(&mut self, blocks: &[Block], id: BlockId) {
        let b = &blocks[id as usize];
        let fresh = self.by_size.insert((b.size, b.addr, id));
        debug_assert!(fresh, "block {id} inserted twice");
    }

    pub fn remove(&mut self, blocks: &[Block], id: BlockId) {
        let b = &blocks[id as usize];
        let found = self.by_size.remove(&(b.size, b.addr, id));
        debug_assert!(found, "free block {id} missing from its list");
    }

    /// Finds and removes the best-fitting free block of at least `size` bytes.
    pub fn take(&mut self, size: u64) -> Option<BlockId> {
        let key = *self.by_size.range((size, 0, 0)..).next()?;
        self.by_size.remove(&key);
        Some(key.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_looks_past_any_number_of_smaller_blocks() {
        // The structure alone: blocks of one size class, all too small but one.
        let mut list = FreeList::new();
        let mut blocks = Vec::new();
        for i in 0..40u64 {
            blocks.push(Block::for_test(0x1000 + i * 0x10_0000, 9 * 512));
        }
        blocks.push(Block::for_test(0x9000_0000, 10 * 512));
        for id in 0..blocks.len() as BlockId {
            list.insert(&blocks, id);
        }
        assert_eq!(list.take(10 * 512), Some(40));
        assert_eq!(list.take(10 * 512), None);
        assert_eq!(
            list.take(9 * 512),
            Some(0),
            "lowest address among equal sizes"
        );
    }
}

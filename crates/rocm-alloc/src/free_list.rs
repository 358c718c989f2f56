//! The free blocks of one pool: exact best fit, found by one binary search.
//!
//! Block sizes (in 512-byte units) fall into classes: one class per size below 8 units, then
//! eight classes per power of two. Each class keeps its free blocks in a vector sorted by
//! (size, address), and a bitmap says which classes are non-empty. Every block of a higher class
//! is larger than every block of a lower one, so a request takes, in order:
//! 1. the first block of its own class at least as large as the request (binary search), else
//! 2. the first block of the next non-empty class above (bitmap scan), which always fits.
//!
//! Either way that is the smallest fitting free block, at the lowest address among equal sizes:
//! exact best fit, deterministic, and no fitting block is ever missed however many smaller ones
//! share its class. Costs, with `k` the number of free blocks in the class concerned: lookup
//! O(log k) plus a scan of at most a few bitmap words; insert and remove O(log k) to find the
//! place plus a shift of up to `k` entries within that one class (classes are narrow, so `k` is
//! small in practice). An earlier version scanned only the first 16 blocks of a class in list
//! order and could miss a fitting block, then report out-of-memory while it existed; a B-tree
//! keyed by (size, address) fixed that but made the cache-hit path 2–3× slower.

use crate::block::{Block, BlockId};
use crate::size_class::{MAX_BLOCK, MIN_BLOCK};

/// Classes below this many units hold exactly one size.
const LINEAR: u64 = 8;
const SUB_BITS: u32 = 3;
const MAX_UNITS_LOG2: u32 = (MAX_BLOCK / MIN_BLOCK).ilog2();
const CLASSES: usize =
    LINEAR as usize + ((MAX_UNITS_LOG2 + 1 - SUB_BITS) as usize) * (1 << SUB_BITS);
const WORDS: usize = CLASSES.div_ceil(64);

/// Class whose range contains a block of `size` bytes.
fn class_of(size: u64) -> usize {
    let units = size / MIN_BLOCK;
    if units < LINEAR {
        return units as usize;
    }
    let log = units.ilog2();
    let sub = (units >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    LINEAR as usize + ((log - SUB_BITS) as usize) * (1 << SUB_BITS) + sub as usize
}

/// (size, address, id): ordered by size first for best fit, then address for determinism.
type Entry = (u64, u64, BlockId);

/// The free blocks of one pool.
#[derive(Debug)]
pub(crate) struct FreeList {
    classes: Vec<Vec<Entry>>,
    bitmap: [u64; WORDS],
    len: usize,
}

impl FreeList {
    pub fn new() -> FreeList {
        FreeList {
            classes: vec![Vec::new(); CLASSES],
            bitmap: [0; WORDS],
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn entry(blocks: &[Block], id: BlockId) -> Entry {
        let b = &blocks[id as usize];
        (b.size, b.addr, id)
    }

    /// Adds a free block. Its size and address must not change until it is removed.
    pub fn insert(&mut self, blocks: &[Block], id: BlockId) {
        let e = Self::entry(blocks, id);
        let c = class_of(e.0);
        let class = &mut self.classes[c];
        match class.binary_search(&e) {
            Ok(_) => debug_assert!(false, "block {id} inserted twice"),
            Err(pos) => class.insert(pos, e),
        }
        self.bitmap[c / 64] |= 1 << (c % 64);
        self.len += 1;
    }

    pub fn remove(&mut self, blocks: &[Block], id: BlockId) {
        let e = Self::entry(blocks, id);
        let c = class_of(e.0);
        match self.classes[c].binary_search(&e) {
            Ok(pos) => {
                self.remove_at(c, pos);
            }
            Err(_) => debug_assert!(false, "free block {id} missing from its list"),
        }
    }

    fn remove_at(&mut self, c: usize, pos: usize) -> BlockId {
        let class = &mut self.classes[c];
        let (_, _, id) = class.remove(pos);
        if class.is_empty() {
            self.bitmap[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        id
    }

    /// Finds and removes the best-fitting free block of at least `size` bytes.
    pub fn take(&mut self, size: u64) -> Option<BlockId> {
        let c0 = class_of(size);
        let pos = self.classes[c0].partition_point(|e| e.0 < size);
        if pos < self.classes[c0].len() {
            return Some(self.remove_at(c0, pos));
        }
        let c = self.next_class_above(c0)?;
        Some(self.remove_at(c, 0))
    }

    fn next_class_above(&self, c0: usize) -> Option<usize> {
        let start = c0 + 1;
        if start >= CLASSES {
            return None;
        }
        let mut w = start / 64;
        let mut word = self.bitmap[w] & (!0u64 << (start % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            if w == WORDS {
                return None;
            }
            word = self.bitmap[w];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_narrow() {
        let mut last = 0;
        let mut units = 1u64;
        while units <= MAX_BLOCK / MIN_BLOCK {
            let c = class_of(units * MIN_BLOCK);
            assert!(c >= last && c < CLASSES, "units {units}");
            last = c;
            units += 1 + units / 5;
        }
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(7 * 512), 7);
        assert_eq!(class_of(8 * 512), 8);
        assert_eq!(class_of(9 * 512), 9);
        assert_eq!(class_of(16 * 512), 16);
        assert_eq!(class_of(18 * 512), 17);
        assert_eq!(class_of(MAX_BLOCK), CLASSES - 8);
    }

    #[test]
    fn best_fit_looks_past_any_number_of_smaller_blocks() {
        // One size class: 64..72 units. 40 blocks too small, inserted after the one that fits.
        let mut list = FreeList::new();
        let mut blocks = vec![Block::for_test(0x9000_0000, 71 * 512)];
        for i in 0..40u64 {
            blocks.push(Block::for_test(0x1000 + i * 0x10_0000, 64 * 512));
        }
        for id in 0..blocks.len() as BlockId {
            list.insert(&blocks, id);
        }
        assert_eq!(class_of(64 * 512), class_of(71 * 512));
        assert_eq!(list.take(70 * 512), Some(0));
        assert_eq!(list.take(65 * 512), None, "nothing fits any more");
        assert_eq!(
            list.take(64 * 512),
            Some(1),
            "lowest address among equal sizes"
        );
    }

    #[test]
    fn a_higher_class_serves_when_the_own_class_cannot() {
        let mut list = FreeList::new();
        let blocks = vec![
            Block::for_test(0x1000, 64 * 512),
            Block::for_test(0x2000_0000, 200 * 512),
            Block::for_test(0x3000_0000, 100 * 512),
        ];
        for id in 0..3 {
            list.insert(&blocks, id);
        }
        assert_eq!(list.take(65 * 512), Some(2), "the smallest larger block");
        list.remove(&blocks, 0);
        assert_eq!(list.take(512), Some(1));
        assert!(list.is_empty());
    }
}

//! Segregated free lists: the structure that finds a free block for a request in O(1).
//!
//! Block sizes (in 512-byte units) fall into classes: one class per size below 8 units, then
//! eight classes per power of two, so a class spans at most 1/8 of its lower bound. Each class
//! holds an intrusive doubly linked list threaded through the blocks, and a bitmap says which
//! classes are non-empty. A request first looks for the smallest fitting block among the first
//! few of its own class (whose blocks may be smaller than the request), then takes any block of
//! the next non-empty class above, which is guaranteed to fit. This replaced an ordered set
//! keyed by (size, address): same best-fit behaviour up to 1/8 of the size, without the tree
//! walks that dominated the cache-hit path.

use crate::block_pool::{Block, BlockId};
use crate::size_class::{MAX_BLOCK, MIN_BLOCK};

pub(crate) const NIL: u32 = u32::MAX;

/// Classes below this many units hold exactly one size.
const LINEAR: u64 = 8;
const SUB_BITS: u32 = 3;
const MAX_UNITS_LOG2: u32 = (MAX_BLOCK / MIN_BLOCK).ilog2();
const CLASSES: usize =
    LINEAR as usize + ((MAX_UNITS_LOG2 + 1 - SUB_BITS) as usize) * (1 << SUB_BITS);
const WORDS: usize = CLASSES.div_ceil(64);
/// How many blocks of the request's own class are examined for a best fit.
const SCAN_LIMIT: usize = 16;

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

/// The free blocks of one pool.
#[derive(Debug)]
pub(crate) struct FreeList {
    heads: Vec<BlockId>,
    bitmap: [u64; WORDS],
    len: usize,
}

impl FreeList {
    pub fn new() -> FreeList {
        FreeList {
            heads: vec![NIL; CLASSES],
            bitmap: [0; WORDS],
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn insert(&mut self, blocks: &mut [Block], id: BlockId) {
        let c = class_of(blocks[id as usize].size);
        let head = self.heads[c];
        {
            let b = &mut blocks[id as usize];
            b.free_prev = NIL;
            b.free_next = head;
        }
        if head != NIL {
            blocks[head as usize].free_prev = id;
        }
        self.heads[c] = id;
        self.bitmap[c / 64] |= 1 << (c % 64);
        self.len += 1;
    }

    pub fn remove(&mut self, blocks: &mut [Block], id: BlockId) {
        let (prev, next, size) = {
            let b = &blocks[id as usize];
            (b.free_prev, b.free_next, b.size)
        };
        if prev != NIL {
            blocks[prev as usize].free_next = next;
        } else {
            let c = class_of(size);
            debug_assert_eq!(self.heads[c], id, "free block missing from its list");
            self.heads[c] = next;
            if next == NIL {
                self.bitmap[c / 64] &= !(1 << (c % 64));
            }
        }
        if next != NIL {
            blocks[next as usize].free_prev = prev;
        }
        self.len -= 1;
    }

    /// Finds and removes a free block of at least `size` bytes.
    pub fn take(&mut self, blocks: &mut [Block], size: u64) -> Option<BlockId> {
        let c0 = class_of(size);
        let mut best = NIL;
        let mut best_size = u64::MAX;
        let mut cur = self.heads[c0];
        let mut seen = 0;
        while cur != NIL && seen < SCAN_LIMIT {
            let s = blocks[cur as usize].size;
            if s >= size && s < best_size {
                best = cur;
                best_size = s;
                if s == size {
                    break;
                }
            }
            cur = blocks[cur as usize].free_next;
            seen += 1;
        }
        if best == NIL {
            let c = self.next_class_above(c0)?;
            best = self.heads[c];
        }
        self.remove(blocks, best);
        Some(best)
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
}

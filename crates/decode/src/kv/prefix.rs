//! The keys the prefix cache finds full blocks by.
//!
//! A full block is known by everything before and in it: a hash chained block by block over
//! the tokens from the start of the sequence, and the block's own tokens, compared exactly.
//! The chain is what lets a block be found again after the block before it was evicted and its
//! id reused for other tokens: ids never enter a key. Two different prefixes share a key only
//! if their 64-bit chains collide and their last blocks' tokens are equal.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// The chain value before the first block.
pub const ROOT: u64 = 0x6b76_5f72_6f6f_7400;

/// One full block's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// The chain over every token up to the end of this block.
    pub chain: u64,
    /// This block's tokens.
    pub tokens: Box<[u32]>,
}

/// The chain after `tokens`, from the chain `parent` before them. `DefaultHasher::new` has
/// fixed keys, so the value is the same for the life of the process, which is all the cache
/// needs.
pub fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The key of the block of `tokens` that follows the chain `parent`.
pub fn key(parent: u64, tokens: &[u32]) -> BlockKey {
    BlockKey {
        chain: chain(parent, tokens),
        tokens: tokens.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_depends_on_everything_before_its_block() {
        let a = key(chain(ROOT, &[1, 2]), &[3, 4]);
        let b = key(chain(ROOT, &[1, 9]), &[3, 4]);
        let c = key(chain(ROOT, &[1, 2]), &[3, 4]);
        assert_ne!(a, b, "the same block after other tokens is another key");
        assert_eq!(a, c);
        assert_ne!(key(ROOT, &[3, 4]), key(ROOT, &[4, 3]));
    }
}

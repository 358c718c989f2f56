//! [`BlockPool`]: the KV cache's blocks, who holds each, and the budget they live under.
//!
//! A block holds `block_len` consecutive positions of one sequence (every layer's keys and
//! values for them: `bytes_per_block`). The pool commits blocks in segments as they are
//! needed and never beyond the budget. Each block is in one of three states:
//! - **held**, by one or more sequences (a reference count: sequences that share a prompt
//!   prefix hold its full blocks together);
//! - **cached**: no sequence holds it, but it is a full block of a finished sequence's
//!   prompt, kept so that a later prompt with the same prefix skips that prefill; the least
//!   recently used cached block is evicted when a block is needed and none is free;
//! - **free**.
//!
//! Every operation that can fail checks first and changes nothing when it fails, so a caller
//! can try, and on [`PoolError::Full`] wait, preempt a sequence or refuse one.

use super::prefix::{self, BlockKey};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A block's index in the pool; its slots are `id * block_len ..` of every layer's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A block to copy before a sequence writes into it: it was shared, and the sequence gets its
/// own copy (copy-on-write). The caller copies every layer's rows of `from` into `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub from: BlockId,
    pub to: BlockId,
}

/// Why the pool could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "the KV cache needs {needed} more blocks of {block_len} positions ({needed_bytes} bytes) \
         but {available} are free or evictable under the budget of {budget_bytes} bytes; \
         wait for a sequence to finish, or raise the KV budget"
    )]
    Full {
        needed: usize,
        available: usize,
        block_len: usize,
        needed_bytes: u64,
        budget_bytes: u64,
    },
    #[error("{0}")]
    Invalid(String),
}

/// One sequence's blocks: entry `i` holds positions `i * block_len ..`. An entry is `None`
/// once the sequence no longer needs its positions (they fell out of a sliding window).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    blocks: Vec<Option<BlockId>>,
    /// Positions the sequence has room for in its blocks (written or about to be).
    len: usize,
    /// The prefix chain after each of the leading full blocks that are registered in the
    /// prefix cache (or were found there).
    chains: Vec<u64>,
}

impl SeqBlocks {
    /// Positions reserved.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block table, in position order.
    pub fn blocks(&self) -> &[Option<BlockId>] {
        &self.blocks
    }

    /// Blocks the sequence holds.
    pub fn held(&self) -> usize {
        self.blocks.iter().flatten().count()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Free,
    /// Held by this many sequences.
    Held(u32),
    /// In the prefix cache, last used at this tick.
    Cached(u64),
}

#[derive(Clone, Debug)]
struct Block {
    state: State,
    /// Its key in the prefix cache, once registered.
    key: Option<BlockKey>,
}

/// Counts for the memory report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub block_len: usize,
    pub bytes_per_block: u64,
    /// Blocks the budget allows.
    pub budget_blocks: usize,
    /// Blocks committed so far (in segments).
    pub committed: usize,
    /// Held by at least one sequence.
    pub in_use: usize,
    /// Held by more than one sequence.
    pub shared: usize,
    /// Kept as the prefix cache.
    pub cached: usize,
    pub free: usize,
}

impl std::fmt::Display for PoolStats {
    /// One line for a memory report: blocks by state, then their bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes =
            |blocks: usize| rocm_alloc::fmt_bytes_decimals(blocks as u64 * self.bytes_per_block, 1);
        write!(
            f,
            "KV pool: {} blocks in use ({} shared), {} cached, {} free of {} committed, budget \
             {} blocks of {} positions; in use {}, committed {} of {}",
            self.in_use,
            self.shared,
            self.cached,
            self.free,
            self.committed,
            self.budget_blocks,
            self.block_len,
            bytes(self.in_use),
            bytes(self.committed),
            bytes(self.budget_blocks),
        )
    }
}

/// The blocks of a paged KV cache under a byte budget.
pub struct BlockPool {
    block_len: usize,
    bytes_per_block: u64,
    budget_blocks: usize,
    segment_blocks: usize,
    blocks: Vec<Block>,
    /// Free blocks, the lowest taken first: blocks in use stay packed at the start of the
    /// pool, so a pool whose memory grows with use can give back its end after a burst
    /// ([`BlockPool::occupied_end`]).
    free: BTreeSet<BlockId>,
    /// The prefix cache: full blocks by key, held or cached.
    by_key: HashMap<BlockKey, BlockId>,
    /// Cached blocks by their last use, oldest first.
    lru: BTreeMap<u64, BlockId>,
    tick: u64,
}

impl BlockPool {
    /// A pool of blocks of `block_len` positions (a power of two) costing `bytes_per_block`,
    /// at most `budget_bytes` in all, committed `segment_blocks` at a time.
    pub fn new(
        block_len: usize,
        bytes_per_block: u64,
        budget_bytes: u64,
        segment_blocks: usize,
    ) -> Result<BlockPool, PoolError> {
        if !block_len.is_power_of_two() {
            return Err(PoolError::Invalid(format!(
                "a KV block of {block_len} positions: the block length must be a power of two"
            )));
        }
        if bytes_per_block == 0 || segment_blocks == 0 {
            return Err(PoolError::Invalid(
                "a KV block must cost at least one byte and a segment hold at least one block"
                    .into(),
            ));
        }
        let budget_blocks = usize::try_from(budget_bytes / bytes_per_block).unwrap_or(usize::MAX);
        if budget_blocks == 0 {
            return Err(PoolError::Invalid(format!(
                "a KV budget of {budget_bytes} bytes is less than one block of {block_len} \
                 positions ({bytes_per_block} bytes); raise the budget"
            )));
        }
        if u32::try_from(budget_blocks).is_err() {
            return Err(PoolError::Invalid(format!(
                "a KV budget of {budget_blocks} blocks is more than the pool can number; use \
                 longer blocks"
            )));
        }
        Ok(BlockPool {
            block_len,
            bytes_per_block,
            budget_blocks,
            segment_blocks,
            blocks: Vec::new(),
            free: BTreeSet::new(),
            by_key: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
        })
    }

    pub fn block_len(&self) -> usize {
        self.block_len
    }

    /// The slot of position `pos` of `seq` in every layer's storage, if a block holds it.
    pub fn slot(&self, seq: &SeqBlocks, pos: usize) -> Option<usize> {
        if pos >= seq.len {
            return None;
        }
        let id = (*seq.blocks.get(pos / self.block_len)?)?;
        Some(id.index() * self.block_len + pos % self.block_len)
    }

    /// Blocks that could be had now: free, not yet committed under the budget, or cached.
    pub fn available(&self) -> usize {
        self.free.len() + (self.budget_blocks - self.blocks.len()) + self.lru.len()
    }

    /// Whether `blocks` more could be had now.
    pub fn can_take(&self, blocks: usize) -> bool {
        blocks <= self.available()
    }

    /// Blocks a sequence needs for `len` positions.
    pub fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block_len)
    }

    fn full(&self, needed: usize) -> PoolError {
        PoolError::Full {
            needed,
            available: self.available(),
            block_len: self.block_len,
            needed_bytes: needed as u64 * self.bytes_per_block,
            budget_bytes: self.budget_blocks as u64 * self.bytes_per_block,
        }
    }

    /// One block, held once: a free one, a newly committed segment's, or the least recently
    /// used cached one (leaving the prefix cache). The caller checked [`Self::available`].
    fn take(&mut self) -> Option<BlockId> {
        if self.free.is_empty() && self.blocks.len() < self.budget_blocks {
            let grow = self
                .segment_blocks
                .min(self.budget_blocks - self.blocks.len());
            let first = self.blocks.len();
            self.blocks.extend((0..grow).map(|_| Block {
                state: State::Free,
                key: None,
            }));
            // In range: the budget fits a u32 (checked at creation). Lowest ids come out first.
            self.free
                .extend((first..first + grow).map(|i| BlockId(i as u32)));
        }
        let id = match self.free.pop_first() {
            Some(id) => id,
            None => {
                let (_, id) = self.lru.pop_first()?;
                if let Some(key) = self.blocks[id.index()].key.take() {
                    self.by_key.remove(&key);
                }
                id
            }
        };
        self.blocks[id.index()].state = State::Held(1);
        Some(id)
    }

    fn incref(&mut self, id: BlockId) {
        let block = &mut self.blocks[id.index()];
        block.state = match block.state {
            State::Held(n) => State::Held(n + 1),
            State::Cached(at) => {
                self.lru.remove(&at);
                State::Held(1)
            }
            // A table never names a free block; holding it makes it held once.
            State::Free => State::Held(1),
        };
    }

    fn decref(&mut self, id: BlockId) {
        let block = &mut self.blocks[id.index()];
        if let State::Held(n) = block.state {
            if n > 1 {
                block.state = State::Held(n - 1);
            } else if block.key.is_some() {
                self.tick += 1;
                block.state = State::Cached(self.tick);
                self.lru.insert(self.tick, id);
            } else {
                block.state = State::Free;
                self.free.insert(id);
            }
        }
    }

    fn refs(&self, id: BlockId) -> u32 {
        match self.blocks[id.index()].state {
            State::Held(n) => n,
            _ => 0,
        }
    }

    /// Room in `seq` for positions up to `new_len`: new blocks at its end and, when its last
    /// block is shared and partly filled, a copy of it to write into. Returns the copies the
    /// caller must make before the next write. Nothing changes on an error.
    pub fn reserve(
        &mut self,
        seq: &mut SeqBlocks,
        new_len: usize,
    ) -> Result<Vec<BlockCopy>, PoolError> {
        if new_len <= seq.len {
            return Ok(Vec::new());
        }
        let grow = self.blocks_for(new_len) - seq.blocks.len();
        // The sequence writes next into its last block when that one is partly filled: if
        // another sequence holds it too, it gets a copy of its own.
        let shared_tail = (!seq.len.is_multiple_of(self.block_len))
            .then(|| seq.blocks.last().copied().flatten())
            .flatten()
            .filter(|&id| self.refs(id) > 1);
        let needed = grow + usize::from(shared_tail.is_some());
        if !self.can_take(needed) {
            return Err(self.full(needed));
        }
        let mut copies = Vec::new();
        if let Some(from) = shared_tail {
            let to = self.take().ok_or_else(|| self.full(needed))?;
            self.decref(from);
            if let Some(last) = seq.blocks.last_mut() {
                *last = Some(to);
            }
            copies.push(BlockCopy { from, to });
        }
        for _ in 0..grow {
            let id = self.take().ok_or_else(|| self.full(needed))?;
            seq.blocks.push(Some(id));
        }
        seq.len = new_len;
        Ok(copies)
    }

    /// Gives back the room past `len` positions (a step that did not run); blocks no longer
    /// needed are released.
    pub fn truncate(&mut self, seq: &mut SeqBlocks, len: usize) {
        if len >= seq.len {
            return;
        }
        let keep = self.blocks_for(len);
        for id in seq.blocks.drain(keep..).flatten().collect::<Vec<_>>() {
            self.decref(id);
        }
        seq.chains.truncate(len / self.block_len);
        seq.len = len;
    }

    /// A sequence that starts as `seq` does: the same blocks, shared. Either one writing into
    /// a shared, partly filled block first gets its own copy ([`Self::reserve`]).
    pub fn fork(&mut self, seq: &SeqBlocks) -> SeqBlocks {
        for id in seq.blocks.iter().flatten() {
            self.incref(*id);
        }
        SeqBlocks {
            blocks: seq.blocks.clone(),
            len: seq.len,
            chains: seq.chains.clone(),
        }
    }

    /// Ends `seq`: its blocks go back to the pool, the registered full ones into the prefix
    /// cache once no sequence holds them.
    pub fn release(&mut self, seq: SeqBlocks) {
        for id in seq.blocks.into_iter().flatten() {
            self.decref(id);
        }
    }

    /// Releases the blocks of `seq` that hold only positions before `pos` (a sliding window's
    /// start): the sequence keeps its length, but those positions are gone.
    pub fn release_before(&mut self, seq: &mut SeqBlocks, pos: usize) {
        let whole = (pos / self.block_len).min(seq.blocks.len());
        let dropped: Vec<BlockId> = seq.blocks[..whole]
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for id in dropped {
            self.decref(id);
        }
    }

    /// Enters the full blocks of `seq` whose positions hold `tokens` (the sequence's tokens
    /// from position 0, at least as many as its written positions) into the prefix cache. A
    /// block whose key another block already has stays out of the cache. Call it once the
    /// positions' keys and values are written.
    pub fn register(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) {
        let bl = self.block_len;
        let full = tokens.len().min(seq.len) / bl;
        while seq.chains.len() < full {
            let i = seq.chains.len();
            let parent = seq.chains.last().copied().unwrap_or(prefix::ROOT);
            let key = prefix::key(parent, &tokens[i * bl..(i + 1) * bl]);
            let chain = key.chain;
            // A block dropped from the table (window) ends the chain there.
            let Some(Some(id)) = seq.blocks.get(i).copied() else {
                break;
            };
            let block = &mut self.blocks[id.index()];
            if block.key.is_none() && !self.by_key.contains_key(&key) {
                block.key = Some(key.clone());
                self.by_key.insert(key, id);
            }
            seq.chains.push(chain);
        }
    }

    /// Takes the blocks `seq` holds out of the prefix index, so no later lookup finds them
    /// (what they hold may be what a failed step wrote). Sequences holding them keep them.
    pub fn unregister(&mut self, seq: &SeqBlocks) {
        for id in seq.blocks.iter().flatten() {
            if let Some(key) = self.blocks[id.index()].key.take() {
                self.by_key.remove(&key);
            }
        }
    }

    /// A new sequence holding the cached blocks that begin `tokens`, at most `max_len`
    /// positions of them (whole blocks only): prefill can start after its length.
    pub fn lookup(&mut self, tokens: &[u32], max_len: usize) -> SeqBlocks {
        let bl = self.block_len;
        let mut seq = SeqBlocks::default();
        let mut parent = prefix::ROOT;
        for block_tokens in tokens[..max_len.min(tokens.len())].chunks_exact(bl) {
            let key = prefix::key(parent, block_tokens);
            let Some(&id) = self.by_key.get(&key) else {
                break;
            };
            self.incref(id);
            parent = key.chain;
            seq.blocks.push(Some(id));
            seq.chains.push(parent);
            seq.len += bl;
        }
        seq
    }

    /// Empties the prefix cache: its blocks become free (a pool whose memory grows can then
    /// give them back). Blocks sequences hold keep their keys.
    pub fn drop_cache(&mut self) {
        for (_, id) in std::mem::take(&mut self.lru) {
            let block = &mut self.blocks[id.index()];
            if let Some(key) = block.key.take() {
                self.by_key.remove(&key);
            }
            block.state = State::Free;
            self.free.insert(id);
        }
    }

    /// One past the highest block a sequence holds or the prefix cache keeps (0 when none
    /// is): memory behind the blocks from here on holds nothing anyone will read.
    pub fn occupied_end(&self) -> usize {
        self.blocks
            .iter()
            .rposition(|b| !matches!(b.state, State::Free))
            .map_or(0, |i| i + 1)
    }

    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats {
            block_len: self.block_len,
            bytes_per_block: self.bytes_per_block,
            budget_blocks: self.budget_blocks,
            committed: self.blocks.len(),
            ..PoolStats::default()
        };
        for b in &self.blocks {
            match b.state {
                State::Free => s.free += 1,
                State::Held(n) => {
                    s.in_use += 1;
                    if n > 1 {
                        s.shared += 1;
                    }
                }
                State::Cached(_) => s.cached += 1,
            }
        }
        s
    }

    /// The reference count of every committed block (0 for free and cached ones), for checks.
    pub fn reference_counts(&self) -> Vec<u32> {
        (0..self.blocks.len())
            .map(|i| self.refs(BlockId(i as u32)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(budget_blocks: u64) -> BlockPool {
        BlockPool::new(4, 100, budget_blocks * 100, 2).unwrap()
    }

    fn ids(seq: &SeqBlocks) -> Vec<u32> {
        seq.blocks().iter().flatten().map(|b| b.0).collect()
    }

    #[test]
    fn the_lowest_free_block_goes_first_so_the_used_blocks_stay_packed() {
        let mut p = pool(8);
        let (mut a, mut b) = (SeqBlocks::default(), SeqBlocks::default());
        p.reserve(&mut a, 8).unwrap();
        p.reserve(&mut b, 8).unwrap();
        assert_eq!((ids(&a), ids(&b)), (vec![0, 1], vec![2, 3]));
        assert_eq!(p.occupied_end(), 4);
        p.release(a);
        assert_eq!(p.occupied_end(), 4, "block 3 is still held");
        let mut c = SeqBlocks::default();
        p.reserve(&mut c, 4).unwrap();
        assert_eq!(ids(&c), vec![0], "the freed low block, not a later one");
        p.release(b);
        assert_eq!(p.occupied_end(), 1);
        // A cached block keeps its memory wanted until the cache is dropped.
        p.register(&mut c, &[1, 2, 3, 4]);
        p.release(c);
        assert_eq!((p.stats().cached, p.occupied_end()), (1, 1));
        p.drop_cache();
        assert_eq!((p.stats().cached, p.occupied_end()), (0, 0));
        assert_eq!(p.lookup(&[1, 2, 3, 4], 4).len(), 0, "the cache is empty");
        assert_eq!(p.stats().free, p.stats().committed);
    }

    #[test]
    fn blocks_come_in_segments_and_never_beyond_the_budget() {
        let mut p = pool(5);
        let mut a = SeqBlocks::default();
        assert!(p.reserve(&mut a, 3).unwrap().is_empty());
        assert_eq!(p.stats().committed, 2, "one segment");
        p.reserve(&mut a, 20).unwrap();
        assert_eq!((p.stats().committed, p.stats().in_use), (5, 5));
        let e = p.reserve(&mut a, 21).unwrap_err();
        assert!(e.to_string().contains("1 more blocks"), "{e}");
        assert_eq!(a.len(), 20, "a refused reserve changes nothing");
        assert_eq!(p.slot(&a, 5), Some(4 + 1));
        assert_eq!(
            p.stats().to_string(),
            "KV pool: 5 blocks in use (0 shared), 0 cached, 0 free of 5 committed, budget 5 \
             blocks of 4 positions; in use 500 B, committed 500 B of 500 B"
        );
        p.release(a);
        assert_eq!(p.stats().free, 5);
    }

    #[test]
    fn a_forked_sequence_copies_the_shared_tail_before_writing() {
        let mut p = pool(8);
        let mut a = SeqBlocks::default();
        p.reserve(&mut a, 6).unwrap();
        let mut b = p.fork(&a);
        assert_eq!(p.stats().shared, 2);
        let copies = p.reserve(&mut b, 7).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].from, a.blocks()[1].unwrap());
        assert_eq!(b.blocks()[0], a.blocks()[0], "the full block stays shared");
        assert_ne!(b.blocks()[1], a.blocks()[1]);
        assert_eq!(p.stats().shared, 1);
        // The original writes into its own tail without a copy now.
        assert!(p.reserve(&mut a, 7).unwrap().is_empty());
    }

    #[test]
    fn a_finished_prompt_is_found_again_until_evicted() {
        let mut p = pool(4);
        let tokens: Vec<u32> = (0..10).collect();
        let mut a = SeqBlocks::default();
        p.reserve(&mut a, 10).unwrap();
        p.register(&mut a, &tokens);
        p.release(a);
        assert_eq!((p.stats().cached, p.stats().free), (2, 2));
        // The same first 8 tokens then others: both full blocks found.
        let mut other = tokens[..8].to_vec();
        other.extend([99, 98]);
        let b = p.lookup(&other, other.len() - 1);
        assert_eq!(b.len(), 8);
        assert_eq!(p.stats().cached, 0);
        // A different first block finds nothing, even with the same second block.
        let mut shifted = tokens.clone();
        shifted[0] = 7;
        assert_eq!(p.lookup(&shifted, 10).len(), 0);
        p.release(b);
        // Needing every block evicts the cached ones, oldest first, and forgets their keys.
        let mut c = SeqBlocks::default();
        p.reserve(&mut c, 16).unwrap();
        assert_eq!(p.stats().cached, 0);
        p.release(c);
        assert_eq!(p.lookup(&tokens, 10).len(), 0);
    }

    #[test]
    fn window_blocks_go_back_and_bad_settings_are_refused() {
        let mut p = pool(4);
        let mut a = SeqBlocks::default();
        p.reserve(&mut a, 12).unwrap();
        p.release_before(&mut a, 9);
        assert_eq!(a.held(), 1);
        assert_eq!(p.slot(&a, 2), None);
        assert!(p.slot(&a, 10).is_some());
        assert!(BlockPool::new(3, 1, 10, 1).is_err());
        let e = BlockPool::new(4, 100, 99, 1).err().unwrap().to_string();
        assert!(e.contains("less than one block"), "{e}");
    }
}

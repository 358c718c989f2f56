//! The block tables of a context's paged KV storage: for each group of layers that share a
//! slot count, and each sequence, the blocks that hold its slots.
//!
//! Layers whose caches hold the whole context are one group, the *pool*: their storage is a
//! pool of blocks, any of which any sequence may hold (what [`super::BlockPool`] hands out),
//! and a sequence's table lists its blocks in position order. A sliding-window layer whose
//! ring of slots is shorter than the context is in a *ring* group of its slot count: each
//! sequence owns a fixed run of blocks that its positions wrap around, so blocks that fall
//! out of the window are reused in place.
//!
//! Slot `s` of a sequence is row `table[s / block] * block + s % block` of each of the group's
//! layers' buffers, the rule the backends' kernels apply (`kv_pages.h` in rocm-kernels).

use crate::error::{DecodeError, Result};

/// A table entry that names no block yet.
pub const UNASSIGNED: u32 = u32::MAX;

/// Positions per KV block by default: a power of two. Sixteen keeps the rounding of a
/// sequence's last block (at most 15 positions) small against any context while a table of a
/// 128k context stays at 8k entries.
pub const BLOCK_POSITIONS: usize = 16;

/// Positions per KV block, for measuring the choice ([`BLOCK_POSITIONS`] by default).
pub static KV_BLOCK: knobs::Knob<usize> = knobs::Knob {
    name: "HIPDECODE_KV_BLOCK",
    default: "16",
    doc: "positions per block of the paged KV cache: a power of two from 8 to 256; longer \
          blocks mean shorter tables and fewer block lookups in attention, but more rounding \
          per sequence and a coarser prefix cache",
    scope: knobs::Scope::Run,
    parse: |v| match v.trim().parse::<usize>() {
        Ok(n) if n.is_power_of_two() && (8..=256).contains(&n) => Ok(n),
        _ => Err("not a power of two from 8 to 256; give e.g. 16".into()),
    },
};

/// Positions per KV block as [`KV_BLOCK`] sets them. An invalid value was refused by the
/// program's start-up check; a library user gets the default, with a warning.
pub fn block_positions() -> usize {
    KV_BLOCK.read().unwrap_or_else(|e| {
        tracing::warn!("{e}; KV blocks hold {BLOCK_POSITIONS} positions");
        BLOCK_POSITIONS
    })
}

/// A group of layers with one table per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvGroup(pub usize);

impl KvGroup {
    /// The full-context layers' group, whose blocks come from the pool.
    pub const POOL: KvGroup = KvGroup(0);
}

/// One group's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupTables {
    /// Slots of each sequence: `table_len * block`.
    pub slots: usize,
    /// Blocks per sequence's table.
    pub table_len: usize,
    /// Blocks of storage in each of the group's layers.
    pub blocks: usize,
    /// `[sequences][table_len]` block ids, [`UNASSIGNED`] where a sequence holds none.
    pub entries: Vec<u32>,
}

impl GroupTables {
    /// Sequence `seq`'s table.
    pub fn table(&self, seq: usize) -> &[u32] {
        &self.entries[seq * self.table_len..][..self.table_len]
    }
}

/// The tables of every group. Backends compare them with the copy they hold (two contexts may
/// share a backend) and rewrite a device copy only when they differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTables {
    block: usize,
    sequences: usize,
    groups: Vec<GroupTables>,
}

impl BlockTables {
    /// Tables for `sequences` sequences: the pool group's `pool_slots` slots per sequence over
    /// `pool_blocks` blocks (every sequence given its own run of blocks in order when they
    /// suffice, none otherwise), and a ring group per entry of `ring_slots`, each sequence
    /// owning its run. Slot counts are whole blocks.
    pub fn new(
        block: usize,
        sequences: usize,
        pool_slots: usize,
        pool_blocks: usize,
        ring_slots: &[usize],
    ) -> Result<BlockTables> {
        if !block.is_power_of_two() {
            return Err(DecodeError::InvalidArgument(format!(
                "a KV block of {block} positions: the block length must be a power of two"
            )));
        }
        let group = |slots: usize, blocks: usize, identity: bool| -> Result<GroupTables> {
            if !slots.is_multiple_of(block) || slots == 0 {
                return Err(DecodeError::InvalidArgument(format!(
                    "{slots} KV slots are not whole blocks of {block}"
                )));
            }
            let table_len = slots / block;
            let n = table_len
                .checked_mul(sequences)
                .filter(|&n| n <= u32::MAX as usize && blocks < UNASSIGNED as usize);
            let Some(n) = n else {
                return Err(DecodeError::InvalidArgument(format!(
                    "{sequences} sequences of {slots} KV slots are more blocks than a table \
                     can number"
                )));
            };
            let entries = if identity {
                (0..n as u32).collect()
            } else {
                vec![UNASSIGNED; n]
            };
            Ok(GroupTables {
                slots,
                table_len,
                blocks,
                entries,
            })
        };
        let pool_owned = pool_slots / block.max(1) * sequences;
        let mut groups = vec![group(pool_slots, pool_blocks, pool_blocks >= pool_owned)?];
        for &slots in ring_slots {
            groups.push(group(slots, slots / block * sequences, true)?);
        }
        Ok(BlockTables {
            block,
            sequences,
            groups,
        })
    }

    pub fn block(&self) -> usize {
        self.block
    }

    pub fn sequences(&self) -> usize {
        self.sequences
    }

    pub fn groups(&self) -> &[GroupTables] {
        &self.groups
    }

    pub fn group(&self, group: KvGroup) -> &GroupTables {
        &self.groups[group.0]
    }

    /// i32 entries of every group's tables together.
    pub fn total_entries(&self) -> usize {
        self.groups.iter().map(|g| g.entries.len()).sum()
    }

    /// Sets sequence `seq`'s pool blocks: `blocks[i]` holds its slots `i * block ..`, `None`
    /// where it holds none. Refuses a block the pool does not have and a table longer than
    /// the sequence's slots, changing nothing.
    pub fn set_pool_blocks(
        &mut self,
        seq: usize,
        blocks: impl IntoIterator<Item = Option<u32>>,
    ) -> Result<()> {
        let sequences = self.sequences;
        let pool = &mut self.groups[KvGroup::POOL.0];
        if seq >= sequences {
            return Err(DecodeError::InvalidArgument(format!(
                "block table of sequence {seq} in a context of {sequences} sequences"
            )));
        }
        let mut table = vec![UNASSIGNED; pool.table_len];
        for (i, b) in blocks.into_iter().enumerate() {
            let Some(slot) = table.get_mut(i) else {
                return Err(DecodeError::InvalidArgument(format!(
                    "a block table of more than {} blocks for {} slots",
                    pool.table_len, pool.slots
                )));
            };
            if let Some(b) = b {
                if b as usize >= pool.blocks {
                    return Err(DecodeError::InvalidArgument(format!(
                        "block {b} of sequence {seq}'s table is not in the pool of {} blocks",
                        pool.blocks
                    )));
                }
                *slot = b;
            }
        }
        pool.entries[seq * pool.table_len..][..pool.table_len].copy_from_slice(&table);
        Ok(())
    }

    /// Gives sequence `seq` ring run `run` in every ring group: the run of blocks that
    /// sequence `run` owns at the start. A scheduler moves runs between sequences this way, so
    /// that a sequence that goes on from a finished one's prefix reads the window that one
    /// left behind ([`super::RingRuns`]). The caller keeps each run with one running sequence.
    pub fn set_ring_run(&mut self, seq: usize, run: usize) -> Result<()> {
        let sequences = self.sequences;
        if seq >= sequences || run >= sequences {
            return Err(DecodeError::InvalidArgument(format!(
                "ring run {run} for sequence {seq} in a context of {sequences} sequences"
            )));
        }
        for g in &mut self.groups[1..] {
            let n = g.table_len;
            let first = (run * n) as u32;
            for (i, entry) in g.entries[seq * n..][..n].iter_mut().enumerate() {
                *entry = first + i as u32;
            }
        }
        Ok(())
    }

    /// The cache row of sequence `seq`'s slot `slot` in `group`, `None` where its block is
    /// unassigned.
    pub fn row(&self, group: KvGroup, seq: usize, slot: usize) -> Option<usize> {
        let g = &self.groups[group.0];
        let b = *g.table(seq).get(slot / self.block)?;
        (b != UNASSIGNED).then(|| b as usize * self.block + slot % self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_tables_start_in_order_when_every_sequence_fits_and_empty_otherwise() {
        let t = BlockTables::new(4, 2, 8, 4, &[4]).unwrap();
        assert_eq!(t.group(KvGroup::POOL).entries, [0, 1, 2, 3]);
        assert_eq!(t.row(KvGroup::POOL, 1, 5), Some(3 * 4 + 1));
        // The ring group: each sequence owns one block, slots wrap inside it.
        assert_eq!(t.group(KvGroup(1)).entries, [0, 1]);
        assert_eq!(t.row(KvGroup(1), 1, 3), Some(7));
        let t = BlockTables::new(4, 2, 8, 3, &[]).unwrap();
        assert!(t
            .group(KvGroup::POOL)
            .entries
            .iter()
            .all(|&b| b == UNASSIGNED));
        assert_eq!(t.row(KvGroup::POOL, 0, 0), None);
    }

    #[test]
    fn set_pool_blocks_checks_the_pool_and_changes_nothing_when_refused() {
        let mut t = BlockTables::new(4, 2, 8, 3, &[]).unwrap();
        t.set_pool_blocks(1, [Some(2), None]).unwrap();
        assert_eq!(t.row(KvGroup::POOL, 1, 2), Some(10));
        assert_eq!(t.row(KvGroup::POOL, 1, 4), None);
        let before = t.clone();
        let err = t.set_pool_blocks(0, [Some(3)]).unwrap_err();
        assert!(err.to_string().contains("pool of 3 blocks"), "{err}");
        let err = t.set_pool_blocks(0, [None, None, Some(0)]).unwrap_err();
        assert!(err.to_string().contains("more than 2 blocks"), "{err}");
        assert!(t.set_pool_blocks(2, []).is_err());
        assert_eq!(t, before, "a refused table changes nothing");
        assert!(BlockTables::new(3, 1, 6, 2, &[]).is_err());
        assert!(BlockTables::new(4, 1, 6, 2, &[]).is_err());
    }

    #[test]
    fn the_block_knob_takes_powers_of_two_from_8_to_256_only() {
        assert_eq!((KV_BLOCK.parse)(" 32"), Ok(32));
        assert_eq!((KV_BLOCK.parse)(KV_BLOCK.default), Ok(BLOCK_POSITIONS));
        for bad in ["12", "4", "512", "0", "sixteen"] {
            let e = (KV_BLOCK.parse)(bad).unwrap_err();
            assert!(e.contains("power of two"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_ring_run_moves_to_another_sequence_in_every_ring_group() {
        let mut t = BlockTables::new(4, 3, 8, 6, &[8, 4]).unwrap();
        t.set_ring_run(0, 2).unwrap();
        // Run 2 of the first ring group is blocks 4 and 5; of the second, block 2.
        assert_eq!(t.group(KvGroup(1)).table(0), [4, 5]);
        assert_eq!(t.group(KvGroup(2)).table(0), [2]);
        assert_eq!(t.row(KvGroup(1), 0, 5), Some(5 * 4 + 1));
        // The pool and the other sequences are untouched.
        assert_eq!(t.group(KvGroup(1)).table(2), [4, 5]);
        assert_eq!(t.group(KvGroup::POOL).table(0), [0, 1]);
        let before = t.clone();
        assert!(t.set_ring_run(0, 3).is_err());
        assert!(t.set_ring_run(3, 0).is_err());
        assert_eq!(t, before);
    }
}

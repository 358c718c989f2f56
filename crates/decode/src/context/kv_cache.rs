//! The KV cache of a context: one key and one value buffer per layer, paged
//! ([`crate::layout::context::KvPlan`]). The layers that hold the whole context share a pool of
//! blocks that any sequence may hold; a sliding-window layer only ever reads its last `window`
//! positions, so when `window + max_batch - 1` slots (enough for a whole prefill chunk) are
//! fewer than the context, each sequence keeps a ring of that many slots in blocks of its own:
//! on Gemma 3 that is 15 of 18 layers. The block tables say which block holds each slot.
//!
//! A shared pool (one a scheduler hands blocks out of) grows: its layers' buffers keep their
//! addresses but are backed only up to the highest block handed out so far
//! ([`Backend::alloc_growable`]), so a server sized for many long sequences takes device
//! memory as its sequences do. The pool hands out its lowest free block first, which keeps
//! what is backed close to what is used.

use crate::backend::{Backend, KvLayer};
use crate::error::Result;
use crate::kv::{BlockTables, KvGroup};
use crate::layout::context::KvPlan;
use crate::memory::MemoryTag;

pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Buffer>,
    pub(crate) v: Vec<B::Buffer>,
    /// Each layer's slots per sequence and group.
    pub(crate) layers: Vec<KvLayer>,
    pub(crate) tables: BlockTables,
    plan: KvPlan,
    capacity: usize,
    dims: (usize, usize),
    /// Whether the pool's layers grow ([`KvPlan::pool_is_shared`]), and the blocks of each
    /// that are backed so far.
    grows: bool,
    backed_blocks: usize,
}

impl<B: Backend> KvCache<B> {
    /// The cache of `plan` for sequences of `capacity` positions, `k_dim` keys and `v_dim`
    /// values per row.
    pub fn new(
        backend: &mut B,
        plan: KvPlan,
        capacity: usize,
        (k_dim, v_dim): (usize, usize),
    ) -> Result<Self> {
        let n = plan.slots.len();
        let grows = plan.pool_is_shared();
        let grows_at = |il: usize| grows && plan.groups[il] == KvGroup::POOL;
        // The layout's rule, which `ModelLayout` lists: a key and a value buffer per layer.
        let mut lens = Vec::with_capacity(2 * n);
        for il in 0..n {
            lens.push((il, plan.values(il, k_dim)?));
            lens.push((il, plan.values(il, v_dim)?));
        }
        // The buffers that do not grow are taken together, when the first of them is due
        // (`Backend::alloc_together`, as `ModelLayout::replay` replays them).
        let fixed: Vec<usize> = (lens.iter())
            .filter(|&&(il, _)| !grows_at(il))
            .map(|&(_, len)| len)
            .collect();
        let mut together = None;
        let mut buffers = Vec::with_capacity(2 * n);
        for &(il, len) in &lens {
            let buffer = if grows_at(il) {
                backend.alloc_growable(MemoryTag::KvCache, len)?
            } else {
                let taken = match together.as_mut() {
                    Some(taken) => taken,
                    None => together.insert(
                        backend
                            .alloc_together(MemoryTag::KvCache, &fixed)?
                            .into_iter(),
                    ),
                };
                taken.next().ok_or_else(|| {
                    crate::error::DecodeError::InvalidArgument(
                        "the backend returned fewer KV buffers than asked".into(),
                    )
                })?
            };
            buffers.push(buffer);
        }
        let mut k = Vec::with_capacity(n);
        let mut v = Vec::with_capacity(n);
        let mut buffers = buffers.into_iter();
        while let (Some(key), Some(value)) = (buffers.next(), buffers.next()) {
            k.push(key);
            v.push(value);
        }
        let layers = (plan.slots.iter().zip(&plan.groups))
            .map(|(&slots, &group)| KvLayer { slots, group })
            .collect();
        Ok(KvCache {
            k,
            v,
            layers,
            tables: plan.tables()?,
            plan,
            capacity,
            dims: (k_dim, v_dim),
            grows,
            backed_blocks: 0,
        })
    }

    /// Whether the pool's storage grows as blocks are handed out.
    pub fn grows(&self) -> bool {
        self.grows
    }

    /// Blocks of the pool backed by memory so far (every block where the pool does not grow).
    pub fn backed_blocks(&self) -> usize {
        if self.grows {
            self.backed_blocks
        } else {
            self.plan.pool_blocks
        }
    }

    /// Backs the pool's first `blocks` blocks in every pool layer (no-op for blocks already
    /// backed, or where the pool does not grow).
    pub(crate) fn back_blocks(&mut self, backend: &mut B, blocks: usize) -> Result<()> {
        let blocks = blocks.min(self.plan.pool_blocks);
        if !self.grows || blocks <= self.backed_blocks {
            return Ok(());
        }
        self.each_pool_buffer(blocks, |buffer, len| backend.commit(buffer, len))?;
        self.backed_blocks = blocks;
        Ok(())
    }

    /// Calls `f` with every pool layer's key and value buffer and the values of its first
    /// `blocks` blocks.
    fn each_pool_buffer(
        &mut self,
        blocks: usize,
        mut f: impl FnMut(&mut B::Buffer, usize) -> Result<()>,
    ) -> Result<()> {
        let rows = blocks * self.plan.block;
        let (kd, vd) = self.dims;
        for (il, layer) in self.layers.iter().enumerate() {
            if layer.group == KvGroup::POOL {
                f(&mut self.k[il], rows * kd)?;
                f(&mut self.v[il], rows * vd)?;
            }
        }
        Ok(())
    }

    /// Gives back the memory behind the pool's blocks from `blocks` on in every pool layer,
    /// where the pool grows (the backend gives it back in whole pieces, so some may stay);
    /// the caller knows no sequence and no cached prefix holds any of them.
    pub(crate) fn release_blocks_from(&mut self, backend: &mut B, blocks: usize) -> Result<()> {
        if !self.grows || blocks >= self.backed_blocks {
            return Ok(());
        }
        self.each_pool_buffer(blocks, |buffer, len| backend.release_beyond(buffer, len))?;
        self.backed_blocks = blocks;
        Ok(())
    }

    /// Positions each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sequences the cache holds tables for.
    pub fn sequences(&self) -> usize {
        self.plan.sequences
    }

    /// How the storage is paged.
    pub fn plan(&self) -> &KvPlan {
        &self.plan
    }
}

//! The KV cache of a context: one key and one value buffer per layer, paged
//! ([`crate::layout::context::KvPlan`]). The layers that hold the whole context share a pool of
//! blocks that any sequence may hold; a sliding-window layer only ever reads its last `window`
//! positions, so when `window + max_batch - 1` slots (enough for a whole prefill chunk) are
//! fewer than the context, each sequence keeps a ring of that many slots in blocks of its own:
//! on Gemma 3 that is 15 of 18 layers. The block tables say which block holds each slot.

use crate::backend::{Backend, KvLayer};
use crate::error::Result;
use crate::kv::BlockTables;
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
        let mut k = Vec::with_capacity(n);
        let mut v = Vec::with_capacity(n);
        for il in 0..n {
            for (buffers, dim) in [(&mut k, k_dim), (&mut v, v_dim)] {
                // The layout's rule, which `ModelLayout` lists.
                let len = plan.values(il, dim)?;
                buffers.push(backend.alloc(MemoryTag::KvCache, len)?);
            }
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
        })
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

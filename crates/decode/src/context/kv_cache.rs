//! The KV cache of a context: one key and one value buffer per layer, holding a segment of
//! `slots` rows for each of the context's sequences (sequence s's rows start at `s * slots`).
//! A sliding-window layer only ever reads its last `window` positions, so its segments are a
//! ring of `window + max_batch - 1` slots (enough for a whole prefill chunk) when that is
//! smaller than the context: on Gemma 3 that is 15 of 18 layers.

use crate::backend::Backend;
use crate::error::Result;
use crate::memory::MemoryTag;

pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Buffer>,
    pub(crate) v: Vec<B::Buffer>,
    /// Rows of one sequence's segment per layer (`capacity` for full layers, less for
    /// ring-buffered window layers).
    pub(crate) slots: Vec<usize>,
    capacity: usize,
    sequences: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache for `sequences` sequences of `capacity` positions each: per layer and sequence,
    /// `slots[l]` rows of `k_dim` keys and `v_dim` values (each at most `capacity`).
    pub fn new(
        backend: &mut B,
        slots: Vec<usize>,
        capacity: usize,
        sequences: usize,
        (k_dim, v_dim): (usize, usize),
    ) -> Result<Self> {
        let mut k = Vec::with_capacity(slots.len());
        let mut v = Vec::with_capacity(slots.len());
        for &n in &slots {
            for (buffers, dim) in [(&mut k, k_dim), (&mut v, v_dim)] {
                // The layout's rule, which `ModelLayout` lists.
                let len = crate::layout::context::kv_values(n, sequences, dim)?;
                buffers.push(backend.alloc(MemoryTag::KvCache, len)?);
            }
        }
        Ok(KvCache {
            k,
            v,
            slots,
            capacity,
            sequences,
        })
    }

    /// Positions each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sequences the cache holds segments for.
    pub fn sequences(&self) -> usize {
        self.sequences
    }
}

//! The KV cache: one key and one value buffer per layer, sized from the requested context.
//! A sliding-window layer only ever reads its last `window` positions, so its buffers are a
//! ring of `window + max_batch - 1` slots (enough for a whole prefill chunk) when that is
//! smaller than the context: on Gemma 3 that is 15 of 18 layers.

use crate::backend::Backend;
use crate::error::{DecodeError, Result};
use crate::memory::MemoryTag;

pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Buffer>,
    pub(crate) v: Vec<B::Buffer>,
    /// Rows per layer (`capacity` for full layers, less for ring-buffered window layers).
    pub(crate) slots: Vec<usize>,
    capacity: usize,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache for `capacity` positions: per layer, `slots[l]` rows of `k_dim` keys and
    /// `v_dim` values (each at most `capacity`).
    pub fn new(
        backend: &mut B,
        slots: Vec<usize>,
        capacity: usize,
        k_dim: usize,
        v_dim: usize,
    ) -> Result<Self> {
        let mut k = Vec::with_capacity(slots.len());
        let mut v = Vec::with_capacity(slots.len());
        for &n in &slots {
            for (buffers, dim, what) in [(&mut k, k_dim, "keys"), (&mut v, v_dim, "values")] {
                let len = n.checked_mul(dim).ok_or_else(|| DecodeError::Allocation {
                    what: format!("the KV cache {what}"),
                    reason: format!("{n} positions of {dim} values overflow"),
                })?;
                buffers.push(backend.alloc(MemoryTag::KvCache, len)?);
            }
        }
        Ok(KvCache {
            k,
            v,
            slots,
            capacity,
            len: 0,
        })
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Forgets every position (a new conversation); the memory stays allocated.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

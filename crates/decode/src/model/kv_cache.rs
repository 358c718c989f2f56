//! The KV cache: one key and one value buffer per layer, sized from the requested context.

use crate::backend::Backend;
use crate::error::Result;
use crate::memory::MemoryTag;

pub struct KvCache<B: Backend> {
    pub(crate) k: Vec<B::Buffer>,
    pub(crate) v: Vec<B::Buffer>,
    capacity: usize,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// Allocates `capacity` positions of `k_dim` keys and `v_dim` values for each layer.
    pub fn new(
        backend: &mut B,
        n_layers: usize,
        capacity: usize,
        k_dim: usize,
        v_dim: usize,
    ) -> Result<Self> {
        let mut k = Vec::with_capacity(n_layers);
        let mut v = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            k.push(backend.alloc(MemoryTag::KvCache, capacity * k_dim)?);
            v.push(backend.alloc(MemoryTag::KvCache, capacity * v_dim)?);
        }
        Ok(KvCache {
            k,
            v,
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

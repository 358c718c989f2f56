//! One device allocation for all the device-resident weights of a load.
//!
//! The allocator's way of packing many weights costs memory: tensors under 10 MiB share 20 MiB
//! segments and larger ones get segments rounded to 2 MiB, and the tails those leave (72 MiB of
//! 992 on the 8B shape at a 1003 MiB budget, on the H200) made budget runs fail at the memory
//! limit although the plan fit, and every other run hold memory no tensor used. So the backend
//! takes the device weights as one allocation on the first device weight and hands out
//! consecutive pieces of it, each rounded to [`PIECE_ALIGN`]: no segment tails between weights.
//! A budget run's plan names the bytes (the bytes the plan counted are the bytes the allocator
//! holds); otherwise the load names them beforehand (`Backend::reserve_weights`).

use rocm_alloc::Allocation;
use std::sync::Arc;

/// Alignment of each weight inside the block: the allocator's own block granularity, which
/// also keeps the 256-byte alignment the vendor GEMM and the vector loads rely on.
pub const PIECE_ALIGN: u64 = 512;

/// Bytes a weight of `len` bytes takes in the block.
pub fn piece_bytes(len: u64) -> u64 {
    len.max(1).next_multiple_of(PIECE_ALIGN)
}

/// The block and how much of it is handed out.
pub(crate) struct WeightBlock {
    block: Arc<Allocation>,
    used: u64,
}

impl WeightBlock {
    pub(crate) fn new(block: Allocation) -> WeightBlock {
        WeightBlock {
            block: Arc::new(block),
            used: 0,
        }
    }

    /// The next `len` bytes of the block, or `None` when they do not fit (the caller then
    /// allocates the weight on its own: a plan that counted a weight smaller than the backend
    /// stores it costs a separate allocation, never a failed load).
    pub(crate) fn take(&mut self, len: u64) -> Option<(Arc<Allocation>, u64)> {
        let need = piece_bytes(len);
        // The whole block the allocator set aside, its rounding included, is usable.
        if self.used + need > self.block.block_size() {
            return None;
        }
        let offset = self.used;
        self.used += need;
        Some((Arc::clone(&self.block), offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocm_alloc::devices::sim::SimDevice;
    use rocm_alloc::{Allocator, AllocatorConfig, StreamId, Tag};

    #[test]
    fn pieces_are_consecutive_aligned_and_stop_at_the_end_of_the_block() {
        let device = Arc::new(SimDevice::discrete(1 << 30));
        let config = AllocatorConfig {
            read_env: false,
            ..Default::default()
        };
        let alloc = Allocator::new(device, config).unwrap();
        // Three weights as a plan would count them: the block holds exactly their pieces.
        let lens = [1000u64, 4096, 3];
        let total: u64 = lens.iter().map(|&l| piece_bytes(l)).sum();
        assert_eq!(total, 1024 + 4096 + 512);
        // Room for one more 1536-byte weight after them.
        let block = alloc
            .alloc(total + 1536, StreamId::DEFAULT, Tag::Weights)
            .unwrap();
        let base = block.ptr();
        let mut b = WeightBlock::new(block);
        let pieces: Vec<_> = lens.iter().map(|&l| (b.take(l).unwrap(), l)).collect();
        let offsets: Vec<u64> = pieces.iter().map(|((_, o), _)| *o).collect();
        assert_eq!(offsets, [0, 1024, 1024 + 4096]);
        // A weight's memory reports the weight's own bytes, not its rounded piece: the kernels'
        // matrix views check the size against the tensor's shape.
        let ((block_ref, offset), len) = pieces[0].clone();
        let mem = super::super::WeightMemory::Block {
            block: block_ref,
            offset,
            len,
        };
        assert_eq!((mem.size(), mem.ptr()), (1000, base));
        assert!(offsets.iter().all(|o| (base + o).is_multiple_of(256)));
        // The block is as large as the allocator rounded it; past that, a weight is refused
        // (and the backend gives it an allocation of its own).
        let room = b.block.block_size() - b.used;
        assert_eq!(room, 1536);
        assert!(b.take(room + 1).is_none());
        assert!(b.take(room).is_some());
        assert!(b.take(1).is_none());
        // Every weight is under the one allocation of the weights tag.
        assert_eq!(alloc.stats().tag(Tag::Weights).current, b.block.size());
    }
}

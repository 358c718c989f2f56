//! The decode arena: one allocation carved by a bump pointer and reset every decode step.
//!
//! A decode step makes the same sequence of temporary allocations each time, so bumping through
//! a fixed region gives the same addresses every step (which captured graphs replay) and costs
//! an addition per allocation. The arena records its high-water mark, including requests it had
//! to refuse, so the right size can be read off after a warm-up step.

use crate::allocator::{Allocation, Allocator};
use crate::device::StreamId;
use crate::error::AllocError;
use crate::tag::Tag;

/// Alignment of every arena slice, enough for any vector load.
pub const ARENA_ALIGN: u64 = 256;

/// A slice of the arena, valid until the next [`DecodeArena::reset`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaSlice {
    /// Device address.
    pub ptr: u64,
    /// Bytes requested.
    pub size: u64,
    /// Offset from the arena base.
    pub offset: u64,
}

/// A bump region for one decode loop. Not shared between threads: the loop owns it.
#[derive(Debug)]
pub struct DecodeArena {
    backing: Allocation,
    used: u64,
    high_water: u64,
    resets: u64,
}

impl Drop for DecodeArena {
    fn drop(&mut self) {
        // The backing allocation is freed right after this, by its own destructor.
        self.backing
            .allocator()
            .arena_dropped(self.backing.block_size());
    }
}

impl DecodeArena {
    fn new(backing: Allocation) -> DecodeArena {
        DecodeArena {
            backing,
            used: 0,
            high_water: 0,
            resets: 0,
        }
    }

    /// Takes `bytes` (aligned to [`ARENA_ALIGN`]) from the arena.
    pub fn alloc(&mut self, bytes: u64) -> Result<ArenaSlice, AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        let aligned = bytes
            .checked_next_multiple_of(ARENA_ALIGN)
            .ok_or(AllocError::TooLarge(bytes))?;
        let end = self
            .used
            .checked_add(aligned)
            .ok_or(AllocError::TooLarge(bytes))?;
        self.high_water = self.high_water.max(end);
        if end > self.capacity() {
            return Err(AllocError::ArenaExhausted {
                requested: bytes,
                used: self.used,
                capacity: self.capacity(),
                high_water: self.high_water,
            });
        }
        let offset = self.used;
        self.used = end;
        Ok(ArenaSlice {
            ptr: self.backing.ptr() + offset,
            size: bytes,
            offset,
        })
    }

    /// Starts a new step: every slice handed out so far is invalid afterwards, and the same
    /// sequence of requests gets the same addresses again.
    pub fn reset(&mut self) {
        self.used = 0;
        self.resets += 1;
    }

    /// Bytes used in the current step.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Most bytes any step needed (refused requests included).
    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Size of the region.
    pub fn capacity(&self) -> u64 {
        self.backing.size()
    }

    /// Base device address.
    pub fn base(&self) -> u64 {
        self.backing.ptr()
    }

    /// Number of resets so far.
    pub fn steps(&self) -> u64 {
        self.resets
    }
}

impl Allocator {
    /// Creates a decode arena of `capacity` bytes on `stream`, accounted under `tag`.
    pub fn new_arena(
        &self,
        capacity: u64,
        stream: StreamId,
        tag: Tag,
    ) -> Result<DecodeArena, AllocError> {
        let backing = self.alloc(capacity, stream, tag)?;
        self.arena_created(backing.block_size());
        Ok(DecodeArena::new(backing))
    }
}

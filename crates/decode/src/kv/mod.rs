//! The paged KV cache's books: fixed-size blocks of positions under a byte budget, each
//! sequence's table of blocks, blocks shared between sequences with the same prefix, and the
//! blocks of finished sequences kept as a prefix cache.
//!
//! This module decides which block holds which positions; it holds no device memory. The
//! context that owns the KV storage asks it for blocks as its sequences grow, copies a block
//! when [`BlockPool::reserve`] says a shared block must be copied before it is written
//! (copy-on-write), and maps a position to its slot through the sequence's [`SeqBlocks`].
//!
//! - [`element`]: [`KvType`], how the cache stores its values and the bytes that takes.
//! - [`pool`]: [`BlockPool`], the blocks, their reference counts and the budget.
//! - [`prefix`]: the keys the prefix cache finds full blocks by.
//! - [`rings`]: [`RingRuns`], the sliding-window layers' rings that finished sequences leave
//!   for the prefix cache.
//! - [`tables`]: [`BlockTables`], which block holds each sequence's slots, as the context and
//!   the backends' kernels read them.

pub mod element;
pub mod pool;
pub mod prefix;
pub mod rings;
pub mod tables;

pub use element::KvType;
pub use pool::{BlockCopy, BlockId, BlockPool, PoolError, PoolStats, SeqBlocks};
pub use rings::{RingHit, RingRuns};
pub use tables::{block_positions, BlockTables, KvGroup, BLOCK_POSITIONS, KV_BLOCK};

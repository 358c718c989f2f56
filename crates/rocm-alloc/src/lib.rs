//! A stream-aware caching allocator for GPU memory whose every byte is bounded and explained.
//!
//! [`Allocator`] sits on a [`RawDevice`] (HIP through `hip-ffi`, or the simulated
//! [`devices::sim::SimDevice`]) and caches device memory in per-stream small and large pools,
//! splitting and merging blocks like PyTorch's CUDA caching allocator. On top of that it adds a
//! bounded cache, a memory limit with environment overrides, tagged accounting, snapshots, an
//! optional trace that can be written to a file and replayed on a simulated device
//! ([`replay`]), graph-capture pools and a decode arena. `docs/memory.md` describes the model
//! and every knob.
//!
//! ```
//! use std::sync::Arc;
//! use rocm_alloc::{Allocator, AllocatorConfig, StreamId, Tag};
//! use rocm_alloc::devices::sim::SimDevice;
//!
//! let device = Arc::new(SimDevice::discrete(1 << 30));
//! let config = AllocatorConfig { read_env: false, ..Default::default() };
//! let alloc = Allocator::new(device, config).unwrap();
//! let kv = alloc.alloc(4 << 20, StreamId::DEFAULT, Tag::KvCache).unwrap();
//! assert_eq!(alloc.stats().tag(Tag::KvCache).current, 4 << 20);
//! drop(kv);
//! assert_eq!(alloc.stats().active_bytes, 0);
//! ```

mod allocator;
mod arena;
mod block;
mod block_pool;
mod breakdown;
mod captures;
mod config;
mod deferred;
mod device;
pub mod devices;
mod error;
mod free_list;
mod graph_pool;
mod growable;
pub mod knobs;
pub mod limits;
mod oom;
pub mod replay;
pub mod size_class;
mod snapshot;
mod stats;
mod tag;
pub mod trace;

pub use allocator::{Allocation, Allocator, TraceLog};
pub use arena::{ArenaSlice, DecodeArena, ARENA_ALIGN};
pub use block::BlockState;
pub use block_pool::GraphPoolId;
pub use breakdown::ReservedBreakdown;
pub use config::{AllocatorConfig, DEFAULT_TRIM_HOT_WINDOW};
pub use device::{DeviceError, EventId, MemoryInfo, RawDevice, StreamId, UmaInfo};
pub use error::AllocError;
pub use graph_pool::{CaptureGuard, CaptureTarget, GraphPool};
pub use growable::GrowableRegion;
pub use limits::{InvalidLimit, LimitParseError, LimitSpec};
pub use oom::{fmt_bytes, fmt_bytes_decimals, OomCause, OomReport};
pub use snapshot::{
    BlockInfo, PoolName, SegmentInfo, Snapshot, StrandedBlock, StrandedReason, StuckBlock,
};
pub use stats::{Stats, TagUsage};
pub use tag::Tag;
pub use trace::{TraceError, TraceEvent, TraceFile, TraceKind};

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

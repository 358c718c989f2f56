//! Device memory a run takes that no buffer of the layout can give exactly before the run:
//! the costs outside the allocator, each a named line with the size measured on the H200 and
//! where it was measured, and one bound derived from the allocator's segment size (the device
//! weights' block, last).

use rocm_alloc::size_class::LARGE_SEGMENT;

/// Bytes outside the allocator once the backend has started: kernel modules, streams, events
/// and the vendor BLAS handle. The memory study measured 4.0 MiB on Gemma 3 270M and 0 on the
/// 8B and 30B-A3B shapes ("runtime" column, docs/benchmark_results/memory-study-2026-11-30.md,
/// section 1; the runtime's context, created before the first reading, is not in it).
pub const RUNTIME_AT_START_BYTES: u64 = 4 << 20;

/// Bytes the instantiated decode graphs take outside the allocator: one 2 MiB page on Gemma 3
/// 270M, none on the two large shapes, whose graphs fit pages the driver already held (the
/// graph table of docs/benchmark_results/memory-study-2026-11-30.md; the backend's own
/// estimate before capture is 2–4 MiB).
pub const DECODE_GRAPH_BYTES: u64 = 2 << 20;

/// A page the runtime took outside the allocator during prefill that no trace explains: 2 MiB
/// on the 30B-A3B shape, the "unattributed" column of the memory study
/// (docs/benchmark_results/memory-study-2026-11-30.md, section 1).
pub const UNTRACED_RUNTIME_BYTES: u64 = 2 << 20;

/// Device memory the runtime takes, outside the allocator, to map `host_bytes` of pinned host
/// memory into the device's address space: its page tables, 8 bytes per 4 KiB page (1/512),
/// rounded up to a MiB. The H200 showed 30 MiB outside the allocator with 12.0 GiB of weights
/// mapped, against 4–8 MiB with none: 22–26 MiB, and 12 GiB / 512 is 24 MiB
/// (docs/benchmark_results/offload-sweep-2026-11-30.md).
pub fn host_mapping_bytes(host_bytes: u64) -> u64 {
    host_bytes.div_ceil(512).next_multiple_of(1 << 20)
}

/// What the device weights of a budget run can add to the allocator's segments beyond their
/// own footprint. They are one block (`backend/gpu/weight_block.rs`) taken right after the
/// step block; the plan decides its size after the layout is made. A block of
/// `MIN_LARGE_ALLOC` (10 MiB) or more has a segment of its own and adds nothing; a smaller one shares the segments the other
/// buffers then fill, which can end a segment earlier and open one more: at most one shared
/// large segment.
pub const SMALL_WEIGHT_BLOCK_BYTES: u64 = LARGE_SEGMENT;

//! Size rounding and segment sizing.
//!
//! The constants match PyTorch's CUDA caching allocator because its trade-offs are well tested
//! on large-model workloads: requests are rounded to 512 bytes; requests up to 1 MiB live in the
//! small pool, carved from 2 MiB segments; larger ones live in the large pool, carved from
//! 20 MiB segments below 10 MiB and from their own 2 MiB-rounded segment above.

/// Every block size is a multiple of this, and so is every block address inside a segment.
pub const MIN_BLOCK: u64 = 512;
/// Largest request served from the small pool.
pub const SMALL_MAX: u64 = 1 << 20;
/// Size of a small-pool segment.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Requests below this (and above [`SMALL_MAX`]) share [`LARGE_SEGMENT`]-sized segments.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Size of a shared large-pool segment.
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Large requests of their own segment are rounded up to this.
pub const ROUND_LARGE: u64 = 2 << 20;

/// Largest block or segment the allocator represents (512 TiB), far beyond any device.
pub const MAX_BLOCK: u64 = 1 << 49;

/// Which pool a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeKind {
    /// Requests up to [`SMALL_MAX`].
    Small,
    /// Everything larger.
    Large,
}

impl SizeKind {
    /// Name used in snapshots.
    pub fn name(self) -> &'static str {
        match self {
            SizeKind::Small => "small",
            SizeKind::Large => "large",
        }
    }
}

/// Rounds a request up to a block size. Returns `None` when the request is so large that
/// rounding would overflow; no device can satisfy such a request anyway.
pub fn round_request(bytes: u64) -> Option<u64> {
    if bytes <= MIN_BLOCK {
        return Some(MIN_BLOCK);
    }
    bytes
        .checked_next_multiple_of(MIN_BLOCK)
        .filter(|&r| r <= MAX_BLOCK)
}

/// The pool a rounded block size belongs to.
pub fn kind_of(rounded: u64) -> SizeKind {
    if rounded <= SMALL_MAX {
        SizeKind::Small
    } else {
        SizeKind::Large
    }
}

/// Size of the device allocation made when a rounded request misses the cache.
pub fn segment_size(rounded: u64) -> Option<u64> {
    if rounded <= SMALL_MAX {
        Some(SMALL_SEGMENT)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_SEGMENT)
    } else {
        rounded
            .checked_next_multiple_of(ROUND_LARGE)
            .filter(|&s| s <= MAX_BLOCK)
    }
}

/// Whether a free block of `block` bytes serving `rounded` bytes should be split, leaving the
/// rest free. Small-pool remainders are kept down to one minimum block; large-pool remainders
/// only above 1 MiB, because a smaller remainder could only serve a small request, and small
/// requests are served by the small pool.
pub fn should_split(kind: SizeKind, block: u64, rounded: u64) -> bool {
    let remainder = block - rounded;
    match kind {
        SizeKind::Small => remainder >= MIN_BLOCK,
        SizeKind::Large => remainder > SMALL_MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_min_block() {
        assert_eq!(round_request(0), Some(512));
        assert_eq!(round_request(1), Some(512));
        assert_eq!(round_request(512), Some(512));
        assert_eq!(round_request(513), Some(1024));
        assert_eq!(round_request(u64::MAX), None);
        assert_eq!(round_request(MAX_BLOCK + 1), None);
    }

    #[test]
    fn pool_boundaries() {
        assert_eq!(kind_of(SMALL_MAX), SizeKind::Small);
        assert_eq!(kind_of(SMALL_MAX + 512), SizeKind::Large);
        assert_eq!(segment_size(512), Some(SMALL_SEGMENT));
        assert_eq!(segment_size(SMALL_MAX + 512), Some(LARGE_SEGMENT));
        assert_eq!(segment_size(MIN_LARGE_ALLOC - 512), Some(LARGE_SEGMENT));
        assert_eq!(segment_size(MIN_LARGE_ALLOC), Some(MIN_LARGE_ALLOC));
        assert_eq!(segment_size(MIN_LARGE_ALLOC + 512), Some(12 << 20));
    }

    #[test]
    fn split_thresholds() {
        assert!(should_split(SizeKind::Small, 2048, 1024));
        assert!(!should_split(SizeKind::Small, 1024, 1024));
        assert!(!should_split(SizeKind::Large, 3 << 20, 2 << 20));
        assert!(should_split(SizeKind::Large, (3 << 20) + 512, 2 << 20));
    }
}

//! What the allocator makes of a layout's buffers: the buffers replayed, in the load's order,
//! on rocm-alloc's own allocator over its simulated device. The per-tag figures are then the
//! allocator's block sizes (its rounding, and the remainders it does not split off), and the
//! peak reserved bytes include every segment tail and every buffer freed and cached during the
//! load: the same rules as the run's, applied by the same code, instead of a rule copied here.

use crate::error::{DecodeError, Result};
use crate::memory::MemoryTag;
use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::{Allocation, Allocator, AllocatorConfig, GrowableRegion, LimitSpec};
use std::sync::Arc;

/// One allocation of the replay.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub tag: MemoryTag,
    /// Bytes asked of the allocator.
    pub bytes: u64,
    /// The earlier request (by position in the replay) freed just before this one is made:
    /// a buffer the load replaces by a larger one.
    pub frees: Option<usize>,
    /// A growable region (`Allocator::reserve_growable`), replayed grown to its whole size.
    pub grows: bool,
}

/// The allocator's figures after the replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorView {
    /// Bytes of live blocks per tag, as `Stats::per_tag` reports them (in `MemoryTag::ALL`
    /// order).
    pub per_tag: [u64; MemoryTag::COUNT],
    /// The most the allocator reserved from the device during the replay.
    pub peak_reserved: u64,
}

impl AllocatorView {
    pub fn get(&self, tag: MemoryTag) -> u64 {
        self.per_tag[tag.index()]
    }
}

/// A simulated device far larger than any real one: the replay never runs out.
const SIMULATED_BYTES: u64 = 1 << 48;

/// Replays `requests` in order on a fresh allocator with the run's settings (the cache limit
/// and trim window from the environment, as `GpuBackend::new` reads them; no memory limit).
pub fn replay(requests: &[Request]) -> Result<AllocatorView> {
    let failed = |e: &dyn std::fmt::Display| DecodeError::Allocation {
        what: "the layout's replay on the simulated allocator".into(),
        reason: e.to_string(),
    };
    let device = Arc::new(SimDevice::discrete(SIMULATED_BYTES));
    let stream = device.create_stream();
    let alloc = Allocator::new(
        device,
        AllocatorConfig {
            memory_limit: Some(LimitSpec::Unbounded),
            ..AllocatorConfig::default()
        },
    )
    .map_err(|e| failed(&e))?;
    /// What a request holds while it lives.
    enum Live {
        Block(#[allow(dead_code)] Allocation),
        Region(#[allow(dead_code)] GrowableRegion),
    }
    let mut live: Vec<Option<Live>> = Vec::with_capacity(requests.len());
    for r in requests {
        if let Some(i) = r.frees {
            let slot = live.get_mut(i).ok_or_else(|| {
                DecodeError::InvalidArgument(format!(
                    "the layout's replay frees request {i} before it is made"
                ))
            })?;
            *slot = None;
        }
        let held = if r.grows {
            let mut region = alloc
                .reserve_growable(r.bytes.max(1), stream, r.tag)
                .map_err(|e| failed(&e))?;
            region.commit(r.bytes.max(1)).map_err(|e| failed(&e))?;
            Live::Region(region)
        } else {
            let block = alloc
                .alloc(r.bytes.max(1), stream, r.tag)
                .map_err(|e| failed(&e))?;
            Live::Block(block)
        };
        live.push(Some(held));
    }
    let stats = alloc.stats();
    let mut per_tag = [0u64; MemoryTag::COUNT];
    for (tag, usage) in &stats.per_tag {
        per_tag[tag.index()] = usage.current;
    }
    let view = AllocatorView {
        per_tag,
        peak_reserved: stats.peak_reserved_bytes,
    };
    drop(live);
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocm_alloc::size_class::{MIN_BLOCK, SMALL_SEGMENT};

    #[test]
    fn blocks_are_rounded_and_a_replaced_buffer_stays_cached() {
        let kv = MemoryTag::KvCache;
        let ws = MemoryTag::Workspace;
        let view = replay(&[
            Request {
                tag: kv,
                bytes: 100,
                frees: None,
                grows: false,
            },
            Request {
                tag: ws,
                bytes: 1000,
                frees: None,
                grows: false,
            },
            // Replaces the workspace buffer: freed first, cached in the small segment.
            Request {
                tag: ws,
                bytes: 3000,
                frees: Some(1),
                grows: false,
            },
        ])
        .unwrap();
        assert_eq!(view.get(kv), MIN_BLOCK);
        assert_eq!(view.get(ws), 3072);
        assert_eq!(view.peak_reserved, SMALL_SEGMENT);
        let err = replay(&[Request {
            tag: ws,
            bytes: 1,
            frees: Some(3),
            grows: false,
        }])
        .unwrap_err();
        assert!(err.to_string().contains("before it is made"), "{err}");
    }

    #[test]
    fn a_growing_buffer_is_priced_in_whole_mapped_pieces() {
        let piece = rocm_alloc::devices::sim::SIM_MAP_GRANULARITY;
        let kv = MemoryTag::KvCache;
        let view = replay(&[
            Request {
                tag: kv,
                bytes: 100,
                frees: None,
                grows: true,
            },
            Request {
                tag: kv,
                bytes: piece + 1,
                frees: None,
                grows: true,
            },
        ])
        .unwrap();
        assert_eq!(view.get(kv), 3 * piece);
        assert_eq!(view.peak_reserved, 3 * piece, "no pool segment besides");
    }

    #[test]
    fn a_large_buffer_takes_its_own_segment() {
        let view = replay(&[Request {
            tag: MemoryTag::Weights,
            bytes: (10 << 20) + 1,
            frees: None,
            grows: false,
        }])
        .unwrap();
        // Rounded to 512 bytes; its segment to 2 MiB, whose remainder (over 1 MiB) is split off.
        assert_eq!(view.get(MemoryTag::Weights), (10 << 20) + 512);
        assert_eq!(view.peak_reserved, 12 << 20);
    }
}

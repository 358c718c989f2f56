//! Growable regions: an address range set aside at its largest size, with device memory
//! mapped into it piece by piece as the user needs more.
//!
//! A paged KV cache is the case this is for: its storage must keep one address for the life of
//! a context (captured graphs and block tables point into it), yet a server sized for many long
//! sequences uses a fraction of it most of the time. Reserving the range costs no memory;
//! [`GrowableRegion::commit`] maps memory at the end of what is mapped, in whole pieces of the
//! device's granularity, under the allocator's memory limit and booked under the region's tag,
//! so the statistics, the breakdown and an OOM report see it like any other active memory.
//!
//! On a device that cannot map memory piece by piece ([`crate::RawDevice::map_granularity`] is
//! `None`), the region takes its whole size from the ordinary pools when it is made, and
//! [`GrowableRegion::grows`] says so; commits then have nothing to do.

use crate::allocator::{Allocation, Allocator};
use crate::device::StreamId;
use crate::error::AllocError;
use crate::tag::Tag;

/// An address range whose memory is mapped as it is needed; see the module docs.
pub struct GrowableRegion {
    allocator: Allocator,
    base: u64,
    capacity: u64,
    tag: Tag,
    /// The stream whose work uses the region: dropping it waits for that work before
    /// unmapping, as the pools' blocks are reused in that stream's order.
    stream: StreamId,
    backing: Backing,
}

enum Backing {
    /// Address space of `reserved` bytes (the capacity rounded up to the granularity), with
    /// `pieces` mapped in address order from the base.
    Mapped {
        reserved: u64,
        granularity: u64,
        /// `(bytes, device handle)` of each mapped piece.
        pieces: Vec<(u64, u64)>,
        mapped: u64,
    },
    /// The device maps no memory piece by piece: the whole capacity, from the pools.
    Whole(Allocation),
}

impl std::fmt::Debug for GrowableRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrowableRegion")
            .field("base", &format_args!("{:#x}", self.base))
            .field("capacity", &self.capacity)
            .field("committed", &self.committed())
            .field("tag", &self.tag)
            .finish()
    }
}

impl GrowableRegion {
    /// The region's device address; it never changes.
    pub fn ptr(&self) -> u64 {
        self.base
    }

    /// Bytes the region may grow to.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes from the base that are backed by memory now (whole pieces, so possibly more than
    /// was asked; never less than the largest [`GrowableRegion::commit`]).
    pub fn committed(&self) -> u64 {
        match &self.backing {
            Backing::Mapped { mapped, .. } => *mapped,
            Backing::Whole(a) => a.block_size(),
        }
    }

    /// Whether memory is mapped as it is needed (`false`: the device cannot, and the whole
    /// capacity was taken at creation).
    pub fn grows(&self) -> bool {
        matches!(self.backing, Backing::Mapped { .. })
    }

    /// The size of the pieces memory is mapped in (the whole capacity where it does not grow).
    pub fn granularity(&self) -> u64 {
        match &self.backing {
            Backing::Mapped { granularity, .. } => *granularity,
            Backing::Whole(a) => a.block_size(),
        }
    }

    /// The accounting tag.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// Backs the first `bytes` of the region with memory, mapping whole pieces at the end of
    /// what is mapped; returns the bytes newly mapped (0 when they were already backed).
    /// Asking for more than the capacity is refused; running into the memory limit or out of
    /// device memory is an [`AllocError::OutOfMemory`] whose report names the region, and
    /// leaves what was mapped before in place.
    pub fn commit(&mut self, bytes: u64) -> Result<u64, AllocError> {
        if bytes > self.capacity {
            return Err(AllocError::RegionExceeded {
                requested: bytes,
                capacity: self.capacity,
            });
        }
        let Backing::Mapped {
            reserved,
            granularity,
            pieces,
            mapped,
        } = &mut self.backing
        else {
            return Ok(0);
        };
        if bytes <= *mapped {
            return Ok(0);
        }
        // In range: `bytes` is at most the capacity, and the reservation is the capacity
        // rounded up to the granularity.
        let target = bytes.next_multiple_of(*granularity).min(*reserved);
        let piece = target - *mapped;
        let handle = self
            .allocator
            .map_region_piece(self.base + *mapped, piece, self.tag)?;
        pieces.push((piece, handle));
        *mapped = target;
        Ok(piece)
    }
}

impl GrowableRegion {
    /// Gives back the mapped pieces that lie wholly beyond the first `bytes` of the region,
    /// last first, once the region's stream has finished the work queued on it; returns the
    /// bytes unmapped. Pieces are unmapped whole, as they were mapped, so a little more than
    /// `bytes` may stay backed. A later [`GrowableRegion::commit`] maps memory there again.
    /// Where the stream cannot be waited for, nothing is unmapped (that work may still touch
    /// the memory) and the error says so.
    pub fn shrink_to(&mut self, bytes: u64) -> Result<u64, AllocError> {
        let Backing::Mapped { pieces, mapped, .. } = &mut self.backing else {
            return Ok(0);
        };
        let beyond = |pieces: &[(u64, u64)], mapped: u64| {
            pieces
                .last()
                .is_some_and(|&(piece, _)| mapped - piece >= bytes)
        };
        if !beyond(pieces, *mapped) {
            return Ok(0);
        }
        if !self.allocator.wait_for_stream(self.stream) {
            return Err(AllocError::Device(crate::device::DeviceError::Driver {
                call: "waiting for a growable region's stream",
                message: format!(
                    "the {} region's work could not be waited for (or a capture is under \
                     way), so its memory stays mapped",
                    self.tag.name()
                ),
            }));
        }
        let before = *mapped;
        while beyond(pieces, *mapped) {
            let Some((piece, handle)) = pieces.pop() else {
                break;
            };
            *mapped -= piece;
            self.allocator
                .unmap_region_piece(self.base + *mapped, piece, handle, self.tag);
        }
        Ok(before - *mapped)
    }
}

impl Drop for GrowableRegion {
    fn drop(&mut self) {
        if let Backing::Mapped {
            reserved, pieces, ..
        } = &mut self.backing
        {
            if !pieces.is_empty() && !self.allocator.wait_for_stream(self.stream) {
                // Unmapping memory that queued work may still touch would fault the device;
                // keeping it mapped leaks it instead, and the warning says so.
                tracing::warn!(
                    "a {} region could not wait for its stream's work, so its {} stay mapped",
                    self.tag.name(),
                    crate::oom::fmt_bytes(pieces.iter().map(|&(b, _)| b).sum())
                );
                return;
            }
            let mut end: u64 = pieces.iter().map(|&(bytes, _)| bytes).sum();
            while let Some((bytes, handle)) = pieces.pop() {
                end -= bytes;
                self.allocator
                    .unmap_region_piece(self.base + end, bytes, handle, self.tag);
            }
            self.allocator.release_region(self.base, *reserved);
        }
        // A `Whole` region's allocation returns to the pools by its own destructor.
    }
}

impl Allocator {
    /// A region of `capacity` bytes under `tag` whose memory is mapped as
    /// [`GrowableRegion::commit`] asks, at an address that never changes. Nothing is mapped
    /// yet. On a device that cannot map memory piece by piece, the whole capacity is taken
    /// now, on `stream`, like [`Allocator::alloc`].
    pub fn reserve_growable(
        &self,
        capacity: u64,
        stream: StreamId,
        tag: Tag,
    ) -> Result<GrowableRegion, AllocError> {
        if capacity == 0 {
            return Err(AllocError::ZeroSize);
        }
        let Some(granularity) = self.map_granularity() else {
            let whole = self.alloc(capacity, stream, tag)?;
            return Ok(GrowableRegion {
                allocator: self.clone(),
                base: whole.ptr(),
                capacity,
                tag,
                stream,
                backing: Backing::Whole(whole),
            });
        };
        let reserved = capacity
            .checked_next_multiple_of(granularity)
            .ok_or(AllocError::TooLarge(capacity))?;
        let base = self.reserve_region(reserved)?;
        Ok(GrowableRegion {
            allocator: self.clone(),
            base,
            capacity,
            tag,
            stream,
            backing: Backing::Mapped {
                reserved,
                granularity,
                pieces: Vec::new(),
                mapped: 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::sim::{SimConfig, SimDevice, SIM_MAP_GRANULARITY};
    use crate::{AllocatorConfig, LimitSpec};
    use std::sync::Arc;

    const G: u64 = SIM_MAP_GRANULARITY;

    fn allocator(device: &Arc<SimDevice>) -> Allocator {
        let config = AllocatorConfig {
            read_env: false,
            memory_limit: Some(LimitSpec::Unbounded),
            ..Default::default()
        };
        Allocator::new(device.clone(), config).unwrap()
    }

    #[test]
    fn a_region_maps_whole_pieces_only_as_commits_ask() {
        let device = Arc::new(SimDevice::discrete(64 * G));
        let alloc = allocator(&device);
        let mut region = alloc
            .reserve_growable(10 * G + 5, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        assert!(region.grows());
        assert_eq!(region.committed(), 0);
        assert_eq!(device.stats().used, 0, "reserving maps nothing");
        assert_eq!(alloc.stats().tag(Tag::KvCache).current, 0);

        assert_eq!(region.commit(1).unwrap(), G);
        assert_eq!(region.commit(G).unwrap(), 0, "already backed");
        assert_eq!(region.commit(3 * G + 1).unwrap(), 3 * G);
        assert_eq!(region.committed(), 4 * G);
        let base = region.ptr();
        assert_eq!(
            region.commit(10 * G + 5).unwrap(),
            7 * G,
            "the last piece is whole"
        );
        assert_eq!(region.ptr(), base, "the address never moves");

        let stats = alloc.stats();
        assert_eq!(stats.tag(Tag::KvCache).current, 11 * G);
        assert_eq!(stats.mapped_bytes, 11 * G);
        assert_eq!(stats.reserved_bytes, 11 * G);
        assert_eq!(device.stats().mapped, 11 * G);
        let breakdown = alloc.snapshot().breakdown();
        assert_eq!(breakdown.active(Tag::KvCache), 11 * G);
        assert_eq!(breakdown.sum(), breakdown.reserved);
        assert_eq!(breakdown.reserved, stats.reserved_bytes);

        assert!(matches!(
            region.commit(10 * G + 6),
            Err(AllocError::RegionExceeded { .. })
        ));
        drop(region);
        assert_eq!(device.stats().used, 0, "dropping unmaps every piece");
        assert_eq!(device.stats().reservations, 0, "and returns the addresses");
        let stats = alloc.stats();
        assert_eq!(stats.tag(Tag::KvCache).current, 0);
        assert_eq!(stats.reserved_bytes, 0);
        assert_eq!(
            stats.tag(Tag::KvCache).peak,
            11 * G,
            "the peak remembers it"
        );
    }

    #[test]
    fn shrinking_gives_back_whole_pieces_beyond_and_a_commit_maps_them_again() {
        let device = Arc::new(SimDevice::discrete(64 * G));
        let alloc = allocator(&device);
        let mut region = alloc
            .reserve_growable(8 * G, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        // Pieces of 1, 2 and 3 granules.
        for bytes in [G, 3 * G, 6 * G] {
            region.commit(bytes).unwrap();
        }
        assert_eq!(region.shrink_to(6 * G).unwrap(), 0, "nothing lies beyond");
        // The 3-granule piece starts at 3 G, inside the first 4 G: it stays whole.
        assert_eq!(region.shrink_to(4 * G).unwrap(), 0);
        assert_eq!(region.shrink_to(2 * G).unwrap(), 3 * G);
        assert_eq!(region.committed(), 3 * G);
        assert_eq!(alloc.stats().mapped_bytes, 3 * G);
        assert_eq!(alloc.stats().tag(Tag::KvCache).current, 3 * G);
        assert_eq!(device.stats().mapped, 3 * G);
        assert_eq!(region.shrink_to(0).unwrap(), 3 * G);
        assert_eq!((region.committed(), device.stats().mapped), (0, 0));
        let base = region.ptr();
        assert_eq!(region.commit(5 * G).unwrap(), 5 * G, "mapped again");
        assert_eq!(region.ptr(), base);
        assert_eq!(alloc.stats().reserved_bytes, 5 * G);
        drop(region);
        assert_eq!(device.stats().used, 0);
    }

    #[test]
    fn a_commit_past_the_memory_limit_is_refused_and_keeps_what_was_mapped() {
        let device = Arc::new(SimDevice::discrete(64 * G));
        let config = AllocatorConfig {
            read_env: false,
            memory_limit: Some(LimitSpec::Bytes(16 * G)),
            ..Default::default()
        };
        let alloc = Allocator::new(device.clone(), config).unwrap();
        // A request of two pieces takes a 20 MiB segment of the pools (ten pieces).
        let other = alloc.alloc(2 * G, StreamId::DEFAULT, Tag::Weights).unwrap();
        assert_eq!(alloc.stats().reserved_bytes, 10 * G);
        let mut region = alloc
            .reserve_growable(16 * G, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        region.commit(3 * G).unwrap();
        let err = region.commit(8 * G).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{text}");
        assert!(
            text.contains("memory limit"),
            "the report names the cause: {text}"
        );
        assert_eq!(region.committed(), 3 * G);
        assert_eq!(alloc.stats().tag(Tag::KvCache).current, 3 * G);
        // The pools' idle segment is released for the region once the weights go.
        drop(other);
        assert_eq!(region.commit(8 * G).unwrap(), 5 * G);
        assert_eq!(alloc.stats().reserved_bytes, 8 * G);
    }

    #[test]
    fn device_out_of_memory_on_a_commit_is_an_error_not_a_panic() {
        let device = Arc::new(SimDevice::discrete(4 * G));
        let alloc = allocator(&device);
        let mut region = alloc
            .reserve_growable(8 * G, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        region.commit(4 * G).unwrap();
        assert!(matches!(
            region.commit(5 * G),
            Err(AllocError::OutOfMemory(_))
        ));
        assert_eq!(region.committed(), 4 * G);
    }

    #[test]
    fn without_mapping_the_region_is_taken_whole_at_once() {
        let device = Arc::new(SimDevice::new(SimConfig {
            map_granularity: None,
            ..SimConfig::discrete(64 * G)
        }));
        let alloc = allocator(&device);
        let mut region = alloc
            .reserve_growable(3 * G, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        assert!(!region.grows());
        assert!(region.committed() >= 3 * G);
        assert_eq!(region.commit(3 * G).unwrap(), 0);
        assert_eq!(alloc.stats().tag(Tag::KvCache).current, region.committed());
        assert_eq!(alloc.stats().mapped_bytes, 0);
        drop(region);
        assert_eq!(alloc.stats().tag(Tag::KvCache).current, 0);
    }
}

//! Errors returned by the allocator.

use crate::device::{DeviceError, StreamId};
use crate::limits::{InvalidLimit, LimitParseError};
use crate::oom::{fmt_bytes, OomReport};

/// Everything that can go wrong when using the allocator.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The request could not be satisfied even after flushing the cache and waiting on pending
    /// events.
    #[error("out of memory: {0}")]
    OutOfMemory(Box<OomReport>),
    /// A zero-byte allocation was requested.
    #[error("zero-byte allocation requested; ask for at least one byte")]
    ZeroSize,
    /// The request is larger than any device could hold.
    #[error("allocation of {0} bytes is too large to represent")]
    TooLarge(u64),
    /// `raw_free` or `raw_record_stream` got an address the allocator did not hand out via
    /// `raw_alloc`, or one already freed.
    #[error("address {0:#x} is not a live raw allocation of this allocator (double free or foreign pointer)")]
    UnknownPointer(u64),
    /// A limit could not be parsed.
    #[error(transparent)]
    Limit(#[from] LimitParseError),
    /// One of the crate's variables ([`crate::knobs`]) holds a value it does not accept.
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    /// A limit given through the API is out of range.
    #[error(transparent)]
    InvalidLimit(#[from] InvalidLimit),
    /// The operation would free device memory or wait on events while a graph capture is
    /// active, which the driver forbids (it would invalidate the capture).
    #[error(
        "{operation} is not allowed while a graph capture is active (it would free device memory \
         or wait on events, which invalidates the capture); end the capture first"
    )]
    CaptureActive {
        /// The refused operation.
        operation: &'static str,
    },
    /// A new memory limit is below what is already reserved and cannot be released.
    #[error(
        "memory limit {} is below the {} already reserved ({} active); free allocations or \
         clear graph pools first, then set the limit again",
        fmt_bytes(*limit),
        fmt_bytes(*reserved),
        fmt_bytes(*active)
    )]
    LimitBelowReserved {
        /// The rejected limit.
        limit: u64,
        /// Bytes reserved after releasing all idle segments.
        reserved: u64,
        /// Bytes active.
        active: u64,
    },
    /// A capture was started on a stream that is already capturing.
    #[error("stream {0:?} is already capturing; end that capture first")]
    AlreadyCapturing(StreamId),
    /// A decode arena ran out of room.
    #[error(
        "decode arena exhausted: {requested} bytes requested with {used} of {capacity} used; \
         create the arena with at least its high-water mark ({high_water} bytes)"
    )]
    ArenaExhausted {
        /// Bytes requested.
        requested: u64,
        /// Bytes already used this step.
        used: u64,
        /// Arena size.
        capacity: u64,
        /// Highest demand seen, including this request.
        high_water: u64,
    },
    /// A growable region was asked to back more than it was made for.
    #[error(
        "a growable region of {} was asked to back {}; make the region larger",
        fmt_bytes(*capacity),
        fmt_bytes(*requested)
    )]
    RegionExceeded {
        /// Bytes asked for.
        requested: u64,
        /// The region's capacity.
        capacity: u64,
    },
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

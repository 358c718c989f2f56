//! The raw-memory trait the allocator is generic over, and the small value types it uses.
//!
//! A backend only moves raw device memory and events; every caching decision lives above it.
//! Two implementations exist (module `devices`): [`crate::devices::sim::SimDevice`] for tests and what-if studies, and
//! [`crate::devices::hip::HipDevice`] on `hip-ffi`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A stream, as the allocator knows it. Only a backend makes these (`SimDevice::create_stream`,
/// `HipDevice::create_stream`); [`StreamId::DEFAULT`] is the device's null stream. The value is
/// a number unique in the process, not a driver handle, and an id the device does not
/// know is refused with [`DeviceError::UnknownStream`] when it is used to allocate or in
/// `record_stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct StreamId(u64);

impl StreamId {
    /// The default (null) stream.
    pub const DEFAULT: StreamId = StreamId(0);

    /// A new id, unique in the process, so that an id from one device is never mistaken for a
    /// stream of another. Made by this crate's devices only.
    pub(crate) fn fresh() -> StreamId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        StreamId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind the id, for logs and reports.
    pub fn value(self) -> u64 {
        self.0
    }
}

/// An event recorded on a stream, identified by an opaque value chosen by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// Memory facts the allocator derives its default limits from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryInfo {
    /// Bytes the device reports as free now.
    pub free: u64,
    /// Bytes the device reports in total (on UMA devices: the carve-out the driver reports).
    pub total: u64,
    /// Present on integrated (UMA) devices, whose memory is shared with the host.
    pub uma: Option<UmaInfo>,
}

/// Memory layout of an integrated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct UmaInfo {
    /// Dedicated carve-out ("VRAM" set aside by firmware).
    pub carve_out: u64,
    /// GTT: host pages the GPU may map, taken from system RAM on demand.
    pub gtt: u64,
    /// System RAM visible to the operating system (excludes the carve-out).
    pub host_ram: u64,
}

/// A failure reported by a backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device could not provide the requested bytes.
    #[error("device out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// Size of the failed request.
        bytes: u64,
    },
    /// A stream id this device did not hand out, or one it cannot record events on.
    #[error(
        "stream {stream:?} is not usable on this device for {purpose}: {reason}; use a stream id \
         from the backend's create_stream"
    )]
    UnknownStream {
        /// The refused id.
        stream: StreamId,
        /// What it was to be used for ("allocation", "record_stream").
        purpose: &'static str,
        /// Why the device refuses it.
        reason: String,
    },
    /// Any other driver error, with the driver's words.
    #[error("device error in {call}: {message}")]
    Driver {
        /// The driver call that failed.
        call: &'static str,
        /// The driver's description.
        message: String,
    },
}

/// Raw device memory, events and memory facts: everything the caching allocator needs from a
/// device. Implementations must be cheap to call from any thread.
pub trait RawDevice: Send + Sync + 'static {
    /// A short human-readable name for reports.
    fn name(&self) -> String;

    /// Allocates `bytes` of device memory and returns its address.
    fn malloc(&self, bytes: u64) -> Result<u64, DeviceError>;

    /// Returns memory obtained from [`RawDevice::malloc`].
    ///
    /// # Safety
    /// `ptr` must come from `malloc` on this device, must not have been freed already, and no
    /// queued or running device work may still access it.
    unsafe fn free(&self, ptr: u64) -> Result<(), DeviceError>;

    /// Whether `stream` is a stream of this device that memory may be allocated on. Called when
    /// a stream first needs memory from the device, and before a capture starts on it.
    fn check_stream(&self, stream: StreamId) -> Result<(), DeviceError>;

    /// Whether events can be recorded on `stream` (needed for `record_stream`). By default the
    /// same streams as [`RawDevice::check_stream`].
    fn check_event_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.check_stream(stream)
    }

    /// Records an event on `stream` that completes when all work queued there so far is done.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError>;

    /// Whether a recorded event has completed; does not block.
    fn event_complete(&self, event: EventId) -> Result<bool, DeviceError>;

    /// Blocks until a recorded event has completed.
    fn event_wait(&self, event: EventId) -> Result<(), DeviceError>;

    /// Releases an event. Called exactly once per recorded event.
    fn destroy_event(&self, event: EventId);

    /// Current memory facts.
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError>;

    /// The size memory is mapped in, where this device can back a reserved address range
    /// piece by piece (virtual memory management); `None` where it cannot, and then
    /// [`crate::Allocator::reserve_growable`] takes the whole region at once.
    fn map_granularity(&self) -> Option<u64> {
        None
    }

    /// Reserves `bytes` (a multiple of the granularity) of address space, backed by nothing.
    fn reserve_addresses(&self, bytes: u64) -> Result<u64, DeviceError> {
        Err(no_mapping("reserve_addresses", bytes))
    }

    /// Returns a reservation.
    ///
    /// # Safety
    /// `[addr, addr + bytes)` is a whole range from `reserve_addresses`, nothing is mapped in
    /// it, and nothing uses it afterwards.
    unsafe fn free_addresses(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        let _ = addr;
        Err(no_mapping("free_addresses", bytes))
    }

    /// Backs `[addr, addr + bytes)` (inside a reservation, a multiple of the granularity) with
    /// new device memory, readable and writable by the device; returns the handle that
    /// [`RawDevice::unmap`] takes. Running out of memory is [`DeviceError::OutOfMemory`].
    ///
    /// # Safety
    /// The range lies inside one reservation of this device and nothing is mapped there.
    unsafe fn map(&self, addr: u64, bytes: u64) -> Result<u64, DeviceError> {
        let _ = addr;
        Err(no_mapping("map", bytes))
    }

    /// Unmaps what one [`RawDevice::map`] mapped and returns its memory.
    ///
    /// # Safety
    /// `addr`, `bytes` and `handle` are exactly one `map`'s, unmapped once, and no queued or
    /// later work touches the range.
    unsafe fn unmap(&self, addr: u64, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        let _ = (addr, handle);
        Err(no_mapping("unmap", bytes))
    }
}

/// The error of a mapping call on a device that cannot map memory piece by piece.
fn no_mapping(call: &'static str, bytes: u64) -> DeviceError {
    DeviceError::Driver {
        call,
        message: format!(
            "this device cannot map memory into reserved address ranges ({bytes} bytes asked)"
        ),
    }
}

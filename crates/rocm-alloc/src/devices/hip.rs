//! The HIP device, on `hip-ffi` (on NVIDIA machines `hip-ffi` serves the same calls through
//! CUDA).
//!
//! Streams are identified to the allocator by [`StreamId`]s this backend hands out when a
//! stream is created through it ([`HipDevice::create_stream`]) or registered with it
//! ([`HipDevice::register_stream`]), because recording an event needs the stream object; any
//! other id is refused. [`StreamId::DEFAULT`] (the null stream) can be allocated on but not
//! recorded on: hip-ffi's safe layer has no handle for it, and the old fallback (synchronizing
//! the whole device) is illegal while any stream captures a graph. `record_stream` with the
//! null stream is therefore an error; use a created stream for cross-stream work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hip_ffi::{Device, DevicePtr, Event, HipError, RawHandle, Stream};

use crate::device::{DeviceError, EventId, MemoryInfo, RawDevice, StreamId, UmaInfo};

#[derive(Default)]
struct Registry {
    streams: HashMap<StreamId, Arc<Stream>>,
    events: HashMap<u64, Event>,
    spare_events: Vec<Event>,
    next_event: u64,
}

/// A HIP device as a [`RawDevice`].
pub struct HipDevice {
    device: Device,
    name: String,
    registry: Mutex<Registry>,
}

fn driver(call: &'static str, e: HipError) -> DeviceError {
    DeviceError::Driver {
        call,
        message: e.to_string(),
    }
}

impl HipDevice {
    /// Wraps a device.
    pub fn new(device: Device) -> HipDevice {
        let name = device
            .name()
            .unwrap_or_else(|_| format!("device {}", device.ordinal()));
        HipDevice {
            device,
            name,
            registry: Mutex::new(Registry {
                next_event: 1,
                ..Default::default()
            }),
        }
    }

    /// The first device of the detected platform, or the reason there is none.
    pub fn first() -> Result<HipDevice, String> {
        hip_ffi::Platform::default_device().map(HipDevice::new)
    }

    /// The wrapped device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates a stream the allocator can record events on, and its id. The stream is kept
    /// alive by this device as long as it lives; launch work on the returned handle.
    pub fn create_stream(&self) -> Result<(StreamId, Arc<Stream>), DeviceError> {
        let stream = Arc::new(Stream::new(&self.device).map_err(|e| driver("hipStreamCreate", e))?);
        let id = self.register_stream(stream.clone())?;
        Ok((id, stream))
    }

    /// Gives the allocator an id for a stream created elsewhere (it must belong to this
    /// device). Registering the same stream twice gives two ids for one stream, which is
    /// harmless but splits its cache in two.
    pub fn register_stream(&self, stream: Arc<Stream>) -> Result<StreamId, DeviceError> {
        if stream.device().ordinal() != self.device.ordinal() {
            return Err(DeviceError::Driver {
                call: "register_stream",
                message: format!(
                    "the stream belongs to device {}, this allocator's device is {}",
                    stream.device().ordinal(),
                    self.device.ordinal()
                ),
            });
        }
        let id = StreamId::fresh();
        self.lock().streams.insert(id, stream);
        Ok(id)
    }

    /// The stream behind an id from [`HipDevice::create_stream`] or
    /// [`HipDevice::register_stream`].
    pub fn stream(&self, id: StreamId) -> Option<Arc<Stream>> {
        self.lock().streams.get(&id).cloned()
    }
}

fn unknown_stream(stream: StreamId, purpose: &'static str) -> DeviceError {
    DeviceError::UnknownStream {
        stream,
        purpose,
        reason: "HipDevice::create_stream or register_stream did not hand it out".into(),
    }
}

/// Host RAM from `/proc/meminfo` (`MemTotal`), in bytes.
fn host_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl RawDevice for HipDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn malloc(&self, bytes: u64) -> Result<u64, DeviceError> {
        let size = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory { bytes })?;
        match self.device.malloc_raw(size) {
            Ok(p) => Ok(p.0),
            Err(e) if e.is_out_of_memory() => Err(DeviceError::OutOfMemory { bytes }),
            Err(e) => Err(driver("hipMalloc", e)),
        }
    }

    unsafe fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees `ptr` came from `malloc` here, is freed once and is no
        // longer used by device work; that is `free_raw`'s contract.
        unsafe { self.device.free_raw(DevicePtr(ptr)) }.map_err(|e| driver("hipFree", e))
    }

    fn map_granularity(&self) -> Option<u64> {
        // A query that fails reads as "cannot": the region is then taken whole, which is
        // what the caller does on devices without virtual memory management anyway.
        self.device.map_granularity().ok().flatten()
    }

    fn reserve_addresses(&self, bytes: u64) -> Result<u64, DeviceError> {
        let size = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory { bytes })?;
        match self.device.reserve_address_raw(size) {
            Ok(p) => Ok(p.0),
            Err(e) if e.is_out_of_memory() => Err(DeviceError::OutOfMemory { bytes }),
            Err(e) => Err(driver("hipMemAddressReserve", e)),
        }
    }

    unsafe fn free_addresses(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract (a whole reservation, unmapped, unused); the size fit a
        // usize when it was reserved.
        unsafe {
            self.device
                .free_address_raw(DevicePtr(addr), bytes as usize)
        }
        .map_err(|e| driver("hipMemAddressFree", e))
    }

    unsafe fn map(&self, addr: u64, bytes: u64) -> Result<u64, DeviceError> {
        let size = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory { bytes })?;
        // SAFETY: forwarded contract (inside one reservation, nothing mapped there).
        match unsafe { self.device.map_new_raw(DevicePtr(addr), size) } {
            Ok(handle) => Ok(handle.value() as u64),
            Err(e) if e.is_out_of_memory() => Err(DeviceError::OutOfMemory { bytes }),
            Err(e) => Err(driver("hipMemCreate", e)),
        }
    }

    unsafe fn unmap(&self, addr: u64, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        // SAFETY: forwarded contract (exactly one `map`'s range and handle, unused).
        unsafe {
            self.device.unmap_raw(
                DevicePtr(addr),
                bytes as usize,
                RawHandle::from_value(handle as usize),
            )
        }
        .map_err(|e| driver("hipMemUnmap", e))
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        if stream == StreamId::DEFAULT || self.lock().streams.contains_key(&stream) {
            return Ok(());
        }
        Err(unknown_stream(stream, "allocation"))
    }

    fn check_event_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        if stream == StreamId::DEFAULT {
            return Err(DeviceError::UnknownStream {
                stream,
                purpose: "record_stream",
                reason: "the HIP backend cannot record events on the null stream (hip-ffi has \
                         no handle for it, and synchronizing the device instead would break \
                         graph captures)"
                    .into(),
            });
        }
        if self.lock().streams.contains_key(&stream) {
            return Ok(());
        }
        Err(unknown_stream(stream, "record_stream"))
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        // Never synchronizes: the null stream is refused (see `check_event_stream`).
        self.check_event_stream(stream)?;
        let mut r = self.lock();
        let s = r
            .streams
            .get(&stream)
            .cloned()
            .ok_or_else(|| unknown_stream(stream, "record_stream"))?;
        let event = match r.spare_events.pop() {
            Some(e) => e,
            None => {
                Event::new_without_timing(&self.device).map_err(|e| driver("hipEventCreate", e))?
            }
        };
        event.record(&s).map_err(|e| driver("hipEventRecord", e))?;
        let id = r.next_event;
        r.next_event += 1;
        r.events.insert(id, event);
        Ok(EventId(id))
    }

    fn event_complete(&self, event: EventId) -> Result<bool, DeviceError> {
        let r = self.lock();
        let e = r.events.get(&event.0).ok_or_else(|| DeviceError::Driver {
            call: "hipEventQuery",
            message: format!("unknown event {}", event.0),
        })?;
        e.query().map_err(|e| driver("hipEventQuery", e))
    }

    fn event_wait(&self, event: EventId) -> Result<(), DeviceError> {
        // Wait outside the registry lock: take the event out, wait, put it back.
        let e = self
            .lock()
            .events
            .remove(&event.0)
            .ok_or_else(|| DeviceError::Driver {
                call: "hipEventSynchronize",
                message: format!("unknown event {}", event.0),
            })?;
        let result = e
            .synchronize()
            .map_err(|e| driver("hipEventSynchronize", e));
        self.lock().events.insert(event.0, e);
        result
    }

    fn destroy_event(&self, event: EventId) {
        let mut r = self.lock();
        if let Some(e) = r.events.remove(&event.0) {
            // Completed events are recycled: creating one costs a driver call.
            r.spare_events.push(e);
        }
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let info = self
            .device
            .mem_get_info()
            .map_err(|e| driver("hipMemGetInfo", e))?;
        let integrated = self
            .device
            .is_integrated()
            .map_err(|e| driver("hipDeviceGetAttribute", e))?;
        let uma = if integrated {
            let host = host_ram().unwrap_or(0);
            // amdgpu's default GTT size is half of system RAM when sysfs does not say.
            let gtt = info.gtt.map_or(host / 2, |g| g.total);
            Some(UmaInfo {
                carve_out: info.total,
                gtt,
                host_ram: host,
            })
        } else {
            None
        };
        Ok(MemoryInfo {
            free: info.free,
            total: info.total,
            uma,
        })
    }
}

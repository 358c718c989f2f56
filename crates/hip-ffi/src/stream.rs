//! Streams and events.

use crate::device::{Device, DevicePtr};
use crate::device_copy::DeviceCopy;
use crate::error::Result;
use crate::ffi::{Addr, CopyKind, RawHandle};
use crate::loaded_module::LoadedModule;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An asynchronous work queue on one device, created non-blocking (it does not synchronise with
/// the legacy default stream). The synchronous memsets and copies in [`crate::memory`] have
/// finished when they return, so work queued here afterwards sees them; they are not ordered
/// after work already queued here, so synchronise the stream before reading or overwriting
/// what that work uses. Destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    device: Device,
    handle: RawHandle,
    /// Set between a successful `begin_capture` and `end_capture` through this handle.
    capturing: AtomicBool,
    /// Modules of kernels launched while capturing; handed to the graph so they stay loaded.
    captured_modules: Mutex<Vec<Arc<LoadedModule>>>,
    /// Kernel launches through [`crate::LaunchBuilder`] since the capture began: the graph's
    /// kernel nodes, which size its device memory.
    captured_launches: AtomicU64,
}

impl Stream {
    /// Creates a non-blocking stream on `device`.
    pub fn new(device: &Device) -> Result<Stream> {
        let handle = device.api.stream_create(device.ordinal)?;
        Ok(Stream {
            device: *device,
            handle,
            capturing: AtomicBool::new(false),
            captured_modules: Mutex::new(Vec::new()),
            captured_launches: AtomicU64::new(0),
        })
    }

    /// `true` while the stream is capturing into a graph (also when the capture was
    /// invalidated by an illegal call and only `end_capture` remains), whoever began it
    /// (`hipStreamIsCapturing` / `cuStreamIsCapturing`).
    pub fn is_capturing(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .stream_is_capturing(self.device.ordinal, self.handle)
        }
    }

    pub(crate) fn set_capturing(&self, capturing: bool) {
        if capturing {
            self.captured_launches.store(0, Ordering::Relaxed);
        }
        self.capturing.store(capturing, Ordering::Release);
    }

    /// Records that a kernel of `module` was launched; kept only while capturing (one relaxed
    /// load per launch otherwise).
    pub(crate) fn keep_alive_if_capturing(&self, module: &Arc<LoadedModule>) {
        if !self.capturing.load(Ordering::Acquire) {
            return;
        }
        self.captured_launches.fetch_add(1, Ordering::Relaxed);
        let mut kept = self
            .captured_modules
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !kept.iter().any(|m| Arc::ptr_eq(m, module)) {
            kept.push(Arc::clone(module));
        }
    }

    /// Kernel launches recorded by the capture that is running or just ended.
    pub(crate) fn captured_launches(&self) -> u64 {
        self.captured_launches.load(Ordering::Relaxed)
    }

    /// The modules recorded during the capture that just ended.
    pub(crate) fn take_captured_modules(&self) -> Vec<Arc<LoadedModule>> {
        std::mem::take(
            &mut *self
                .captured_modules
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle, for identification (e.g. per-stream pools) and FFI.
    pub fn raw(&self) -> RawHandle {
        self.handle
    }

    /// Blocks until all work queued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .stream_synchronize(self.device.ordinal, self.handle)
        }
    }

    /// `true` when all queued work has finished; never blocks.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .stream_query(self.device.ordinal, self.handle)
        }
    }

    /// Makes later work on this stream wait until `event` has completed.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live while their owners are.
        unsafe {
            self.device
                .api
                .stream_wait_event(self.device.ordinal, self.handle, event.handle)
        }
    }

    /// Stream-ordered allocation (`hipMallocAsync`): the memory is usable by work queued on
    /// this stream after this call. Check [`Device::supports_async_alloc`] first.
    pub fn malloc_async_raw(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(crate::error::HipError::host(
                "hipMallocAsync",
                crate::error::ErrorKind::InvalidArgument,
                "zero-byte allocation requested",
            ));
        }
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .malloc_async(self.device.ordinal, bytes, self.handle)
        }
        .map(DevicePtr)
    }

    /// Stream-ordered free (`hipFreeAsync`).
    ///
    /// # Safety
    /// `ptr` came from [`Stream::malloc_async_raw`] (on any stream of this device), is freed
    /// once, and work on other streams that still uses it is ordered before this point.
    pub unsafe fn free_async_raw(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: forwarded contract; the handle is live.
        unsafe {
            self.device
                .api
                .free_async(self.device.ordinal, ptr.0, self.handle)
        }
    }
}

impl Stream {
    /// Queues a copy of `src` to the device address `dst` (`hipMemcpyHtoDAsync`), for memory
    /// this crate did not allocate (a caching allocator's blocks).
    ///
    /// # Safety
    /// `[dst, dst + size_of_val(src))` is device memory of this stream's device that stays
    /// allocated until the stream reaches the copy, and `src` stays alive and unchanged until
    /// then (synchronize the stream, or an event recorded after the copy, before reusing it).
    pub unsafe fn copy_from_host_raw<T: DeviceCopy>(
        &self,
        dst: DevicePtr,
        src: &[T],
    ) -> Result<()> {
        // SAFETY: forwarded contract; the handle is live.
        unsafe {
            self.device.api.memcpy(
                self.device.ordinal,
                dst.0,
                src.as_ptr() as Addr,
                std::mem::size_of_val(src),
                CopyKind::HostToDevice,
                self.handle,
            )
        }
    }

    /// Queues a copy from the device address `src` into `dst` (`hipMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// `[src, src + size_of_val(dst))` is device memory of this stream's device that stays
    /// allocated until the stream reaches the copy, and `dst` stays alive and is neither read
    /// nor written until the stream has passed the copy.
    pub unsafe fn copy_to_host_raw<T: DeviceCopy>(
        &self,
        dst: &mut [T],
        src: DevicePtr,
    ) -> Result<()> {
        // SAFETY: forwarded contract; the handle is live.
        unsafe {
            self.device.api.memcpy(
                self.device.ordinal,
                dst.as_mut_ptr() as Addr,
                src.0,
                std::mem::size_of_val(dst),
                CopyKind::DeviceToHost,
                self.handle,
            )
        }
    }
}

/// The stream of each device that the synchronous memsets and copies run on (each one queued
/// there, then waited for). Created on first use, kept for the process's lifetime.
pub(crate) fn blocking_ops_stream(device: &Device) -> Result<RawHandle> {
    static STREAMS: Mutex<Vec<(i32, RawHandle)>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, handle)) = streams
        .iter()
        .find(|(ordinal, _)| *ordinal == device.ordinal)
    {
        return Ok(handle);
    }
    let handle = device.api.stream_create(device.ordinal)?;
    streams.push((device.ordinal, handle));
    Ok(handle)
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once; the runtime lets queued work finish.
        let result = unsafe {
            self.device
                .api
                .stream_destroy(self.device.ordinal, self.handle)
        };
        if let Err(e) = result {
            tracing::warn!("destroying a stream failed: {e}");
        }
    }
}

/// A marker in a stream: record it, then query, wait for, or time it. Destroyed on drop.
#[derive(Debug)]
pub struct Event {
    device: Device,
    handle: RawHandle,
    timing: bool,
}

impl Event {
    /// An event that can be used for timing.
    pub fn new(device: &Device) -> Result<Event> {
        Self::create(device, true)
    }

    /// An event without timing, cheaper to record and query (for synchronisation only).
    pub fn new_without_timing(device: &Device) -> Result<Event> {
        Self::create(device, false)
    }

    fn create(device: &Device, timing: bool) -> Result<Event> {
        let handle = device.api.event_create(device.ordinal, timing)?;
        Ok(Event {
            device: *device,
            handle,
            timing,
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> RawHandle {
        self.handle
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live while their owners are.
        unsafe {
            self.device
                .api
                .event_record(self.device.ordinal, self.handle, stream.handle)
        }
    }

    /// `true` once the work before the recorded point has finished (and for a never-recorded
    /// event); never blocks.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .event_query(self.device.ordinal, self.handle)
        }
    }

    /// Blocks until the recorded point is reached.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self` is.
        unsafe {
            self.device
                .api
                .event_synchronize(self.device.ordinal, self.handle)
        }
    }

    /// Milliseconds from `start` to this event; both must be recorded and complete.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        if !self.timing || !start.timing {
            return Err(crate::error::HipError::host(
                "hipEventElapsedTime",
                crate::error::ErrorKind::InvalidArgument,
                "an event created with new_without_timing cannot be timed; use Event::new",
            ));
        }
        // SAFETY: both handles are live while their owners are.
        unsafe {
            self.device
                .api
                .event_elapsed_ms(self.device.ordinal, start.handle, self.handle)
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        let result = unsafe {
            self.device
                .api
                .event_destroy(self.device.ordinal, self.handle)
        };
        if let Err(e) = result {
            tracing::warn!("destroying an event failed: {e}");
        }
    }
}

//! Device, pinned-host and managed memory with RAII ownership.

use crate::device::{Device, DevicePtr};
pub use crate::device_copy::DeviceCopy;
use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::{Addr, CopyKind, RawHandle};
use crate::stream::Stream;

fn byte_len<T>(slice: &[T]) -> usize {
    std::mem::size_of_val(slice)
}

fn size_mismatch(op: &'static str, wanted: usize, have: usize) -> HipError {
    HipError::host(
        op,
        ErrorKind::InvalidArgument,
        format!("copy of {wanted} bytes does not fit a buffer of {have} bytes"),
    )
}

/// Runs one memset or copy to completion: queued on the device's internal stream, then that
/// stream is waited for. The runtimes' own "synchronous" calls are not enough: `cuMemsetD8` and
/// device-to-device copies return before the device has done them, and work on a non-blocking
/// stream queued right after would race with them. Cost: one stream synchronisation per call
/// (a few microseconds on top of the operation), the same as a blocking call.
fn run_to_completion(device: &Device, queue: impl FnOnce(RawHandle) -> Result<()>) -> Result<()> {
    let stream = crate::stream::blocking_ops_stream(device)?;
    queue(stream)?;
    // SAFETY: the internal stream lives for the process's lifetime.
    unsafe { device.api.stream_synchronize(device.ordinal, stream) }
}

/// Owned device memory. Dropping it frees synchronously (`hipFree`, which also accepts
/// stream-ordered allocations); [`DeviceBuffer::free_async`] frees in stream order instead.
#[derive(Debug)]
pub struct DeviceBuffer {
    device: Device,
    ptr: DevicePtr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` (> 0) of device memory (contents undefined until written).
    pub fn alloc(device: &Device, bytes: usize) -> Result<DeviceBuffer> {
        let ptr = device.malloc_raw(bytes)?;
        Ok(DeviceBuffer {
            device: *device,
            ptr,
            bytes,
        })
    }

    /// Stream-ordered allocation on `stream` (`hipMallocAsync`); usable by work queued on
    /// that stream afterwards. Check [`Device::supports_async_alloc`] first.
    pub fn alloc_async(stream: &Stream, bytes: usize) -> Result<DeviceBuffer> {
        let ptr = stream.malloc_async_raw(bytes)?;
        Ok(DeviceBuffer {
            device: *stream.device(),
            ptr,
            bytes,
        })
    }

    /// Frees in stream order on `stream` (`hipFreeAsync`) instead of synchronously.
    ///
    /// # Safety
    /// Work queued on other streams that still uses this memory must be ordered before this
    /// point on `stream` (e.g. through an event the stream waits on).
    pub unsafe fn free_async(self, stream: &Stream) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: owned pointer, freed once (drop is suppressed); ordering is the caller's.
        unsafe { stream.free_async_raw(this.ptr) }
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The owning device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Sets every byte to `value`; done on the device when this returns (so work queued on
    /// any stream afterwards sees it). Not ordered after work already queued on other streams.
    pub fn memset(&mut self, value: u8) -> Result<()> {
        run_to_completion(&self.device, |stream| {
            // SAFETY: the whole range is owned device memory; the stream is live.
            unsafe {
                self.device
                    .api
                    .memset(self.device.ordinal, self.ptr.0, value, self.bytes, stream)
            }
        })
    }

    /// Queues a memset on `stream`.
    pub fn memset_async(&mut self, value: u8, stream: &Stream) -> Result<()> {
        // SAFETY: the whole range is owned device memory; the stream is live. Dropping the
        // buffer frees synchronously, which waits for the memset.
        unsafe {
            self.device.api.memset(
                self.device.ordinal,
                self.ptr.0,
                value,
                self.bytes,
                stream.raw(),
            )
        }
    }

    /// Copies `src` to the start of the buffer; done on the device when this returns. Not
    /// ordered after work already queued on other streams.
    pub fn copy_from_host<T: DeviceCopy>(&mut self, src: &[T]) -> Result<()> {
        let n = byte_len(src);
        if n > self.bytes {
            return Err(size_mismatch("hipMemcpyHtoD", n, self.bytes));
        }
        run_to_completion(&self.device, |stream| {
            // SAFETY: `src` is valid for `n` bytes and borrowed until the copy has completed
            // (waited for before returning); the buffer holds at least `n`.
            unsafe {
                self.device.api.memcpy(
                    self.device.ordinal,
                    self.ptr.0,
                    src.as_ptr() as Addr,
                    n,
                    CopyKind::HostToDevice,
                    stream,
                )
            }
        })
    }

    /// Copies the start of the buffer into `dst`; complete when this returns. Not ordered
    /// after work already queued on other streams: synchronise them first.
    pub fn copy_to_host<T: DeviceCopy>(&self, dst: &mut [T]) -> Result<()> {
        let n = byte_len(dst);
        if n > self.bytes {
            return Err(size_mismatch("hipMemcpyDtoH", n, self.bytes));
        }
        run_to_completion(&self.device, |stream| {
            // SAFETY: `dst` is valid for `n` bytes, borrowed until the copy has completed
            // (waited for before returning), and any bit pattern is a valid `T`.
            unsafe {
                self.device.api.memcpy(
                    self.device.ordinal,
                    dst.as_mut_ptr() as Addr,
                    self.ptr.0,
                    n,
                    CopyKind::DeviceToHost,
                    stream,
                )
            }
        })
    }

    /// Reads the whole buffer as `T`s (length = bytes / size of `T`).
    pub fn to_host_vec<T: DeviceCopy>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.bytes / std::mem::size_of::<T>()];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Copies all of `src` to the start of this buffer (device to device); done on the device
    /// when this returns. Not ordered after work already queued on other streams.
    pub fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<()> {
        if src.bytes > self.bytes {
            return Err(size_mismatch("hipMemcpyDtoD", src.bytes, self.bytes));
        }
        run_to_completion(&self.device, |stream| {
            // SAFETY: both ranges are owned device memory of at least `src.bytes`, borrowed
            // until the copy has completed.
            unsafe {
                self.device.api.memcpy(
                    self.device.ordinal,
                    self.ptr.0,
                    src.ptr.0,
                    src.bytes,
                    CopyKind::DeviceToDevice,
                    stream,
                )
            }
        })
    }

    /// Queues a device-to-device copy of all of `src` on `stream`.
    pub fn copy_from_device_async(&mut self, src: &DeviceBuffer, stream: &Stream) -> Result<()> {
        if src.bytes > self.bytes {
            return Err(size_mismatch("hipMemcpyDtoDAsync", src.bytes, self.bytes));
        }
        // SAFETY: both ranges are owned device memory; dropping either frees synchronously,
        // which waits for the copy.
        unsafe {
            self.device.api.memcpy(
                self.device.ordinal,
                self.ptr.0,
                src.ptr.0,
                src.bytes,
                CopyKind::DeviceToDevice,
                stream.raw(),
            )
        }
    }

    /// Queues a host-to-device copy on `stream`.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the stream has reached the copy (synchronise
    /// the stream or an event recorded after it). For true overlap use pinned host memory.
    pub unsafe fn copy_from_host_async<T: DeviceCopy>(
        &mut self,
        src: &[T],
        stream: &Stream,
    ) -> Result<()> {
        let n = byte_len(src);
        if n > self.bytes {
            return Err(size_mismatch("hipMemcpyHtoDAsync", n, self.bytes));
        }
        // SAFETY: sizes checked; the caller keeps `src` alive until the copy has run.
        unsafe {
            self.device.api.memcpy(
                self.device.ordinal,
                self.ptr.0,
                src.as_ptr() as Addr,
                n,
                CopyKind::HostToDevice,
                stream.raw(),
            )
        }
    }

    /// Queues a device-to-host copy on `stream`.
    ///
    /// # Safety
    /// `dst` must stay alive and must not be read or written until the stream has reached the
    /// copy.
    pub unsafe fn copy_to_host_async<T: DeviceCopy>(
        &self,
        dst: &mut [T],
        stream: &Stream,
    ) -> Result<()> {
        let n = byte_len(dst);
        if n > self.bytes {
            return Err(size_mismatch("hipMemcpyDtoHAsync", n, self.bytes));
        }
        // SAFETY: sizes checked; the caller keeps `dst` untouched until the copy has run.
        unsafe {
            self.device.api.memcpy(
                self.device.ordinal,
                dst.as_mut_ptr() as Addr,
                self.ptr.0,
                n,
                CopyKind::DeviceToHost,
                stream.raw(),
            )
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer is owned and freed once; hipFree waits for queued work.
        let result = unsafe { self.device.api.free(self.device.ordinal, self.ptr.0) };
        if let Err(e) = result {
            tracing::warn!("freeing {} bytes of device memory failed: {e}", self.bytes);
        }
    }
}

/// What a failed pinning of `bytes` most likely means and what to do, for the error message.
/// Page-locking fails for two reasons in practice: the process's locked-memory limit
/// (`ulimit -l`, which HIP's allocator and containers with a low `memlock` honour) or too
/// little free host RAM to lock (pinned pages cannot be swapped, so the kernel refuses what it
/// cannot back).
pub fn pinning_failure_advice(bytes: usize) -> String {
    format!(
        "pinning {bytes} bytes ({:.1} MiB) of host memory failed; the likely cause is the \
         locked-memory limit (check `ulimit -l`; in a container, its memlock limit) or too \
         little free host RAM (check `free -m`); fix: raise the limit (`ulimit -l unlimited`, \
         or the container's --ulimit memlock=-1), free host memory, or give the GPU a larger \
         budget so that fewer weights stay in host memory",
        bytes as f64 / (1024.0 * 1024.0)
    )
}

/// Page-locked host memory mapped into the device (`hipHostMalloc` with `hipHostMallocMapped`):
/// kernels read and write it through [`PinnedHostBuffer::device_ptr`]. Zeroed at allocation.
#[derive(Debug)]
pub struct PinnedHostBuffer {
    device: Device,
    host: *mut u8,
    device_ptr: DevicePtr,
    bytes: usize,
}

// SAFETY: the buffer owns its allocation exclusively; the pointer is not tied to a thread.
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: shared access only hands out `&[T]`.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// Allocates `bytes` (> 0) of mapped, pinned host memory, zero-filled.
    pub fn alloc(device: &Device, bytes: usize) -> Result<PinnedHostBuffer> {
        let buffer = Self::alloc_uninit(device, bytes)?;
        // SAFETY: `host` points to `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(buffer.host, 0, bytes) };
        Ok(buffer)
    }

    /// Allocates mapped, pinned host memory holding a copy of `src` (non-empty). The bytes are
    /// written once, by the copy: a weight of many GiB is not zero-filled first.
    pub fn from_bytes(device: &Device, src: &[u8]) -> Result<PinnedHostBuffer> {
        let buffer = Self::alloc_uninit(device, src.len())?;
        // SAFETY: `host` points to `src.len()` writable bytes just allocated, which no one
        // else can see yet; `src` is a distinct borrowed slice of the same length.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buffer.host, src.len()) };
        Ok(buffer)
    }

    /// The allocation, contents undefined: callers initialise every byte before handing the
    /// buffer out (the slice views rely on it).
    fn alloc_uninit(device: &Device, bytes: usize) -> Result<PinnedHostBuffer> {
        if bytes == 0 {
            return Err(HipError::host(
                "hipHostMalloc",
                ErrorKind::InvalidArgument,
                "zero-byte allocation requested",
            ));
        }
        let (host, device_ptr) = device
            .api
            .host_alloc_mapped(device.ordinal, bytes)
            .map_err(|e| match e.kind {
                // The advice is about limits and free memory; other failures (a call made
                // while a stream captures, a bad context) say what they are themselves.
                ErrorKind::OutOfMemory | ErrorKind::Other => {
                    e.with_detail(pinning_failure_advice(bytes))
                }
                _ => e,
            })?;
        Ok(PinnedHostBuffer {
            device: *device,
            host,
            device_ptr: DevicePtr(device_ptr),
            bytes,
        })
    }

    /// The address kernels use.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The contents as `T`s. Do not rely on values a kernel may still be writing: synchronise
    /// first.
    pub fn as_slice<T: DeviceCopy>(&self) -> &[T] {
        // SAFETY: page-aligned (runtime allocation), initialised (zeroed at allocation), any
        // bit pattern is a valid `T`, and the length stays inside the allocation.
        unsafe {
            std::slice::from_raw_parts(self.host.cast(), self.bytes / std::mem::size_of::<T>())
        }
    }

    /// Mutable contents as `T`s.
    pub fn as_mut_slice<T: DeviceCopy>(&mut self) -> &mut [T] {
        // SAFETY: as for `as_slice`, plus `&mut self` gives exclusive host access.
        unsafe {
            std::slice::from_raw_parts_mut(self.host.cast(), self.bytes / std::mem::size_of::<T>())
        }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by hipHostMalloc and freed once.
        let result = unsafe { self.device.api.host_free(self.device.ordinal, self.host) };
        if let Err(e) = result {
            tracing::warn!("freeing {} bytes of pinned memory failed: {e}", self.bytes);
        }
    }
}

/// Existing host memory page-locked and mapped into the device (`hipHostRegister`) for as long
/// as this value lives; it holds the exclusive borrow of the memory meanwhile.
#[derive(Debug)]
pub struct HostRegistration<'a, T: DeviceCopy> {
    device: Device,
    memory: &'a mut [T],
    device_ptr: DevicePtr,
}

impl<'a, T: DeviceCopy> HostRegistration<'a, T> {
    /// Registers `memory` (non-empty) with the device.
    pub fn new(device: &Device, memory: &'a mut [T]) -> Result<HostRegistration<'a, T>> {
        let bytes = byte_len(memory);
        if bytes == 0 {
            return Err(HipError::host(
                "hipHostRegister",
                ErrorKind::InvalidArgument,
                "cannot register an empty slice",
            ));
        }
        // SAFETY: the slice is valid for `bytes` and stays borrowed until unregistered in drop.
        let device_ptr = unsafe {
            device
                .api
                .host_register(device.ordinal, memory.as_mut_ptr().cast(), bytes)
        }?;
        Ok(HostRegistration {
            device: *device,
            memory,
            device_ptr: DevicePtr(device_ptr),
        })
    }

    /// The address kernels use.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }

    /// Host view (synchronise device work that writes it first).
    pub fn as_slice(&self) -> &[T] {
        self.memory
    }

    /// Mutable host view.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.memory
    }
}

impl<T: DeviceCopy> Drop for HostRegistration<'_, T> {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, unregistered once.
        let result = unsafe {
            self.device
                .api
                .host_unregister(self.device.ordinal, self.memory.as_mut_ptr().cast())
        };
        if let Err(e) = result {
            tracing::warn!("unregistering host memory failed: {e}");
        }
    }
}

/// Managed (unified) memory, reachable from host and device at one address. Zeroed at
/// allocation. Only where [`Device::supports_managed_memory`] says so; otherwise allocation
/// returns an [`ErrorKind::NotSupported`] error.
#[derive(Debug)]
pub struct ManagedBuffer {
    device: Device,
    ptr: DevicePtr,
    bytes: usize,
}

// SAFETY: the buffer owns its allocation exclusively.
unsafe impl Send for ManagedBuffer {}
// SAFETY: shared access hands out only `&[T]` behind `unsafe`.
unsafe impl Sync for ManagedBuffer {}

impl ManagedBuffer {
    /// Allocates `bytes` (> 0) of managed memory. Refuses requests larger than the device's
    /// free memory: oversubscribing managed memory can hang some GPUs.
    pub fn alloc(device: &Device, bytes: usize) -> Result<ManagedBuffer> {
        if bytes == 0 {
            return Err(HipError::host(
                "hipMallocManaged",
                ErrorKind::InvalidArgument,
                "zero-byte allocation requested",
            ));
        }
        if !device.supports_managed_memory()? {
            return Err(HipError::host(
                "hipMallocManaged",
                ErrorKind::NotSupported,
                "this device does not support managed memory; use DeviceBuffer or \
                 PinnedHostBuffer",
            ));
        }
        let free = device.mem_get_info()?.free;
        if bytes as u64 > free {
            return Err(HipError::host(
                "hipMallocManaged",
                ErrorKind::OutOfMemory,
                format!("{bytes} bytes requested but only {free} free on the device"),
            ));
        }
        let ptr = device.api.malloc_managed(device.ordinal, bytes)?;
        let buffer = ManagedBuffer {
            device: *device,
            ptr: DevicePtr(ptr),
            bytes,
        };
        run_to_completion(device, |stream| {
            // SAFETY: the whole range was just allocated; the stream is live.
            unsafe {
                device
                    .api
                    .memset(device.ordinal, buffer.ptr.0, 0, bytes, stream)
            }
        })?;
        Ok(buffer)
    }

    /// The single address valid on host and device.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// Host view of the contents.
    ///
    /// # Safety
    /// No device work that writes this memory may be in flight (synchronise first), and on
    /// devices without concurrent managed access no device work may touch it at all.
    pub unsafe fn host_slice_mut<T: DeviceCopy>(&mut self) -> &mut [T] {
        // SAFETY: initialised (zeroed at allocation), suitably aligned (runtime allocation),
        // any bit pattern is a valid `T`; the caller guarantees no concurrent device access.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.0 as usize as *mut T,
                self.bytes / std::mem::size_of::<T>(),
            )
        }
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by hipMallocManaged and freed once.
        let result = unsafe { self.device.api.free(self.device.ordinal, self.ptr.0) };
        if let Err(e) = result {
            tracing::warn!("freeing {} bytes of managed memory failed: {e}", self.bytes);
        }
    }
}

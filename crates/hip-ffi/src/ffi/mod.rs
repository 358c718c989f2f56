//! The raw layer: every foreign call of the crate lives under this module.
//!
//! [`GpuApi`] is the HIP-shaped interface the safe layer is written against. Two implementations
//! exist: [`hip::HipApi`] (AMD, `libamdhip64` + `libhiprtc` loaded at run time through the bindgen
//! bindings in [`crate::sys`]) and [`cuda::CudaApi`] (NVIDIA, the CUDA driver API and NVRTC through
//! cudarc's `sys` layer, also loaded at run time). Each turns status codes into [`HipError`] in a
//! single `check` function. Methods that take raw pointers or handles are `unsafe`: the caller
//! (the safe layer) guarantees the handles are live and the pointers cover the byte counts.

pub(crate) mod blaslt;
pub(crate) mod cuda;
pub(crate) mod hip;
mod hip_vmm;
mod library_search;
pub(crate) mod nvml;
pub(crate) mod rtc;

use crate::error::{ErrorKind, HipError, Result};
use std::ffi::c_void;

/// An opaque runtime handle (stream, event, module, function, graph, graph exec).
///
/// Stored as an integer so the safe types that own one are `Send`; both runtimes allow their
/// handles to be used from any thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawHandle(pub(crate) usize);

impl RawHandle {
    /// The null handle: the legacy default stream where a stream is expected.
    pub const NULL: RawHandle = RawHandle(0);

    /// The handle as a number, for a caller that keeps it outside this crate's types.
    pub fn value(self) -> usize {
        self.0
    }

    /// A handle from [`RawHandle::value`]. Any value may be made; only the `unsafe` calls that
    /// take a handle rely on it being live.
    pub fn from_value(value: usize) -> Self {
        RawHandle(value)
    }

    pub(crate) fn from_ptr<T>(ptr: *mut T) -> Self {
        RawHandle(ptr as usize)
    }

    pub(crate) fn as_ptr<T>(self) -> *mut T {
        self.0 as *mut T
    }
}

/// The device attributes the safe layer reads, named once for both runtimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attr {
    ComputeCapabilityMajor,
    ComputeCapabilityMinor,
    Integrated,
    WarpSize,
    MultiprocessorCount,
    ManagedMemory,
    PageableMemoryAccess,
    ConcurrentManagedAccess,
    CanMapHostMemory,
    MemoryPoolsSupported,
    PciBusId,
    PciDeviceId,
    PciDomainId,
    MaxThreadsPerBlock,
    MaxSharedMemoryPerBlock,
}

/// Direction of a copy; both runtimes need it spelled out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// Source or destination of a copy: host pointers and device addresses travel as integers.
pub(crate) type Addr = u64;

/// What one kernel takes of the hardware, as the NVIDIA driver reports it
/// ([`crate::Function::resources`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionResources {
    /// Registers per thread.
    pub registers: u32,
    /// Local (spill and stack) memory per thread, in bytes.
    pub local_bytes: u32,
    /// Statically declared shared memory per block, in bytes (dynamic shared memory is the
    /// launch's).
    pub static_shared_bytes: u32,
    /// The largest block the kernel can be launched with, given its registers.
    pub max_threads_per_block: u32,
}

/// The HIP-shaped API both platforms implement. `dev` is the runtime's device ordinal; every
/// method that touches a device makes it current on the calling thread first.
pub(crate) trait GpuApi: Send + Sync + 'static {
    /// Driver/runtime versions as a human string.
    fn version_string(&self) -> String;
    fn device_count(&self) -> Result<i32>;
    fn device_name(&self, dev: i32) -> Result<String>;
    fn attribute(&self, dev: i32, attr: Attr) -> Result<i32>;
    fn total_memory(&self, dev: i32) -> Result<u64>;
    /// `(free, total)` as the runtime reports them.
    fn mem_get_info(&self, dev: i32) -> Result<(u64, u64)>;
    /// Architecture string for the compiler (`gfx1151`, `sm_90`); `None` if it cannot be told.
    fn arch_name(&self, dev: i32) -> Result<Option<String>>;
    fn synchronize_device(&self, dev: i32) -> Result<()>;
    /// Makes `dev` current on the calling thread, for a vendor library that works on the
    /// current device (the GEMM library).
    fn make_current(&self, dev: i32) -> Result<()>;

    fn malloc(&self, dev: i32, bytes: usize) -> Result<Addr>;
    /// # Safety
    /// `ptr` came from `malloc` (or `malloc_managed`) on this device and is not used afterwards.
    unsafe fn free(&self, dev: i32, ptr: Addr) -> Result<()>;
    /// # Safety
    /// `stream` is a live stream of `dev`.
    unsafe fn malloc_async(&self, dev: i32, bytes: usize, stream: RawHandle) -> Result<Addr>;
    /// # Safety
    /// `ptr` came from `malloc_async`, `stream` is live, and no work after this on other streams
    /// uses `ptr` without ordering.
    unsafe fn free_async(&self, dev: i32, ptr: Addr, stream: RawHandle) -> Result<()>;
    fn malloc_managed(&self, dev: i32, bytes: usize) -> Result<Addr>;
    /// Queues a memset on `stream` (stream-ordered; the runtimes' unordered variants are not
    /// offered, see `memory::run_to_completion`).
    /// # Safety
    /// `[ptr, ptr + bytes)` is device memory of `dev` that stays allocated until the stream
    /// reaches the memset; `stream` is live.
    unsafe fn memset(
        &self,
        dev: i32,
        ptr: Addr,
        value: u8,
        bytes: usize,
        stream: RawHandle,
    ) -> Result<()>;
    /// Queues a copy on `stream`.
    /// # Safety
    /// `dst` and `src` are valid for `bytes` on the sides `kind` names and stay valid until the
    /// stream reaches the copy; `stream` is live.
    unsafe fn memcpy(
        &self,
        dev: i32,
        dst: Addr,
        src: Addr,
        bytes: usize,
        kind: CopyKind,
        stream: RawHandle,
    ) -> Result<()>;
    /// Page-locked host memory mapped into the device: `(host pointer, device pointer)`.
    fn host_alloc_mapped(&self, dev: i32, bytes: usize) -> Result<(*mut u8, Addr)>;
    /// # Safety
    /// `ptr` came from `host_alloc_mapped` and is not used afterwards.
    unsafe fn host_free(&self, dev: i32, ptr: *mut u8) -> Result<()>;
    /// Page-locks and maps existing host memory; returns its device pointer.
    /// # Safety
    /// `[ptr, ptr + bytes)` is valid host memory that stays allocated until unregistered.
    unsafe fn host_register(&self, dev: i32, ptr: *mut u8, bytes: usize) -> Result<Addr>;
    /// # Safety
    /// `ptr` was registered with `host_register` and no device work uses it any more.
    unsafe fn host_unregister(&self, dev: i32, ptr: *mut u8) -> Result<()>;

    /// The size physical memory is mapped in, when `dev` can back a reserved address range
    /// with memory piece by piece (virtual memory management); `None` where it cannot.
    fn map_granularity(&self, dev: i32) -> Result<Option<u64>>;
    /// Reserves `bytes` (a multiple of the granularity) of `dev`'s address space, backed by
    /// nothing yet.
    fn address_reserve(&self, dev: i32, bytes: usize) -> Result<Addr>;
    /// # Safety
    /// `[addr, addr + bytes)` is a whole range from `address_reserve` with nothing mapped in it,
    /// and is not used afterwards.
    unsafe fn address_free(&self, dev: i32, addr: Addr, bytes: usize) -> Result<()>;
    /// Creates `bytes` (a multiple of the granularity) of physical memory on `dev`, maps it at
    /// `addr` readable and writable by `dev`, and returns its handle.
    /// # Safety
    /// `[addr, addr + bytes)` lies inside a reservation of `dev` and has nothing mapped.
    unsafe fn map_new(&self, dev: i32, addr: Addr, bytes: usize) -> Result<RawHandle>;
    /// Unmaps `[addr, addr + bytes)` and releases the physical memory `handle` behind it.
    /// # Safety
    /// The range and handle are exactly one `map_new`'s, and no queued or later work uses the
    /// range.
    unsafe fn unmap_release(
        &self,
        dev: i32,
        addr: Addr,
        bytes: usize,
        handle: RawHandle,
    ) -> Result<()>;

    fn stream_create(&self, dev: i32) -> Result<RawHandle>;
    /// # Safety
    /// `stream` is live and not used afterwards.
    unsafe fn stream_destroy(&self, dev: i32, stream: RawHandle) -> Result<()>;
    /// # Safety
    /// `stream` is live (or NULL for the default stream).
    unsafe fn stream_synchronize(&self, dev: i32, stream: RawHandle) -> Result<()>;
    /// `Ok(true)` when all work on the stream is done.
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_query(&self, dev: i32, stream: RawHandle) -> Result<bool>;
    /// # Safety
    /// Both handles are live.
    unsafe fn stream_wait_event(&self, dev: i32, stream: RawHandle, event: RawHandle)
        -> Result<()>;

    fn event_create(&self, dev: i32, timing: bool) -> Result<RawHandle>;
    /// # Safety
    /// `event` is live and not used afterwards.
    unsafe fn event_destroy(&self, dev: i32, event: RawHandle) -> Result<()>;
    /// # Safety
    /// Both handles are live.
    unsafe fn event_record(&self, dev: i32, event: RawHandle, stream: RawHandle) -> Result<()>;
    /// # Safety
    /// `event` is live.
    unsafe fn event_query(&self, dev: i32, event: RawHandle) -> Result<bool>;
    /// # Safety
    /// `event` is live.
    unsafe fn event_synchronize(&self, dev: i32, event: RawHandle) -> Result<()>;
    /// # Safety
    /// Both events are live, created with timing, and recorded.
    unsafe fn event_elapsed_ms(&self, dev: i32, start: RawHandle, end: RawHandle) -> Result<f32>;

    fn module_load(&self, dev: i32, image: &[u8]) -> Result<RawHandle>;
    /// # Safety
    /// `module` is live and none of its functions are used afterwards.
    unsafe fn module_unload(&self, dev: i32, module: RawHandle) -> Result<()>;
    /// # Safety
    /// `module` is live.
    unsafe fn module_function(&self, dev: i32, module: RawHandle, name: &str) -> Result<RawHandle>;
    /// What the kernel takes of the hardware as the driver reports it, or `None` where this
    /// platform's runtime does not say (HIP: read the code object's metadata instead).
    /// # Safety
    /// `function` is live.
    unsafe fn function_resources(
        &self,
        dev: i32,
        function: RawHandle,
    ) -> Result<Option<FunctionResources>>;
    /// # Safety
    /// `function` is live; `params` points to one pointer per kernel parameter, each pointing to
    /// a value of the parameter's exact type; `stream` is live. With `programmatic`, the kernel
    /// waits for the grid ahead of it before touching memory (see
    /// [`crate::Function::with_programmatic_dependency`]); a platform without such launches
    /// ignores it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        dev: i32,
        function: RawHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: RawHandle,
        params: *mut *mut c_void,
        programmatic: bool,
    ) -> Result<()>;

    /// # Safety
    /// `stream` is live and not capturing.
    unsafe fn begin_capture(&self, dev: i32, stream: RawHandle) -> Result<()>;
    /// `true` while the stream is capturing (actively or invalidated, awaiting `end_capture`).
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_is_capturing(&self, dev: i32, stream: RawHandle) -> Result<bool>;
    /// # Safety
    /// `stream` is live and capturing.
    unsafe fn end_capture(&self, dev: i32, stream: RawHandle) -> Result<RawHandle>;
    /// # Safety
    /// `graph` is live.
    unsafe fn graph_instantiate(&self, dev: i32, graph: RawHandle) -> Result<RawHandle>;
    /// # Safety
    /// Both handles are live.
    unsafe fn graph_launch(&self, dev: i32, exec: RawHandle, stream: RawHandle) -> Result<()>;
    /// # Safety
    /// `graph` is live and not used afterwards.
    unsafe fn graph_destroy(&self, dev: i32, graph: RawHandle) -> Result<()>;
    /// # Safety
    /// `exec` is live and not used afterwards.
    unsafe fn graph_exec_destroy(&self, dev: i32, exec: RawHandle) -> Result<()>;
}

/// Converts a name to a C string, rejecting interior NULs with a clear error.
pub(crate) fn c_string(op: &'static str, what: &str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| {
        HipError::host(
            op,
            ErrorKind::InvalidArgument,
            format!("{what} contains a NUL byte"),
        )
    })
}

//! NVIDIA: the HIP-shaped API on the CUDA driver API, through cudarc's `sys` layer (NVRTC is
//! loaded separately, by [`super::rtc`]).
//!
//! cudarc is built with `dynamic-loading` and `cuda-13000` (the workspace pins it): `libcuda` is
//! opened at run time and each symbol is looked up by name on first use. Every entry point used
//! here exists with the same signature in CUDA 12 drivers, except `cuEventElapsedTime_v2` (new in
//! CUDA 12.8), for which the older `cuEventElapsedTime` (same signature) is used when absent; so
//! the minimum is a CUDA 12.0 driver (the 525 series), checked with `cuDriverGetVersion`.
//! cudarc panics when a library or symbol is missing, so [`CudaApi::load`] first checks with
//! libloading that the library opens, that the driver is new enough and that every symbol used
//! here exists; after that no cudarc call can hit its panic path.

use super::library_search::nvidia_library_dirs;
use super::{c_string, Addr, Attr, CopyKind, GpuApi, RawHandle};
use crate::error::{classify_cuda, Api, HipError, Result};
use cudarc::driver::sys as cu;
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::Mutex;

/// Driver symbols this backend calls (the exported names, with their `_v2` suffixes).
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAllocManaged",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuThreadExchangeStreamCaptureMode",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// The oldest driver supported, as `cuDriverGetVersion` reports it (1000 * major + 10 * minor).
const MIN_DRIVER_VERSION: i32 = 12_000;

/// `cuEventElapsedTime_v2` (CUDA 12.8 and later) or `cuEventElapsedTime`; same signature.
type ElapsedTimeFn = unsafe extern "C" fn(*mut f32, cu::CUevent, cu::CUevent) -> cu::CUresult;

/// A driver version as people write it: 12040 -> "12.4".
fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// CUDA's "not ready" status, shared by stream and event queries.
const NOT_READY: i32 = 600;

thread_local! {
    /// The device whose primary context is current on this thread (-1: none set by us).
    static CURRENT_DEVICE: Cell<i32> = const { Cell::new(-1) };
}

/// The NVIDIA backend. Primary contexts are retained on first use and kept for the process's
/// lifetime (the backend itself is a process-wide singleton).
pub(crate) struct CudaApi {
    elapsed_time: ElapsedTimeFn,
    driver_version: i32,
    contexts: Mutex<Vec<(i32, usize)>>,
}

/// Opens a library by cudarc's candidate names (then in [`nvidia_library_dirs`]), checks the
/// driver version it reports (when it exports `cuDriverGetVersion`) against
/// [`MIN_DRIVER_VERSION`], and reports the symbols it lacks, naming the version found and the
/// minimum. A library found only by full path is kept loaded, so cudarc's own later `dlopen` by
/// soname (`libcuda.so.1`) finds the same, already loaded object.
fn probe_library(lib_name: &str, symbols: &[&str]) -> std::result::Result<(), String> {
    let names = cudarc::get_lib_name_candidates(lib_name);
    let by_name = names.iter().map(|n| (PathBuf::from(n), false));
    let by_path = nvidia_library_dirs()
        .into_iter()
        .flat_map(|dir| names.iter().map(move |n| (dir.join(n), true)))
        .filter(|(path, _)| path.is_file())
        .collect::<Vec<_>>();
    let minimum = format!(
        "hipdecode needs a driver for CUDA {} or newer (the 525 series or later)",
        cuda_version_text(MIN_DRIVER_VERSION)
    );
    for (candidate, found_by_path) in by_name.chain(by_path) {
        // SAFETY: opening a system library runs its initialisers; libcuda is designed to be
        // loaded this way (it is what cudarc itself does next).
        let Ok(lib) = (unsafe { libloading::Library::new(&candidate) }) else {
            continue;
        };
        type VersionFn = unsafe extern "C" fn(*mut i32) -> cu::CUresult;
        // SAFETY: `cuDriverGetVersion(int*)` has this signature in every CUDA release; it needs
        // no cuInit and writes one int.
        let version = unsafe { lib.get::<VersionFn>(b"cuDriverGetVersion\0") }
            .ok()
            .and_then(|get| {
                let mut version = 0;
                // SAFETY: plain out-parameter.
                let status = unsafe { get(&mut version) };
                (status == cu::CUresult::CUDA_SUCCESS).then_some(version)
            });
        let found = match version {
            Some(v) => format!(
                "the driver in {} supports CUDA {}",
                candidate.display(),
                cuda_version_text(v)
            ),
            None => format!("{} does not report its version", candidate.display()),
        };
        if let Some(v) = version {
            if v < MIN_DRIVER_VERSION {
                return Err(format!("{found}; {minimum}"));
            }
        }
        let missing: Vec<&str> = symbols
            .iter()
            .copied()
            .filter(|sym| {
                // SAFETY: only the symbol's presence is checked; the pointer is never called.
                unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.is_err()
            })
            .collect();
        if !missing.is_empty() {
            return Err(format!("{found} but lacks {missing:?}; {minimum}"));
        }
        if found_by_path {
            // Kept for the process's lifetime on purpose (see above).
            std::mem::forget(lib);
        }
        return Ok(());
    }
    Err(format!(
        "lib{lib_name} not found (tried {} names and the CUDA folders); install the NVIDIA driver",
        names.len()
    ))
}

/// `cuEventElapsedTime_v2` where the driver has it, else `cuEventElapsedTime`.
fn elapsed_time_fn() -> std::result::Result<ElapsedTimeFn, String> {
    // SAFETY: the probe proved the driver library loads by cudarc's names.
    let lib = unsafe { cu::culib() };
    // SAFETY: both symbols have the `ElapsedTimeFn` signature in the CUDA headers; the library
    // stays loaded for the process's lifetime (cudarc keeps it in a static).
    unsafe {
        lib.get::<ElapsedTimeFn>(b"cuEventElapsedTime_v2\0")
            .or_else(|_| lib.get::<ElapsedTimeFn>(b"cuEventElapsedTime\0"))
            .map(|f| *f)
    }
    .map_err(|_| {
        "the CUDA driver exports neither cuEventElapsedTime_v2 nor cuEventElapsedTime".into()
    })
}

/// The single place where a `CUresult` becomes a `HipError`.
fn check(op: &'static str, status: cu::CUresult) -> Result<()> {
    if status == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let code = status as i32;
    let mut name_ptr: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    let name = unsafe {
        if cu::cuGetErrorName(status, &mut name_ptr) == cu::CUresult::CUDA_SUCCESS
            && !name_ptr.is_null()
        {
            CStr::from_ptr(name_ptr).to_string_lossy().into_owned()
        } else {
            format!("CUresult({code})")
        }
    };
    Err(HipError {
        op,
        code,
        name,
        api: Api::Cuda,
        kind: classify_cuda(code),
        detail: None,
    })
}

/// Maps a query status: success means done, "not ready" means still running.
fn check_query(op: &'static str, status: cu::CUresult) -> Result<bool> {
    if status as i32 == NOT_READY {
        return Ok(false);
    }
    check(op, status).map(|()| true)
}

impl CudaApi {
    /// Loads the driver. Never panics: a missing library, a driver older than CUDA 12.0 or
    /// lacking a symbol, or a failed `cuInit` is an error naming what was found.
    pub(crate) fn load() -> std::result::Result<CudaApi, String> {
        probe_library("cuda", DRIVER_SYMBOLS)?;
        let elapsed_time = elapsed_time_fn()?;
        // SAFETY: the probe above proved the library and every symbol we call are present.
        check("cuInit", unsafe { cu::cuInit(0) }).map_err(|e| e.to_string())?;
        let mut driver_version = 0;
        // SAFETY: plain out-parameter.
        check("cuDriverGetVersion", unsafe {
            cu::cuDriverGetVersion(&mut driver_version)
        })
        .map_err(|e| e.to_string())?;
        Ok(CudaApi {
            elapsed_time,
            driver_version,
            contexts: Mutex::new(Vec::new()),
        })
    }

    fn device(&self, dev: i32) -> Result<cu::CUdevice> {
        let mut device: cu::CUdevice = 0;
        // SAFETY: plain out-parameter; an out-of-range ordinal is reported as an error.
        check("cuDeviceGet", unsafe { cu::cuDeviceGet(&mut device, dev) })?;
        Ok(device)
    }

    /// Makes `dev`'s primary context current on this thread (cached per thread).
    fn bind(&self, dev: i32) -> Result<()> {
        if CURRENT_DEVICE.with(|c| c.get()) == dev {
            return Ok(());
        }
        let ctx = {
            let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            match contexts.iter().find(|(d, _)| *d == dev) {
                Some(&(_, ctx)) => ctx,
                None => {
                    let device = self.device(dev)?;
                    let mut ctx: cu::CUcontext = std::ptr::null_mut();
                    // SAFETY: `device` is valid; the retained context is kept for the
                    // process's lifetime, so it is never released while in use.
                    check("cuDevicePrimaryCtxRetain", unsafe {
                        cu::cuDevicePrimaryCtxRetain(&mut ctx, device)
                    })?;
                    contexts.push((dev, ctx as usize));
                    ctx as usize
                }
            }
        };
        // SAFETY: `ctx` is a retained primary context.
        check("cuCtxSetCurrent", unsafe {
            cu::cuCtxSetCurrent(ctx as cu::CUcontext)
        })?;
        CURRENT_DEVICE.with(|c| c.set(dev));
        Ok(())
    }

    fn stream(handle: RawHandle) -> cu::CUstream {
        handle.as_ptr()
    }
}

fn attribute_id(attr: Attr) -> cu::CUdevice_attribute {
    use cu::CUdevice_attribute as A;
    match attr {
        Attr::ComputeCapabilityMajor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        Attr::ComputeCapabilityMinor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        Attr::Integrated => A::CU_DEVICE_ATTRIBUTE_INTEGRATED,
        Attr::WarpSize => A::CU_DEVICE_ATTRIBUTE_WARP_SIZE,
        Attr::MultiprocessorCount => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        Attr::ManagedMemory => A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
        Attr::PageableMemoryAccess => A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
        Attr::ConcurrentManagedAccess => A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        Attr::CanMapHostMemory => A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
        Attr::MemoryPoolsSupported => A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        Attr::PciBusId => A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        Attr::PciDeviceId => A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
        Attr::PciDomainId => A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
        Attr::MaxThreadsPerBlock => A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        Attr::MaxSharedMemoryPerBlock => A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
    }
}

/// Plain device memory of `device`, as the virtual memory calls describe it.
fn device_memory(device: cu::CUdevice) -> cu::CUmemAllocationProp {
    // SAFETY: the struct is plain data for which all-zero bytes are valid (zero is each enum's
    // "none" or first value); the fields that matter are set below.
    let mut prop: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

impl GpuApi for CudaApi {
    fn version_string(&self) -> String {
        let driver = cuda_version_text(self.driver_version);
        let nvrtc = match super::rtc::library(crate::platform_kind::PlatformKind::Nvidia) {
            Ok(rtc) => rtc.version(),
            Err(_) => "NVRTC not found".to_string(),
        };
        format!("CUDA driver API {driver}, {nvrtc} (cudarc bindings: cuda-13000)")
    }

    fn device_count(&self) -> Result<i32> {
        let mut count = 0;
        // SAFETY: plain out-parameter.
        check("cuDeviceGetCount", unsafe {
            cu::cuDeviceGetCount(&mut count)
        })?;
        Ok(count)
    }

    fn device_name(&self, dev: i32) -> Result<String> {
        let device = self.device(dev)?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
        check("cuDeviceGetName", unsafe {
            cu::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)
        })?;
        // SAFETY: NUL-terminated by the driver (and the buffer was zeroed).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    fn attribute(&self, dev: i32, attr: Attr) -> Result<i32> {
        let device = self.device(dev)?;
        let mut value = 0;
        // SAFETY: plain out-parameter, valid device.
        check("cuDeviceGetAttribute", unsafe {
            cu::cuDeviceGetAttribute(&mut value, attribute_id(attr), device)
        })?;
        Ok(value)
    }

    fn total_memory(&self, dev: i32) -> Result<u64> {
        let device = self.device(dev)?;
        let mut bytes = 0usize;
        // SAFETY: plain out-parameter, valid device.
        check("cuDeviceTotalMem", unsafe {
            cu::cuDeviceTotalMem_v2(&mut bytes, device)
        })?;
        Ok(bytes as u64)
    }

    fn mem_get_info(&self, dev: i32) -> Result<(u64, u64)> {
        self.bind(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: plain out-parameters; the context is current.
        check("cuMemGetInfo", unsafe {
            cu::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn arch_name(&self, dev: i32) -> Result<Option<String>> {
        let major = self.attribute(dev, Attr::ComputeCapabilityMajor)?;
        let minor = self.attribute(dev, Attr::ComputeCapabilityMinor)?;
        Ok(Some(format!("sm_{major}{minor}")))
    }

    fn make_current(&self, dev: i32) -> Result<()> {
        self.bind(dev)
    }

    fn synchronize_device(&self, dev: i32) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the context is current.
        check("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() })
    }

    fn malloc(&self, dev: i32, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let mut ptr: cu::CUdeviceptr = 0;
        // cuMemAlloc is not stream-ordered, so it cannot corrupt a capture, but the thread's
        // capture mode forbids it while this thread captures; relaxed mode for this one call
        // lets a caching allocator grow a capture's private pool (PyTorch's allocator does the
        // same).
        let mut mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: plain in/out parameter.
        check("cuThreadExchangeStreamCaptureMode", unsafe {
            cu::cuThreadExchangeStreamCaptureMode(&mut mode)
        })?;
        // SAFETY: plain out-parameter; the context is current.
        let result = check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, bytes) })
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")));
        // SAFETY: restores the mode exchanged above.
        check("cuThreadExchangeStreamCaptureMode", unsafe {
            cu::cuThreadExchangeStreamCaptureMode(&mut mode)
        })?;
        result?;
        Ok(ptr)
    }

    unsafe fn free(&self, dev: i32, ptr: Addr) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `ptr` came from cuMemAlloc/cuMemAllocManaged.
        check("cuMemFree", unsafe { cu::cuMemFree_v2(ptr) })
    }

    unsafe fn malloc_async(&self, dev: i32, bytes: usize, stream: RawHandle) -> Result<Addr> {
        self.bind(dev)?;
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the caller guarantees the stream is live.
        check("cuMemAllocAsync", unsafe {
            cu::cuMemAllocAsync(&mut ptr, bytes, Self::stream(stream))
        })
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        Ok(ptr)
    }

    unsafe fn free_async(&self, dev: i32, ptr: Addr, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `ptr` came from cuMemAllocAsync and the stream is live.
        check("cuMemFreeAsync", unsafe {
            cu::cuMemFreeAsync(ptr, Self::stream(stream))
        })
    }

    fn malloc_managed(&self, dev: i32, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let mut ptr: cu::CUdeviceptr = 0;
        let flags = cu::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        // SAFETY: plain out-parameter; the context is current.
        check("cuMemAllocManaged", unsafe {
            cu::cuMemAllocManaged(&mut ptr, bytes, flags)
        })
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        Ok(ptr)
    }

    unsafe fn memset(
        &self,
        dev: i32,
        ptr: Addr,
        value: u8,
        bytes: usize,
        stream: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the range is device memory and the stream is live.
        check("cuMemsetD8Async", unsafe {
            cu::cuMemsetD8Async(ptr, value, bytes, Self::stream(stream))
        })
    }

    unsafe fn memcpy(
        &self,
        dev: i32,
        dst: Addr,
        src: Addr,
        bytes: usize,
        kind: CopyKind,
        stream: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        let s = Self::stream(stream);
        let host_dst = dst as usize as *mut c_void;
        let host_src = src as usize as *const c_void;
        // SAFETY: the caller guarantees both ranges are valid on the sides `kind` names and
        // stay valid until an async copy has run.
        unsafe {
            match kind {
                CopyKind::HostToDevice => check(
                    "cuMemcpyHtoDAsync",
                    cu::cuMemcpyHtoDAsync_v2(dst, host_src, bytes, s),
                ),
                CopyKind::DeviceToHost => check(
                    "cuMemcpyDtoHAsync",
                    cu::cuMemcpyDtoHAsync_v2(host_dst, src, bytes, s),
                ),
                CopyKind::DeviceToDevice => check(
                    "cuMemcpyDtoDAsync",
                    cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, s),
                ),
            }
        }
    }

    fn host_alloc_mapped(&self, dev: i32, bytes: usize) -> Result<(*mut u8, Addr)> {
        self.bind(dev)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_DEVICEMAP | cu::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain out-parameter; the context is current.
        check("cuMemHostAlloc", unsafe {
            cu::cuMemHostAlloc(&mut host, bytes, flags)
        })
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        let mut device: cu::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP.
        let mapped = check("cuMemHostGetDevicePointer", unsafe {
            cu::cuMemHostGetDevicePointer_v2(&mut device, host, 0)
        });
        if let Err(e) = mapped {
            // SAFETY: `host` came from cuMemHostAlloc and is not handed out.
            let _ = unsafe { cu::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok((host.cast(), device))
    }

    unsafe fn host_free(&self, dev: i32, ptr: *mut u8) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `ptr` came from cuMemHostAlloc.
        check("cuMemFreeHost", unsafe { cu::cuMemFreeHost(ptr.cast()) })
    }

    unsafe fn host_register(&self, dev: i32, ptr: *mut u8, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let flags = cu::CU_MEMHOSTREGISTER_DEVICEMAP | cu::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller guarantees the range is valid host memory.
        check("cuMemHostRegister", unsafe {
            cu::cuMemHostRegister_v2(ptr.cast(), bytes, flags)
        })?;
        let mut device: cu::CUdeviceptr = 0;
        // SAFETY: the range was just registered with DEVICEMAP.
        let mapped = check("cuMemHostGetDevicePointer", unsafe {
            cu::cuMemHostGetDevicePointer_v2(&mut device, ptr.cast(), 0)
        });
        if let Err(e) = mapped {
            // SAFETY: registered just above, not handed out.
            let _ = unsafe { cu::cuMemHostUnregister(ptr.cast()) };
            return Err(e);
        }
        Ok(device)
    }

    unsafe fn host_unregister(&self, dev: i32, ptr: *mut u8) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `ptr` was registered.
        check("cuMemHostUnregister", unsafe {
            cu::cuMemHostUnregister(ptr.cast())
        })
    }

    fn map_granularity(&self, dev: i32) -> Result<Option<u64>> {
        let device = self.device(dev)?;
        let mut supported = 0;
        // SAFETY: plain out-parameter.
        check("cuDeviceGetAttribute", unsafe {
            cu::cuDeviceGetAttribute(
                &mut supported,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                device,
            )
        })?;
        if supported == 0 {
            return Ok(None);
        }
        let prop = device_memory(device);
        let mut granularity = 0usize;
        // SAFETY: plain out-parameter and a fully initialised property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            cu::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok((granularity > 0).then_some(granularity as u64))
    }

    fn address_reserve(&self, dev: i32, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let mut addr: cu::CUdeviceptr = 0;
        // SAFETY: plain out-parameter; no fixed address is asked for.
        check("cuMemAddressReserve", unsafe {
            cu::cuMemAddressReserve(&mut addr, bytes, 0, 0, 0)
        })
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes of address space")))?;
        Ok(addr)
    }

    unsafe fn address_free(&self, dev: i32, addr: Addr, bytes: usize) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees a whole, unmapped reservation.
        check("cuMemAddressFree", unsafe {
            cu::cuMemAddressFree(addr, bytes)
        })
    }

    unsafe fn map_new(&self, dev: i32, addr: Addr, bytes: usize) -> Result<RawHandle> {
        self.bind(dev)?;
        let device = self.device(dev)?;
        let prop = device_memory(device);
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: plain out-parameter and a fully initialised property struct.
        check("cuMemCreate", unsafe {
            cu::cuMemCreate(&mut handle, bytes, &prop, 0)
        })
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        let access = cu::CUmemAccessDesc {
            location: prop.location,
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the caller guarantees the range is reserved and unmapped; the handle holds
        // `bytes`. On failure the steps done so far are undone before returning.
        let mapped = unsafe {
            check("cuMemMap", cu::cuMemMap(addr, bytes, 0, handle, 0)).and_then(|()| {
                check(
                    "cuMemSetAccess",
                    cu::cuMemSetAccess(addr, bytes, &access, 1),
                )
                .inspect_err(|_| {
                    cu::cuMemUnmap(addr, bytes);
                })
            })
        };
        if let Err(e) = mapped {
            // SAFETY: the handle was created above and is mapped nowhere.
            unsafe { cu::cuMemRelease(handle) };
            return Err(e);
        }
        Ok(RawHandle(handle as usize))
    }

    unsafe fn unmap_release(
        &self,
        dev: i32,
        addr: Addr,
        bytes: usize,
        handle: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the range and handle are one `map_new`'s and unused.
        check("cuMemUnmap", unsafe { cu::cuMemUnmap(addr, bytes) })?;
        // SAFETY: as above; the handle is mapped nowhere now.
        check("cuMemRelease", unsafe {
            cu::cuMemRelease(handle.0 as cu::CUmemGenericAllocationHandle)
        })
    }

    fn stream_create(&self, dev: i32) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut stream: cu::CUstream = std::ptr::null_mut();
        let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: plain out-parameter; the context is current.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut stream, flags)
        })?;
        Ok(RawHandle::from_ptr(stream))
    }

    unsafe fn stream_destroy(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live and unused afterwards.
        check("cuStreamDestroy", unsafe {
            cu::cuStreamDestroy_v2(Self::stream(stream))
        })
    }

    unsafe fn stream_synchronize(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live.
        check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(Self::stream(stream))
        })
    }

    unsafe fn stream_query(&self, dev: i32, stream: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live.
        check_query("cuStreamQuery", unsafe {
            cu::cuStreamQuery(Self::stream(stream))
        })
    }

    unsafe fn stream_wait_event(
        &self,
        dev: i32,
        stream: RawHandle,
        event: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(Self::stream(stream), event.as_ptr(), 0)
        })
    }

    fn event_create(&self, dev: i32, timing: bool) -> Result<RawHandle> {
        self.bind(dev)?;
        let flags = if timing {
            cu::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        let mut event: cu::CUevent = std::ptr::null_mut();
        // SAFETY: plain out-parameter; the context is current.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut event, flags)
        })?;
        Ok(RawHandle::from_ptr(event))
    }

    unsafe fn event_destroy(&self, dev: i32, event: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live and unused afterwards.
        check("cuEventDestroy", unsafe {
            cu::cuEventDestroy_v2(event.as_ptr())
        })
    }

    unsafe fn event_record(&self, dev: i32, event: RawHandle, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        check("cuEventRecord", unsafe {
            cu::cuEventRecord(event.as_ptr(), Self::stream(stream))
        })
    }

    unsafe fn event_query(&self, dev: i32, event: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live.
        check_query("cuEventQuery", unsafe { cu::cuEventQuery(event.as_ptr()) })
    }

    unsafe fn event_synchronize(&self, dev: i32, event: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live.
        check("cuEventSynchronize", unsafe {
            cu::cuEventSynchronize(event.as_ptr())
        })
    }

    unsafe fn event_elapsed_ms(&self, dev: i32, start: RawHandle, end: RawHandle) -> Result<f32> {
        self.bind(dev)?;
        let mut ms = 0f32;
        // SAFETY: the caller guarantees both events are live timing events.
        check("cuEventElapsedTime", unsafe {
            (self.elapsed_time)(&mut ms, start.as_ptr(), end.as_ptr())
        })?;
        Ok(ms)
    }

    fn module_load(&self, dev: i32, image: &[u8]) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a complete CUBIN produced by NVRTC (the driver validates it).
        check("cuModuleLoadData", unsafe {
            cu::cuModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Ok(RawHandle::from_ptr(module))
    }

    unsafe fn module_unload(&self, dev: i32, module: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the module is live and unused afterwards.
        check("cuModuleUnload", unsafe {
            cu::cuModuleUnload(module.as_ptr())
        })
    }

    unsafe fn module_function(&self, dev: i32, module: RawHandle, name: &str) -> Result<RawHandle> {
        self.bind(dev)?;
        let c_name = c_string("cuModuleGetFunction", "kernel name", name)?;
        let mut function: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: the caller guarantees the module is live; the name is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut function, module.as_ptr(), c_name.as_ptr())
        })
        .map_err(|e| e.with_detail(format!("kernel `{name}`")))?;
        Ok(RawHandle::from_ptr(function))
    }

    unsafe fn function_resources(
        &self,
        dev: i32,
        function: RawHandle,
    ) -> Result<Option<super::FunctionResources>> {
        use cu::CUfunction_attribute as A;
        self.bind(dev)?;
        let get = |attribute: A| -> Result<u32> {
            let mut value: std::ffi::c_int = 0;
            // SAFETY: the caller guarantees the function is live; `value` is a valid out
            // pointer.
            check("cuFuncGetAttribute", unsafe {
                cu::cuFuncGetAttribute(&mut value, attribute, function.as_ptr())
            })?;
            Ok(u32::try_from(value).unwrap_or(0))
        };
        Ok(Some(super::FunctionResources {
            registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_threads_per_block: get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        }))
    }

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
    ) -> Result<()> {
        self.bind(dev)?;
        if programmatic {
            // SAFETY: an all-zero attribute is a valid value of the plain C struct.
            let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = cu::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: shared_bytes,
                hStream: Self::stream(stream),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `config` and the attribute it points to live across the call,
            // and the caller guarantees the kernel waits for the grid ahead of it.
            return check("cuLaunchKernelEx", unsafe {
                cu::cuLaunchKernelEx(&config, function.as_ptr(), params, std::ptr::null_mut())
            });
        }
        // SAFETY: the caller guarantees the function and stream are live and `params` matches
        // the kernel's parameter list.
        check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                function.as_ptr(),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                Self::stream(stream),
                params,
                std::ptr::null_mut(),
            )
        })
    }

    unsafe fn begin_capture(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        let mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the caller guarantees the stream is live and not capturing.
        check("cuStreamBeginCapture", unsafe {
            cu::cuStreamBeginCapture_v2(Self::stream(stream), mode)
        })
    }

    unsafe fn stream_is_capturing(&self, dev: i32, stream: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        // Read as a plain integer: cudarc declares the status as a Rust enum, and a value the
        // bindings do not list must not become an invalid enum (0 = none, 1 = active,
        // 2 = invalidated).
        let mut status: u32 = 0;
        // SAFETY: the caller guarantees the stream is live; the out-parameter is a C enum,
        // 4 bytes, which `status` provides.
        check("cuStreamIsCapturing", unsafe {
            cu::cuStreamIsCapturing(
                Self::stream(stream),
                (&mut status as *mut u32).cast::<cu::CUstreamCaptureStatus>(),
            )
        })?;
        Ok(status != 0)
    }

    unsafe fn end_capture(&self, dev: i32, stream: RawHandle) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: the caller guarantees the stream is live and capturing.
        check("cuStreamEndCapture", unsafe {
            cu::cuStreamEndCapture(Self::stream(stream), &mut graph)
        })?;
        Ok(RawHandle::from_ptr(graph))
    }

    unsafe fn graph_instantiate(&self, dev: i32, graph: RawHandle) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut exec: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the caller guarantees the graph is live.
        check("cuGraphInstantiateWithFlags", unsafe {
            cu::cuGraphInstantiateWithFlags(&mut exec, graph.as_ptr(), 0)
        })?;
        Ok(RawHandle::from_ptr(exec))
    }

    unsafe fn graph_launch(&self, dev: i32, exec: RawHandle, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec.as_ptr(), Self::stream(stream))
        })
    }

    unsafe fn graph_destroy(&self, dev: i32, graph: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the graph is live and unused afterwards.
        check("cuGraphDestroy", unsafe {
            cu::cuGraphDestroy(graph.as_ptr())
        })
    }

    unsafe fn graph_exec_destroy(&self, dev: i32, exec: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the exec is live and unused afterwards.
        check("cuGraphExecDestroy", unsafe {
            cu::cuGraphExecDestroy(exec.as_ptr())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let err = probe_library("hipdecode_no_such_library", &["cuInit"]).expect_err("absent");
        assert!(err.contains("not found"), "{err}");
    }

    #[test]
    fn driver_versions_read_as_cuda_releases() {
        assert_eq!(cuda_version_text(12_040), "12.4");
        assert_eq!(cuda_version_text(13_000), "13.0");
        assert_eq!(cuda_version_text(MIN_DRIVER_VERSION), "12.0");
    }
}

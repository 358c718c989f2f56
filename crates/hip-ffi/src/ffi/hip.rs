//! AMD: the HIP runtime (`libamdhip64`), loaded at run time through the bindgen loader struct in
//! [`crate::sys`] (hiprtc is loaded separately, by [`super::rtc`]).
//!
//! Every function pointer is looked up when the library is opened; a function the installed
//! runtime lacks becomes a clear error at the call, never a panic (bindgen's own wrappers would
//! panic, so they are not used: [`call!`] reads the looked-up pointer itself).

use super::library_search::rocm_library_candidates;
use super::{c_string, Addr, Attr, CopyKind, GpuApi, RawHandle};
use crate::error::{classify_hip, Api, ErrorKind, HipError, Result};
use crate::sys::runtime as hip;
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;

/// HIP's "not ready" status, shared by stream and event queries.
const NOT_READY: i32 = 600;

thread_local! {
    /// The device last made current on this thread by `hipSetDevice` (-1: none).
    static CURRENT_DEVICE: Cell<i32> = const { Cell::new(-1) };
}

/// Calls a looked-up runtime function and checks its status. Must be used inside `unsafe`.
macro_rules! call {
    ($api:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $api.rt.$f.as_ref() {
            Ok(f) => $api.check(stringify!($f), (*f)($($arg),*) as i32),
            Err(_) => Err(missing_symbol(stringify!($f))),
        }
    };
}

fn missing_symbol(name: &'static str) -> HipError {
    HipError::host(
        name,
        ErrorKind::NotSupported,
        "the installed HIP runtime does not export this function (ROCm too old?)",
    )
}

/// The AMD backend.
pub(crate) struct HipApi {
    rt: hip::HipRuntime,
    runtime_path: String,
    /// The virtual memory calls, where the runtime has them.
    vmm: Option<super::hip_vmm::VmmCalls>,
}

/// Library file names tried for the HIP runtime, newest soname first, then under ROCm roots.
pub(crate) fn runtime_candidates() -> Vec<PathBuf> {
    rocm_library_candidates("libamdhip64")
}

impl HipApi {
    /// Opens `libamdhip64` and initialises the runtime. Never panics.
    pub(crate) fn load() -> std::result::Result<HipApi, String> {
        let mut last_error = None;
        for candidate in runtime_candidates() {
            // SAFETY: loading the HIP runtime runs its initialisers, which is how it is meant
            // to be used; the loader struct only looks symbols up.
            match unsafe { hip::HipRuntime::new(&candidate) } {
                Ok(rt) => return Self::init(rt, candidate.display().to_string()),
                Err(e) => last_error = Some(e.to_string()),
            }
        }
        Err(format!(
            "libamdhip64 not found ({})",
            last_error.unwrap_or_else(|| "no candidates".into())
        ))
    }

    fn init(rt: hip::HipRuntime, runtime_path: String) -> std::result::Result<HipApi, String> {
        if rt.hipInit.is_err() || rt.hipGetDeviceCount.is_err() || rt.hipGetErrorName.is_err() {
            return Err(format!("{runtime_path} is not a usable HIP runtime"));
        }
        let vmm = super::hip_vmm::VmmCalls::load(&runtime_path);
        let api = HipApi {
            rt,
            runtime_path,
            vmm,
        };
        // SAFETY: hipInit takes flags only.
        unsafe { call!(api, hipInit(0)) }.map_err(|e| e.to_string())?;
        Ok(api)
    }

    /// The single place where a `hipError_t` becomes a `HipError`.
    fn check(&self, op: &'static str, code: i32) -> Result<()> {
        if code == hip::hipSuccess as i32 {
            return Ok(());
        }
        let name = match self.rt.hipGetErrorName.as_ref() {
            // SAFETY: hipGetErrorName returns a static string for any code.
            Ok(f) => unsafe {
                let ptr = (*f)(code as hip::hipError_t);
                if ptr.is_null() {
                    format!("hipError_t({code})")
                } else {
                    CStr::from_ptr(ptr).to_string_lossy().into_owned()
                }
            },
            Err(_) => format!("hipError_t({code})"),
        };
        Err(HipError {
            op,
            code,
            name,
            api: Api::Hip,
            kind: classify_hip(code),
            detail: None,
        })
    }

    fn bind(&self, dev: i32) -> Result<()> {
        if CURRENT_DEVICE.with(|c| c.get()) == dev {
            return Ok(());
        }
        // SAFETY: an out-of-range ordinal is reported as an error.
        unsafe { call!(self, hipSetDevice(dev)) }?;
        CURRENT_DEVICE.with(|c| c.set(dev));
        Ok(())
    }

    fn stream(handle: RawHandle) -> hip::hipStream_t {
        handle.as_ptr()
    }
}

fn attribute_id(attr: Attr) -> hip::hipDeviceAttribute_t {
    match attr {
        Attr::ComputeCapabilityMajor => hip::hipDeviceAttributeComputeCapabilityMajor,
        Attr::ComputeCapabilityMinor => hip::hipDeviceAttributeComputeCapabilityMinor,
        Attr::Integrated => hip::hipDeviceAttributeIntegrated,
        Attr::WarpSize => hip::hipDeviceAttributeWarpSize,
        Attr::MultiprocessorCount => hip::hipDeviceAttributeMultiprocessorCount,
        Attr::ManagedMemory => hip::hipDeviceAttributeManagedMemory,
        Attr::PageableMemoryAccess => hip::hipDeviceAttributePageableMemoryAccess,
        Attr::ConcurrentManagedAccess => hip::hipDeviceAttributeConcurrentManagedAccess,
        Attr::CanMapHostMemory => hip::hipDeviceAttributeCanMapHostMemory,
        Attr::MemoryPoolsSupported => hip::hipDeviceAttributeMemoryPoolsSupported,
        Attr::PciBusId => hip::hipDeviceAttributePciBusId,
        Attr::PciDeviceId => hip::hipDeviceAttributePciDeviceId,
        Attr::PciDomainId => hip::hipDeviceAttributePciDomainID,
        Attr::MaxThreadsPerBlock => hip::hipDeviceAttributeMaxThreadsPerBlock,
        Attr::MaxSharedMemoryPerBlock => hip::hipDeviceAttributeMaxSharedMemoryPerBlock,
    }
}

fn ptr(addr: Addr) -> *mut c_void {
    addr as usize as *mut c_void
}

impl HipApi {
    /// The virtual memory calls, or the error that names the one asked for as missing.
    fn vmm_calls(&self, name: &'static str) -> Result<&super::hip_vmm::VmmCalls> {
        self.vmm.as_ref().ok_or_else(|| missing_symbol(name))
    }
}

impl GpuApi for HipApi {
    fn version_string(&self) -> String {
        let (mut driver, mut runtime) = (0, 0);
        // SAFETY: plain out-parameters.
        let _ = unsafe { call!(self, hipDriverGetVersion(&mut driver)) };
        // SAFETY: plain out-parameters.
        let _ = unsafe { call!(self, hipRuntimeGetVersion(&mut runtime)) };
        // HIP_VERSION = major * 10_000_000 + minor * 100_000 + patch.
        let fmt = |v: i32| format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000);
        format!(
            "HIP runtime {} (driver {}) from {}; hiprtc: {}; bindings: {}",
            fmt(runtime),
            fmt(driver),
            self.runtime_path,
            match super::rtc::library(crate::platform_kind::PlatformKind::Amd) {
                Ok(rtc) => rtc.version(),
                Err(_) => "not found".to_string(),
            },
            if crate::sys::GENERATED_AT_BUILD_TIME {
                "generated from installed headers"
            } else {
                "committed (HIP 5.2 headers)"
            }
        )
    }

    fn device_count(&self) -> Result<i32> {
        let mut count = 0;
        // SAFETY: plain out-parameter.
        match unsafe { call!(self, hipGetDeviceCount(&mut count)) } {
            Ok(()) => Ok(count),
            // "no device" is an answer here, not a failure.
            Err(e) if e.kind == ErrorKind::NoDevice => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn device_name(&self, dev: i32) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within it.
        unsafe {
            call!(
                self,
                hipDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev)
            )
        }?;
        // SAFETY: NUL-terminated (and zeroed beforehand).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    fn attribute(&self, dev: i32, attr: Attr) -> Result<i32> {
        let mut value = 0;
        // SAFETY: plain out-parameter.
        unsafe {
            call!(
                self,
                hipDeviceGetAttribute(&mut value, attribute_id(attr), dev)
            )
        }?;
        Ok(value)
    }

    fn total_memory(&self, dev: i32) -> Result<u64> {
        let mut bytes = 0usize;
        // SAFETY: plain out-parameter.
        unsafe { call!(self, hipDeviceTotalMem(&mut bytes, dev)) }?;
        Ok(bytes as u64)
    }

    fn mem_get_info(&self, dev: i32) -> Result<(u64, u64)> {
        self.bind(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: plain out-parameters.
        unsafe { call!(self, hipMemGetInfo(&mut free, &mut total)) }?;
        Ok((free as u64, total as u64))
    }

    fn arch_name(&self, dev: i32) -> Result<Option<String>> {
        // The gfx name lives only in hipDeviceProp_t, whose layout changed between ROCm 5 and 6;
        // the KFD topology in sysfs has it too, keyed by PCI location, which attributes give.
        // HSA_OVERRIDE_GFX_VERSION comes first: the runtime loads code objects for the ISA it
        // names, so kernels compiled for the topology's would not load.
        let pci = crate::sysfs::PciLocation {
            domain: self.attribute(dev, Attr::PciDomainId)? as u32,
            bus: self.attribute(dev, Attr::PciBusId)? as u32,
            device: self.attribute(dev, Attr::PciDeviceId)? as u32,
        };
        let override_text = std::env::var(crate::sysfs::HSA_OVERRIDE_GFX_VERSION).ok();
        crate::sysfs::gfx_arch(
            std::path::Path::new(crate::sysfs::KFD_TOPOLOGY),
            pci,
            override_text.as_deref(),
        )
        .map_err(|reason| {
            HipError::host(
                "HSA_OVERRIDE_GFX_VERSION",
                ErrorKind::InvalidArgument,
                format!("{reason}; unset it to use the device's own architecture"),
            )
        })
    }

    fn make_current(&self, dev: i32) -> Result<()> {
        self.bind(dev)
    }

    fn synchronize_device(&self, dev: i32) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: no arguments.
        unsafe { call!(self, hipDeviceSynchronize()) }
    }

    fn malloc(&self, dev: i32, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // hipMalloc is not stream-ordered; relaxed capture mode for this one call lets a
        // caching allocator grow a capture's private pool while this thread captures (as on
        // CUDA, see the CUDA backend).
        let mut mode: hip::hipStreamCaptureMode = hip::hipStreamCaptureModeRelaxed;
        // SAFETY: plain in/out parameter.
        unsafe { call!(self, hipThreadExchangeStreamCaptureMode(&mut mode)) }?;
        // SAFETY: plain out-parameter.
        let result = unsafe { call!(self, hipMalloc(&mut p, bytes)) }
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")));
        // SAFETY: restores the mode exchanged above.
        unsafe { call!(self, hipThreadExchangeStreamCaptureMode(&mut mode)) }?;
        result?;
        Ok(p as usize as Addr)
    }

    unsafe fn free(&self, dev: i32, addr: Addr) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `addr` came from hipMalloc/hipMallocManaged.
        unsafe { call!(self, hipFree(ptr(addr))) }
    }

    unsafe fn malloc_async(&self, dev: i32, bytes: usize, stream: RawHandle) -> Result<Addr> {
        self.bind(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller guarantees the stream is live.
        unsafe { call!(self, hipMallocAsync(&mut p, bytes, Self::stream(stream))) }
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        Ok(p as usize as Addr)
    }

    unsafe fn free_async(&self, dev: i32, addr: Addr, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `addr` came from hipMallocAsync and the stream is live.
        unsafe { call!(self, hipFreeAsync(ptr(addr), Self::stream(stream))) }
    }

    fn malloc_managed(&self, dev: i32, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        unsafe {
            call!(
                self,
                hipMallocManaged(&mut p, bytes, hip::hipMemAttachGlobal)
            )
        }
        .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        Ok(p as usize as Addr)
    }

    unsafe fn memset(
        &self,
        dev: i32,
        addr: Addr,
        value: u8,
        bytes: usize,
        stream: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the range is device memory and the stream is live.
        unsafe {
            call!(
                self,
                hipMemsetAsync(ptr(addr), i32::from(value), bytes, Self::stream(stream))
            )
        }
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
        let kind = match kind {
            CopyKind::HostToDevice => hip::hipMemcpyHostToDevice,
            CopyKind::DeviceToHost => hip::hipMemcpyDeviceToHost,
            CopyKind::DeviceToDevice => hip::hipMemcpyDeviceToDevice,
        };
        // SAFETY: the caller guarantees both ranges are valid and outlive an async copy.
        unsafe {
            call!(
                self,
                hipMemcpyAsync(ptr(dst), ptr(src), bytes, kind, Self::stream(stream))
            )
        }
    }

    fn host_alloc_mapped(&self, dev: i32, bytes: usize) -> Result<(*mut u8, Addr)> {
        self.bind(dev)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = hip::hipHostMallocMapped | hip::hipHostMallocPortable;
        // SAFETY: plain out-parameter.
        unsafe { call!(self, hipHostMalloc(&mut host, bytes, flags)) }
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        let mut device: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` was just allocated mapped.
        let mapped = unsafe { call!(self, hipHostGetDevicePointer(&mut device, host, 0)) };
        if let Err(e) = mapped {
            // SAFETY: `host` came from hipHostMalloc and is not handed out.
            let _ = unsafe { call!(self, hipHostFree(host)) };
            return Err(e);
        }
        Ok((host.cast(), device as usize as Addr))
    }

    unsafe fn host_free(&self, dev: i32, p: *mut u8) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `p` came from hipHostMalloc.
        unsafe { call!(self, hipHostFree(p.cast())) }
    }

    unsafe fn host_register(&self, dev: i32, p: *mut u8, bytes: usize) -> Result<Addr> {
        self.bind(dev)?;
        let flags = hip::hipHostRegisterMapped | hip::hipHostRegisterPortable;
        // SAFETY: the caller guarantees the range is valid host memory.
        unsafe { call!(self, hipHostRegister(p.cast(), bytes, flags)) }?;
        let mut device: *mut c_void = std::ptr::null_mut();
        // SAFETY: the range was just registered mapped.
        let mapped = unsafe { call!(self, hipHostGetDevicePointer(&mut device, p.cast(), 0)) };
        if let Err(e) = mapped {
            // SAFETY: registered above and not handed out.
            let _ = unsafe { call!(self, hipHostUnregister(p.cast())) };
            return Err(e);
        }
        Ok(device as usize as Addr)
    }

    unsafe fn host_unregister(&self, dev: i32, p: *mut u8) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees `p` was registered.
        unsafe { call!(self, hipHostUnregister(p.cast())) }
    }

    fn map_granularity(&self, dev: i32) -> Result<Option<u64>> {
        let Some(vmm) = &self.vmm else {
            return Ok(None);
        };
        self.bind(dev)?;
        let prop = super::hip_vmm::AllocationProp::device(dev);
        let mut granularity = 0usize;
        // SAFETY: plain out-parameter and a fully initialised property struct.
        let status = unsafe {
            (vmm.granularity)(&mut granularity, &prop, super::hip_vmm::GRANULARITY_MINIMUM)
        };
        // A device that cannot map memory piece by piece answers "not supported" here.
        match self.check("hipMemGetAllocationGranularity", status) {
            Ok(()) => Ok((granularity > 0).then_some(granularity as u64)),
            Err(e) if e.kind == ErrorKind::NotSupported || e.kind == ErrorKind::InvalidArgument => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn address_reserve(&self, dev: i32, bytes: usize) -> Result<Addr> {
        let vmm = self.vmm_calls("hipMemAddressReserve")?;
        self.bind(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: plain out-parameter; no fixed address is asked for.
        let status = unsafe { (vmm.reserve)(&mut p, bytes, 0, std::ptr::null_mut(), 0) };
        self.check("hipMemAddressReserve", status)
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes of address space")))?;
        Ok(p as usize as Addr)
    }

    unsafe fn address_free(&self, dev: i32, addr: Addr, bytes: usize) -> Result<()> {
        let vmm = self.vmm_calls("hipMemAddressFree")?;
        self.bind(dev)?;
        // SAFETY: the caller guarantees a whole, unmapped reservation.
        let status = unsafe { (vmm.address_free)(ptr(addr), bytes) };
        self.check("hipMemAddressFree", status)
    }

    unsafe fn map_new(&self, dev: i32, addr: Addr, bytes: usize) -> Result<RawHandle> {
        let vmm = self.vmm_calls("hipMemCreate")?;
        self.bind(dev)?;
        let prop = super::hip_vmm::AllocationProp::device(dev);
        let mut handle: super::hip_vmm::Handle = std::ptr::null_mut();
        // SAFETY: plain out-parameter and a fully initialised property struct.
        let status = unsafe { (vmm.create)(&mut handle, bytes, &prop, 0) };
        self.check("hipMemCreate", status)
            .map_err(|e| e.with_detail(format!("asked for {bytes} bytes")))?;
        let access = super::hip_vmm::AccessDesc {
            location: prop.location,
            flags: super::hip_vmm::ACCESS_READ_WRITE,
        };
        // SAFETY: the caller guarantees the range is reserved and unmapped; the handle holds
        // `bytes`. On failure the steps done so far are undone before returning.
        let mapped = unsafe {
            self.check("hipMemMap", (vmm.map)(ptr(addr), bytes, 0, handle, 0))
                .and_then(|()| {
                    self.check(
                        "hipMemSetAccess",
                        (vmm.set_access)(ptr(addr), bytes, &access, 1),
                    )
                    .inspect_err(|_| {
                        (vmm.unmap)(ptr(addr), bytes);
                    })
                })
        };
        if let Err(e) = mapped {
            // SAFETY: the handle was created above and is mapped nowhere.
            unsafe { (vmm.release)(handle) };
            return Err(e);
        }
        Ok(RawHandle::from_ptr(handle))
    }

    unsafe fn unmap_release(
        &self,
        dev: i32,
        addr: Addr,
        bytes: usize,
        handle: RawHandle,
    ) -> Result<()> {
        let vmm = self.vmm_calls("hipMemUnmap")?;
        self.bind(dev)?;
        // SAFETY: the caller guarantees the range and handle are one `map_new`'s and unused.
        self.check("hipMemUnmap", unsafe { (vmm.unmap)(ptr(addr), bytes) })?;
        // SAFETY: as above; the handle is mapped nowhere now.
        self.check("hipMemRelease", unsafe { (vmm.release)(handle.as_ptr()) })
    }

    fn stream_create(&self, dev: i32) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut stream: hip::hipStream_t = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        unsafe {
            call!(
                self,
                hipStreamCreateWithFlags(&mut stream, hip::hipStreamNonBlocking)
            )
        }?;
        Ok(RawHandle::from_ptr(stream))
    }

    unsafe fn stream_destroy(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live and unused afterwards.
        unsafe { call!(self, hipStreamDestroy(Self::stream(stream))) }
    }

    unsafe fn stream_synchronize(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live.
        unsafe { call!(self, hipStreamSynchronize(Self::stream(stream))) }
    }

    unsafe fn stream_query(&self, dev: i32, stream: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live.
        match unsafe { call!(self, hipStreamQuery(Self::stream(stream))) } {
            Ok(()) => Ok(true),
            Err(e) if e.code == NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    unsafe fn stream_wait_event(
        &self,
        dev: i32,
        stream: RawHandle,
        event: RawHandle,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        unsafe {
            call!(
                self,
                hipStreamWaitEvent(Self::stream(stream), event.as_ptr(), 0)
            )
        }
    }

    fn event_create(&self, dev: i32, timing: bool) -> Result<RawHandle> {
        self.bind(dev)?;
        let flags = if timing {
            hip::hipEventDefault
        } else {
            hip::hipEventDisableTiming
        };
        let mut event: hip::hipEvent_t = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        unsafe { call!(self, hipEventCreateWithFlags(&mut event, flags)) }?;
        Ok(RawHandle::from_ptr(event))
    }

    unsafe fn event_destroy(&self, dev: i32, event: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live and unused afterwards.
        unsafe { call!(self, hipEventDestroy(event.as_ptr())) }
    }

    unsafe fn event_record(&self, dev: i32, event: RawHandle, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        unsafe { call!(self, hipEventRecord(event.as_ptr(), Self::stream(stream))) }
    }

    unsafe fn event_query(&self, dev: i32, event: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live.
        match unsafe { call!(self, hipEventQuery(event.as_ptr())) } {
            Ok(()) => Ok(true),
            Err(e) if e.code == NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    unsafe fn event_synchronize(&self, dev: i32, event: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the event is live.
        unsafe { call!(self, hipEventSynchronize(event.as_ptr())) }
    }

    unsafe fn event_elapsed_ms(&self, dev: i32, start: RawHandle, end: RawHandle) -> Result<f32> {
        self.bind(dev)?;
        let mut ms = 0f32;
        // SAFETY: the caller guarantees both events are live timing events.
        unsafe {
            call!(
                self,
                hipEventElapsedTime(&mut ms, start.as_ptr(), end.as_ptr())
            )
        }?;
        Ok(ms)
    }

    fn module_load(&self, dev: i32, image: &[u8]) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut module: hip::hipModule_t = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object from hiprtc (the runtime validates it).
        unsafe { call!(self, hipModuleLoadData(&mut module, image.as_ptr().cast())) }?;
        Ok(RawHandle::from_ptr(module))
    }

    unsafe fn module_unload(&self, dev: i32, module: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the module is live and unused afterwards.
        unsafe { call!(self, hipModuleUnload(module.as_ptr())) }
    }

    unsafe fn module_function(&self, dev: i32, module: RawHandle, name: &str) -> Result<RawHandle> {
        self.bind(dev)?;
        let c_name = c_string("hipModuleGetFunction", "kernel name", name)?;
        let mut function: hip::hipFunction_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the module is live; the name is NUL-terminated.
        unsafe {
            call!(
                self,
                hipModuleGetFunction(&mut function, module.as_ptr(), c_name.as_ptr())
            )
        }
        .map_err(|e| e.with_detail(format!("kernel `{name}`")))?;
        Ok(RawHandle::from_ptr(function))
    }

    unsafe fn function_resources(
        &self,
        _dev: i32,
        _function: RawHandle,
    ) -> Result<Option<super::FunctionResources>> {
        // The bindings are cut from the HIP 5.2 headers without hipFuncGetAttribute; on AMD the
        // code object's metadata says the same (rocm-kernels' code_object).
        Ok(None)
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
        // HIP has no programmatic dependent launch: every launch waits for the one before.
        _programmatic: bool,
    ) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the function and stream are live and `params` matches
        // the kernel's parameter list.
        unsafe {
            call!(
                self,
                hipModuleLaunchKernel(
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
            )
        }
    }

    unsafe fn begin_capture(&self, dev: i32, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the stream is live and not capturing.
        unsafe {
            call!(
                self,
                hipStreamBeginCapture(Self::stream(stream), hip::hipStreamCaptureModeThreadLocal)
            )
        }
    }

    unsafe fn stream_is_capturing(&self, dev: i32, stream: RawHandle) -> Result<bool> {
        self.bind(dev)?;
        let mut status: hip::hipStreamCaptureStatus = hip::hipStreamCaptureStatusNone;
        // SAFETY: the caller guarantees the stream is live; plain out-parameter (an integer,
        // since the bindings turn enums into integer constants).
        unsafe {
            call!(
                self,
                hipStreamIsCapturing(Self::stream(stream), &mut status)
            )
        }?;
        Ok(status != hip::hipStreamCaptureStatusNone)
    }

    unsafe fn end_capture(&self, dev: i32, stream: RawHandle) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut graph: hip::hipGraph_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the stream is live and capturing.
        unsafe { call!(self, hipStreamEndCapture(Self::stream(stream), &mut graph)) }?;
        Ok(RawHandle::from_ptr(graph))
    }

    unsafe fn graph_instantiate(&self, dev: i32, graph: RawHandle) -> Result<RawHandle> {
        self.bind(dev)?;
        let mut exec: hip::hipGraphExec_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the graph is live; no error-node or log buffer.
        unsafe {
            call!(
                self,
                hipGraphInstantiate(
                    &mut exec,
                    graph.as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0
                )
            )
        }?;
        Ok(RawHandle::from_ptr(exec))
    }

    unsafe fn graph_launch(&self, dev: i32, exec: RawHandle, stream: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees both handles are live.
        unsafe { call!(self, hipGraphLaunch(exec.as_ptr(), Self::stream(stream))) }
    }

    unsafe fn graph_destroy(&self, dev: i32, graph: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the graph is live and unused afterwards.
        unsafe { call!(self, hipGraphDestroy(graph.as_ptr())) }
    }

    unsafe fn graph_exec_destroy(&self, dev: i32, exec: RawHandle) -> Result<()> {
        self.bind(dev)?;
        // SAFETY: the caller guarantees the exec is live and unused afterwards.
        unsafe { call!(self, hipGraphExecDestroy(exec.as_ptr())) }
    }
}

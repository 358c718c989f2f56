//! NVIDIA's management library (NVML), loaded at run time for one figure: the device memory a
//! process holds as `nvidia-smi` shows it (`--query-compute-apps=used_memory`), which counts
//! the CUDA context and the loaded modules that the runtime's free-memory query, read after the
//! context exists, cannot separate from other processes.
//!
//! Only four entry points are bound. A missing library or symbol is a reason string, never a
//! panic; every status goes through [`Nvml::check`].

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::path::PathBuf;

type Status = i32;
type DeviceHandle = *mut c_void;

type InitFn = unsafe extern "C" fn() -> Status;
type HandleByPciFn = unsafe extern "C" fn(*const c_char, *mut DeviceHandle) -> Status;
type ProcessesFn = unsafe extern "C" fn(DeviceHandle, *mut c_uint, *mut ProcessInfo) -> Status;
type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;

const SUCCESS: Status = 0;
/// `NVML_ERROR_INSUFFICIENT_SIZE`: the list grew past the buffer; the count says how long.
const INSUFFICIENT_SIZE: Status = 7;
/// `NVML_VALUE_NOT_AVAILABLE` in `usedGpuMemory`.
const NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlProcessInfo_t` of the `_v3` process query (`nvml.h`, CUDA 11.x and later).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

// The `_v3` query's entry is 24 bytes (`pid`, padding, `usedGpuMemory`, two instance ids).
const _: () = assert!(std::mem::size_of::<ProcessInfo>() == 24);

/// The loaded and initialised library.
pub(crate) struct Nvml {
    _lib: libloading::Library,
    handle_by_pci: HandleByPciFn,
    processes: ProcessesFn,
    error_string: ErrorStringFn,
}

/// One process's use of a device, from NVML's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessUse {
    pub(crate) pid: u32,
    /// `None` where NVML does not know it (`NVML_VALUE_NOT_AVAILABLE`).
    pub(crate) bytes: Option<u64>,
}

impl Nvml {
    /// Opens `libnvidia-ml.so.1` (the driver installs it) and calls `nvmlInit_v2`.
    pub(crate) fn load() -> std::result::Result<Nvml, String> {
        let tried = [
            PathBuf::from("libnvidia-ml.so.1"),
            PathBuf::from("libnvidia-ml.so"),
        ];
        let mut last = String::new();
        for candidate in &tried {
            // SAFETY: opening the driver's library runs its initialisers, which is how it is
            // meant to be used; nothing is called until every symbol below resolved.
            match unsafe { libloading::Library::new(candidate) } {
                Ok(lib) => return Self::resolve(lib),
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!("NVML (libnvidia-ml.so.1) not found: {last}"))
    }

    fn resolve(lib: libloading::Library) -> std::result::Result<Nvml, String> {
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the symbol has this signature in every nvml.h that has the name
                // (the versioned names pin it); the pointer is used only while `lib` lives,
                // which the struct guarantees by holding it.
                let symbol = unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
                *symbol.map_err(|e| format!("NVML lacks {}: {e}", $name))?
            }};
        }
        let init: InitFn = sym!("nvmlInit_v2", InitFn);
        let nvml = Nvml {
            handle_by_pci: sym!("nvmlDeviceGetHandleByPciBusId_v2", HandleByPciFn),
            processes: sym!("nvmlDeviceGetComputeRunningProcesses_v3", ProcessesFn),
            error_string: sym!("nvmlErrorString", ErrorStringFn),
            _lib: lib,
        };
        // SAFETY: takes no arguments; NVML counts its initialisations, and this one is never
        // undone, since the library stays loaded for the process's life.
        nvml.check("nvmlInit_v2", unsafe { init() })?;
        Ok(nvml)
    }

    /// The one place NVML statuses become errors, with NVML's own words.
    fn check(&self, call: &str, status: Status) -> std::result::Result<(), String> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: nvmlErrorString takes any status and returns a static C string.
        let text = unsafe { (self.error_string)(status) };
        let text = if text.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated and static, as documented.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(format!("{call}: {text} (NVML status {status})"))
    }

    /// The compute processes NVML lists on the device at `pci_bus_id`
    /// (`domain:bus:device.function`).
    pub(crate) fn processes(
        &self,
        pci_bus_id: &str,
    ) -> std::result::Result<Vec<ProcessUse>, String> {
        let id = std::ffi::CString::new(pci_bus_id)
            .map_err(|_| format!("PCI bus id {pci_bus_id:?} holds a NUL"))?;
        let mut device: DeviceHandle = std::ptr::null_mut();
        // SAFETY: `id` is NUL-terminated and `device` a valid out-pointer.
        let status = unsafe { (self.handle_by_pci)(id.as_ptr(), &mut device) };
        self.check("nvmlDeviceGetHandleByPciBusId_v2", status)?;
        let mut capacity: c_uint = 8;
        loop {
            let mut infos = vec![ProcessInfo::default(); capacity as usize];
            let mut count = capacity;
            // SAFETY: `device` came from NVML above; `infos` has room for `count` entries,
            // and NVML writes at most that many (it reports a larger need in `count`).
            let status = unsafe { (self.processes)(device, &mut count, infos.as_mut_ptr()) };
            if status == INSUFFICIENT_SIZE && count > capacity {
                // Processes started between the calls: ask again with room to spare.
                capacity = count + 8;
                continue;
            }
            self.check("nvmlDeviceGetComputeRunningProcesses_v3", status)?;
            infos.truncate((count as usize).min(infos.len()));
            return Ok(infos
                .into_iter()
                .map(|p| ProcessUse {
                    pid: p.pid,
                    bytes: (p.used_gpu_memory != NOT_AVAILABLE).then_some(p.used_gpu_memory),
                })
                .collect());
        }
    }
}

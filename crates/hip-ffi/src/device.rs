//! A GPU device: its attributes and memory figures, and the entry point for allocations.

use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::{Attr, GpuApi, RawHandle};
use crate::platform_kind::PlatformKind;
use crate::sysfs::{self, GttInfo, PciLocation};
use std::fmt;
use std::path::Path;

/// A device address (`hipDeviceptr_t` / `CUdeviceptr`), as an integer. Transparent over `u64`,
/// so a kernel parameter of any pointer type can be passed one (see [`crate::KernelArg`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// This address plus `bytes`.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }

    /// True for the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A handle to one visible GPU. Cheap to copy; usable from any thread (each call makes the
/// device current on the calling thread first).
#[derive(Clone, Copy)]
pub struct Device {
    pub(crate) api: &'static dyn GpuApi,
    pub(crate) ordinal: i32,
    platform: PlatformKind,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("platform", &self.platform)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

/// Everything the project asks about a device, read in one go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttributes {
    /// Marketing name, e.g. `NVIDIA H200` or `AMD Radeon Graphics`.
    pub name: String,
    /// Compiler architecture: `gfx1151`, `sm_90`, or `None` when it cannot be told (then hiprtc
    /// compiles for the current device by itself).
    pub arch: Option<String>,
    /// Device memory size in bytes (on UMA APUs: the carve-out the runtime reports).
    pub total_memory: u64,
    /// Integrated GPU sharing system memory (UMA APU such as Strix Halo).
    pub integrated: bool,
    /// Threads per warp/wavefront: 32 on NVIDIA and RDNA, 64 on CDNA/GCN.
    pub warp_size: u32,
    /// Streaming multiprocessors / compute units.
    pub multiprocessor_count: u32,
    /// `hipMallocManaged` works.
    pub managed_memory: bool,
    /// The device can access pageable host memory coherently without registration.
    pub pageable_memory_access: bool,
    /// Host and device can touch managed memory concurrently.
    pub concurrent_managed_access: bool,
    /// Host memory can be mapped into the device address space.
    pub can_map_host_memory: bool,
    /// Stream-ordered allocation (`hipMallocAsync`) is supported.
    pub async_alloc: bool,
    /// Largest block.
    pub max_threads_per_block: u32,
    /// Shared (LDS) memory per block, bytes.
    pub max_shared_memory_per_block: u32,
    /// PCI location.
    pub pci: PciLocation,
    /// Compute capability (NVIDIA) or gfx major/minor (AMD).
    pub compute_capability: (u32, u32),
}

/// `mem_get_info` figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Free device memory in bytes, never more than `total`.
    pub free: u64,
    /// Total device memory in bytes.
    pub total: u64,
    /// GTT of an integrated AMD device, when sysfs shows it.
    pub gtt: Option<GttInfo>,
}

impl MemInfo {
    /// Builds the figures, clamping `free` to `total` (some UMA drivers report more free than
    /// total, counting GTT in one and not the other).
    pub fn new(free: u64, total: u64, gtt: Option<GttInfo>) -> MemInfo {
        MemInfo {
            free: free.min(total),
            total,
            gtt,
        }
    }
}

fn to_u32(op: &'static str, value: i32) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        HipError::host(
            op,
            ErrorKind::Other,
            format!("runtime returned negative {value}"),
        )
    })
}

impl Device {
    pub(crate) fn new(api: &'static dyn GpuApi, ordinal: i32, platform: PlatformKind) -> Device {
        Device {
            api,
            ordinal,
            platform,
        }
    }

    /// The runtime's ordinal of this device (after `*_VISIBLE_DEVICES` filtering).
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// AMD or NVIDIA.
    pub fn platform(&self) -> PlatformKind {
        self.platform
    }

    /// Marketing name.
    pub fn name(&self) -> Result<String> {
        self.api.device_name(self.ordinal)
    }

    /// Compiler architecture (`gfx1151`, `sm_90`), when it can be told.
    pub fn arch(&self) -> Result<Option<String>> {
        self.api.arch_name(self.ordinal)
    }

    /// Whether kernels can be launched with programmatic dependent launch: NVIDIA devices of
    /// compute capability 9.0 and later. HIP has no such launch.
    pub fn supports_programmatic_launch(&self) -> Result<bool> {
        Ok(self.platform == PlatformKind::Nvidia && self.count(Attr::ComputeCapabilityMajor)? >= 9)
    }

    /// Device memory size in bytes.
    pub fn total_memory(&self) -> Result<u64> {
        self.api.total_memory(self.ordinal)
    }

    fn flag(&self, attr: Attr) -> Result<bool> {
        Ok(self.api.attribute(self.ordinal, attr)? != 0)
    }

    fn count(&self, attr: Attr) -> Result<u32> {
        to_u32(
            "hipDeviceGetAttribute",
            self.api.attribute(self.ordinal, attr)?,
        )
    }

    /// Integrated (UMA) GPU.
    pub fn is_integrated(&self) -> Result<bool> {
        self.flag(Attr::Integrated)
    }

    /// Threads per warp/wavefront.
    pub fn warp_size(&self) -> Result<u32> {
        self.count(Attr::WarpSize)
    }

    /// Streaming multiprocessors / compute units.
    pub fn multiprocessor_count(&self) -> Result<u32> {
        self.count(Attr::MultiprocessorCount)
    }

    /// Managed (unified) memory allocation is supported.
    pub fn supports_managed_memory(&self) -> Result<bool> {
        self.flag(Attr::ManagedMemory)
    }

    /// The device can access pageable host memory coherently.
    pub fn supports_pageable_memory_access(&self) -> Result<bool> {
        self.flag(Attr::PageableMemoryAccess)
    }

    /// Stream-ordered allocation (`malloc_async`) is supported.
    pub fn supports_async_alloc(&self) -> Result<bool> {
        self.flag(Attr::MemoryPoolsSupported)
    }

    /// PCI location.
    pub fn pci_location(&self) -> Result<PciLocation> {
        Ok(PciLocation {
            domain: self.count(Attr::PciDomainId)?,
            bus: self.count(Attr::PciBusId)?,
            device: self.count(Attr::PciDeviceId)?,
        })
    }

    /// Every attribute in [`DeviceAttributes`].
    pub fn attributes(&self) -> Result<DeviceAttributes> {
        Ok(DeviceAttributes {
            name: self.name()?,
            arch: self.arch()?,
            total_memory: self.total_memory()?,
            integrated: self.is_integrated()?,
            warp_size: self.warp_size()?,
            multiprocessor_count: self.multiprocessor_count()?,
            managed_memory: self.supports_managed_memory()?,
            pageable_memory_access: self.supports_pageable_memory_access()?,
            concurrent_managed_access: self.flag(Attr::ConcurrentManagedAccess)?,
            can_map_host_memory: self.flag(Attr::CanMapHostMemory)?,
            async_alloc: self.supports_async_alloc()?,
            max_threads_per_block: self.count(Attr::MaxThreadsPerBlock)?,
            max_shared_memory_per_block: self.count(Attr::MaxSharedMemoryPerBlock)?,
            pci: self.pci_location()?,
            compute_capability: (
                self.count(Attr::ComputeCapabilityMajor)?,
                self.count(Attr::ComputeCapabilityMinor)?,
            ),
        })
    }

    /// Free and total device memory; free is clamped to total. On integrated AMD devices the
    /// GTT size from sysfs is added when readable.
    pub fn mem_get_info(&self) -> Result<MemInfo> {
        let (free, total) = self.api.mem_get_info(self.ordinal)?;
        let gtt = if self.platform == PlatformKind::Amd && self.is_integrated()? {
            sysfs::gtt_info(Path::new(sysfs::PCI_DEVICES), self.pci_location()?)
        } else {
            None
        };
        Ok(MemInfo::new(free, total, gtt))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.api.synchronize_device(self.ordinal)
    }

    /// Allocates `bytes` of device memory and returns the bare pointer (for allocators that
    /// manage lifetimes themselves). Zero bytes is rejected.
    pub fn malloc_raw(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(HipError::host(
                "hipMalloc",
                ErrorKind::InvalidArgument,
                "zero-byte allocation requested",
            ));
        }
        self.api.malloc(self.ordinal, bytes).map(DevicePtr)
    }

    /// The size device memory is mapped in when this device can back a reserved address
    /// range piece by piece (virtual memory management), or `None` where it cannot.
    pub fn map_granularity(&self) -> Result<Option<u64>> {
        self.api.map_granularity(self.ordinal)
    }

    /// Reserves `bytes` of address space (a multiple of [`Device::map_granularity`]), backed by
    /// no memory until [`Device::map_new_raw`] maps some into it.
    pub fn reserve_address_raw(&self, bytes: usize) -> Result<DevicePtr> {
        self.check_granular("hipMemAddressReserve", bytes)?;
        self.api.address_reserve(self.ordinal, bytes).map(DevicePtr)
    }

    /// Returns a reservation from [`Device::reserve_address_raw`].
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is the whole reservation, nothing is mapped in it any more, and
    /// nothing uses it afterwards.
    pub unsafe fn free_address_raw(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.api.address_free(self.ordinal, ptr.0, bytes) }
    }

    /// Creates `bytes` of device memory (a multiple of the granularity) and maps it at `ptr`,
    /// readable and writable by this device; the handle goes to [`Device::unmap_raw`].
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` lies inside one reservation of this device and nothing is mapped
    /// there.
    pub unsafe fn map_new_raw(&self, ptr: DevicePtr, bytes: usize) -> Result<RawHandle> {
        self.check_granular("hipMemCreate", bytes)?;
        // SAFETY: forwarded contract.
        unsafe { self.api.map_new(self.ordinal, ptr.0, bytes) }
    }

    /// Unmaps what [`Device::map_new_raw`] mapped and releases its memory (synchronous with
    /// respect to the device's use of it only as the caller guarantees below).
    ///
    /// # Safety
    /// `ptr`, `bytes` and `handle` are exactly one `map_new_raw`'s, unmapped once, and no
    /// queued or later work touches the range.
    pub unsafe fn unmap_raw(&self, ptr: DevicePtr, bytes: usize, handle: RawHandle) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.api.unmap_release(self.ordinal, ptr.0, bytes, handle) }
    }

    /// Refuses a size of zero, or one that is not a multiple of the granularity (or on a
    /// device that maps no memory piece by piece), before the runtime sees it.
    fn check_granular(&self, op: &'static str, bytes: usize) -> Result<()> {
        let Some(granularity) = self.map_granularity()? else {
            return Err(HipError::host(
                op,
                ErrorKind::NotSupported,
                "this device cannot map memory into reserved address ranges",
            ));
        };
        if bytes == 0 || !(bytes as u64).is_multiple_of(granularity) {
            return Err(HipError::host(
                op,
                ErrorKind::InvalidArgument,
                format!("{bytes} bytes is not a whole number of {granularity}-byte pieces"),
            ));
        }
        Ok(())
    }

    /// Frees a pointer from [`Device::malloc_raw`] (synchronous: waits for the device).
    ///
    /// # Safety
    /// `ptr` came from `malloc_raw` on this device, is freed once, and no queued or later work
    /// uses it.
    pub unsafe fn free_raw(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.api.free(self.ordinal, ptr.0) }
    }
}

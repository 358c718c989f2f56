//! AMD: HIP's virtual memory management entry points (`hipMemAddressReserve`, `hipMemCreate`,
//! `hipMemMap` and their partners), looked up in the same `libamdhip64` as the rest.
//!
//! They are declared here by hand, with the two structs they take, because the committed
//! bindings in [`crate::sys`] were generated from Debian's HIP 5.2 headers with an allowlist
//! that predates them, and this project's build machines have no HIP headers to regenerate
//! from. The layouts follow `hip_runtime_api.h` of ROCm 6 (the same as CUDA's
//! `CUmemAllocationProp` and `CUmemAccessDesc`); the size checks below pin them. A runtime
//! without these symbols (ROCm before 5.3) leaves every field `None`, and the caller reports
//! the device as unable to map memory piece by piece.

use std::ffi::c_void;

/// `hipMemLocationType::hipMemLocationTypeDevice`.
pub(crate) const LOCATION_DEVICE: u32 = 1;
/// `hipMemAllocationType::hipMemAllocationTypePinned`.
pub(crate) const ALLOCATION_PINNED: u32 = 1;
/// `hipMemAccessFlags::hipMemAccessFlagsProtReadWrite`.
pub(crate) const ACCESS_READ_WRITE: u32 = 3;
/// `hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum`.
pub(crate) const GRANULARITY_MINIMUM: u32 = 0;

/// `hipMemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemLocation {
    pub kind: u32,
    pub id: i32,
}

/// `hipMemAllocationProp`: type, requested handle type, location, a Win32 pointer, and four
/// bytes of flags (padded to eight).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AllocationProp {
    pub kind: u32,
    pub handle_type: u32,
    pub location: MemLocation,
    pub win32_metadata: *mut c_void,
    pub compression: u8,
    pub rdma_capable: u8,
    pub usage: u16,
}

/// `hipMemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

const _: () = assert!(std::mem::size_of::<AllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<AccessDesc>() == 12);

impl AllocationProp {
    /// Plain device memory of device `id`.
    pub(crate) fn device(id: i32) -> AllocationProp {
        AllocationProp {
            kind: ALLOCATION_PINNED,
            handle_type: 0,
            location: MemLocation {
                kind: LOCATION_DEVICE,
                id,
            },
            win32_metadata: std::ptr::null_mut(),
            compression: 0,
            rdma_capable: 0,
            usage: 0,
        }
    }
}

type Status = i32;
/// `hipMemGenericAllocationHandle_t`: an opaque pointer.
pub(crate) type Handle = *mut c_void;

pub(crate) type GranularityFn =
    unsafe extern "C" fn(*mut usize, *const AllocationProp, u32) -> Status;
pub(crate) type ReserveFn =
    unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> Status;
pub(crate) type AddressFreeFn = unsafe extern "C" fn(*mut c_void, usize) -> Status;
pub(crate) type CreateFn =
    unsafe extern "C" fn(*mut Handle, usize, *const AllocationProp, u64) -> Status;
pub(crate) type ReleaseFn = unsafe extern "C" fn(Handle) -> Status;
pub(crate) type MapFn = unsafe extern "C" fn(*mut c_void, usize, usize, Handle, u64) -> Status;
pub(crate) type UnmapFn = unsafe extern "C" fn(*mut c_void, usize) -> Status;
pub(crate) type SetAccessFn =
    unsafe extern "C" fn(*mut c_void, usize, *const AccessDesc, usize) -> Status;

/// The entry points, all present or none.
pub(crate) struct VmmCalls {
    pub granularity: GranularityFn,
    pub reserve: ReserveFn,
    pub address_free: AddressFreeFn,
    pub create: CreateFn,
    pub release: ReleaseFn,
    pub map: MapFn,
    pub unmap: UnmapFn,
    pub set_access: SetAccessFn,
    /// Keeps the library (already loaded by the runtime's loader) mapped while these are held.
    _library: libloading::Library,
}

impl VmmCalls {
    /// Looks the entry points up in the runtime at `path`; `None` if any is missing.
    pub(crate) fn load(path: &str) -> Option<VmmCalls> {
        // SAFETY: the library is the HIP runtime the caller has already loaded, so opening it
        // again only takes another reference; its initialisers have run.
        let library = unsafe { libloading::Library::new(path) }.ok()?;
        // SAFETY: each symbol is declared with the signature of ROCm 6's header.
        unsafe {
            Some(VmmCalls {
                granularity: *library.get(b"hipMemGetAllocationGranularity\0").ok()?,
                reserve: *library.get(b"hipMemAddressReserve\0").ok()?,
                address_free: *library.get(b"hipMemAddressFree\0").ok()?,
                create: *library.get(b"hipMemCreate\0").ok()?,
                release: *library.get(b"hipMemRelease\0").ok()?,
                map: *library.get(b"hipMemMap\0").ok()?,
                unmap: *library.get(b"hipMemUnmap\0").ok()?,
                set_access: *library.get(b"hipMemSetAccess\0").ok()?,
                _library: library,
            })
        }
    }
}

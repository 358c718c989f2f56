//! HIP runtime API for hipdecode: bindings loaded at run time, a checked result layer and safe
//! RAII types.
//!
//! On AMD it loads `libamdhip64` and hiprtc; on NVIDIA it serves the same HIP-shaped API
//! through the CUDA driver API (via cudarc's `cuda-13000` bindings; CUDA 12.0 drivers and newer)
//! and NVRTC, which is how the project is tested. Layers:
//!
//! * [`sys`]: raw bindgen output (the committed HIP 5.2 bindings, or with the
//!   `generate-bindings` feature, generated at build time from installed HIP headers).
//! * `ffi` (private): the only module with foreign calls; one `check` per runtime and per
//!   compiler turns status codes into [`HipError`]. It imports only what lies below it
//!   ([`sys`], [`error`], [`knobs`], [`sysfs`] and [`PlatformKind`]), never the safe layer.
//! * the safe layer: [`Platform`], [`Device`], [`Stream`], [`Event`], [`DeviceBuffer`],
//!   [`PinnedHostBuffer`], [`HostRegistration`], [`ManagedBuffer`], [`Module`], [`Function`]
//!   with [`LaunchBuilder`], [`Graph`], [`GraphExec`], and [`rtc::Compiler`], which compiles
//!   kernels without a GPU.
//! * [`Device::process_memory`] ([`process_memory`]): the process's device memory as
//!   nvidia-smi (NVML, loaded at run time like the runtimes) or rocm-smi (amdkfd's sysfs) list
//!   it, the runtime's context included.
//! * `testing` (behind the `testing` feature, for tests only): `device_or_skip` for GPU tests
//!   (`HIPDECODE_REQUIRE_GPU=1` turns skips into failures).
//!
//! ```no_run
//! use hip_ffi::{DeviceBuffer, Platform};
//! let device = Platform::detect().device(0)?;
//! let mut buf = DeviceBuffer::alloc(&device, 16)?;
//! buf.copy_from_host(&[1u32, 2, 3, 4])?;
//! assert_eq!(buf.to_host_vec::<u32>()?, vec![1, 2, 3, 4]);
//! # Ok::<(), hip_ffi::HipError>(())
//! ```

pub mod blas;
pub mod device;
mod device_copy;
pub mod error;
mod ffi;
pub mod graph;
pub mod knobs;
mod loaded_module;
pub mod memory;
pub mod module;
pub mod platform;
mod platform_kind;
pub mod process_memory;
pub mod rtc;
pub mod stream;
pub mod sys;
pub mod sysfs;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use blas::{BlasLt, GemmPlan, GemmShape};
pub use device::{Device, DeviceAttributes, DevicePtr, MemInfo};
pub use error::{Api, ErrorKind, HipError, Result};
pub use ffi::{FunctionResources, RawHandle};
pub use graph::{Graph, GraphExec};
pub use memory::{DeviceBuffer, DeviceCopy, HostRegistration, ManagedBuffer, PinnedHostBuffer};
pub use module::{
    device_compile_options, Function, KernelArg, LaunchBuilder, LaunchConfig, Module,
};
pub use platform::{Platform, PlatformKind, Visibility};
pub use process_memory::ProcessMemory;
pub use rtc::Compiler;
pub use stream::{Event, Stream};
pub use sysfs::{GttInfo, PciLocation};

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

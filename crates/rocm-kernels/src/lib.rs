//! HIP C++ kernels for hipdecode, compiled at run time (hiprtc on AMD, NVRTC on NVIDIA) through
//! `hip-ffi`, with a disk cache and a CPU reference for every op.
//!
//! * [`source`]: the table of kernel modules: each module's source file and entry points. Every
//!   source starts with `kernels/portability.h`, the only place where HIP and CUDA differ.
//! * [`code_object`]: what each kernel of an AMD code object asks of the hardware (registers,
//!   spills, LDS, scratch, the block size it was compiled for) and the rules it is held to.
//! * [`launch_bounds`]: the largest block each kernel is launched with, which its
//!   `__launch_bounds__` declares.
//! * [`cache`]: compiled code objects on disk, keyed by source hash, architecture, compiler
//!   version and flags; the folder is `$HIPDECODE_KERNEL_CACHE` (`off` disables it), else the
//!   user's cache folder.
//! * [`Kernels`]: every module compiled and loaded for one device.
//! * [`mma`]: which implementation of the matrix-core layer (`kernels/mma.h`) a device gets.
//! * [`view`]: typed views of device memory that the launch wrappers take.
//! * [`ops`]: one safe launch wrapper per op; shapes are checked against the views.
//! * [`reference`](mod@reference): the CPU reference of every op, which the GPU tests compare against.
//! * [`selftest`]: every kernel against its reference at small shapes; the table the GPU tests
//!   run and `hipdecode selftest` runs on a user's GPU.

pub mod cache;
pub mod code_object;
pub mod error;
pub mod kernels;
pub mod knobs;
pub mod launch_bounds;
pub mod mma;
pub mod ops;
pub mod reference;
pub mod selftest;
pub mod source;
pub mod view;

pub use error::{KernelError, Result};
pub use kernels::{KernelUsage, Kernels};
pub use source::KernelModule;
pub use view::{DeviceSlice, DeviceSliceMut};

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

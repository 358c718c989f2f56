//! Run-time kernel compilation (hiprtc on AMD, NVRTC on NVIDIA), modules and launches.
//!
//! Kernel sources are written in the subset HIP and CUDA share: `extern "C" __global__`
//! functions, `blockIdx`/`threadIdx`/`blockDim`, `__shared__`, `__syncthreads()`. The compiler
//! gets the device's architecture (`--offload-arch=gfx…` / `--gpu-architecture=sm_XY`) and
//! `-DWARP_SIZE=<n>` from the device attribute, so sources never hard-code 32 or 64.

use crate::backend::RawHandle;
use crate::device::Device;
use crate::error::{ErrorKind, HipError, Result};
use crate::rtc::Compiler;
use crate::stream::Stream;
use std::ffi::c_void;

/// The compiler options derived from the device: architecture and warp size (see
/// [`crate::rtc::target_options`]).
pub fn device_compile_options(device: &Device) -> Result<Vec<String>> {
    Ok(crate::rtc::target_options(
        device.platform(),
        device.arch()?.as_deref(),
        device.warp_size()?,
    ))
}

impl Device {
    /// Compiles `source` for this device and returns the code object (HSACO on AMD, CUBIN on
    /// NVIDIA), e.g. for a disk cache. Goes through [`Compiler`] with the device's architecture
    /// and warp size; `extra_options` follow those.
    pub fn compile(&self, source: &str, name: &str, extra_options: &[String]) -> Result<Vec<u8>> {
        Compiler::load(self.platform())?.compile_for(
            source,
            name,
            self.arch()?.as_deref(),
            self.warp_size()?,
            extra_options,
        )
    }

    /// Loads a code object produced by [`Device::compile`] for this device.
    pub fn load_module(&self, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(HipError::host(
                "hipModuleLoadData",
                ErrorKind::InvalidArgument,
                "empty code object",
            ));
        }
        let handle = self.api.module_load(self.ordinal, image)?;
        Ok(Module {
            device: *self,
            handle,
        })
    }

    /// Compiles and loads in one step.
    pub fn compile_module(
        &self,
        source: &str,
        name: &str,
        extra_options: &[String],
    ) -> Result<Module> {
        let image = self.compile(source, name, extra_options)?;
        self.load_module(&image)
    }
}

/// A loaded code object; unloaded on drop (its functions borrow it).
#[derive(Debug)]
pub struct Module {
    device: Device,
    handle: RawHandle,
}

impl Module {
    /// Looks up an `extern "C"` kernel by name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        // SAFETY: the module is live while `self` is.
        let handle = unsafe {
            self.device
                .api
                .module_function(self.device.ordinal, self.handle, name)
        }?;
        Ok(Function {
            module: self,
            handle,
            name: name.to_string(),
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module is live and unloaded once; functions borrow it, so none remain.
        let result = unsafe {
            self.device
                .api
                .module_unload(self.device.ordinal, self.handle)
        };
        if let Err(e) = result {
            tracing::warn!("unloading a module failed: {e}");
        }
    }
}

/// Grid and block shape plus dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks per grid (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch covering `n` items with `block` threads per block.
    pub fn for_elements(n: u32, block: u32) -> LaunchConfig {
        let block = block.max(1);
        LaunchConfig {
            grid: [n.div_ceil(block).max(1), 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
        }
    }
}

/// A kernel in a loaded module.
#[derive(Debug)]
pub struct Function<'m> {
    module: &'m Module,
    handle: RawHandle,
    name: String,
}

/// The pointer a launch wants for one argument: the address of the value.
pub fn kernel_arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

impl Function<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues the kernel on `stream` (`hipModuleLaunchKernel`).
    ///
    /// # Safety
    /// `args` holds one pointer per kernel parameter (see [`kernel_arg`]), in order, each
    /// pointing to a live value of exactly the parameter's type; device pointers passed in
    /// must stay valid until the kernel has run; the kernel must not access memory out of the
    /// bounds of what it was given.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        stream: &Stream,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if config.grid.contains(&0) || config.block.contains(&0) {
            return Err(HipError::host(
                "hipModuleLaunchKernel",
                ErrorKind::InvalidArgument,
                format!(
                    "kernel `{}`: grid {:?} and block {:?} must have no zero dimension",
                    self.name, config.grid, config.block
                ),
            ));
        }
        let device = &self.module.device;
        // SAFETY: function and stream are live; the caller guarantees the arguments.
        unsafe {
            device.api.launch(
                device.ordinal,
                self.handle,
                config.grid,
                config.block,
                config.shared_bytes,
                stream.raw(),
                args.as_mut_ptr(),
            )
        }
        .map_err(|e| e.with_detail(format!("kernel `{}`", self.name)))
    }
}

//! Loaded code objects ([`Module`]), their kernels ([`Function`]) and typed launches
//! ([`LaunchBuilder`]).
//!
//! Kernel sources are written in the subset HIP and CUDA share: `extern "C" __global__`
//! functions, `blockIdx`/`threadIdx`/`blockDim`, `__shared__`, `__syncthreads()`. The compiler
//! gets the device's architecture (`--offload-arch=gfx…` / `--gpu-architecture=sm_XY`) and
//! `-DWARP_SIZE=<n>` from the device attribute, so sources never hard-code 32 or 64.
//!
//! Lifetimes: a loaded module is shared by its [`Module`] handle and every [`Function`] taken
//! from it (reference counted), and a stream that is capturing keeps the modules of the kernels
//! launched on it, handing them to the graph. The module is unloaded when the last of those goes;
//! the unload first waits for the whole device (one `hipDeviceSynchronize`), because kernels of
//! the module may still be queued or running on any stream. Modules normally live until
//! teardown, so this costs one device synchronisation per module at shutdown. Do not drop the
//! last handle of a module while a stream of this thread is capturing: synchronising the device
//! is not allowed then, the unload is logged as failed and the capture is invalidated.

use crate::device::{Device, DevicePtr};
use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::RawHandle;
use crate::loaded_module::LoadedModule;
use crate::rtc::Compiler;
use crate::stream::Stream;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

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
            inner: Arc::new(LoadedModule {
                device: *self,
                handle,
            }),
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

/// A loaded code object. Cheap to clone (the clones share it); it stays loaded while this
/// handle, a [`Function`] from it, or a graph that captured one of its kernels exists.
#[derive(Clone, Debug)]
pub struct Module {
    inner: Arc<LoadedModule>,
}

impl Module {
    /// Looks up an `extern "C"` kernel by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        // SAFETY: the module is live while `self.inner` is.
        let handle = unsafe {
            self.inner.device.api.module_function(
                self.inner.device.ordinal,
                self.inner.handle,
                name,
            )
        }?;
        Ok(Function {
            module: Arc::clone(&self.inner),
            handle,
            name: Arc::from(name),
            programmatic: false,
        })
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
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

/// A kernel in a loaded module. Holds its module loaded; cheap to clone; usable from any thread.
#[derive(Clone, Debug)]
pub struct Function {
    module: Arc<LoadedModule>,
    handle: RawHandle,
    name: Arc<str>,
    /// Launched with programmatic dependent launch; see
    /// [`Function::with_programmatic_dependency`].
    programmatic: bool,
}

mod sealed {
    pub trait Sealed {}
}

/// A value that can be passed to a kernel parameter of the same C type: the primitive integers
/// and floats (`unsigned int` is `u32`, `float` is `f32`, …) and [`DevicePtr`] for any `T*`.
/// Sealed: only plain-old-data types whose layout is the C type's.
pub trait KernelArg: sealed::Sealed {}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelArg for $t {}
    )*};
}
kernel_arg!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, DevicePtr);

/// The arguments of one kernel launch, collected in order; see [`Function::builder`].
///
/// Each argument is borrowed for `'a`, so the values a launch reads stay alive and unchanged
/// until the launch has been queued (the runtime copies them then).
#[derive(Debug)]
pub struct LaunchBuilder<'a> {
    function: &'a Function,
    stream: &'a Stream,
    args: Vec<*mut c_void>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> LaunchBuilder<'a> {
    /// Appends the next kernel argument.
    pub fn arg<T: KernelArg>(&mut self, value: &'a T) -> &mut Self {
        // The runtime reads `size_of::<T>()` bytes through this pointer and never writes.
        self.args.push(value as *const T as *mut c_void);
        self
    }

    /// Queues the kernel on the stream (`hipModuleLaunchKernel` / `cuLaunchKernel`) with the
    /// arguments given so far. A grid or block with a zero dimension is refused. The builder
    /// can launch again (same arguments) or be dropped.
    ///
    /// # Safety
    /// * The arguments match the kernel's parameter list exactly: same count, same order, and
    ///   each of the parameter's C type (`unsigned int` ↔ `u32`, `float` ↔ `f32`, `T*` ↔
    ///   [`DevicePtr`]).
    /// * Every device pointer passed is valid for everything the kernel reads and writes
    ///   through it, and stays allocated (not freed or reused) until the kernel has finished.
    /// * `config` gives the kernel what it assumes (shared memory size, block shape), and the
    ///   kernel stays in bounds for the sizes it is given.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<()> {
        let function = self.function;
        if config.grid.contains(&0) || config.block.contains(&0) {
            return Err(HipError::host(
                "hipModuleLaunchKernel",
                ErrorKind::InvalidArgument,
                format!(
                    "kernel `{}`: grid {:?} and block {:?} must have no zero dimension",
                    function.name, config.grid, config.block
                ),
            ));
        }
        let device = &function.module.device;
        // SAFETY: the function is live (its module is held by `function.module`), the stream is
        // live while borrowed, each argument pointer points to a live value borrowed for `'a`,
        // and the caller guarantees they match the kernel's parameters.
        unsafe {
            device.api.launch(
                device.ordinal,
                function.handle,
                config.grid,
                config.block,
                config.shared_bytes,
                self.stream.raw(),
                self.args.as_mut_ptr(),
                function.programmatic,
            )
        }
        .map_err(|e| e.with_detail(format!("kernel `{}`", function.name)))?;
        self.stream.keep_alive_if_capturing(&function.module);
        Ok(())
    }
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kernel's registers, local and static shared memory as the driver reports them
    /// (`cuFuncGetAttribute`); `None` on AMD, where the code object's metadata says it.
    pub fn resources(&self) -> Result<Option<crate::ffi::FunctionResources>> {
        let device = &self.module.device;
        // SAFETY: the function is live: its module is held by `self.module`.
        unsafe { device.api.function_resources(device.ordinal, self.handle) }
            .map_err(|e| e.with_detail(format!("kernel `{}`", self.name)))
    }

    /// This kernel, launched from now on with programmatic dependent launch: the launch may
    /// begin while the kernel ahead of it on the stream is still running, which hides most of
    /// the gap between two dependent kernels. Call it only where
    /// [`Device::supports_programmatic_launch`] says so; on AMD the flag is ignored.
    ///
    /// # Safety
    /// Every thread of the kernel waits for the grid ahead of it (PTX `griddepcontrol.wait`)
    /// before it reads or writes any memory that grid may touch, and before it can exit (a
    /// thread that exited early would let the kernel finish before its predecessor, and the
    /// kernel after it would no longer wait for both).
    pub unsafe fn with_programmatic_dependency(mut self) -> Function {
        self.programmatic = true;
        self
    }

    /// Starts a launch of this kernel on `stream`: add arguments with [`LaunchBuilder::arg`],
    /// then [`LaunchBuilder::launch`].
    ///
    /// ```no_run
    /// # use hip_ffi::{DeviceBuffer, LaunchConfig, Platform, Stream};
    /// # let device = Platform::detect().device(0)?;
    /// # let module = device.compile_module("extern \"C\" __global__ void k(float*, unsigned int) {}", "k.cu", &[])?;
    /// let kernel = module.function("k")?;
    /// let stream = Stream::new(&device)?;
    /// let buffer = DeviceBuffer::alloc(&device, 1024 * 4)?;
    /// let (ptr, n) = (buffer.ptr(), 1024u32);
    /// let mut launch = kernel.builder(&stream);
    /// launch.arg(&ptr).arg(&n);
    /// // SAFETY: (float*, unsigned int) matches `k`; the buffer outlives the synchronize.
    /// unsafe { launch.launch(LaunchConfig::for_elements(n, 256)) }?;
    /// stream.synchronize()?;
    /// # Ok::<(), hip_ffi::HipError>(())
    /// ```
    pub fn builder<'a>(&'a self, stream: &'a Stream) -> LaunchBuilder<'a> {
        LaunchBuilder {
            function: self,
            stream,
            args: Vec::new(),
            _borrows: PhantomData,
        }
    }

    /// The shared module state, for graphs that must keep it loaded.
    pub(crate) fn loaded_module(&self) -> &Arc<LoadedModule> {
        &self.module
    }
}

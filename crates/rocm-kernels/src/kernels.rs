//! Every kernel module compiled (through the disk cache) and loaded for one device.
//!
//! OWNER: infra engineer (E1). The signatures below are the contract the op wrappers in
//! `crate::ops` are written against; keep them stable.

use crate::cache::KernelCache;
use crate::error::Result;
use crate::source::KernelModule;
use hip_ffi::{Device, Function};

/// The loaded kernels of one device.
pub struct Kernels {
    device: Device,
    wave_size: u32,
    functions: std::collections::HashMap<(KernelModule, &'static str), Function>,
}

impl Kernels {
    /// Compiles (or takes from `cache`) and loads every module in [`KernelModule::ALL`] for
    /// `device`, and looks up each module's entry points.
    pub fn load(device: &Device, cache: &KernelCache) -> Result<Kernels> {
        let _ = (device, cache);
        todo!("E1")
    }

    /// The device the kernels were loaded for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device's wave (warp) size the kernels were compiled for: 32 or 64.
    pub fn wave_size(&self) -> u32 {
        self.wave_size
    }

    /// The entry point `name` of `module`; an error naming both when it does not exist.
    pub(crate) fn function(&self, module: KernelModule, name: &'static str) -> Result<&Function> {
        let _ = (&self.functions, module, name);
        todo!("E1")
    }
}

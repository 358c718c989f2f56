//! [`LoadedModule`], the reference-counted code object behind [`crate::Module`]. A module of its
//! own because a capturing [`crate::Stream`] keeps the modules of the kernels launched on it,
//! while launches (in [`crate::module`]) are queued on streams: kept with either, it would tie the
//! two into a ring.

use crate::device::Device;
use crate::ffi::RawHandle;

/// The loaded code object itself, shared by its [`crate::Module`], its [`crate::Function`]s, capturing
/// streams and graphs; unloaded when the last of them lets go.
#[derive(Debug)]
pub(crate) struct LoadedModule {
    pub(crate) device: Device,
    pub(crate) handle: RawHandle,
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // Kernels of this module may still be queued or running on any stream; unloading under
        // them is undefined behaviour, so wait for the whole device first.
        if let Err(e) = self.device.synchronize() {
            tracing::warn!("synchronising before a module unload failed: {e}");
        }
        // SAFETY: no handle to the module remains (this is the last owner) and, after the
        // device synchronisation, no kernel of it is queued or running.
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

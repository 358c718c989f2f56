//! Stream capture into a graph, instantiation and replay.
//!
//! A graph records kernel launches with their arguments by value, device pointers included, so
//! a replay touches the same addresses as the captured work did. What a graph keeps alive:
//! the modules of kernels launched through [`crate::LaunchBuilder`] on the capturing stream
//! (collected automatically) and of any [`Function`] handed to [`GraphExec::keep_alive`]
//! (kernels captured on other streams joined into the capture). What it cannot keep alive is
//! device memory: buffers are owned elsewhere (by the caller or an allocator), which is why
//! [`GraphExec::launch`] is `unsafe`.

use crate::device::Device;
use crate::error::Result;
use crate::ffi::RawHandle;
use crate::loaded_module::LoadedModule;
use crate::module::Function;
use crate::stream::Stream;
use std::sync::Arc;

/// A captured graph (`hipGraph_t`); destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    device: Device,
    handle: RawHandle,
    modules: Vec<Arc<LoadedModule>>,
    kernel_nodes: u64,
}

/// An instantiated graph ready to launch (`hipGraphExec_t`); destroyed on drop. Keeps the
/// modules of its kernels loaded.
#[derive(Debug)]
pub struct GraphExec {
    device: Device,
    handle: RawHandle,
    modules: Vec<Arc<LoadedModule>>,
}

impl Stream {
    /// Starts capturing the work queued on this stream (thread-local capture mode: other
    /// threads may keep using the runtime meanwhile). Nothing runs until the graph is launched.
    pub fn begin_capture(&self) -> Result<()> {
        // SAFETY: the stream is live while `self` is.
        unsafe {
            self.device()
                .api
                .begin_capture(self.device().ordinal, self.raw())
        }?;
        self.set_capturing(true);
        Ok(())
    }

    /// Ends the capture and returns what was recorded, with the modules of the kernels
    /// launched on this stream meanwhile.
    pub fn end_capture(&self) -> Result<Graph> {
        // SAFETY: the stream is live; a stream that is not capturing gets an error back.
        let ended = unsafe {
            self.device()
                .api
                .end_capture(self.device().ordinal, self.raw())
        };
        // The capture is over either way (a failed end also ends it).
        self.set_capturing(false);
        let modules = self.take_captured_modules();
        Ok(Graph {
            device: *self.device(),
            handle: ended?,
            modules,
            kernel_nodes: self.captured_launches(),
        })
    }
}

impl Graph {
    /// Kernel launches the capture recorded through [`crate::LaunchBuilder`] on the capturing
    /// stream (copies, memsets and work joined from other streams are not counted).
    pub fn kernel_nodes(&self) -> u64 {
        self.kernel_nodes
    }

    /// Instantiates the graph for launching.
    pub fn instantiate(&self) -> Result<GraphExec> {
        // SAFETY: the graph is live while `self` is.
        let handle = unsafe {
            self.device
                .api
                .graph_instantiate(self.device.ordinal, self.handle)
        }?;
        Ok(GraphExec {
            device: self.device,
            handle,
            modules: self.modules.clone(),
        })
    }
}

impl GraphExec {
    /// Keeps `function`'s module loaded for as long as this graph exists. Needed for kernels
    /// captured on streams other than the one `begin_capture` was called on (the capturing
    /// stream's own launches are recorded automatically).
    pub fn keep_alive(&mut self, function: &Function) {
        let module = function.loaded_module();
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(Arc::clone(module));
        }
    }

    /// Queues one replay of the graph on `stream`.
    ///
    /// # Safety
    /// Every device buffer the captured work reads or writes (the pointers in its kernel
    /// arguments, copies and memsets) is still allocated at the same address, has not been
    /// freed or handed to another owner, and is not used concurrently by other work in a way
    /// that would race with the replay; the graph must have been captured for this device.
    /// Modules of kernels captured on other streams are loaded (see [`GraphExec::keep_alive`]).
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live while their owners are; the memory the graph uses is
        // the caller's guarantee.
        unsafe {
            self.device
                .api
                .graph_launch(self.device.ordinal, self.handle, stream.raw())
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: live and destroyed once; instantiated execs do not depend on it.
        let result = unsafe {
            self.device
                .api
                .graph_destroy(self.device.ordinal, self.handle)
        };
        if let Err(e) = result {
            tracing::warn!("destroying a graph failed: {e}");
        }
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: live and destroyed once. The runtime lets launched replays finish; the
        // modules (dropped after this) synchronise the device before they unload.
        let result = unsafe {
            self.device
                .api
                .graph_exec_destroy(self.device.ordinal, self.handle)
        };
        if let Err(e) = result {
            tracing::warn!("destroying a graph exec failed: {e}");
        }
    }
}

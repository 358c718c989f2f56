//! Stream capture into a graph, instantiation and replay.

use crate::backend::RawHandle;
use crate::device::Device;
use crate::error::Result;
use crate::stream::Stream;

/// A captured graph (`hipGraph_t`); destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    device: Device,
    handle: RawHandle,
}

/// An instantiated graph ready to launch (`hipGraphExec_t`); destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    device: Device,
    handle: RawHandle,
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
        }
    }

    /// Ends the capture and returns what was recorded.
    pub fn end_capture(&self) -> Result<Graph> {
        // SAFETY: the stream is live; a stream that is not capturing gets an error back.
        let handle = unsafe {
            self.device()
                .api
                .end_capture(self.device().ordinal, self.raw())
        }?;
        Ok(Graph {
            device: *self.device(),
            handle,
        })
    }
}

impl Graph {
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
        })
    }
}

impl GraphExec {
    /// Queues one replay of the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live while their owners are.
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
        // SAFETY: live and destroyed once.
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

//! Weights kept in pinned host memory (offload): where they live, how decode splits their
//! products with the host's cores, and how they are streamed into device slots.

pub mod host_weights;
pub mod hybrid;
pub mod prefetch;
mod split;

use crate::backend::gpu::GpuBackend;
use crate::backend::MoeShape;
use crate::error::{DecodeError, Result};

impl GpuBackend {
    /// Copies a streamed weight whole into the next prefetch slot, ahead of the stream's use.
    pub(crate) fn stage_whole(&mut self, host: &[u8]) -> Result<prefetch::Staged> {
        let Some(p) = self.prefetch.as_mut() else {
            return Err(DecodeError::InvalidArgument(
                "a weight is planned to stream, but the prefetch slots are not reserved".into(),
            ));
        };
        // SAFETY: `host` is a model weight's pinned memory, alive as long as the backend (whose
        // drop waits for the device).
        unsafe { p.stage(&self.stream, host) }
    }
}

//! Weights the kernels read in place from host memory: the offload plan's zero-copy
//! placement.
//!
//! A weight named in the [`HostPlacement`] is copied into mapped pinned host memory
//! ([`PinnedHostBuffer`]) at load instead of into a device allocation, and the kernels get the
//! buffer's device address. Nothing else changes: every kernel takes a device address, and a
//! mapped pinned page is one, so the decode kernels, the MoE kernels (which index the stacked
//! expert tensor by expert id and so read only the selected experts' rows) and the vendor
//! GEMM's dequantization kernel all read these weights over the host link as they are.
//!
//! Pinned bytes cannot be swapped, so they are bounded like device memory: the placement
//! carries a host budget, a load that would exceed it is refused before pinning, and the
//! device report prints what is pinned.

use super::super::WeightSource;
use crate::error::{DecodeError, Result};
use hip_ffi::{Device, PinnedHostBuffer};
use rocm_alloc::{fmt_bytes, Allocation};
use std::collections::HashSet;

/// Which weights stay in host memory, and how much host memory they may pin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPlacement {
    /// Tensor names, as the model file spells them.
    pub names: HashSet<String>,
    /// The most bytes of weights that may be pinned.
    pub host_budget: u64,
}

/// Where a loaded weight's bytes are.
pub enum WeightMemory {
    /// A device allocation of the backend's allocator (tag `weights`).
    Device(Allocation),
    /// Mapped pinned host memory, read by the kernels over the host link. Dropping it frees
    /// with `hipHostFree` / `cuMemFreeHost`, which wait for the device's queued work, so a
    /// kernel still reading the weight finishes first (as `hipFree` does for device memory).
    Host(PinnedHostBuffer),
}

impl WeightMemory {
    /// The address kernels read.
    pub fn ptr(&self) -> u64 {
        match self {
            WeightMemory::Device(a) => a.ptr(),
            WeightMemory::Host(p) => p.device_ptr().0,
        }
    }

    /// Bytes held (the allocator's rounded size on the device, the exact size on the host).
    pub fn size(&self) -> u64 {
        match self {
            WeightMemory::Device(a) => a.size(),
            WeightMemory::Host(p) => p.len_bytes() as u64,
        }
    }
}

/// The backend's books of pinned weights.
#[derive(Default)]
pub(crate) struct HostWeights {
    placement: HostPlacement,
    pinned: u64,
    tensors: usize,
}

impl HostWeights {
    /// Replaces the placement (before any weight is loaded).
    pub(crate) fn set_placement(&mut self, placement: HostPlacement) -> Result<()> {
        if self.tensors > 0 {
            return Err(DecodeError::InvalidArgument(
                "a host placement must be set before the model's weights are loaded".into(),
            ));
        }
        self.placement = placement;
        Ok(())
    }

    /// `Some` with `bytes` pinned when the placement keeps `src` on the host, `None` when it
    /// goes to the device. `bytes` is what the backend stores: the file's blocks for a
    /// matrix, f32 values for a vector.
    pub(crate) fn place(
        &mut self,
        device: &Device,
        src: &WeightSource<'_>,
        bytes: &[u8],
    ) -> Result<Option<WeightMemory>> {
        if !self.placement.names.contains(src.name) {
            return Ok(None);
        }
        let after = self.pinned.saturating_add(bytes.len() as u64);
        if after > self.placement.host_budget {
            return Err(DecodeError::Allocation {
                what: format!("pinned host memory for weight '{}'", src.name),
                reason: format!(
                    "{} more would bring the pinned weights to {}, above the host budget of {}; \
                     raise the host budget (--host-budget or HIPDECODE_HOST_BUDGET), or raise \
                     the GPU budget so that fewer weights stay in host memory",
                    fmt_bytes(bytes.len() as u64),
                    fmt_bytes(after),
                    fmt_bytes(self.placement.host_budget)
                ),
            });
        }
        let pinned =
            PinnedHostBuffer::from_bytes(device, bytes).map_err(|e| DecodeError::Allocation {
                what: format!("pinned host memory for weight '{}'", src.name),
                reason: e.to_string(),
            })?;
        self.pinned = after;
        self.tensors += 1;
        Ok(Some(WeightMemory::Host(pinned)))
    }

    /// Bytes pinned for weights so far.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pinned
    }

    /// The device report's line, or nothing when no weight is on the host.
    pub(crate) fn report_line(&self) -> String {
        if self.tensors == 0 {
            return String::new();
        }
        format!(
            "pinned host: weights {} in {} tensors read in place (host budget {})\n",
            fmt_bytes(self.pinned),
            self.tensors,
            fmt_bytes(self.placement.host_budget)
        )
    }
}

/// A vector weight's f32 values as the bytes the device reads.
pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

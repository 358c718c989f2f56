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

use crate::backend::WeightSource;
use crate::error::{DecodeError, Result};
use hip_ffi::{Device, PinnedHostBuffer};
use offload::Placement;
use rocm_alloc::{fmt_bytes, Allocation};
use std::collections::HashMap;

/// Which weights stay in host memory, and how much host memory they may pin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPlacement {
    /// The plan's placement of each tensor kept in host memory, by the name the model file
    /// spells (a tensor not named here goes to the device): read in place, or streamed into
    /// device slots ahead of each decode product.
    pub placements: HashMap<String, Placement>,
    /// Bytes of one streaming slot: the largest streamed tensor (0 when none streams).
    pub stream_slot_bytes: u64,
    /// The bytes of the weights the plan keeps on the device, each counted as
    /// `super::weight_block::piece_bytes` rounds it: the backend takes them as one allocation
    /// (0: one allocation per weight).
    pub device_weight_bytes: u64,
    /// The most bytes of weights that may be pinned.
    pub host_budget: u64,
}

/// Where a loaded weight's bytes are.
pub enum WeightMemory {
    /// A device allocation of the backend's allocator (tag `weights`).
    Device(Allocation),
    /// `len` bytes at `offset` in the block that holds a budget run's device weights
    /// (`weight_block.rs`).
    Block {
        /// The shared block.
        block: std::sync::Arc<Allocation>,
        /// Where this weight starts in it.
        offset: u64,
        /// The weight's bytes.
        len: u64,
    },
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
            WeightMemory::Block { block, offset, .. } => block.ptr() + offset,
            WeightMemory::Host(p) => p.device_ptr().0,
        }
    }

    /// The weight's bytes (what it was given; the allocator's and the block's rounding is not
    /// counted, so a matrix view over it has the tensor's exact size).
    pub fn size(&self) -> u64 {
        match self {
            WeightMemory::Device(a) => a.size(),
            WeightMemory::Block { len, .. } => *len,
            WeightMemory::Host(p) => p.len_bytes() as u64,
        }
    }
}

/// The backend's books of pinned weights.
#[derive(Default)]
pub(crate) struct HostWeights {
    pub(crate) placement: HostPlacement,
    /// Whether a budget run set the placement (its host budget then bounds every pin).
    pub(crate) planned: bool,
    /// Bytes and tensors pinned for the placement's weights.
    pub(crate) pinned: u64,
    pub(crate) tensors: usize,
    /// Bytes and tensors pinned for lookup tables kept on the host whatever the placement
    /// (`HIPDECODE_GPU_EMBED_TABLE=host`). Apart from the placement's, since no product reads
    /// them: they neither split with the host's cores nor need the prefetch slots.
    pub(crate) lookup_pinned: u64,
    pub(crate) lookup_tensors: usize,
}

impl HostWeights {
    /// The plan's placement of weight `name`.
    pub(crate) fn placement_of(&self, name: &str) -> Placement {
        self.placement
            .placements
            .get(name)
            .copied()
            .unwrap_or(Placement::Device)
    }

    /// Bytes of one slot that decode streaming needs (0: nothing streams).
    pub(crate) fn stream_slot_bytes(&self) -> u64 {
        self.placement.stream_slot_bytes
    }

    /// Replaces the placement (before any weight is loaded).
    pub(crate) fn set_placement(&mut self, placement: HostPlacement) -> Result<()> {
        if self.tensors > 0 {
            return Err(DecodeError::InvalidArgument(
                "a host placement must be set before the model's weights are loaded".into(),
            ));
        }
        self.placement = placement;
        self.planned = true;
        Ok(())
    }

    /// Pins lookup table `src` (an embedding only looked up, never multiplied), which the
    /// backend keeps in host memory whatever the placement. Its bytes count against the host
    /// budget with the placement's: a budget run's plan already counted them (its request keeps
    /// lookup tables on the host); a run without one is bounded by `unplanned_budget` (the
    /// host budget's variable, or a share of available host memory), asked only then.
    pub(crate) fn place_lookup(
        &mut self,
        device: &Device,
        src: &WeightSource<'_>,
        unplanned_budget: impl FnOnce() -> Result<(u64, String)>,
    ) -> Result<WeightMemory> {
        self.admit_lookup(src.name, src.bytes.len() as u64, unplanned_budget)?;
        let pinned = PinnedHostBuffer::from_bytes(device, src.bytes).map_err(|e| {
            DecodeError::Allocation {
                what: format!("pinned host memory for the lookup table '{}'", src.name),
                reason: format!(
                    "{e}; keep the table on the device with HIPDECODE_GPU_EMBED_TABLE=device"
                ),
            }
        })?;
        self.lookup_pinned += src.bytes.len() as u64;
        self.lookup_tensors += 1;
        Ok(WeightMemory::Host(pinned))
    }

    /// Whether lookup table `name` of `len` bytes may be pinned: an error naming the fixes when
    /// it would pass the host budget (checked before anything is pinned).
    fn admit_lookup(
        &self,
        name: &str,
        len: u64,
        unplanned_budget: impl FnOnce() -> Result<(u64, String)>,
    ) -> Result<()> {
        let (budget, source) = match self.planned {
            true => (
                self.placement.host_budget,
                "the run's host budget".to_string(),
            ),
            false => unplanned_budget()?,
        };
        let after = self.pinned_total().saturating_add(len);
        if after > budget {
            let raise = match self.planned {
                true => "raise the host budget (--host-budget or HIPDECODE_HOST_BUDGET)",
                false => "raise HIPDECODE_HOST_BUDGET or free host memory",
            };
            return Err(DecodeError::Allocation {
                what: format!("pinned host memory for the lookup table '{name}'"),
                reason: format!(
                    "{} more would bring pinned host memory to {}, above {} ({source}); {raise}, \
                     or keep the table on the device with HIPDECODE_GPU_EMBED_TABLE=device",
                    fmt_bytes(len),
                    fmt_bytes(after),
                    fmt_bytes(budget)
                ),
            });
        }
        Ok(())
    }

    /// Bytes pinned for weights of either kind.
    fn pinned_total(&self) -> u64 {
        self.pinned.saturating_add(self.lookup_pinned)
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
        if !self.admit(src.name, bytes.len() as u64)? {
            return Ok(None);
        }
        let pinned =
            PinnedHostBuffer::from_bytes(device, bytes).map_err(|e| DecodeError::Allocation {
                what: format!("pinned host memory for weight '{}'", src.name),
                reason: e.to_string(),
            })?;
        self.pinned += bytes.len() as u64;
        self.tensors += 1;
        Ok(Some(WeightMemory::Host(pinned)))
    }

    /// Whether weight `name` of `len` bytes goes to the host: `false` when the placement keeps
    /// it on the device, an error when pinning it would pass the host budget (checked before
    /// anything is pinned).
    pub(crate) fn admit(&self, name: &str, len: u64) -> Result<bool> {
        if self.placement_of(name) == Placement::Device {
            return Ok(false);
        }
        let after = self.pinned_total().saturating_add(len);
        if after > self.placement.host_budget {
            return Err(DecodeError::Allocation {
                what: format!("pinned host memory for weight '{name}'"),
                reason: format!(
                    "{} more would bring the pinned weights to {}, above the host budget of {}; \
                     raise the host budget (--host-budget or HIPDECODE_HOST_BUDGET), or raise \
                     the GPU budget so that fewer weights stay in host memory",
                    fmt_bytes(len),
                    fmt_bytes(after),
                    fmt_bytes(self.placement.host_budget)
                ),
            });
        }
        Ok(true)
    }

    /// The plan's device weight bytes, which the backend takes as one block (0: none).
    pub(crate) fn device_weight_bytes(&self) -> u64 {
        self.placement.device_weight_bytes
    }

    /// Bytes pinned for the placement's weights so far (lookup tables apart).
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pinned
    }

    /// Bytes pinned for lookup tables kept on the host.
    pub(crate) fn lookup_bytes(&self) -> u64 {
        self.lookup_pinned
    }

    /// The device report's line, or nothing when no weight is on the host.
    pub(crate) fn report_line(&self) -> String {
        let mut line = String::new();
        if self.lookup_tensors > 0 {
            line += &format!(
                "pinned host: embedding table {} read in place, a row a token \
                 (HIPDECODE_GPU_EMBED_TABLE=host)\n",
                fmt_bytes(self.lookup_pinned)
            );
        }
        if self.tensors > 0 {
            line += &format!(
                "pinned host: weights {} in {} tensors read in place (host budget {})\n",
                fmt_bytes(self.pinned),
                self.tensors,
                fmt_bytes(self.placement.host_budget)
            );
        }
        line
    }
}

/// A vector weight's f32 values as the bytes the device reads.
pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn books(names: &[&str], host_budget: u64) -> HostWeights {
        let mut b = HostWeights::default();
        b.set_placement(HostPlacement {
            device_weight_bytes: 0,
            placements: names
                .iter()
                .map(|n| (n.to_string(), Placement::HostZeroCopy))
                .collect(),
            host_budget,
            ..HostPlacement::default()
        })
        .unwrap();
        b
    }

    #[test]
    fn lookup_tables_share_the_host_budget_and_the_report() {
        let unplanned = || Ok((100, "a test's 100 bytes".to_string()));
        let never = || -> Result<(u64, String)> { panic!("a planned run has its own budget") };
        // Without a plan: the unplanned budget bounds the table.
        let b = HostWeights::default();
        b.admit_lookup("token_embd.weight", 100, unplanned).unwrap();
        let err = b
            .admit_lookup("token_embd.weight", 101, unplanned)
            .expect_err("one byte over")
            .to_string();
        for part in [
            "'token_embd.weight'",
            "a test's 100 bytes",
            "EMBED_TABLE=device",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        // With a plan: its host budget bounds the table and the planned weights together.
        let mut b = books(&["a"], 100);
        b.admit_lookup("t", 100, never).unwrap();
        b.lookup_pinned = 70;
        b.lookup_tensors = 1;
        assert!(b.admit("a", 30).unwrap());
        let err = b
            .admit("a", 31)
            .expect_err("the table's bytes count")
            .to_string();
        assert!(err.contains("above the host budget"), "{err}");
        let err = b.admit_lookup("t", 31, never).unwrap_err().to_string();
        assert!(err.contains("--host-budget"), "{err}");
        // Apart in the books: the placement's pinned bytes (which turn on the hybrid split)
        // stay 0, and the report names the table.
        assert_eq!((b.pinned_bytes(), b.lookup_bytes()), (0, 70));
        assert!(b
            .report_line()
            .starts_with("pinned host: embedding table 70 B"));
    }

    #[test]
    fn only_named_weights_go_to_the_host_and_the_host_budget_holds() {
        let mut b = books(&["a", "b"], 100);
        assert!(!b.admit("c", 10).unwrap(), "not named: the device");
        assert!(b.admit("a", 100).unwrap(), "exactly the budget fits");
        b.pinned = 60;
        assert!(b.admit("b", 40).unwrap());
        let err = b.admit("b", 41).expect_err("one byte over").to_string();
        assert!(err.contains("weight 'b'"), "{err}");
        assert!(err.contains("above the host budget"), "{err}");
        assert!(err.contains("--host-budget"), "{err}");
        assert!(b.report_line().is_empty(), "nothing pinned yet: no line");
        b.tensors = 1;
        assert!(b
            .report_line()
            .starts_with("pinned host: weights 60 B in 1 tensors"));
    }

    #[test]
    fn the_placement_cannot_change_after_weights_are_loaded() {
        let mut b = books(&["a"], 100);
        b.tensors = 1;
        let err = b
            .set_placement(HostPlacement::default())
            .expect_err("after a load")
            .to_string();
        assert!(
            err.contains("before the model's weights are loaded"),
            "{err}"
        );
    }
}

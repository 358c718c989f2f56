//! A weight as the GPU backend holds it.

use crate::backend::gpu::WeightMemory;
use crate::error::{DecodeError, Result};
use gguf_loader::GgmlType;
use rocm_kernels::ops::matvec::QuantMatrix;
use rocm_kernels::DeviceSlice;

/// A resident weight: a (stacked) matrix in its stored format, or a vector converted to f32.
pub enum GpuWeight {
    /// `[mats][rows][cols]` raw GGUF blocks.
    Matrix {
        mem: WeightMemory,
        format: GgmlType,
        dims: [usize; 3],
        name: String,
    },
    /// Norm weights, biases, frequency factors: f32.
    Vector { mem: WeightMemory, len: usize },
}

impl GpuWeight {
    pub(super) fn matrix(&self, op: &str) -> Result<(QuantMatrix, [usize; 3])> {
        match self {
            GpuWeight::Matrix {
                mem,
                format,
                dims,
                name,
            } => {
                let [cols, rows, mats] = *dims;
                // SAFETY: the allocation holds the tensor's bytes and lives as long as `self`
                // (see `GpuBuffer::view`).
                let data = unsafe { DeviceSlice::from_raw(mem.ptr(), mem.size() as usize) };
                let m = QuantMatrix::new(data, *format, rows * mats, cols).map_err(|e| {
                    DecodeError::InvalidArgument(format!("{op}: weight '{name}': {e}"))
                })?;
                Ok((m, *dims))
            }
            GpuWeight::Vector { .. } => Err(DecodeError::InvalidArgument(format!(
                "{op}: expected a matrix weight, got a vector"
            ))),
        }
    }

    pub(super) fn vector(&self, op: &str) -> Result<DeviceSlice<f32>> {
        match self {
            // SAFETY: the allocation holds `len` f32 and lives as long as `self`.
            GpuWeight::Vector { mem, len } => Ok(unsafe { DeviceSlice::from_raw(mem.ptr(), *len) }),
            GpuWeight::Matrix { name, .. } => Err(DecodeError::InvalidArgument(format!(
                "{op}: weight '{name}' is a matrix where a vector was expected"
            ))),
        }
    }
}

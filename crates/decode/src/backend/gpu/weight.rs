//! A weight as the GPU backend holds it.

use crate::backend::gpu::WeightMemory;
use crate::error::{DecodeError, Result};
use gguf_loader::GgmlType;
use rocm_kernels::ops::matvec::QuantMatrix;
use rocm_kernels::DeviceSlice;

/// How decode's products read a matrix: chosen once, when the weight is loaded, from the
/// plan's placement of it (and whether the hybrid split is on), so no op re-derives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPath {
    /// From device memory.
    Resident,
    /// From pinned host memory, by the kernels reading across the link (zero-copy).
    ZeroCopy,
    /// From pinned host memory, each decode product's rows split between the GPU's reads in
    /// place and the host's cores ([`crate::backend::gpu::offload::hybrid`]).
    Split,
    /// From pinned host memory, copied whole into a prefetch slot ahead of each decode
    /// product ([`crate::backend::gpu::offload::prefetch`]).
    Streamed,
}

/// A resident weight: a (stacked) matrix in its stored format, or a vector converted to f32.
pub enum GpuWeight {
    /// `[mats][rows][cols]` raw GGUF blocks.
    Matrix {
        mem: WeightMemory,
        format: GgmlType,
        dims: [usize; 3],
        name: String,
        read: ReadPath,
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
                ..
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

    /// How decode reads the weight (a vector is read where it lives).
    pub fn read_path(&self) -> ReadPath {
        match self {
            GpuWeight::Matrix { read, .. } => *read,
            GpuWeight::Vector { mem, .. } => match mem {
                WeightMemory::Host(_) => ReadPath::ZeroCopy,
                _ => ReadPath::Resident,
            },
        }
    }

    /// The pinned host bytes of a matrix whose read path is `path`.
    pub(crate) fn host_bytes_for(&self, path: ReadPath) -> Option<&[u8]> {
        match self {
            GpuWeight::Matrix {
                mem: WeightMemory::Host(p),
                read,
                ..
            } if *read == path => Some(p.as_slice::<u8>()),
            _ => None,
        }
    }

    /// The pinned host bytes of an offloaded matrix, whatever decode's read path (prefill
    /// streams every one).
    pub(crate) fn host_bytes(&self) -> Option<&[u8]> {
        match self {
            GpuWeight::Matrix {
                mem: WeightMemory::Host(p),
                ..
            } => Some(p.as_slice::<u8>()),
            _ => None,
        }
    }
}

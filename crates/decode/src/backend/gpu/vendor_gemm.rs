//! Prefill products on the vendor GEMM library (cuBLASLt on NVIDIA, hipBLASLt on AMD), on the
//! matrix cores our own kernels do not use.
//!
//! Weights stay quantized in device memory. For each product a block of the weight's rows is
//! dequantized to f16 into one reused buffer and multiplied by the activations' f16 copy, with
//! f32 accumulation and result; a larger matrix goes block by block, each product writing its
//! columns of the result. Nothing of the model is ever kept in full precision: the block holds
//! at most [`WEIGHT_BLOCK_VALUES`] values.
//!
//! Every byte is the allocator's, under the workspace tag, taken once by
//! `VendorGemm::reserve` before the first step: the f16 weight block, the f16 activations and
//! the library's own workspace (the library is handed it per call and allocates nothing).
//!
//! Only products of at least [`VENDOR_GEMM_MIN_ROWS`] token rows come here: below that, reading
//! the quantized weights once per few tokens (the matrix-vector kernels) moves fewer bytes than
//! writing and reading an f16 copy. On devices with native matrix cores, products of up to
//! `HIPDECODE_GPU_INT8_MMA_ROWS` rows by the formats the int8 matrix-core kernel reads go to
//! that kernel first (`int8_mma.rs`).

use crate::backend::gpu::offload::prefetch::Prefetch;
use crate::layout::workspace::block_rows;
// The sizes are the layout's, which `ModelLayout` lists too.
use crate::backend::gpu::{error::kerr, GpuBuffer};
use crate::error::{DecodeError, Result};
pub use crate::layout::workspace::{
    LIBRARY_WORKSPACE_BYTES, MOE_GROUPED_MIN_ROWS, VENDOR_GEMM_MIN_ROWS, WEIGHT_BLOCK_VALUES,
};
use hip_ffi::{BlasLt, GemmPlan, GemmShape};
use hip_ffi::{DevicePtr, Stream};
use rocm_alloc::{Allocation, Allocator, StreamId, Tag};
use rocm_kernels::ops::{dequant, matvec::QuantMatrix};
use rocm_kernels::{DeviceSliceMut, Kernels};
use std::collections::HashMap;

/// Where prefill products run: `HIPDECODE_GPU_PREFILL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillPath {
    /// The vendor GEMM when its library opens, our kernels otherwise (the default).
    Auto,
    /// The vendor GEMM; an error when its library does not open.
    Vendor,
    /// Our kernels only (on AMD, the path for architectures where the vendor library
    /// misbehaves).
    Kernels,
}

pub static GPU_PREFILL: knobs::Knob<PrefillPath> = knobs::Knob {
    name: "HIPDECODE_GPU_PREFILL",
    default: "auto",
    doc: "prefill's products on the GPU: `auto` (the vendor GEMM where its library opens), \
          `vendor` (an error without it) or `kernels` (ours only)",
    scope: knobs::Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("auto", PrefillPath::Auto),
                ("vendor", PrefillPath::Vendor),
                ("kernels", PrefillPath::Kernels),
            ],
        )
    },
};

/// The library handle, its prepared products, and the buffers they use.
pub(super) struct VendorGemm {
    blas: BlasLt,
    plans: HashMap<GemmShape, GemmPlan>,
    /// f16 weight rows of the product being run.
    weights: Option<Allocation>,
    /// f16 copy of the activations, and what it was made from: the buffer's id and version,
    /// and the count of leading values.
    activations: Option<Allocation>,
    activations_from: Option<(u64, u64, usize)>,
    workspace: Option<Allocation>,
}

impl VendorGemm {
    /// Opens the library on the kernels' device; `Err` says why it is unusable.
    pub(super) fn open(kernels: &Kernels) -> std::result::Result<VendorGemm, String> {
        Ok(VendorGemm {
            blas: BlasLt::open(kernels.device())?,
            plans: HashMap::new(),
            weights: None,
            activations: None,
            activations_from: None,
            workspace: None,
        })
    }

    pub(super) fn describe(&self) -> String {
        self.blas.describe()
    }

    /// Takes the buffers for products of up to `max_rows` token rows over matrices of at most
    /// `max_matrix_values` values and `max_cols` columns.
    pub(super) fn reserve(
        &mut self,
        alloc: &Allocator,
        stream: StreamId,
        max_rows: usize,
        max_matrix_values: usize,
        max_cols: usize,
    ) -> Result<()> {
        let take = |bytes: usize, what: &str| {
            alloc
                .alloc(bytes.max(1) as u64, stream, Tag::Workspace)
                .map_err(|e| DecodeError::Allocation {
                    what: what.to_string(),
                    reason: e.to_string(),
                })
        };
        let sizes =
            crate::layout::workspace::vendor_gemm_buffers(max_rows, max_matrix_values, max_cols)?;
        if sizes.weight_values > self.weight_values() {
            self.weights = None;
            self.weights = Some(take(sizes.weight_bytes(), "f16 weight block")?);
        }
        if sizes.activation_values > self.activation_values() {
            self.activations = None;
            self.activations_from = None;
            self.activations = Some(take(sizes.activation_bytes(), "f16 activations")?);
        }
        if self.workspace.is_none() {
            self.workspace = Some(take(sizes.library_bytes, "vendor GEMM workspace")?);
        }
        Ok(())
    }

    /// f16 values the weight block holds (0 before `reserve`).
    fn weight_values(&self) -> usize {
        self.weights.as_ref().map_or(0, |a| a.size() as usize / 2)
    }

    /// The f16 weight block lent as f32 scratch to a product that does not run here: the
    /// matrix-core kernel's split partials (`matmul_mma_split`). Lending it is safe in stream
    /// order: a product here and one there both run on the backend's stream, so neither sees
    /// the other's values, and nothing reads the block between products. `None` before
    /// `reserve`.
    pub(super) fn weight_block_as_f32(&self) -> Option<DeviceSliceMut<f32>> {
        let a = self.weights.as_ref()?;
        // SAFETY: the allocation holds `size()` bytes of device memory, 256-byte aligned by the
        // allocator, and lives as long as `self`, which outlives the product it is lent to; it is only
        // used on the backend's stream (see above).
        Some(unsafe { DeviceSliceMut::<f32>::from_raw(a.ptr(), a.size() as usize / 4) })
    }

    /// f16 values the activations' copy holds (0 before `reserve`).
    fn activation_values(&self) -> usize {
        self.activations
            .as_ref()
            .map_or(0, |a| a.size() as usize / 2)
    }

    /// Whether a product of `rows` token rows by `m` runs here: at least
    /// [`VENDOR_GEMM_MIN_ROWS`], and buffers reserved for it.
    pub(super) fn takes(&self, m: &QuantMatrix, rows: usize) -> bool {
        self.fits(m, rows)
    }

    /// Whether the reserved buffers hold a product of `rows` token rows by `m`.
    fn fits(&self, m: &QuantMatrix, rows: usize) -> bool {
        rows >= VENDOR_GEMM_MIN_ROWS
            && rows * m.cols() <= self.activation_values()
            && m.cols() <= self.weight_values()
            && self.workspace.is_some()
    }

    /// Queues `out[t][r] = Σ_c m[r][c] · x[t][c]` for `t < rows` on `stream`. `host` is the
    /// matrix's bytes when it lives in pinned host memory, and `prefetch` the slots to stream
    /// it through (see [`Self::product`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &mut self,
        kernels: &Kernels,
        stream: &Stream,
        m: &QuantMatrix,
        host: Option<(&[u8], &mut Prefetch)>,
        x: &GpuBuffer,
        out: &mut GpuBuffer,
        rows: usize,
    ) -> Result<()> {
        let (n_rows, cols) = (m.rows(), m.cols());
        if !self.fits(m, rows) || x.len() < rows * cols || out.len() < rows * n_rows {
            return Err(DecodeError::InvalidArgument(format!(
                "vendor GEMM: {rows} rows of a {n_rows}x{cols} product do not fit its buffers"
            )));
        }
        let Some(activations) = &self.activations else {
            return Err(DecodeError::InvalidArgument(
                "vendor GEMM: its buffers are not reserved".into(),
            ));
        };
        let values = rows * cols;
        let source = (x.id(), x.version(), values);
        let fresh = self
            .activations_from
            .is_some_and(|(a, v, n)| (a, v) == (source.0, source.1) && n >= values);
        if !fresh {
            // SAFETY: the allocation holds `activation_values() >= values` f16 and lives as long
            // as `self`; it is only used on the backend's stream.
            let mut xh = unsafe { DeviceSliceMut::<u16>::from_raw(activations.ptr(), values) };
            dequant::f32_to_f16(kernels, stream, x.view(), values, &mut xh)
                .map_err(kerr("activations to f16"))?;
            self.activations_from = Some(source);
        }
        let out_ptr = out.view_mut().ptr();
        let b = DevicePtr(activations.ptr());
        // SAFETY: the activations hold `rows x cols` f16 (converted above) and `out` `rows` rows
        // of `n_rows` f32 (checked above); both live until the stream has run the products.
        unsafe {
            self.product(
                kernels,
                stream,
                m,
                host,
                0..n_rows,
                b,
                rows,
                out_ptr,
                n_rows,
            )
        }
    }

    /// Queues `out[t][r - rows.start] = Σ_c m[r][c] · b[t][c]` for `r` in `rows` and `t < n`,
    /// result rows `d_stride` apart, dequantizing the weight rows block by block.
    ///
    /// `host` is `m`'s bytes, when the matrix lives in pinned host memory, with the prefetch
    /// slots to stream them through: each block's rows are then copied into a device slot ahead
    /// of their dequantization (`prefetch.rs`) instead of being read over the link by the
    /// kernel. `None`: the kernel reads `m` where it is.
    ///
    /// # Safety
    /// `b` holds `n` rows of `m.cols()` f16 and `out` `n` rows of `d_stride >= rows.len()` f32,
    /// both device memory of the stream's device that stays allocated until the stream has run
    /// the products, and `rows` lies within `m`. `host`, when given, is the pinned host memory
    /// `m` reads, alive and unchanged until the stream has run the products.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn product(
        &mut self,
        kernels: &Kernels,
        stream: &Stream,
        m: &QuantMatrix,
        host: Option<(&[u8], &mut Prefetch)>,
        rows: std::ops::Range<usize>,
        b: DevicePtr,
        n: usize,
        out: DevicePtr,
        d_stride: usize,
    ) -> Result<()> {
        let cols = m.cols();
        let (Some(weights), Some(workspace)) = (&self.weights, &self.workspace) else {
            return Err(DecodeError::InvalidArgument(
                "vendor GEMM: its buffers are not reserved".into(),
            ));
        };
        let block_rows = block_rows(rows.len(), cols, self.weight_values());
        let row_bytes = m.row_bytes();
        let mut host = host;
        if host
            .as_ref()
            .is_some_and(|(h, _)| h.len() != m.data().len())
        {
            return Err(DecodeError::InvalidArgument(
                "vendor GEMM: the host copy of a weight is not the matrix's size".into(),
            ));
        }
        for start in rows.clone().step_by(block_rows) {
            let end = (start + block_rows).min(rows.end);
            let shape = GemmShape {
                m: end - start,
                n,
                k: cols,
                d_stride,
            };
            // SAFETY: the block holds `weight_values() >= block_rows * cols` f16, lives as long
            // as `self` and is only used on the backend's stream, where the product below
            // reads it before the next block overwrites it.
            let mut wh =
                unsafe { DeviceSliceMut::<u16>::from_raw(weights.ptr(), (end - start) * cols) };
            match host.as_mut() {
                Some((host, prefetch)) => {
                    let bytes = &host[start * row_bytes..end * row_bytes];
                    // SAFETY: the caller vouches that `host` stays alive and unchanged until
                    // the stream has run this product, which waits for the copy.
                    let staged = unsafe { prefetch.stage(stream, bytes) }?;
                    // Released below, after the dequantization that reads it.
                    let block = staged.matrix(m.format(), end - start, cols)?;
                    dequant::dequantize_f16(kernels, stream, &block, 0..end - start, &mut wh)
                        .map_err(kerr("weights to f16"))?;
                    prefetch.release(stream, staged)?;
                }
                None => dequant::dequantize_f16(kernels, stream, m, start..end, &mut wh)
                    .map_err(kerr("weights to f16"))?,
            }
            if !self.plans.contains_key(&shape) {
                let plan = self
                    .blas
                    .plan(shape, LIBRARY_WORKSPACE_BYTES)
                    .map_err(kerr("planning a vendor GEMM"))?;
                self.plans.insert(shape, plan);
            }
            let plan = &self.plans[&shape];
            // SAFETY: the weight block holds this block's `m x k` f16; the caller vouches for
            // `b` and `out`, of which this product writes columns [start, end) - rows.start;
            // the workspace holds LIBRARY_WORKSPACE_BYTES, the most the plan was allowed, and
            // lives as long as `self`; only the backend's stream uses any of them.
            unsafe {
                self.blas.gemm(
                    plan,
                    DevicePtr(weights.ptr()),
                    b,
                    out.offset(((start - rows.start) * 4) as u64),
                    DevicePtr(workspace.ptr()),
                    stream,
                )
            }
            .map_err(kerr("vendor GEMM"))?;
        }
        Ok(())
    }
}

//! Batched steps' products on the int8 matrix-core kernel (`rocm_kernels::ops::matmul_q8_mma`):
//! steps of more token rows than the int8 matrix-vector kernels take, up to
//! `HIPDECODE_GPU_INT8_MMA_ROWS`, read each weight in its GGUF blocks against the rows' 8-bit
//! copies, where the vendor GEMM would write and read an f16 copy of it.

use crate::backend::gpu::error::kerr;
use crate::backend::gpu::{GpuBackend, GpuBuffer};
use crate::error::Result;
use rocm_kernels::ops::matmul_q8_mma;
use rocm_kernels::ops::matvec::QuantMatrix;

impl GpuBackend {
    /// `out = m x` for `rows` token rows of `x`, on the int8 matrix-core kernel. The columns'
    /// split partials borrow the vendor GEMM's weight block, idle during this product; without
    /// it the product runs unsplit.
    pub(super) fn matmul_int8_mma(
        &mut self,
        m: &QuantMatrix,
        x: &GpuBuffer,
        out: &mut GpuBuffer,
        rows: usize,
    ) -> Result<()> {
        let q = self.q8_activations(x, rows, m.cols())?;
        let mut partials = self
            .vendor_gemm
            .as_ref()
            .and_then(|v| v.weight_block_as_f32());
        matmul_q8_mma::matmul(
            &self.kernels,
            &self.stream,
            m,
            q.as_const(),
            &mut out.view_mut(),
            rows,
            partials.as_mut(),
        )
        .map_err(kerr("matmul (int8 matrix cores)"))?;
        // The kernel reads the weights once per tile of token rows.
        let weight_reads = rows.div_ceil(matmul_q8_mma::tile_tokens(rows));
        self.op_done(
            || {
                format!(
                    "matmul int8 mma {} {}x{}",
                    m.format().name(),
                    m.rows(),
                    m.cols()
                )
            },
            (weight_reads * m.data().len() + rows * (m.cols() + m.rows() * 4)) as u64,
        )
    }
}

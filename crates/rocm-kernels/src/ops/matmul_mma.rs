//! Matrix-matrix products over quantized weights on the matrix cores, for steps of a few dozen
//! to a few hundred token rows (batched decode and short prefill).
//!
//! `out[t][r] = sum_c W[r][c] * x[t][c]`, the op of [`matmul`](super::matmul::matmul), with the
//! same views. The kernel (`kernels/matmul_mma.hip`) dequantizes each weight tile into shared
//! memory as f16 and multiplies it by the activations, also rounded to f16, through `mma.h`
//! (f32 accumulation), so each quantized weight is read once per [`TILE_TOKENS`] tokens and no
//! f16 copy of the matrix is ever written. Which implementation of `mma.h` runs is
//! [`Kernels::mma_variant`]; every variant gives the same result up to the order of f32
//! additions.
//!
//! Against the f32 kernels the f16 rounding of both operands costs about 1e-3 of each
//! product's magnitude (as the vendor GEMM's does).

use super::matmul::launch_product;
use super::matvec::{check_io, shape_error, QuantMatrix};
use crate::error::Result;
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matmul_mma";
/// Warps per block (`MMA_WARPS`): each owns 16 weight rows of the tile.
const WARPS: u32 = 4;
/// Tokens per tile (`MM_BT`).
pub const TILE_TOKENS: usize = 64;
/// Weight rows per tile (`MM_BR`).
const TILE_ROWS: u32 = 16 * WARPS;
/// Largest grid y dimension every device takes.
const MAX_GRID_Y: u32 = 65_535;

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens`, on the matrix cores.
///
/// Reads `n_tokens * cols` values of `x`, writes `n_tokens * rows` values of `out` (which must
/// not overlap `x`). `n_tokens == 0` queues nothing. Errors (nothing queued) when a view is too
/// short or the matrix has more than 65535 tiles of rows (over 4 million rows).
pub fn matmul_mma(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
) -> Result<()> {
    check_io(OP, w, x.len(), out.len(), n_tokens)?;
    if n_tokens == 0 {
        return Ok(());
    }
    let row_tiles = u32::try_from(w.rows().div_ceil(TILE_ROWS as usize))
        .ok()
        .filter(|&t| t <= MAX_GRID_Y)
        .ok_or_else(|| {
            shape_error(
                OP,
                format!("{} rows are more than one launch takes", w.rows()),
            )
        })?;
    let token_tiles = u32::try_from(n_tokens.div_ceil(TILE_TOKENS))
        .map_err(|_| shape_error(OP, format!("{n_tokens} tokens; split the batch")))?;
    let config = LaunchConfig {
        grid: [token_tiles, row_tiles, 1],
        block: [WARPS * kernels.wave_size(), 1, 1],
        shared_bytes: 0,
    };
    // SAFETY: every read of w is of a row < rows (QuantMatrix::new checked the bytes), of x at
    // token < n_tokens and column < cols, and every write of out at [t][r] with t < n_tokens,
    // r < rows; check_io checked both views hold that much. The block is the WARPS warps of
    // the device's wave size the kernel's tiling assumes, and its shared memory is static.
    unsafe {
        launch_product(
            kernels,
            stream,
            KernelModule::MatmulMma,
            w,
            x,
            out,
            n_tokens,
            config,
        )
    }
}

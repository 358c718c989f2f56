//! Matrix-matrix products over quantized weights, for prefill (many tokens).
//!
//! `out[t][r] = sum_c W[r][c] * x[t][c]`, the same op as [`matvec`](super::matvec::matvec),
//! with `x` `[n_tokens][cols]` and `out` `[n_tokens][rows]` in f32.
//!
//! The kernel (`kernels/matmul.hip`) is tiled: a block of 256 threads computes 64 tokens x 64
//! rows, dequantizing a 64 x 32 weight tile into shared memory per step (the weights stay
//! quantized in device memory) and accumulating in f32. Partial tiles are bounds-checked, so
//! any token count, row count and (for dense formats) column count works. Nothing depends on
//! the wave size. [`linear`] picks matvec for up to [`MAX_TOKENS`] tokens and matmul above.

use super::matvec::{self, check_io, format_entry, shape_error, QuantMatrix, MAX_TOKENS};
use crate::error::Result;
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matmul";
/// Threads per block, fixed by the kernel's tiling (`MATMUL_THREADS`).
pub(crate) const THREADS: u32 = 256;
/// Tokens per tile (`MATMUL_BT`).
const TILE_TOKENS: u32 = 64;
/// Rows per tile (`MATMUL_BR`).
const TILE_ROWS: u32 = 64;
/// Largest grid y dimension every device takes.
const MAX_GRID_Y: u32 = 65_535;

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens`, with the tiled kernel.
///
/// Reads `n_tokens * cols` values of `x`, writes `n_tokens * rows` values of `out` (which must
/// not overlap `x`). `n_tokens == 0` queues nothing. Errors (nothing queued) when a view is too
/// short or `n_tokens` needs more than 65535 token tiles (over 4 million tokens).
pub fn matmul(
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
    let token_tiles = u32::try_from(n_tokens.div_ceil(TILE_TOKENS as usize))
        .ok()
        .filter(|&t| t <= MAX_GRID_Y)
        .ok_or_else(|| {
            shape_error(
                OP,
                format!("{n_tokens} tokens are more than one launch takes; split the batch"),
            )
        })?;
    let config = LaunchConfig {
        grid: [(w.rows() as u32).div_ceil(TILE_ROWS), token_tiles, 1],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
    };
    // SAFETY: every read of w is of a row < rows (QuantMatrix::new checked the bytes), of x at
    // token < n_tokens and column < cols, and every write of out at [t][r] with t < n_tokens,
    // r < rows; check_io checked both views hold that much. The block is the 256 threads the
    // kernel's tiling assumes.
    unsafe {
        launch_product(
            kernels,
            stream,
            KernelModule::Matmul,
            w,
            x,
            out,
            n_tokens,
            config,
        )
    }
}

/// Launches `module`'s product kernel for `w`'s format, whose signature is `(const u8* w, const
/// float* x, float* out, u32 rows, u32 cols, u32 n_tokens)` (matmul_<format>).
///
/// # Safety
/// `config` is a launch the kernel's tiling takes, `x` and `out` hold `n_tokens` rows of the
/// matrix's columns and rows (`check_io`), and `out` does not overlap `x`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn launch_product(
    kernels: &Kernels,
    stream: &Stream,
    module: KernelModule,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
    config: LaunchConfig,
) -> Result<()> {
    let entry = format_entry(module, 0, module.name(), w.format())?;
    let function = kernels.function(module, entry)?;
    let rows = w.rows() as u32;
    let cols = w.cols() as u32;
    let nt = n_tokens as u32;
    let (w_p, x_p, out_p) = (w.data().ptr(), x.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&x_p)
        .arg(&out_p)
        .arg(&rows)
        .arg(&cols)
        .arg(&nt);
    // SAFETY: the arguments match the kernel's signature in order and type; the caller vouches
    // for the views and the launch shape.
    unsafe { l.launch(config) }?;
    Ok(())
}

/// The projection of `n_tokens` rows of `x` through `w`: [`matvec`](matvec::matvec) for up to
/// [`MAX_TOKENS`] tokens (decode), [`matmul`] above (prefill). Same views and errors.
pub fn linear(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
) -> Result<()> {
    if n_tokens <= MAX_TOKENS {
        matvec::matvec(kernels, stream, w, x, out, n_tokens)
    } else {
        matmul(kernels, stream, w, x, out, n_tokens)
    }
}

//! RMSNorm over rows: `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight`, f32.
//!
//! Gemma's `(1 + w)` RMSNorm is not a separate op: llama.cpp's converter stores `1 + w` in every
//! Gemma norm weight (Q/K norms included; see docs/decode.md), so the decode crate uses norm
//! weights as stored and so does this kernel.
//!
//! Shapes: `x` and `out` hold `rows * dim` values (`[rows][dim]`, row-major), `weight` holds
//! `dim`. Per-head Q/K norm is [`rms_norm_inplace`] over `tokens * n_heads` rows of `head_dim`.
//! Short rows (at most [`WARP_ROW_MAX`]) take one warp each, longer rows one block each.
//! Nothing but `x` and `weight` is read from device memory; `rows`, `dim` and `eps` are launch
//! arguments (model constants).

use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{DevicePtr, LaunchConfig, Stream};

const OP: &str = "rms_norm";
/// Longest row normalized by one warp (`rms_norm_warp`); longer rows get a block.
pub const WARP_ROW_MAX: usize = 256;
/// Threads per block of the one-warp-per-row kernel: a multiple of both wave sizes.
pub(crate) const WARP_KERNEL_BLOCK: u32 = 256;
/// Most threads per block of the one-block-per-row kernels (`rms_norm_rows`,
/// `add_rms_norm_q8`), which take about four values per thread.
pub(crate) const ROWS_MAX_BLOCK: u32 = 1024;
/// Most rows of one launch: one block per row of up to 1024 threads must keep the grid's thread
/// count within 2^32 (HIP's limit).
pub const MAX_ROWS: usize = 1 << 22;

/// Checks a norm's shape against the buffer lengths (in values); shared with the CPU reference.
pub fn check(
    x_len: usize,
    weight_len: usize,
    out_len: usize,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check_shape(dim > 0, OP, || "dim is 0".to_string())?;
    check_shape(eps.is_finite() && eps >= 0.0, OP, || {
        format!("eps = {eps} must be finite and >= 0")
    })?;
    let n = rows.checked_mul(dim);
    check_shape(n.is_some_and(|n| n <= u32::MAX as usize), OP, || {
        format!("{rows} rows of {dim} do not fit one launch (at most 2^32 - 1 values)")
    })?;
    check_shape(rows <= MAX_ROWS, OP, || {
        format!("{rows} rows; one launch takes at most {MAX_ROWS}")
    })?;
    let n = n.unwrap_or(0);
    check_shape(weight_len >= dim, OP, || {
        format!("weight holds {weight_len} values, dim is {dim}")
    })?;
    check_shape(x_len >= n, OP, || {
        format!("x holds {x_len} values, {rows} rows of {dim} need {n}")
    })?;
    check_shape(out_len >= n, OP, || {
        format!("out holds {out_len} values, {rows} rows of {dim} need {n}")
    })
}

/// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for `rows` rows of `dim`.
///
/// Reads `rows * dim` values of `x` and `dim` of `weight`, writes `rows * dim` values of `out`.
/// `out` may be the same memory as `x` (that is [`rms_norm_inplace`]), but not a partly
/// overlapping range. Errors (nothing queued) on a zero `dim`, a non-finite or negative `eps`,
/// views too short for the shape, or a partial overlap.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    kernels: &Kernels,
    stream: &Stream,
    x: DeviceSlice<f32>,
    weight: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), out.len(), rows, dim, eps)?;
    let bytes = (rows * dim * 4) as u64;
    let (a, b) = (x.addr(), out.addr());
    let overlap = a < b + bytes && b < a + bytes;
    check_shape(a == b || !overlap || bytes == 0, OP, || {
        format!("x at {a:#x} and out at {b:#x} overlap without being the same rows")
    })?;
    launch(
        kernels,
        stream,
        x.ptr(),
        weight.ptr(),
        out.ptr(),
        rows,
        dim,
        eps,
    )
}

/// [`rms_norm`] in place: `x[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for `rows`
/// vectors of `dim`. Per-head Q/K norm: `rows = tokens * n_heads`, `dim = head_dim`.
///
/// Reads and writes `rows * dim` values of `x`, reads `dim` of `weight`.
pub fn rms_norm_inplace(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    weight: DeviceSlice<f32>,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), x.len(), rows, dim, eps)?;
    launch(
        kernels,
        stream,
        x.ptr(),
        weight.ptr(),
        x.ptr(),
        rows,
        dim,
        eps,
    )
}

/// The residual [`add_rms_norm`] adds to `x`.
pub enum Residual<'a> {
    /// `x += y`.
    Add(DeviceSlice<f32>),
    /// `y = y / sqrt(mean(y^2) + eps) * weight` in place first, then `x += y`: a block's output
    /// with its own norm before the residual add (Gemma 3's post-attention and
    /// post-feed-forward norms).
    NormAdd {
        /// The block's output, normalized in place.
        y: &'a mut DeviceSliceMut<f32>,
        /// Its norm's weight (`dim` values).
        weight: DeviceSlice<f32>,
    },
}

/// Decode's residual add, norm and activation quantization in one launch: when `residual` is
/// given, `x[r] += y[r]` (with `y` normalized first for [`Residual::NormAdd`]); then `out[r] =
/// x[r] / sqrt(mean(x[r]^2) + eps) * weight`; when `q8` is given, `out` quantized into it
/// exactly as [`crate::ops::matvec_q8::quantize`] would (so the next matrix-vector products
/// read it without a launch of their own).
///
/// `x`, `y` and `out` hold `rows * dim` values and must not overlap; with `q8`, `dim` is a
/// multiple of 32 and its views hold `rows * dim` values and `rows * dim / 32` scales.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    residual: Option<Residual<'_>>,
    weight: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    q8: Option<&mut crate::ops::matvec_q8::Q8ActivationsMut>,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), out.len(), rows, dim, eps)?;
    let n = rows * dim;
    let bytes = (n * 4) as u64;
    let disjoint = |a: u64, b: u64| a + bytes <= b || b + bytes <= a;
    check_shape(disjoint(x.addr(), out.addr()), OP, || {
        "x and out overlap".to_string()
    })?;
    let (y_p, y_len, yw) = match &residual {
        None => (DevicePtr(0), 0, None),
        Some(Residual::Add(y)) => (y.ptr(), y.len(), None),
        Some(Residual::NormAdd { y, weight }) => (y.ptr(), y.len(), Some(weight)),
    };
    if residual.is_some() {
        check_shape(y_len >= n, OP, || {
            format!("y holds {y_len} values, {rows} rows of {dim} need {n}")
        })?;
        check_shape(
            disjoint(y_p.0, x.addr()) && disjoint(y_p.0, out.addr()),
            OP,
            || "y overlaps x or out".to_string(),
        )?;
    }
    if let Some(yw) = yw {
        check_shape(yw.len() >= dim, OP, || {
            format!("y's norm weight holds {} values, dim is {dim}", yw.len())
        })?;
    }
    let yw_p = yw.map_or(DevicePtr(0), |w| w.ptr());
    let (q_p, d_p) = match &q8 {
        Some(q) => {
            check_shape(dim.is_multiple_of(32), OP, || {
                format!("{dim} values per row are not whole groups of 32 to quantize")
            })?;
            check_shape(q.values.len() >= n && q.scales.len() >= n / 32, OP, || {
                format!("the quantized views are too short for {n} values")
            })?;
            (q.values.ptr(), q.scales.ptr())
        }
        None => (DevicePtr(0), DevicePtr(0)),
    };
    if rows == 0 {
        return Ok(());
    }
    let (x_p, w_p, o_p) = (x.ptr(), weight.ptr(), out.ptr());
    let dim_u = dim as u32;
    let block = (dim_u.div_ceil(4).div_ceil(64) * 64).clamp(64, ROWS_MAX_BLOCK);
    let function = kernels.function(KernelModule::Norm, "add_rms_norm_q8")?;
    let mut l = function.builder(stream);
    l.arg(&x_p)
        .arg(&y_p)
        .arg(&yw_p)
        .arg(&w_p)
        .arg(&o_p)
        .arg(&q_p)
        .arg(&d_p)
        .arg(&dim_u)
        .arg(&eps);
    // SAFETY: the arguments match `add_rms_norm_q8(float*, float*, const float*, const float*,
    // float*, i8*, float*, u32, float)`. Block r reads and writes row r < rows of x, reads row
    // r of y (when not null; writes it back only with yw, which is given only with a mutable
    // y), reads dim values of yw and w, writes row r of out and, when not null, the row's dim
    // quantized values and dim / 32 scales; `check` and the checks above made every view long
    // enough, and x, y and out do not overlap.
    unsafe {
        l.launch(LaunchConfig {
            grid: [rows as u32, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// [`rms_norm_inplace`] of two tensors of the same vector length in one launch where the
/// vectors are short enough for one warp each (per-head Q and K norms): `x` holds `rows`
/// vectors normalized with `weight`, `x2` holds `rows2` normalized with `weight2`. Longer
/// vectors take two launches. Errors (nothing queued) as [`rms_norm_inplace`] does for either
/// tensor, and when the two overlap.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_inplace_pair(
    kernels: &Kernels,
    stream: &Stream,
    (x, weight, rows): (&mut DeviceSliceMut<f32>, DeviceSlice<f32>, usize),
    (x2, weight2, rows2): (&mut DeviceSliceMut<f32>, DeviceSlice<f32>, usize),
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), x.len(), rows, dim, eps)?;
    check(x2.len(), weight2.len(), x2.len(), rows2, dim, eps)?;
    check(
        usize::MAX,
        dim,
        usize::MAX,
        rows.saturating_add(rows2),
        dim,
        eps,
    )?;
    let span = |p: u64, r: usize| p..p + (r * dim * 4) as u64;
    let (a, b) = (span(x.addr(), rows), span(x2.addr(), rows2));
    check_shape(
        a.end <= b.start || b.end <= a.start || rows * rows2 == 0,
        OP,
        || "the two tensors overlap".to_string(),
    )?;
    if dim > WARP_ROW_MAX {
        launch(
            kernels,
            stream,
            x.ptr(),
            weight.ptr(),
            x.ptr(),
            rows,
            dim,
            eps,
        )?;
        return launch(
            kernels,
            stream,
            x2.ptr(),
            weight2.ptr(),
            x2.ptr(),
            rows2,
            dim,
            eps,
        );
    }
    let second = (x2.ptr(), weight2.ptr(), rows2 as u32);
    launch_warp(
        kernels,
        stream,
        x.ptr(),
        weight.ptr(),
        x.ptr(),
        rows,
        dim,
        eps,
        second,
    )
}

// Internal: the checked shape and raw addresses of one launch.
#[allow(clippy::too_many_arguments)]
fn launch(
    kernels: &Kernels,
    stream: &Stream,
    x: DevicePtr,
    weight: DevicePtr,
    out: DevicePtr,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    // `check` bounded rows * dim by u32::MAX, and dim >= 1.
    let rows_u = rows as u32;
    let dim_u = dim as u32;
    if dim <= WARP_ROW_MAX {
        let none = (DevicePtr(0), DevicePtr(0), 0);
        launch_warp(kernels, stream, x, weight, out, rows, dim, eps, none)?;
    } else {
        // About four values per thread, in whole multiples of 64 (a multiple of both wave
        // sizes), between 64 and 1024 threads.
        let block = (dim_u.div_ceil(4).div_ceil(64) * 64).clamp(64, ROWS_MAX_BLOCK);
        let function = kernels.function(KernelModule::Norm, "rms_norm_rows")?;
        let mut l = function.builder(stream);
        l.arg(&x).arg(&weight).arg(&out).arg(&dim_u).arg(&eps);
        // SAFETY: the arguments match `rms_norm_rows(const float*, const float*, float*, u32,
        // float)`. Block r reads row r < rows of x and writes row r of out, which `check` made
        // long enough, and reads dim values of weight. x == out is allowed: each value is read
        // and written by the same thread, after the block's sum.
        unsafe {
            l.launch(LaunchConfig {
                grid: [rows_u, 1, 1],
                block: [block, 1, 1],
                shared_bytes: 0,
            })
        }?;
    }
    Ok(())
}

// Internal: `rms_norm_warp` over `rows` vectors of x (into out) and the `second` tensor's
// vectors in place (none with 0 vectors). The callers checked both shapes; dim <=
// WARP_ROW_MAX.
#[allow(clippy::too_many_arguments)]
fn launch_warp(
    kernels: &Kernels,
    stream: &Stream,
    x: DevicePtr,
    weight: DevicePtr,
    out: DevicePtr,
    rows: usize,
    dim: usize,
    eps: f32,
    (x2, weight2, rows2): (DevicePtr, DevicePtr, u32),
) -> Result<()> {
    // `check` bounded (rows + rows2) * dim by u32::MAX, and dim >= 1.
    let (rows_u, dim_u) = (rows as u32, dim as u32);
    let total = rows_u + rows2;
    if total == 0 {
        return Ok(());
    }
    let wave = kernels.wave_size().max(1);
    let per_block = (WARP_KERNEL_BLOCK / wave).max(1);
    let function = kernels.function(KernelModule::Norm, "rms_norm_warp")?;
    let mut l = function.builder(stream);
    l.arg(&x)
        .arg(&weight)
        .arg(&out)
        .arg(&rows_u)
        .arg(&dim_u)
        .arg(&eps)
        .arg(&x2)
        .arg(&weight2)
        .arg(&rows2);
    // SAFETY: the arguments match `rms_norm_warp(const float*, const float*, float*, u32, u32,
    // float, float*, const float*, u32)`. The callers' `check`s made x and out hold rows * dim
    // values, x2 rows2 * dim (null only with rows2 = 0) and both weights dim; warp v of the
    // grid normalizes vector v < rows of x, or vector v - rows < rows2 of x2 in place, reading
    // and writing only its dim values. x == out is allowed: each value is read and written by
    // the same lane.
    unsafe {
        l.launch(LaunchConfig {
            grid: [total.div_ceil(per_block), 1, 1],
            block: [WARP_KERNEL_BLOCK, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

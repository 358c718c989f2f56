//! Matrix-vector products against 8-bit activations: the decode fast path.
//!
//! [`quantize`] turns f32 activations `[n_tokens][cols]` into [`Q8Activations`]: per group of
//! [`GROUP`] values one f32 scale `d = max|x| / 127` and 32 signed bytes `round(x / d)`. Then
//! [`matvec`] multiplies a [`QuantMatrix`] of a [`Q8_FORMATS`] format by them with integer dot
//! products (dp4a / sdot4, four values per instruction) and applies the scales once per group,
//! so the weights are read once at close to the memory bandwidth and the arithmetic stays off
//! the critical path. One quantization serves every matrix that reads the same activations
//! (Q, K and V; gate and up).
//!
//! The cost is the activation rounding: a relative error of about 0.4 % per value that
//! averages out over a row. [`crate::reference::matvec_q8`] reproduces the quantization on the
//! CPU, so the kernels are checked against the exact product of the same 8-bit activations.

use crate::error::{check_shape, KernelError, Result};
use crate::kernels::Kernels;
use crate::ops::matvec::{check_io, shape_error, QuantMatrix, MAX_TOKENS};
use crate::ops::moe::{self, ExpertInput, QuantExperts};
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use gguf_loader::GgmlType;
use hip_ffi::{DevicePtr, LaunchConfig, Stream};

const OP: &str = "matvec_q8";

/// Values per activation scale.
pub const GROUP: usize = 32;

/// The weight formats with an 8-bit-activation kernel, in the order of the module's entry
/// points (`kernels/matvec_q8.hip`).
pub const Q8_FORMATS: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// `format`'s place in `formats` (and so in a module's entry points), or the error that names
/// the formats with a kernel.
pub(crate) fn format_index(
    op: &'static str,
    formats: &[GgmlType],
    format: GgmlType,
) -> Result<usize> {
    formats
        .iter()
        .position(|&f| f == format)
        .ok_or_else(|| KernelError::UnsupportedFormat {
            op,
            format,
            supported: formats
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Whether [`matvec`] reads `format`.
pub fn supports(format: GgmlType) -> bool {
    Q8_FORMATS.contains(&format)
}

/// Bytes of quantized activations for `n_tokens` rows of `cols` (values, then scales), as a
/// caller sizes its buffer: `cols` values of one byte and `cols / 32` f32 scales per token.
pub fn bytes_needed(n_tokens: usize, cols: usize) -> Option<usize> {
    let values = n_tokens.checked_mul(cols)?;
    values.checked_add(values / GROUP * 4)
}

/// Quantized activations in device memory: `values` is `[n_tokens][cols]` signed bytes,
/// `scales` `[n_tokens][cols / 32]` f32.
#[derive(Clone, Copy, Debug)]
pub struct Q8Activations {
    pub values: DeviceSlice<i8>,
    pub scales: DeviceSlice<f32>,
}

/// The same, to be written by [`quantize`].
#[derive(Debug)]
pub struct Q8ActivationsMut {
    pub values: DeviceSliceMut<i8>,
    pub scales: DeviceSliceMut<f32>,
}

impl Q8ActivationsMut {
    /// Read-only views of the same memory.
    pub fn as_const(&self) -> Q8Activations {
        Q8Activations {
            values: self.values.as_const(),
            scales: self.scales.as_const(),
        }
    }
}

/// Checks what every kernel reading `x` needs of it for `rows` rows of `cols` values: their
/// scales are all there, and the values start 16-byte aligned. (Their lengths are the
/// caller's check, with the rest of the shape.)
pub(crate) fn check_activations(
    op: &'static str,
    x: &Q8Activations,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let need = rows.saturating_mul(cols) / GROUP;
    check_shape(x.scales.len() >= need, op, || {
        format!(
            "{} activation scales; {rows} rows of {cols} need {need}",
            x.scales.len()
        )
    })?;
    check_shape(x.values.addr().is_multiple_of(16), op, || {
        "the quantized values must be 16-byte aligned".into()
    })
}

fn check_cols(cols: usize) -> Result<()> {
    check_shape(cols > 0 && cols.is_multiple_of(GROUP), OP, || {
        format!("{cols} columns are not a whole number of groups of {GROUP}")
    })
}

/// Quantizes `n_tokens` rows of `cols` values of `x` into `q` (see the module docs).
///
/// `cols` must be a multiple of 32, `x` 16-byte aligned (device allocations are) and `q`'s
/// views at least `n_tokens * cols` bytes and `n_tokens * cols / 32` scales, their values
/// 16-byte aligned.
pub fn quantize(
    kernels: &Kernels,
    stream: &Stream,
    x: DeviceSlice<f32>,
    n_tokens: usize,
    cols: usize,
    q: &mut Q8ActivationsMut,
) -> Result<()> {
    check_cols(cols)?;
    let n = n_tokens
        .checked_mul(cols)
        .ok_or_else(|| shape_error(OP, format!("{n_tokens} x {cols} overflows")))?;
    check_shape(x.len() >= n, OP, || {
        format!("x holds {} values, {n} are quantized", x.len())
    })?;
    check_shape(
        q.values.len() >= n && q.scales.len() >= n / GROUP,
        OP,
        || {
            format!(
                "the quantized buffers hold {} values and {} scales; {n} and {} are needed",
                q.values.len(),
                q.scales.len(),
                n / GROUP
            )
        },
    )?;
    check_shape(
        x.addr().is_multiple_of(16) && q.values.addr().is_multiple_of(16),
        OP,
        || "x and the quantized values must be 16-byte aligned".into(),
    )?;
    if n == 0 {
        return Ok(());
    }
    let values = u32::try_from(n)
        .map_err(|_| shape_error(OP, format!("{n} values are too many for one launch")))?;
    let groups = values / GROUP as u32;
    let function = kernels.function(KernelModule::MatvecQ8, "quantize_q8")?;
    let (x_p, v_p, s_p) = (x.ptr(), q.values.ptr(), q.scales.ptr());
    let mut l = function.builder(stream);
    l.arg(&x_p).arg(&v_p).arg(&s_p).arg(&groups);
    const THREADS: u32 = QUANTIZE_THREADS;
    // SAFETY: `quantize_q8(const float*, i8*, float*, u32)`: thread k < 32 * groups reads x[k]
    // and writes values[k] and scales[k / 32], all inside the views checked above (n = 32 *
    // groups values). THREADS is a multiple of 32, as the kernel's group shuffles need.
    unsafe {
        l.launch(LaunchConfig {
            grid: [values.div_ceil(THREADS), 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Threads per block of `quantize_q8`: one per value, a multiple of 32 so that the 32 values
/// of a group are whole on 32 lanes.
pub(crate) const QUANTIZE_THREADS: u32 = 256;

/// Threads per block of the product (a multiple of both wave sizes).
pub(crate) const BLOCK_THREADS: u32 = 128;

fn warps_per_row(rows: usize, pieces_per_row: usize, wave: u32, multiprocessors: u32) -> u32 {
    crate::ops::matvec::warps_per_row(rows, pieces_per_row, wave, multiprocessors, BLOCK_THREADS)
}

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens` with `x` given quantized, as
/// [`quantize`] left it for `w.cols()` columns. One launch per [`MAX_TOKENS`] tokens.
///
/// Errors (nothing queued) when the format has no kernel here, or a view is too short.
pub fn matvec(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: Q8Activations,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
) -> Result<()> {
    launch_products(kernels, stream, w, out, None, x, n_tokens)
}

/// [`matvec`] of two matrices of the same format and width over the same activations, in one
/// launch per [`MAX_TOKENS`] tokens (gate and up; Q and K): `out` from `w`, `out2` from `w2`.
#[allow(clippy::too_many_arguments)]
pub fn matvec_pair(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    out: &mut DeviceSliceMut<f32>,
    w2: &QuantMatrix,
    out2: &mut DeviceSliceMut<f32>,
    x: Q8Activations,
    n_tokens: usize,
) -> Result<()> {
    check_shape(
        w.format() == w2.format() && w.cols() == w2.cols(),
        OP,
        || {
            format!(
                "a pair needs one format and width: {} x {} against {} x {}",
                w.format(),
                w.cols(),
                w2.format(),
                w2.cols()
            )
        },
    )?;
    launch_products(kernels, stream, w, out, Some((w2, out2)), x, n_tokens)
}

fn launch_products(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    out: &mut DeviceSliceMut<f32>,
    mut second: Option<(&QuantMatrix, &mut DeviceSliceMut<f32>)>,
    x: Q8Activations,
    n_tokens: usize,
) -> Result<()> {
    let format = w.format();
    let index = format_index(OP, &Q8_FORMATS, format)?;
    let cols = w.cols();
    check_cols(cols)?;
    check_io(OP, w, x.values.len(), out.len(), n_tokens)?;
    if let Some((w2, out2)) = &second {
        check_io(OP, w2, x.values.len(), out2.len(), n_tokens)?;
    }
    check_activations(OP, &x, n_tokens, cols)?;
    let entries = &KernelModule::MatvecQ8.entry_points()[1..1 + 2 * Q8_FORMATS.len()];
    let many = kernels.function(KernelModule::MatvecQ8, entries[2 * index])?;
    let one = kernels.function(KernelModule::MatvecQ8, entries[2 * index + 1])?;
    let pieces = cols / format.block_size() * if format.block_size() == 256 { 8 } else { 2 };
    let wave = kernels.wave_size();
    let rows2 = second.as_ref().map_or(0, |(w2, _)| w2.rows());
    let wpr = warps_per_row(w.rows() + rows2, pieces, wave, kernels.multiprocessors());
    let rows_per_block = BLOCK_THREADS / wave / wpr;
    let (rows, rows2_u, cols_u) = (w.rows() as u32, rows2 as u32, cols as u32);
    let mut grid_x = rows.max(rows2_u).div_ceil(rows_per_block);
    if let (1, Some(per_sm)) = (wpr, kernels.matvec_blocks_per_sm()) {
        // A warp per row strides over the rows (the kernel's loop), so a smaller grid still
        // covers them all.
        grid_x = grid_x.min(per_sm.saturating_mul(kernels.multiprocessors()).max(1));
    }
    let grid_y = if second.is_some() { 2 } else { 1 };
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(MAX_TOKENS);
        let values = x
            .values
            .slice(t0 * cols, nt * cols)
            .ok_or_else(|| shape_error(OP, "x is too short".into()))?;
        let scales = x
            .scales
            .slice(t0 * cols / GROUP, nt * cols / GROUP)
            .ok_or_else(|| shape_error(OP, "the scales are too short".into()))?;
        let os = out
            .slice_mut(t0 * w.rows(), nt * w.rows())
            .ok_or_else(|| shape_error(OP, "out is too short".into()))?;
        let (w2_p, o2_p) = match &mut second {
            Some((w2, out2)) => {
                let os2 = out2
                    .slice_mut(t0 * w2.rows(), nt * w2.rows())
                    .ok_or_else(|| shape_error(OP, "out2 is too short".into()))?;
                (w2.data().ptr(), os2.ptr())
            }
            None => (hip_ffi::DevicePtr(0), hip_ffi::DevicePtr(0)),
        };
        let function = if nt == 1 { one } else { many };
        let nt_u = nt as u32;
        let (w_p, v_p, s_p, o_p) = (w.data().ptr(), values.ptr(), scales.ptr(), os.ptr());
        let mut l = function.builder(stream);
        l.arg(&w_p)
            .arg(&v_p)
            .arg(&s_p)
            .arg(&o_p)
            .arg(&rows)
            .arg(&cols_u)
            .arg(&nt_u)
            .arg(&wpr)
            .arg(&w2_p)
            .arg(&o2_p)
            .arg(&rows2_u);
        // SAFETY: the arguments match `matvec_q8[_one]_<fmt>(const u8*, const i8*, const
        // float*, float*, u32, u32, u32, u32, const u8*, float*, u32)`. Row r < rows of grid
        // row 0 reads row r of w (QuantMatrix::new checked the bytes), nt * cols values and
        // nt * cols / 32 scales of the activation slices, and writes out[t * rows + r], t < nt,
        // inside `os`; grid row 1 (only with a second matrix, whose width and format are w's)
        // does the same with w2, rows2 and `os2`. warps_per_row divides the block's warps
        // (both powers of two).
        unsafe {
            l.launch(LaunchConfig {
                grid: [grid_x, grid_y, 1],
                block: [BLOCK_THREADS, 1, 1],
                shared_bytes: 0,
            })
        }?;
        t0 += nt;
    }
    Ok(())
}

/// [`crate::ops::moe::matvec_id`] on 8-bit activations: for pair `p = t * k + s`,
/// `out[p][r] = W[ids[p]][r] . x[xrow]` with `xrow = t` ([`ExpertInput::PerToken`], `x` holds
/// `n_tokens` quantized rows) or `p` ([`ExpertInput::PerSlot`], `n_tokens * k` rows), each of
/// `experts.cols()` values. The ids stay on the device; an id outside `[0, n_expert)` gives
/// zeros. Errors (nothing queued) as `matvec_id` does, and for a format without a kernel here.
#[allow(clippy::too_many_arguments)]
pub fn matvec_id(
    kernels: &Kernels,
    stream: &Stream,
    experts: &QuantExperts,
    ids: DeviceSlice<i32>,
    n_tokens: usize,
    k: usize,
    x: Q8Activations,
    input: ExpertInput,
    out: &mut DeviceSliceMut<f32>,
) -> Result<()> {
    matvec_id_launch(
        kernels,
        stream,
        (experts, out),
        None,
        ids,
        n_tokens,
        k,
        x,
        input,
    )
}

/// [`matvec_id`] for two expert stacks of the same format and shape over the same ids and
/// activations (an MoE's gate and up) in one launch: `out` from `experts`, `out2` from
/// `experts2`. Errors (nothing queued) as [`matvec_id`] does, and when the stacks differ in
/// format or shape.
#[allow(clippy::too_many_arguments)]
pub fn matvec_id_pair(
    kernels: &Kernels,
    stream: &Stream,
    (experts, out): (&QuantExperts, &mut DeviceSliceMut<f32>),
    (experts2, out2): (&QuantExperts, &mut DeviceSliceMut<f32>),
    ids: DeviceSlice<i32>,
    n_tokens: usize,
    k: usize,
    x: Q8Activations,
    input: ExpertInput,
) -> Result<()> {
    const OP: &str = "matvec_id_q8 pair";
    let same = experts.format() == experts2.format()
        && experts.rows() == experts2.rows()
        && experts.cols() == experts2.cols()
        && experts.n_expert() == experts2.n_expert();
    let bytes = |o: &DeviceSliceMut<f32>| o.addr()..o.addr() + (o.len() * 4) as u64;
    let (a, b) = (bytes(out), bytes(out2));
    check_shape(a.end <= b.start || b.end <= a.start, OP, || {
        "out and out2 overlap".to_string()
    })?;
    check_shape(same, OP, || {
        format!(
            "the stacks differ: {} {}x{}x{} against {} {}x{}x{}",
            experts.format().name(),
            experts.n_expert(),
            experts.rows(),
            experts.cols(),
            experts2.format().name(),
            experts2.n_expert(),
            experts2.rows(),
            experts2.cols()
        )
    })?;
    matvec_id_launch(
        kernels,
        stream,
        (experts, out),
        Some((experts2, out2)),
        ids,
        n_tokens,
        k,
        x,
        input,
    )
}

#[allow(clippy::too_many_arguments)]
fn matvec_id_launch(
    kernels: &Kernels,
    stream: &Stream,
    (experts, out): (&QuantExperts, &mut DeviceSliceMut<f32>),
    second: Option<(&QuantExperts, &mut DeviceSliceMut<f32>)>,
    ids: DeviceSlice<i32>,
    n_tokens: usize,
    k: usize,
    x: Q8Activations,
    input: ExpertInput,
) -> Result<()> {
    const OP: &str = "matvec_id_q8";
    let format = experts.format();
    let index = format_index(OP, &Q8_FORMATS, format)?;
    let (rows, cols) = (experts.rows(), experts.cols());
    check_cols(cols)?;
    let outs = std::iter::once(out.len()).chain(second.as_ref().map(|(_, o)| o.len()));
    for out_len in outs {
        moe::check_matvec_id(
            rows,
            cols,
            ids.len(),
            n_tokens,
            k,
            x.values.len(),
            input,
            out_len,
        )?;
    }
    let x_rows = match input {
        ExpertInput::PerToken => n_tokens,
        ExpertInput::PerSlot => n_tokens * k,
    };
    check_activations(OP, &x, x_rows, cols)?;
    let pairs = n_tokens.saturating_mul(k);
    if pairs == 0 {
        return Ok(());
    }
    let wave = kernels.wave_size();
    let rows_per_block = BLOCK_THREADS / wave;
    let row_blocks = (rows as u32).div_ceil(rows_per_block);
    check_shape(
        pairs < i32::MAX as usize && row_blocks <= 65_535,
        OP,
        || format!("{pairs} pairs of {rows} rows are more than one launch takes"),
    )?;
    let entry = KernelModule::MatvecQ8.entry_points()[1 + 2 * Q8_FORMATS.len() + index];
    let function = kernels.function(KernelModule::MatvecQ8, entry)?;
    let (n_expert, rows_u, cols_u, k_u) = (
        experts.n_expert() as u32,
        rows as u32,
        cols as u32,
        k as u32,
    );
    let per_slot = u32::from(input == ExpertInput::PerSlot);
    let (w2_p, out2_p) = match &second {
        Some((e2, o2)) => (e2.data().ptr(), o2.ptr()),
        None => (DevicePtr(0), DevicePtr(0)),
    };
    let grid_z = if second.is_some() { 2 } else { 1 };
    let (w_p, ids_p, v_p, s_p, out_p) = (
        experts.data().ptr(),
        ids.ptr(),
        x.values.ptr(),
        x.scales.ptr(),
        out.ptr(),
    );
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&ids_p)
        .arg(&v_p)
        .arg(&s_p)
        .arg(&out_p)
        .arg(&n_expert)
        .arg(&rows_u)
        .arg(&cols_u)
        .arg(&k_u)
        .arg(&per_slot)
        .arg(&w2_p)
        .arg(&out2_p);
    // SAFETY: the arguments match `matvec_id_q8_<fmt>(const u8*, const i32*, const i8*, const
    // float*, float*, u32, u32, u32, u32, u32, const u8*, float*)`. Block (p, y, z) reads
    // ids[p], p < pairs <= ids.len(); weights only of an id in [0, n_expert) of the stack z
    // picks (QuantExperts checked each stack's bytes; the second has the first's format and
    // shape, and is only read with grid z = 2); the quantized row t or p of x (checked above)
    // and writes out[p * rows + r] (or out2's), r < rows, inside it (check_matvec_id, run for
    // both outputs).
    unsafe {
        l.launch(LaunchConfig {
            grid: [pairs as u32, row_blocks, grid_z],
            block: [BLOCK_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Most routed experts per token [`moe_down`] takes: its block is one wave per slot, at most
/// 1024 threads on either wave size.
pub const MOE_DOWN_MAX_K: usize = 16;

/// An MoE's down projection with the routing weights applied, in one launch: for token `t`,
/// `out[t][r] = sum_s weights[t * k + s] * (W[ids[t * k + s]][r] . x[t * k + s])`, with `x`
/// quantized per slot (`n_tokens * k` rows of `experts.cols()`), the slots added in order as
/// [`crate::ops::moe::weighted_sum`] adds them. It replaces [`matvec_id`] with
/// [`ExpertInput::PerSlot`] followed by a weighted sum that stores. An id outside
/// `[0, n_expert)` adds nothing. Errors (nothing queued) as [`matvec_id`] does, when `k` is 0
/// or above [`MOE_DOWN_MAX_K`], or when a view is too short.
#[allow(clippy::too_many_arguments)]
pub fn moe_down(
    kernels: &Kernels,
    stream: &Stream,
    experts: &QuantExperts,
    ids: DeviceSlice<i32>,
    weights: DeviceSlice<f32>,
    n_tokens: usize,
    k: usize,
    x: Q8Activations,
    out: &mut DeviceSliceMut<f32>,
) -> Result<()> {
    const OP: &str = "moe_down_q8";
    let format = experts.format();
    let index = format_index(OP, &Q8_FORMATS, format)?;
    let (rows, cols) = (experts.rows(), experts.cols());
    check_cols(cols)?;
    check_shape((1..=MOE_DOWN_MAX_K).contains(&k), OP, || {
        format!("{k} experts per token; this kernel takes 1 to {MOE_DOWN_MAX_K}")
    })?;
    let pairs = n_tokens.saturating_mul(k);
    // The shared checks cover ids and x; out holds n_tokens rows here, not one per pair.
    moe::check_matvec_id(
        rows,
        cols,
        ids.len(),
        n_tokens,
        k,
        x.values.len(),
        ExpertInput::PerSlot,
        usize::MAX,
    )?;
    check_activations(OP, &x, pairs, cols)?;
    check_shape(weights.len() >= pairs, OP, || {
        format!("{} routing weights; {pairs} pairs need them", weights.len())
    })?;
    check_shape(out.len() >= n_tokens * rows, OP, || {
        format!(
            "out holds {}; {n_tokens} rows of {rows} need {}",
            out.len(),
            n_tokens * rows
        )
    })?;
    if n_tokens == 0 || rows == 0 {
        return Ok(());
    }
    check_shape(n_tokens < i32::MAX as usize && rows <= 65_535, OP, || {
        format!("{n_tokens} tokens of {rows} rows are more than one launch takes")
    })?;
    let entry = KernelModule::MatvecQ8.entry_points()[1 + 3 * Q8_FORMATS.len() + index];
    let function = kernels.function(KernelModule::MatvecQ8, entry)?;
    let (n_expert, rows_u, cols_u, k_u) = (
        experts.n_expert() as u32,
        rows as u32,
        cols as u32,
        k as u32,
    );
    let (w_p, ids_p, wt_p, v_p, s_p, out_p) = (
        experts.data().ptr(),
        ids.ptr(),
        weights.ptr(),
        x.values.ptr(),
        x.scales.ptr(),
        out.ptr(),
    );
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&ids_p)
        .arg(&wt_p)
        .arg(&v_p)
        .arg(&s_p)
        .arg(&out_p)
        .arg(&n_expert)
        .arg(&rows_u)
        .arg(&cols_u)
        .arg(&k_u);
    // SAFETY: the arguments match `moe_down_q8_<fmt>(const u8*, const i32*, const float*,
    // const i8*, const float*, float*, u32, u32, u32, u32)`. Block (t, r) has k <= 16 waves
    // (at most 1024 threads, and at most 32 slot sums in shared memory); wave s reads ids[p]
    // and weights[p], p = t * k + s < pairs (checked above), the weights of an id in
    // [0, n_expert) only (QuantExperts checked the stack), the quantized row p of x (checked
    // above), and thread 0 writes out[t * rows + r] inside `out`.
    unsafe {
        l.launch(LaunchConfig {
            grid: [n_tokens as u32, rows_u, 1],
            block: [k_u * kernels.wave_size(), 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_follow_the_format_list() {
        let entries = KernelModule::MatvecQ8.entry_points();
        assert_eq!(entries[0], "quantize_q8");
        assert_eq!(entries.len(), 1 + 4 * Q8_FORMATS.len());
        for (i, format) in Q8_FORMATS.iter().enumerate() {
            let suffix = format.name().to_ascii_lowercase();
            assert_eq!(entries[1 + 2 * i], format!("matvec_q8_{suffix}"));
            assert_eq!(entries[2 + 2 * i], format!("matvec_q8_one_{suffix}"));
            let id_entry = entries[1 + 2 * Q8_FORMATS.len() + i];
            assert_eq!(id_entry, format!("matvec_id_q8_{suffix}"));
            let down_entry = entries[1 + 3 * Q8_FORMATS.len() + i];
            assert_eq!(down_entry, format!("moe_down_q8_{suffix}"));
        }
    }

    #[test]
    fn warps_per_row_fill_the_device_but_not_past_the_row() {
        // 132 multiprocessors want about 4224 warps.
        assert_eq!(warps_per_row(14336, 448, 32, 132), 1);
        assert_eq!(warps_per_row(1024, 128, 32, 132), 4);
        // A short row (Gemma's 640 columns of Q8_0: 40 pieces) keeps one warp.
        assert_eq!(warps_per_row(256, 40, 32, 132), 1);
        // Wave64 blocks hold two warps: at most two per row.
        assert_eq!(warps_per_row(1024, 128, 64, 304), 2);
        for wpr in [
            warps_per_row(1, 1 << 20, 32, 132),
            warps_per_row(1, 1 << 20, 64, 132),
        ] {
            assert!(wpr.is_power_of_two() && wpr <= BLOCK_THREADS / 32);
        }
    }

    #[test]
    fn byte_count_of_quantized_activations() {
        assert_eq!(bytes_needed(2, 64), Some(128 + 4 * 4));
        assert_eq!(bytes_needed(usize::MAX, 2), None);
    }
}

//! Weight rows dequantized to IEEE half, and f32 -> f16 conversion: the inputs of a vendor GEMM
//! (cuBLASLt / hipBLASLt) for prefill.
//!
//! Prefill dequantizes one weight matrix at a time into a reused f16 workspace and multiplies
//! it with the activations converted to f16, so the matrix cores do the product instead of the
//! tiled f32 [`matmul`](super::matmul::matmul). On an 8B model that is about 4.6 GB of Q4_K
//! read and 16 GB of f16 written per prefill chunk, so the kernel (`kernels/dequant.hip`) is
//! shaped for memory bandwidth: each thread dequantizes a run of eight consecutive values with
//! quant.h's `dequant_run8` (the float operations of every other weight kernel), converts them
//! with the hardware f32 -> f16 conversion and writes them with one 16-byte store;
//! neighbouring threads take neighbouring runs, so stores are fully coalesced.
//!
//! f16 values are `u16` bits, as in the f16 KV cache ([`super::kv_cache::KvElem::F16`]):
//! rounded to nearest even, so a value beyond the f16 range (|x| >= 65520) becomes +-inf and a
//! tiny one a subnormal or zero. Real weights sit far inside the range, but the formats do not
//! forbid leaving it (an F32 or BF16 value, or a block scale near the f16 maximum times its
//! quant); such a value is written as +-inf, not clamped, because a clamped weight would be
//! silently wrong while an inf shows up in the GEMM's output. A caller that cannot rule it out
//! keeps the f32 path for that matrix.
//!
//! Formats: [`WEIGHT_FORMATS`](super::matvec::WEIGHT_FORMATS), as every weight kernel.

use super::kv_cache::to_u32;
use super::matvec::{format_entry, shape_error, QuantMatrix};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};
use std::ops::Range;

const OP_DEQUANT: &str = "dequantize_f16";
const OP_CONVERT: &str = "f32_to_f16";
/// Threads per block: a multiple of both wave sizes; the kernels do not depend on it.
pub(crate) const THREADS: u32 = 256;
/// Values per thread: one 16-byte store of halves.
const RUN: usize = 8;

/// Checks a [`dequantize_f16`] of `rows` of `m` into an output view of `out_len` halves, and
/// returns the number of runs of eight columns the launch covers (0 for an empty range).
///
/// Public so that a caller can size and validate its workspace plan without a device (the
/// wrapper makes exactly these checks before queuing anything). Errors when the range is
/// reversed or ends beyond the matrix, when `out_len` is shorter than `rows.len() * cols`, or
/// when a size overflows (the product, or more runs than the kernel's 32-bit index).
pub fn check_dequantize_f16(m: &QuantMatrix, rows: &Range<usize>, out_len: usize) -> Result<u32> {
    let (row0, end) = (rows.start, rows.end);
    check_shape(row0 <= end, OP_DEQUANT, || {
        format!("rows {row0}..{end} is a reversed range")
    })?;
    check_shape(end <= m.rows(), OP_DEQUANT, || {
        format!("rows {row0}..{end} run past the matrix's {} rows", m.rows())
    })?;
    let n_rows = end - row0;
    let cols = m.cols();
    let need = n_rows.checked_mul(cols);
    check_shape(need.is_some_and(|n| n <= out_len), OP_DEQUANT, || {
        let need = need.map_or_else(|| "more than memory holds".to_string(), |n| n.to_string());
        format!("out holds {out_len} halves; {n_rows} rows of {cols} need {need}")
    })?;
    let runs = n_rows.checked_mul(cols.div_ceil(RUN));
    let runs = runs.and_then(|r| u32::try_from(r).ok());
    runs.ok_or_else(|| {
        shape_error(
            OP_DEQUANT,
            format!(
                "{n_rows} rows of {cols} are more runs of {RUN} than the kernel's 32-bit index \
                 takes; convert fewer rows per call"
            ),
        )
    })
}

/// Writes rows `rows` of `m` into `out` as IEEE half bits, row-major `[rows.len()][cols]`,
/// densely packed (row `rows.start + i` at `out[i * cols..]`).
///
/// Values are dequantized in f32 exactly as the other weight kernels do it, then rounded to
/// nearest even; values beyond the f16 range become +-inf (see the module docs). Every format
/// of [`WEIGHT_FORMATS`](super::matvec::WEIGHT_FORMATS) works. The 16-byte stores need `out`
/// 16-byte aligned and `cols` a multiple of 8 (any allocation and every quantized format
/// qualify); other views are written with 16-bit stores, correctly but more slowly.
///
/// `out` must not overlap the matrix. An empty range queues nothing. Errors (nothing queued):
/// see [`check_dequantize_f16`].
pub fn dequantize_f16(
    kernels: &Kernels,
    stream: &Stream,
    m: &QuantMatrix,
    rows: Range<usize>,
    out: &mut DeviceSliceMut<u16>,
) -> Result<()> {
    let runs = check_dequantize_f16(m, &rows, out.len())?;
    if runs == 0 {
        return Ok(());
    }
    let entry = format_entry(KernelModule::Dequant, 0, OP_DEQUANT, m.format())?;
    let function = kernels.function(KernelModule::Dequant, entry)?;
    let n_rows = rows.end - rows.start;
    // The first row's bytes; QuantMatrix::new checked that data holds rows() whole rows.
    let first = m
        .data()
        .slice(rows.start * m.row_bytes(), n_rows * m.row_bytes())
        .ok_or_else(|| {
            shape_error(
                OP_DEQUANT,
                format!("rows {}..{} are not in the data", rows.start, rows.end),
            )
        })?;
    // QuantMatrix::new keeps cols within u32, and runs_per_row <= runs.
    let cols = to_u32(OP_DEQUANT, "cols", m.cols())?;
    let runs_per_row = to_u32(OP_DEQUANT, "runs per row", m.cols().div_ceil(RUN))?;
    let (w_p, out_p) = (first.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&out_p)
        .arg(&cols)
        .arg(&runs_per_row)
        .arg(&runs);
    // SAFETY: the arguments match `dequant_f16_<format>(const u8*, u16*, u32, u32, u32)`.
    // Thread t < runs reads run t % runs_per_row of row t / runs_per_row < n_rows of `first`
    // (n_rows whole rows of the format, a slice of the checked matrix) and writes at most eight
    // halves inside that row's n_rows * cols slot of `out` (checked to hold them); the 16-byte
    // stores happen only where the kernel sees `out` 16-byte aligned and cols a multiple of 8.
    unsafe {
        l.launch(LaunchConfig {
            grid: [runs.div_ceil(THREADS), 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Checks an [`f32_to_f16`] of `n` values from a view of `x_len` into one of `out_len`, and
/// returns `n` as the kernel's 32-bit count. Public for the same reason as
/// [`check_dequantize_f16`]. Errors when a view is shorter than `n` or `n` does not fit 32 bits.
pub fn check_f32_to_f16(x_len: usize, n: usize, out_len: usize) -> Result<u32> {
    check_shape(x_len >= n, OP_CONVERT, || {
        format!("x holds {x_len} values, {n} asked for")
    })?;
    check_shape(out_len >= n, OP_CONVERT, || {
        format!("out holds {out_len} halves, {n} asked for")
    })?;
    to_u32(OP_CONVERT, "n", n)
}

/// `out[i] = half(x[i])` for `i < n`, as IEEE half bits rounded to nearest even: +-0,
/// subnormals and infinities convert exactly as IEEE says, values beyond the f16 range become
/// +-inf, and NaN stays NaN (its payload is not kept).
///
/// Activations for the f16 GEMM. 16-byte loads and stores when both views are 16-byte aligned,
/// 4- and 2-byte ones otherwise. `out` must not overlap `x`. `n == 0` queues nothing. Errors
/// (nothing queued): see [`check_f32_to_f16`].
pub fn f32_to_f16(
    kernels: &Kernels,
    stream: &Stream,
    x: DeviceSlice<f32>,
    n: usize,
    out: &mut DeviceSliceMut<u16>,
) -> Result<()> {
    let n_u32 = check_f32_to_f16(x.len(), n, out.len())?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Dequant, "convert_f32_to_f16")?;
    // n <= u32::MAX, so the thread count fits too.
    let threads = n_u32.div_ceil(RUN as u32);
    let (x_p, out_p) = (x.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&x_p).arg(&out_p).arg(&n_u32);
    // SAFETY: the arguments match `convert_f32_to_f16(const float*, u16*, u32)`. Thread t reads
    // and writes elements 8t .. min(8t + 8, n) only, inside both views (each holds n, checked);
    // the 16-byte accesses happen only where the kernel sees both views 16-byte aligned.
    unsafe {
        l.launch(LaunchConfig {
            grid: [threads.div_ceil(THREADS), 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matvec::WEIGHT_FORMATS;
    use gguf_loader::GgmlType;

    #[test]
    fn entry_points_follow_the_format_list() {
        let names = KernelModule::Dequant.entry_points();
        for (i, format) in WEIGHT_FORMATS.into_iter().enumerate() {
            let entry = format_entry(KernelModule::Dequant, 0, OP_DEQUANT, format).unwrap();
            let suffix = format.name().to_ascii_lowercase();
            assert_eq!(entry, format!("dequant_f16_{suffix}"));
            assert_eq!(names[i], entry);
        }
        assert_eq!(names.len(), WEIGHT_FORMATS.len() + 1);
        assert_eq!(names[WEIGHT_FORMATS.len()], "convert_f32_to_f16");
        let err = format_entry(KernelModule::Dequant, 0, OP_DEQUANT, GgmlType::Mxfp4).unwrap_err();
        assert!(err.to_string().contains("MXFP4"), "{err}");
    }
}

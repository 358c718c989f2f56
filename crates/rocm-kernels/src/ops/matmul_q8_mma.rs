//! Products of quantized weights by 8-bit activations on the matrix cores' integer path, for
//! batched decode steps of a few dozen token rows.
//!
//! `out[t][r] = sum_c W[r][c] * x[t][c]`, with `x` quantized as
//! [`crate::ops::matvec_q8::quantize`] leaves it: the op of
//! [`crate::ops::matvec_q8::matvec`] for more tokens than its kernels take. The kernel
//! (`kernels/matmul_q8_mma.hip`) unpacks each step of 256 columns of 64 weight rows into
//! shared memory as signed bytes and multiplies them by the activation
//! bytes with `mma.h`'s `mma_i8_16x16x16`: the integer sums are exact, and the weight and
//! activation scales are applied once per group of 32 in f32, as in the int8 matrix-vector
//! kernels. So it differs from [`crate::reference::matvec_q8`] only in the order of the f32
//! additions, and each weight byte is read from memory once per [`TILE_TOKENS`] tokens, with
//! no f16 copy of the matrix (which the vendor GEMM path writes and reads every step).
//!
//! Few row tiles (a 1024-row projection is 16 of them) leave most of the device idle, so the
//! columns are split over the grid when the caller lends a partials buffer, under the rule of
//! [`crate::ops::matmul_mma`], and the splits are added in order: the result is the same on
//! every run.

use super::matmul_mma::{reduce_splits, split_count, Tile};
use super::matvec::{check_io, shape_error, QuantMatrix};
use super::matvec_q8::{check_activations, format_index, Q8Activations, GROUP};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::DeviceSliceMut;
use gguf_loader::GgmlType;
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matmul_q8_mma";
/// Warps per block (`MQ_WARPS`): each owns 16 weight rows of the tile.
pub(crate) const WARPS: u32 = 4;
/// Tokens per tile (`MQ_BT`).
pub const TILE_TOKENS: usize = 64;
/// Weight rows per tile (`MQ_BR`).
const TILE_ROWS: usize = 16 * WARPS as usize;
/// Columns per step of the kernel (`MQ_BK`): a split covers a whole number of steps.
const TILE_COLS: usize = 256;
/// Largest grid y dimension every device takes.
const MAX_GRID_Y: usize = 65_535;

/// The weight formats with a kernel here, in the order of the module's entry points.
pub const FORMATS: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// The alignment in bytes the kernel needs of a matrix of `format`: Q4_K and Q5_K read their
/// quants in 16-byte loads, the others in 16-bit ones.
fn alignment(format: GgmlType) -> u64 {
    match format {
        GgmlType::Q4K | GgmlType::Q5K => 16,
        _ => 2,
    }
}

/// Whether [`matmul`] takes `w`: a format of [`FORMATS`], aligned as its loads need (GGUF
/// tensors are, at the file's 32-byte alignment).
pub fn takes(w: &QuantMatrix) -> bool {
    FORMATS.contains(&w.format()) && w.data().addr().is_multiple_of(alignment(w.format()))
}

/// How many splits of the columns a product of `n_tokens` rows by a `rows` x `cols` matrix
/// takes on a device of `multiprocessors`, given a partials buffer of `partial_floats` f32
/// (1: no split, no partials).
pub fn splits_for(
    multiprocessors: u32,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    partial_floats: usize,
) -> usize {
    let tile = Tile {
        rows: TILE_ROWS,
        tokens: TILE_TOKENS,
        cols: TILE_COLS,
    };
    split_count(multiprocessors, tile, rows, cols, n_tokens, partial_floats)
}

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens`, `x` quantized for `w.cols()`
/// columns. With `partials`, the columns are split where that fills the device better
/// ([`splits_for`]) and the partial sums kept there; returns the splits used (1: `partials`
/// was not touched). `partials` must not overlap `x` or `out`.
///
/// Errors (nothing queued) when [`takes`] refuses `w`, a view is too short or misaligned, or
/// the matrix has more than 65535 tiles of rows.
pub fn matmul(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: Q8Activations,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
    partials: Option<&mut DeviceSliceMut<f32>>,
) -> Result<usize> {
    let format = w.format();
    let index = format_index(OP, &FORMATS, format)?;
    let (rows, cols) = (w.rows(), w.cols());
    check_shape(cols.is_multiple_of(GROUP), OP, || {
        format!("{cols} columns are not a whole number of groups of {GROUP}")
    })?;
    check_io(OP, w, x.values.len(), out.len(), n_tokens)?;
    check_activations(OP, &x, n_tokens, cols)?;
    check_shape(
        w.data().addr().is_multiple_of(alignment(format)),
        OP,
        || {
            format!(
                "{format} weights must be {}-byte aligned",
                alignment(format)
            )
        },
    )?;
    if n_tokens == 0 {
        return Ok(1);
    }
    let row_tiles = rows.div_ceil(TILE_ROWS);
    check_shape(row_tiles <= MAX_GRID_Y, OP, || {
        format!("{rows} rows are more than one launch takes")
    })?;
    let token_tiles = u32::try_from(n_tokens.div_ceil(TILE_TOKENS))
        .map_err(|_| shape_error(OP, format!("{n_tokens} tokens; split the batch")))?;
    let splits = partials.as_ref().map_or(1, |p| {
        splits_for(kernels.multiprocessors(), rows, cols, n_tokens, p.len())
    });
    let k_split = (cols.div_ceil(TILE_COLS).div_ceil(splits) * TILE_COLS) as u32;
    let dst = match &partials {
        Some(p) if splits > 1 => p.ptr(),
        _ => out.ptr(),
    };
    let entry = KernelModule::MatmulQ8Mma.entry_points()[index];
    let function = kernels.function(KernelModule::MatmulQ8Mma, entry)?;
    let (r32, c32, nt) = (rows as u32, cols as u32, n_tokens as u32);
    let (w_p, v_p, s_p) = (w.data().ptr(), x.values.ptr(), x.scales.ptr());
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&v_p)
        .arg(&s_p)
        .arg(&dst)
        .arg(&r32)
        .arg(&c32)
        .arg(&nt)
        .arg(&k_split);
    // SAFETY: the arguments match `matmul_q8_mma_<fmt>(const u8*, const i8*, const float*,
    // float*, u32, u32, u32, u32)`. Every read of w is of a row < rows (QuantMatrix::new
    // checked the bytes), of the activations at token < n_tokens and column < cols (values
    // and scales checked above), with the alignments checked above. Split z writes n_tokens x
    // rows values at dst + z * n_tokens * rows: with one split dst is out (check_io); with
    // more, splits_for kept splits * n_tokens * rows within partials. The block is the WARPS
    // warps of the device's wave size the kernel's tiling assumes; its shared memory is
    // static.
    unsafe {
        l.launch(LaunchConfig {
            grid: [token_tiles, row_tiles as u32, splits as u32],
            block: [WARPS * kernels.wave_size(), 1, 1],
            shared_bytes: 0,
        })
    }?;
    if splits > 1 {
        reduce_splits(kernels, stream, dst, out, n_tokens * rows, splits)?;
    }
    Ok(splits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_follow_the_format_list() {
        let entries = KernelModule::MatmulQ8Mma.entry_points();
        assert_eq!(entries.len(), FORMATS.len());
        for (entry, format) in entries.iter().zip(FORMATS) {
            assert_eq!(
                *entry,
                format!("matmul_q8_mma_{}", format.name().to_ascii_lowercase())
            );
        }
    }

    #[test]
    fn the_8b_projections_are_split_and_the_output_head_is_not() {
        // The K projection (1024 x 4096) at 32 tokens: 16 tiles, 16 steps; 8 splits of two.
        assert_eq!(splits_for(132, 1024, 4096, 32, 1 << 24), 8);
        // The FFN's 14336 rows: 224 tiles, three splits to reach 528 blocks.
        assert_eq!(splits_for(132, 14_336, 4096, 32, 1 << 24), 3);
        // The output head's 2004 tiles fill the device alone.
        assert_eq!(splits_for(132, 128_256, 4096, 32, 1 << 24), 1);
        // No buffer, no split.
        assert_eq!(splits_for(132, 1024, 4096, 32, 0), 1);
    }
}

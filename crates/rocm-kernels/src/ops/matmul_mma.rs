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
//!
//! A decode step's product has few tiles (a 1024 x 4096 projection at 16 tokens is 16 of them)
//! and one block keeps one tile's loads in flight, so [`matmul_mma_split`] also splits the
//! columns over the grid when the caller lends a partials buffer: each split writes its sums
//! there, and a second kernel adds them in split order, so the result is the same on every
//! run (it differs from the unsplit sum only in the order of f32 additions).

use super::matvec::{check_io, format_entry, shape_error, QuantMatrix};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matmul_mma";
/// Warps per block (`MMA_WARPS`): each owns 16 weight rows of the tile.
pub(crate) const WARPS: u32 = 4;
/// Tokens per tile (`MM_BT`).
pub const TILE_TOKENS: usize = 64;
/// Weight rows per tile (`MM_BR`).
const TILE_ROWS: u32 = 16 * WARPS;
/// Columns per step of the kernel (`MM_BK`): a split covers a whole number of steps.
const TILE_COLS: usize = 128;
/// Largest grid y dimension every device takes.
const MAX_GRID_Y: u32 = 65_535;
/// Most splits of one product's columns.
pub const MAX_SPLITS: usize = 16;
/// Steps of [`TILE_COLS`] every split covers at least: fewer would spend more on writing and
/// adding partial sums than the split gains.
const MIN_SPLIT_STEPS: usize = 2;
/// Blocks per multiprocessor a split launch aims for: the kernel's 35 KB of shared memory lets
/// about six stay resident on a Hopper or CDNA multiprocessor, and a few resident blocks are
/// what keeps enough weight loads in flight.
const BLOCKS_PER_MULTIPROCESSOR: usize = 4;
/// Threads per block of the reduction.
pub(crate) const REDUCE_THREADS: u32 = 256;

/// How many splits of the columns a product of `n_tokens` rows by a `rows` x `cols` matrix
/// takes on a device of `multiprocessors`, given a partials buffer of `partial_floats` f32:
/// enough for `BLOCKS_PER_MULTIPROCESSOR` blocks per multiprocessor, each split at least
/// `MIN_SPLIT_STEPS` steps, at most [`MAX_SPLITS`], and all of them in the buffer. 1 means
/// no split (and no partials).
pub fn splits_for(
    multiprocessors: u32,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    partial_floats: usize,
) -> usize {
    let tile = Tile {
        rows: TILE_ROWS as usize,
        tokens: TILE_TOKENS,
        cols: TILE_COLS,
    };
    split_count(multiprocessors, tile, rows, cols, n_tokens, partial_floats)
}

/// The output tile and column step of a split-K kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tile {
    pub rows: usize,
    pub tokens: usize,
    pub cols: usize,
}

/// The split rule of every split-K product here: for a product of `n_tokens` rows by a `rows`
/// x `cols` matrix in tiles of `tile` on a device of `multiprocessors`, with a partials buffer
/// of `partial_floats` f32, the splits that give about `BLOCKS_PER_MULTIPROCESSOR` blocks per
/// multiprocessor, each at least `MIN_SPLIT_STEPS` column steps, at most [`MAX_SPLITS`], all
/// in the buffer and none empty; 1 means no split.
pub(crate) fn split_count(
    multiprocessors: u32,
    tile: Tile,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    partial_floats: usize,
) -> usize {
    let tiles = rows.div_ceil(tile.rows) * n_tokens.div_ceil(tile.tokens);
    let steps = cols.div_ceil(tile.cols);
    let by_buffer = partial_floats / rows.saturating_mul(n_tokens).max(1);
    let wanted = (multiprocessors as usize * BLOCKS_PER_MULTIPROCESSOR).div_ceil(tiles.max(1));
    let by_steps = steps / MIN_SPLIT_STEPS;
    let splits = wanted.min(by_steps).min(by_buffer).min(MAX_SPLITS);
    if splits < 2 {
        return 1;
    }
    // Whole steps per split; the last split may be shorter, and none is left empty.
    steps.div_ceil(steps.div_ceil(splits))
}

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens`, on the matrix cores, in one pass
/// over the columns.
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
    launch(kernels, stream, w, x, out, n_tokens, None).map(|_| ())
}

/// [`matmul_mma`] with the columns split over the grid where that fills the device better
/// ([`splits_for`]), the partial sums kept in `partials` and added in split order. Returns the
/// splits used (1: `partials` was not touched). `partials` must not overlap `x` or `out`.
pub fn matmul_mma_split(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
    partials: &mut DeviceSliceMut<f32>,
) -> Result<usize> {
    launch(kernels, stream, w, x, out, n_tokens, Some(partials))
}

fn launch(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
    partials: Option<&mut DeviceSliceMut<f32>>,
) -> Result<usize> {
    check_io(OP, w, x.len(), out.len(), n_tokens)?;
    if n_tokens == 0 {
        return Ok(1);
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
    let (rows, cols) = (w.rows(), w.cols());
    let splits = partials.as_ref().map_or(1, |p| {
        splits_for(kernels.multiprocessors(), rows, cols, n_tokens, p.len())
    });
    let k_split = (cols.div_ceil(TILE_COLS).div_ceil(splits) * TILE_COLS) as u32;
    let dst = match &partials {
        Some(p) if splits > 1 => p.ptr(),
        _ => out.ptr(),
    };
    let entry = format_entry(KernelModule::MatmulMma, 0, OP, w.format())?;
    let function = kernels.function(KernelModule::MatmulMma, entry)?;
    let config = LaunchConfig {
        grid: [token_tiles, row_tiles, splits as u32],
        block: [WARPS * kernels.wave_size(), 1, 1],
        shared_bytes: 0,
    };
    let (r32, c32, nt) = (rows as u32, cols as u32, n_tokens as u32);
    let (w_p, x_p) = (w.data().ptr(), x.ptr());
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&x_p)
        .arg(&dst)
        .arg(&r32)
        .arg(&c32)
        .arg(&nt)
        .arg(&k_split);
    // SAFETY: every read of w is of a row < rows (QuantMatrix::new checked the bytes), of x at
    // token < n_tokens and column < cols (check_io checked x's length). Split z writes
    // n_tokens x rows values at dst + z * n_tokens * rows: with one split dst is out, which
    // check_io checked; with more, splits_for kept splits * n_tokens * rows within partials.
    // The block is the WARPS warps of the device's wave size the kernel's tiling assumes, its
    // shared memory is static, and the arguments match the kernel's signature in order and
    // type.
    unsafe { l.launch(config) }?;
    if splits > 1 {
        reduce_splits(kernels, stream, dst, out, n_tokens * rows, splits)?;
    }
    Ok(splits)
}

/// Queues `out[i] = sum over s < splits of partials[s * n + i]`, the splits added in order
/// (`matmul_mma_reduce`), for a split-K product whose `splits` partial sums of `n` values each
/// lie at `partials`.
pub(crate) fn reduce_splits(
    kernels: &Kernels,
    stream: &Stream,
    partials: hip_ffi::DevicePtr,
    out: &mut DeviceSliceMut<f32>,
    n: usize,
    splits: usize,
) -> Result<()> {
    check_shape(out.len() >= n, OP, || {
        format!("out holds {} values; the reduction writes {n}", out.len())
    })?;
    let n = u32::try_from(n).map_err(|_| shape_error(OP, format!("{n} values to reduce")))?;
    let reduce = kernels.function(KernelModule::MatmulMma, "matmul_mma_reduce")?;
    let blocks = n
        .div_ceil(REDUCE_THREADS)
        .min(kernels.multiprocessors().max(1) * 8);
    let (out_p, s32) = (out.ptr(), splits as u32);
    let mut l = reduce.builder(stream);
    l.arg(&partials).arg(&out_p).arg(&n).arg(&s32);
    // SAFETY: the reduction reads splits * n values at `partials` (the caller's split launch
    // wrote them there, inside its partials buffer) and writes n values of out (checked
    // above); the two do not overlap (the split launchers' contract), and the arguments match
    // its signature.
    unsafe {
        l.launch(LaunchConfig {
            grid: [blocks.max(1), 1, 1],
            block: [REDUCE_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_tiles_are_split_to_fill_the_device_and_many_are_not() {
        // The 8B's K projection (1024 x 4096) at 16 tokens: 16 tiles on 132 multiprocessors.
        let s = splits_for(132, 1024, 4096, 16, 1 << 22);
        assert_eq!(s, 16, "528 blocks wanted, 16 splits of 2 steps each");
        // Its output head (128256 rows): 2004 tiles already fill the device.
        assert_eq!(splits_for(132, 128_256, 4096, 16, 1 << 22), 1);
        // The FFN's 14336 rows at 64 tokens: 224 tiles, three splits.
        assert_eq!(splits_for(132, 14_336, 4096, 64, 1 << 22), 3);
    }

    #[test]
    fn splits_stay_within_the_buffer_and_the_columns() {
        // Room for two splits' partials only.
        assert_eq!(splits_for(132, 1024, 4096, 16, 2 * 1024 * 16), 2);
        // Less than two splits' room, or no buffer: no split.
        assert_eq!(splits_for(132, 1024, 4096, 16, 2 * 1024 * 16 - 1), 1);
        assert_eq!(splits_for(132, 1024, 4096, 16, 0), 1);
        // 384 columns are three steps: one split of two steps at most.
        assert_eq!(splits_for(132, 64, 384, 16, 1 << 22), 1);
        // 640 columns, five steps: two splits (three steps and two), none empty.
        assert_eq!(splits_for(132, 64, 640, 16, 1 << 22), 2);
    }

    #[test]
    fn every_split_covers_columns() {
        for cols in (128..=8192).step_by(128) {
            for rows in [64, 1024, 4096] {
                let s = splits_for(132, rows, cols, 9, usize::MAX);
                let k_split = cols.div_ceil(TILE_COLS).div_ceil(s) * TILE_COLS;
                assert!((1..=MAX_SPLITS).contains(&s), "{rows} x {cols}: {s}");
                assert!(
                    (s - 1) * k_split < cols,
                    "{rows} x {cols}: split {s} is empty"
                );
            }
        }
    }
}

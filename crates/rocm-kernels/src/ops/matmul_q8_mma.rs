//! Products of quantized weights by 8-bit activations on the matrix cores' integer path, for
//! batched decode steps of a few dozen token rows.
//!
//! `out[t][r] = sum_c W[r][c] * x[t][c]`, with `x` quantized as
//! [`crate::ops::matvec_q8::quantize`] leaves it: the op of
//! [`crate::ops::matvec_q8::matvec`] for more tokens than its kernels take. The kernel
//! (`kernels/matmul_q8_mma.hip`) unpacks each step of 128 columns (256 for Q6_K) of 64 weight
//! rows into shared memory as signed bytes and multiplies them by the activation bytes with
//! `mma.h`'s integer products: the integer sums are exact, and the weight and activation scales
//! are applied once per group of 32 in f32, as in the int8 matrix-vector kernels. So it differs
//! from [`crate::reference::matvec_q8`] only in the order of the f32 additions, and each weight
//! byte is read from memory once per tile of [`tile_tokens`] tokens (32 for steps of up to 32,
//! whose smaller tiles fit more blocks on a multiprocessor; else 64), with no f16 copy of the
//! matrix (which the vendor GEMM path writes and reads every step).
//!
//! Few row tiles (a 1024-row projection is 16 of them) leave most of the device idle, so the
//! columns are split over the grid when the caller lends a partials buffer, under the rule of
//! [`crate::ops::matmul_mma`], and the splits are added in order: the result is the same on
//! every run.
//!
//! [`matmul_grouped`] is the same product for a mixture of experts' prefill: every expert's
//! rows (token rows gathered in expert order) by its own matrix, in one launch over a table of
//! (expert, first row, rows) tiles that [`group_tiles`] makes, with no split.

use super::matmul_mma::{reduce_splits, split_count, Tile};
use super::matvec::{check_io, shape_error, QuantMatrix};
use super::matvec_q8::{check_activations, format_index, Q8Activations, GROUP};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use gguf_loader::GgmlType;
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matmul_q8_mma";
/// Warps per block (`MQ_WARPS`): each owns 16 weight rows of the tile.
pub(crate) const WARPS: u32 = 4;
/// Tokens per tile (`MQ_BT_LARGE`): of the grouped entries, and of steps of more than
/// [`SMALL_TILE_TOKENS`] tokens.
pub const TILE_TOKENS: usize = 64;
/// Tokens per tile of the `small` entries (`MQ_BT_SMALL`), which take steps of up to this many
/// tokens: smaller tiles leave room for more blocks on a multiprocessor.
pub const SMALL_TILE_TOKENS: usize = 32;
/// Weight rows per tile (`MQ_BR`).
const TILE_ROWS: usize = 16 * WARPS as usize;

/// Tokens per tile of a plain product of `n_tokens` rows: what its entry was compiled for.
pub fn tile_tokens(n_tokens: usize) -> usize {
    if n_tokens <= SMALL_TILE_TOKENS {
        SMALL_TILE_TOKENS
    } else {
        TILE_TOKENS
    }
}

/// Columns per step of the kernel for `format` (`MqStep<FMT>::BK`): a split covers a whole
/// number of steps.
fn step_cols(format: GgmlType) -> usize {
    match format {
        GgmlType::Q6K => 256,
        _ => 128,
    }
}
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

/// How many splits of the columns a product of `n_tokens` rows by a `rows` x `cols` matrix of
/// `format` takes on a device of `multiprocessors`, given a partials buffer of `partial_floats`
/// f32 (1: no split, no partials).
pub fn splits_for(
    multiprocessors: u32,
    format: GgmlType,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    partial_floats: usize,
) -> usize {
    let tile = Tile {
        rows: TILE_ROWS,
        tokens: tile_tokens(n_tokens),
        cols: step_cols(format),
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
    let index = check_weights(OP, w)?;
    let (rows, cols) = (w.rows(), w.cols());
    check_io(OP, w, x.values.len(), out.len(), n_tokens)?;
    check_activations(OP, &x, n_tokens, cols)?;
    if n_tokens == 0 {
        return Ok(1);
    }
    let row_tiles = rows.div_ceil(TILE_ROWS);
    check_shape(row_tiles <= MAX_GRID_Y, OP, || {
        format!("{rows} rows are more than one launch takes")
    })?;
    let tile_tokens = tile_tokens(n_tokens);
    let token_tiles = u32::try_from(n_tokens.div_ceil(tile_tokens))
        .map_err(|_| shape_error(OP, format!("{n_tokens} tokens; split the batch")))?;
    let splits = partials.as_ref().map_or(1, |p| {
        splits_for(
            kernels.multiprocessors(),
            w.format(),
            rows,
            cols,
            n_tokens,
            p.len(),
        )
    });
    let step = step_cols(w.format());
    let k_split = (cols.div_ceil(step).div_ceil(splits) * step) as u32;
    let dst = match &partials {
        Some(p) if splits > 1 => p.ptr(),
        _ => out.ptr(),
    };
    // The plain entries, then the grouped, then the small-tile ones (source.rs).
    let entry_index = match tile_tokens {
        SMALL_TILE_TOKENS => 2 * FORMATS.len() + index,
        _ => index,
    };
    let entry = KernelModule::MatmulQ8Mma.entry_points()[entry_index];
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
    // SAFETY: the arguments match `matmul_q8_mma_[small_]<fmt>(const u8*, const i8*, const
    // float*, float*, u32, u32, u32, u32)`, the entry compiled for tiles of `tile_tokens`, the
    // grid's x. Every read of w is of a row < rows (QuantMatrix::new
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

/// The checks both entries make of the weights: a format with a kernel (its index in
/// [`FORMATS`] is returned), whole groups of columns, and the alignment its loads need.
fn check_weights(op: &'static str, w: &QuantMatrix) -> Result<usize> {
    let format = w.format();
    let index = format_index(op, &FORMATS, format)?;
    let cols = w.cols();
    check_shape(cols.is_multiple_of(GROUP), op, || {
        format!("{cols} columns are not a whole number of groups of {GROUP}")
    })?;
    check_shape(
        w.data().addr().is_multiple_of(alignment(format)),
        op,
        || {
            format!(
                "{format} weights must be {}-byte aligned",
                alignment(format)
            )
        },
    )?;
    Ok(index)
}

/// The tile table of [`matmul_grouped`] for experts whose rows start at `starts[e]` and number
/// `counts[e]`: three i32 per tile, (expert, first row, rows), at most [`TILE_TOKENS`] rows a
/// tile, experts with no rows left out. `None` when a row index does not fit an i32.
pub fn group_tiles(starts: &[usize], counts: &[usize]) -> Option<Vec<i32>> {
    let mut tiles = Vec::new();
    for (e, (&start, &count)) in starts.iter().zip(counts).enumerate() {
        for offset in (0..count).step_by(TILE_TOKENS) {
            let rows = (count - offset).min(TILE_TOKENS);
            tiles.push(i32::try_from(e).ok()?);
            tiles.push(i32::try_from(start.checked_add(offset)?).ok()?);
            tiles.push(rows as i32);
        }
    }
    Some(tiles)
}

/// Most tiles [`group_tiles`] makes for `pairs` rows over `n_expert` experts: every expert's
/// last tile may be partial.
pub fn max_group_tiles(pairs: usize, n_expert: usize) -> usize {
    pairs.div_ceil(TILE_TOKENS) + n_expert.min(pairs)
}

/// Threads of [`group_pairs`]' one block.
pub(crate) const GROUP_THREADS: u32 = 256;
/// Most experts [`group_pairs`] takes (its shared counters).
pub const GROUP_MAX_EXPERTS: usize = 1024;

/// The shape of [`group_pairs`]: `pairs = n_tokens * k` routed pairs over `n_expert` experts,
/// each expert's slots starting on a multiple of `align`, in `slots` slots in all (enough for
/// every routing: `pairs` plus each expert's padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairGroups {
    pub pairs: usize,
    pub k: usize,
    pub n_expert: usize,
    pub align: usize,
    pub slots: usize,
}

impl PairGroups {
    /// Entries of the tile table [`group_pairs`] writes: three i32 for each of
    /// [`max_group_tiles`] tiles.
    pub fn tile_entries(&self) -> usize {
        3 * max_group_tiles(self.pairs, self.n_expert)
    }
}

/// The grouped prefill's index from the routing `ids` (`pairs` i32, read when the kernel
/// runs), on the device: `slot_token[slot]` (the token whose row each slot gathers, 0 for
/// padding), `pair_slot[p]` (the slot pair `p`'s output comes back from, -1 for an id outside
/// `[0, n_expert)`), and the tile table of
/// [`matmul_grouped`], as
/// [`group_tiles`] lays it out for these counts, padded
/// with empty tiles to [`PairGroups::tile_entries`]. Expert `e`'s pairs take the slots from
/// its start (the earlier experts' counts, each rounded up to `align`); within an expert their
/// order is the device's, which changes no product (each slot's row is its own).
///
/// Errors (nothing queued) when a view is too short, `k` or `align` is 0, or there are more
/// than [`GROUP_MAX_EXPERTS`] experts or 2^31 slots.
pub fn group_pairs(
    kernels: &Kernels,
    stream: &Stream,
    ids: DeviceSlice<i32>,
    shape: PairGroups,
    slot_token: &mut DeviceSliceMut<i32>,
    pair_slot: &mut DeviceSliceMut<i32>,
    tiles: &mut DeviceSliceMut<i32>,
) -> Result<()> {
    const OP: &str = "moe_group_pairs";
    let PairGroups {
        pairs,
        k,
        n_expert,
        align,
        slots,
    } = shape;
    check_shape(k > 0 && align > 0, OP, || {
        format!("k {k} and align {align} must be at least 1")
    })?;
    check_shape(n_expert <= GROUP_MAX_EXPERTS, OP, || {
        format!("{n_expert} experts are more than the {GROUP_MAX_EXPERTS} its counters hold")
    })?;
    let entries = shape.tile_entries();
    check_shape(
        ids.len() >= pairs
            && pair_slot.len() >= pairs
            && slot_token.len() >= slots
            && tiles.len() >= entries,
        OP,
        || {
            format!(
                "ids {}, pair_slot {} (need {pairs}), slot_token {} (need {slots}), tiles {} \
                 (need {entries})",
                ids.len(),
                pair_slot.len(),
                slot_token.len(),
                tiles.len()
            )
        },
    )?;
    let to_u32 = |v: usize, what: &str| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v <= i32::MAX as u32)
            .ok_or_else(|| shape_error(OP, format!("{what} {v} does not fit an i32")))
    };
    let (pairs_u, k_u, n_expert_u, align_u) = (
        to_u32(pairs, "pairs")?,
        to_u32(k, "k")?,
        to_u32(n_expert, "n_expert")?,
        to_u32(align, "align")?,
    );
    let (slots_u, tile_rows, max_tiles) = (
        to_u32(slots, "slots")?,
        TILE_TOKENS as u32,
        to_u32(entries / 3, "tiles")?,
    );
    if pairs == 0 && slots == 0 && entries == 0 {
        return Ok(());
    }
    // The kernel is moe.hip's, beside the routing it reads.
    let function = kernels.function(KernelModule::Moe, OP)?;
    let (ids_p, slot_p, pair_p, tiles_p) =
        (ids.ptr(), slot_token.ptr(), pair_slot.ptr(), tiles.ptr());
    let mut l = function.builder(stream);
    l.arg(&ids_p)
        .arg(&slot_p)
        .arg(&pair_p)
        .arg(&tiles_p)
        .arg(&pairs_u)
        .arg(&k_u)
        .arg(&n_expert_u)
        .arg(&align_u)
        .arg(&slots_u)
        .arg(&tile_rows)
        .arg(&max_tiles);
    // SAFETY: the arguments match `moe_group_pairs(const i32*, i32*, i32*, i32*, u32 x 7)`.
    // The block reads ids[0..pairs] and writes slot_token[0..slots], pair_slot[0..pairs] and
    // tiles[0..3 * max_tiles], inside the views (checked above); a slot it would give past
    // `slots` is written as -1 instead, and n_expert fits its shared counters.
    unsafe {
        l.launch(LaunchConfig {
            grid: [1, 1, 1],
            block: [GROUP_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Products of every expert's rows by its matrix in one launch: for each tile (expert `e`,
/// first row `s`, `n` rows) of `tiles` (`n_tiles` of them, as [`group_tiles`] lays them out),
/// `out[s + t][r] = sum_c w_e[r][c] * x[s + t][c]` for `t < n`, where `w` stacks the experts'
/// matrices of `rows_per_expert` rows each and `x` (quantized for `w.cols()` columns) and
/// `out` hold `slots` rows. Rows no tile names are left as they were. A tile whose expert or
/// rows lie outside these bounds is skipped by the kernel, so the table (device memory, often
/// computed) cannot send it out of bounds.
///
/// Errors (nothing queued) when [`takes`] refuses `w`, its rows are not a whole number of
/// experts, or a view is too short or misaligned.
#[allow(clippy::too_many_arguments)]
pub fn matmul_grouped(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    rows_per_expert: usize,
    tiles: DeviceSlice<i32>,
    n_tiles: usize,
    x: Q8Activations,
    out: &mut DeviceSliceMut<f32>,
    slots: usize,
) -> Result<()> {
    const OP_G: &str = "matmul_q8_mma (grouped)";
    let index = check_weights(OP_G, w)?;
    let cols = w.cols();
    check_shape(
        rows_per_expert > 0 && w.rows().is_multiple_of(rows_per_expert),
        OP_G,
        || {
            format!(
                "{} rows are not a whole number of experts of {rows_per_expert} rows",
                w.rows()
            )
        },
    )?;
    let n_expert = w.rows() / rows_per_expert;
    check_activations(OP_G, &x, slots, cols)?;
    check_shape(
        slots.checked_mul(cols).is_some_and(|n| x.values.len() >= n),
        OP_G,
        || {
            format!(
                "x holds {} values, {slots} rows of {cols} are read",
                x.values.len()
            )
        },
    )?;
    let need_out = slots.checked_mul(rows_per_expert);
    check_shape(need_out.is_some_and(|n| out.len() >= n), OP_G, || {
        format!(
            "out holds {} values, {slots} rows of {rows_per_expert} are written",
            out.len()
        )
    })?;
    check_shape(
        n_tiles.checked_mul(3).is_some_and(|n| tiles.len() >= n),
        OP_G,
        || {
            format!(
                "the tile table holds {} i32, {n_tiles} tiles need 3 each",
                tiles.len()
            )
        },
    )?;
    if n_tiles == 0 {
        return Ok(());
    }
    let row_tiles = rows_per_expert.div_ceil(TILE_ROWS);
    check_shape(row_tiles <= MAX_GRID_Y, OP_G, || {
        format!("{rows_per_expert} rows are more than one launch takes")
    })?;
    let grid_x = u32::try_from(n_tiles)
        .map_err(|_| shape_error(OP_G, format!("{n_tiles} tiles; split the batch")))?;
    let (r32, c32, e32, s32) = (
        u32::try_from(rows_per_expert)
            .map_err(|_| shape_error(OP_G, format!("{rows_per_expert} rows")))?,
        cols as u32,
        u32::try_from(n_expert).map_err(|_| shape_error(OP_G, format!("{n_expert} experts")))?,
        u32::try_from(slots).map_err(|_| shape_error(OP_G, format!("{slots} rows")))?,
    );
    let entry = KernelModule::MatmulQ8Mma.entry_points()[FORMATS.len() + index];
    let function = kernels.function(KernelModule::MatmulQ8Mma, entry)?;
    let (w_p, t_p, v_p, s_p, o_p) = (
        w.data().ptr(),
        tiles.ptr(),
        x.values.ptr(),
        x.scales.ptr(),
        out.ptr(),
    );
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&t_p)
        .arg(&v_p)
        .arg(&s_p)
        .arg(&o_p)
        .arg(&r32)
        .arg(&c32)
        .arg(&e32)
        .arg(&s32);
    // SAFETY: the arguments match `matmul_q8_mma_grouped_<fmt>(const u8*, const i32*, const
    // i8*, const float*, float*, u32, u32, u32, u32)`. Block x reads tiles[3x .. 3x + 2], x <
    // n_tiles (checked against the table's length), and skips a tile unless its expert is <
    // n_expert and its rows lie in 0..slots; it then reads expert e's rows of w (e *
    // rows_per_expert + r < w.rows(), whose bytes QuantMatrix::new checked), activations of
    // rows < slots and columns < cols (checked above, with the alignments), and writes rows <
    // slots of out, which holds slots * rows_per_expert values. The block is the WARPS warps
    // of the device's wave size; its shared memory is static.
    unsafe {
        l.launch(LaunchConfig {
            grid: [grid_x, row_tiles as u32, 1],
            block: [WARPS * kernels.wave_size(), 1, 1],
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
        let entries = KernelModule::MatmulQ8Mma.entry_points();
        assert_eq!(entries.len(), 3 * FORMATS.len());
        let (plain, rest) = entries.split_at(FORMATS.len());
        let (grouped, small) = rest.split_at(FORMATS.len());
        for (i, format) in FORMATS.iter().enumerate() {
            let name = format.name().to_ascii_lowercase();
            assert_eq!(plain[i], format!("matmul_q8_mma_{name}"));
            assert_eq!(grouped[i], format!("matmul_q8_mma_grouped_{name}"));
            assert_eq!(small[i], format!("matmul_q8_mma_small_{name}"));
        }
    }

    #[test]
    fn group_tiles_cover_each_experts_rows_in_tiles_of_at_most_64() {
        // Expert 0: 3 rows from 0; expert 1: none; expert 2: 130 rows from 8.
        let tiles = group_tiles(&[0, 8, 8], &[3, 0, 130]).unwrap();
        assert_eq!(tiles, [0, 0, 3, 2, 8, 64, 2, 72, 64, 2, 136, 2]);
        assert!(tiles.len() / 3 <= max_group_tiles(133, 3));
        assert_eq!(group_tiles(&[], &[]).unwrap(), Vec::<i32>::new());
        // A first row past i32 cannot be named.
        assert!(group_tiles(&[1 << 40], &[1]).is_none());
    }

    #[test]
    fn the_8b_projections_are_split_and_the_output_head_is_not() {
        let q4k = GgmlType::Q4K;
        // The K projection (1024 x 4096) at 32 tokens: 16 tiles, 32 steps of 128; 16 splits.
        assert_eq!(splits_for(132, q4k, 1024, 4096, 32, 1 << 24), 16);
        // The FFN's 14336 rows: 224 tiles, three splits to reach 528 blocks.
        assert_eq!(splits_for(132, q4k, 14_336, 4096, 32, 1 << 24), 3);
        // The FFN's down product (Q6_K, 4096 x 14336): 64 tiles, 56 steps of 256; 8 splits.
        assert_eq!(splits_for(132, GgmlType::Q6K, 4096, 14_336, 32, 1 << 24), 8);
        // At 64 tokens the tiles are of 64 tokens: still one tile of tokens.
        assert_eq!(splits_for(132, q4k, 14_336, 4096, 64, 1 << 24), 3);
        // At 33 tokens two tiles of 64 would be one: 224 tiles still.
        assert_eq!(tile_tokens(33), TILE_TOKENS);
        assert_eq!(tile_tokens(32), SMALL_TILE_TOKENS);
        // The output head's 2004 tiles fill the device alone.
        assert_eq!(splits_for(132, q4k, 128_256, 4096, 32, 1 << 24), 1);
        // No buffer, no split.
        assert_eq!(splits_for(132, q4k, 1024, 4096, 32, 0), 1);
    }
}

//! The GPU backend's workspace, and the 8-bit copies of activations: the one definition of each
//! size. `GpuBackend::new` and `reserve_workspace` (and the helpers they call in `scratch.rs`,
//! `moe_prefill.rs`, `vendor_gemm.rs` and `offload/prefetch.rs`) allocate what these functions
//! say, and [`super::ModelLayout`] lists the same figures, so the estimate cannot drift from
//! the allocation.
//!
//! Everything here is a pure function of shapes and settings: no device, no backend state.

use super::bytes::{overflow, product};
use crate::error::{DecodeError, Result};
use rocm_kernels::ops::attention::{decode_workspace_floats_up_to, AttentionShape};
use rocm_kernels::ops::matmul_q8_mma::max_group_tiles;
use rocm_kernels::ops::{matvec::MAX_TOKENS, matvec_q8, sampling};

/// Token rows from which a dense product runs on the vendor GEMM: every step of more rows than
/// the int8 matrix-vector kernels take in one launch. Up to that, reading the quantized weights
/// once per few tokens moves fewer bytes than writing and reading an f16 copy; past it the
/// int8 kernels run out of arithmetic (their time grows with the rows) and the tiled f32
/// kernels are slower still (measured on the H200: `docs/benchmark_results/batching-*`).
pub const VENDOR_GEMM_MIN_ROWS: usize = MAX_TOKENS + 1;

/// Whether a dense product of `rows` token rows runs on the matrix-core kernel
/// (`rocm_kernels::ops::matmul_mma`) instead of the vendor GEMM: on a device whose matrix-core
/// variant is `native`, from the rows the vendor GEMM would take up to `max_rows`
/// (`HIPDECODE_GPU_MMA_ROWS`). The kernel reads the quantized weights once per 64
/// token rows and writes no f16 copy of them, which the vendor GEMM writes and reads whole at
/// any row count; past a few hundred rows that copy costs less than the repeated reads.
pub fn matrix_cores_take(rows: usize, max_rows: usize, native: bool) -> bool {
    native && rows >= VENDOR_GEMM_MIN_ROWS && rows <= max_rows
}

/// Token rows from which an MoE runs as grouped products on the vendor GEMM (the experts'
/// rows gathered per expert); below that each (token, expert) pair reads its expert alone.
pub const MOE_GROUPED_MIN_ROWS: usize = 32;
/// The most weight values the vendor GEMM dequantizes at once (32 MiB of f16).
pub const WEIGHT_BLOCK_VALUES: usize = 16 << 20;
/// Workspace offered to the vendor library for one product (what cuBLASLt's documentation
/// advises for Hopper; hipBLASLt uses less).
pub const LIBRARY_WORKSPACE_BYTES: usize = 32 << 20;

/// Bytes of the argmax (and sampling) workspace: `ARGMAX_WORKSPACE` u64.
pub const ARGMAX_BYTES: usize = sampling::ARGMAX_WORKSPACE * 8;
/// Bytes of the sampler's uniform draw on the device: one f32.
pub const DRAW_BYTES: usize = 4;

/// i32 values of the step block for steps of up to `max_batch` tokens: the positions, the
/// token ids, and a next-token slot per row (greedy rows of a batch are picked in one launch).
pub fn step_block_ints(max_batch: usize) -> usize {
    // Saturates so that `step_block_bytes` reports a size that overflows as an error.
    max_batch.saturating_mul(3)
}

/// i32 values of the block-table buffer: a sequence id per row of the largest step, then
/// every table of the context (`table_entries`).
pub fn block_table_ints(max_tokens: usize, table_entries: usize) -> Result<usize> {
    max_tokens
        .checked_add(table_entries)
        .ok_or_else(|| overflow("the block tables"))
}

/// Bytes of the step block for steps of up to `max_batch` tokens.
pub fn step_block_bytes(max_batch: usize) -> Result<usize> {
    step_block_ints(max_batch)
        .checked_mul(4)
        .ok_or_else(|| overflow("the step block"))
}

/// f32 values of the split-attention partials: the most any layer's decode attention needs
/// at any number of rows up to its shape's (rocm-kernels computes each exactly).
pub fn attention_partials_floats(decode_attention: &[AttentionShape]) -> Result<usize> {
    decode_attention.iter().try_fold(0usize, |most, shape| {
        let need = decode_workspace_floats_up_to(shape)
            .map_err(|e| DecodeError::InvalidArgument(format!("decode attention: {e}")))?;
        Ok(most.max(need))
    })
}

/// Rows a product reads as 8-bit activations in a step of `max_tokens`: up to the int8
/// matrix-vector kernels' rows, or the int8 matrix-core kernel's `int8_mma_rows`
/// (`HIPDECODE_GPU_INT8_MMA_ROWS`) where that is more (larger steps take other kernels).
pub fn int8_rows(max_tokens: usize, int8_mma_rows: usize) -> usize {
    max_tokens.min(MAX_TOKENS.max(int8_mma_rows))
}

/// Whether a product of `rows` token rows runs on the int8 matrix-core kernel
/// (`rocm_kernels::ops::matmul_q8_mma`): on a device whose matrix-core variant is `native`,
/// from the rows the int8 matrix-vector kernels leave up to `max_rows`.
pub fn int8_matrix_cores_take(rows: usize, max_rows: usize, native: bool) -> bool {
    native && rows > MAX_TOKENS && rows <= max_rows
}

/// Values the 8-bit copy of a `buffer_values`-long activation buffer of rows of `width` holds
/// for steps of up to `max_tokens`: [`int8_rows`]' rows, rounded down to whole groups.
pub fn q8_input_capacity(
    max_tokens: usize,
    int8_mma_rows: usize,
    width: usize,
    buffer_values: usize,
) -> usize {
    q8_capacity(
        int8_rows(max_tokens, int8_mma_rows)
            .saturating_mul(width)
            .min(buffer_values),
    )
}

/// `values` rounded down to whole quantization groups.
pub fn q8_capacity(values: usize) -> usize {
    values - values % matvec_q8::GROUP
}

/// Byte offset of the scales in an 8-bit copy laid out for `capacity` values: after the
/// values, 16-byte aligned.
pub fn q8_scales_offset(capacity: usize) -> usize {
    capacity.next_multiple_of(16)
}

/// Bytes of an 8-bit copy of `capacity` values: the values, then one f32 scale per group.
pub fn q8_shadow_bytes(capacity: usize) -> usize {
    q8_scales_offset(capacity) + capacity / matvec_q8::GROUP * 4
}

/// Whether the vendor GEMM's prefill buffers (and the grouped MoE prefill) are reserved: the
/// int8 path, the library opened, and steps long enough to use it.
pub fn vendor_gemm_applies(int8: bool, vendor_gemm: bool, max_tokens: usize) -> bool {
    int8 && vendor_gemm && max_tokens >= VENDOR_GEMM_MIN_ROWS
}

/// f16 values of the vendor GEMM's weight block for a model whose largest matrix has
/// `max_matrix_values` values and whose widest has `max_cols` columns: whole rows of the
/// widest matrix fit.
pub fn weight_block_values(max_matrix_values: usize, max_cols: usize) -> usize {
    max_matrix_values
        .min(WEIGHT_BLOCK_VALUES.max(max_cols))
        .max(1)
}

/// The vendor GEMM's buffers for products of up to `max_rows` token rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VendorGemmBuffers {
    /// f16 values of the weight block.
    pub weight_values: usize,
    /// f16 values of the activations' copy.
    pub activation_values: usize,
    /// Bytes of the library's workspace.
    pub library_bytes: usize,
}

impl VendorGemmBuffers {
    pub fn weight_bytes(&self) -> usize {
        self.weight_values * 2
    }
    pub fn activation_bytes(&self) -> usize {
        self.activation_values * 2
    }
}

/// The vendor GEMM's buffers for products of up to `max_rows` rows over matrices of at most
/// `max_matrix_values` values and `max_cols` columns.
pub fn vendor_gemm_buffers(
    max_rows: usize,
    max_matrix_values: usize,
    max_cols: usize,
) -> Result<VendorGemmBuffers> {
    let weight_values = weight_block_values(max_matrix_values, max_cols);
    let activation_values = product("the vendor GEMM activations", &[max_rows, max_cols, 2])? / 2;
    product("the vendor GEMM weight block", &[weight_values, 2])?;
    Ok(VendorGemmBuffers {
        weight_values,
        activation_values,
        library_bytes: LIBRARY_WORKSPACE_BYTES,
    })
}

/// Rows of a `cols`-wide matrix that one block takes when a product covers `rows` rows and the
/// block holds `block_values`: whole 64-row groups, so each block's result columns start
/// 256-byte aligned (what the libraries assume of every pointer), unless one block does it all.
pub fn block_rows(rows: usize, cols: usize, block_values: usize) -> usize {
    let fit = (block_values / cols.max(1)).max(1);
    if fit >= rows {
        rows.max(1)
    } else if fit < 64 {
        fit
    } else {
        fit - fit % 64
    }
}

/// Bytes of one streamed-prefetch slot for `matrices` (rows a product covers, columns, bytes
/// per row) when the vendor GEMM's f16 weight block holds `block_values`: the largest block of
/// rows it stages (0 when there are none).
pub fn prefetch_slot_bytes(matrices: &[(usize, usize, usize)], block_values: usize) -> usize {
    matrices
        .iter()
        .map(|&(rows, cols, row_bytes)| {
            (block_rows(rows, cols, block_values).min(rows)).saturating_mul(row_bytes)
        })
        .max()
        .unwrap_or(0)
}

/// The MoE scratch for steps of up to `max_tokens` tokens: routing, the experts' gate, up and
/// output rows per (token, choice) pair, and the int8 path's copy of the gated activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeScratch {
    /// (token, choice) pairs.
    pub pairs: usize,
    /// f32 values of the gate and of the up rows (each).
    pub hidden_floats: usize,
    /// f32 values of the output rows.
    pub out_floats: usize,
    /// Values of the int8 copy of the gated activations.
    pub q8_values: usize,
}

/// Bytes of the expert ids of `pairs` (token, choice) pairs: an i32 each.
pub fn moe_ids_bytes(pairs: usize) -> usize {
    pairs.max(1) * 4
}

/// [`MoeScratch`] for `max_tokens` tokens of `n_embd`, experts of `n_ff`, `k` used per token.
pub fn moe_scratch(max_tokens: usize, n_embd: usize, n_ff: usize, k: usize) -> Result<MoeScratch> {
    let what = "the MoE scratch";
    let pairs = product(what, &[max_tokens, k])?;
    Ok(MoeScratch {
        pairs,
        hidden_floats: product(what, &[pairs, n_ff, 4])? / 4,
        out_floats: product(what, &[pairs, n_embd, 4])? / 4,
        q8_values: product(what, &[int8_rows(max_tokens, 0), k, n_ff])?,
    })
}

/// Slots of one expert in the grouped MoE prefill start at a multiple of this, so that every
/// row block a product reads or writes starts 256-byte aligned: the alignment the vendor
/// libraries' heuristics assume of every pointer unless told otherwise.
pub fn moe_slot_alignment(n_embd: usize, n_ff: usize) -> usize {
    let aligned = |p: usize| {
        [n_embd * 2, n_embd * 4, n_ff * 2, n_ff * 4]
            .iter()
            .all(|b| p.wrapping_mul(*b) % 256 == 0)
    };
    (1..=256).find(|&p| aligned(p)).unwrap_or(256)
}

/// Slots for `pairs` (token, choice) pairs over `n_expert` experts, each expert's slots
/// padded to [`moe_slot_alignment`].
pub fn moe_prefill_slots(pairs: usize, n_expert: usize, n_embd: usize, n_ff: usize) -> usize {
    pairs.saturating_add(n_expert.saturating_mul(moe_slot_alignment(n_embd, n_ff) - 1))
}

/// The grouped MoE prefill's buffers (see `backend/gpu/moe_prefill.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoePrefill {
    pub pairs: usize,
    pub slots: usize,
    /// f32 values of the gate and of the up scratch (each), grown to the padded slots.
    pub hidden_floats: usize,
    /// Bytes of the slot-to-token and pair-to-slot index, then the int8 products' tile table
    /// (i32; `matmul_q8_mma::group_tiles`).
    pub index_bytes: usize,
    /// Bytes of the token rows in expert order (f32).
    pub rows_bytes: usize,
    /// Bytes of their f16 copy.
    pub f16_rows_bytes: usize,
    /// Bytes of the f16 hidden rows.
    pub f16_hidden_bytes: usize,
}

/// [`MoePrefill`] for `pairs` pairs over `n_expert` experts of `n_ff`, rows of `n_embd`.
pub fn moe_prefill(
    pairs: usize,
    n_expert: usize,
    n_embd: usize,
    n_ff: usize,
) -> Result<MoePrefill> {
    let what = "the MoE prefill scratch";
    let slots = moe_prefill_slots(pairs, n_expert, n_embd, n_ff);
    Ok(MoePrefill {
        pairs,
        slots,
        hidden_floats: product(what, &[slots, n_ff, 4])? / 4,
        index_bytes: product(
            what,
            &[
                slots
                    .checked_add(pairs)
                    .and_then(|n| n.checked_add(3 * max_group_tiles(pairs, n_expert)))
                    .ok_or_else(|| overflow(what))?,
                4,
            ],
        )?,
        rows_bytes: product(what, &[slots, n_embd, 4])?,
        f16_rows_bytes: product(what, &[slots, n_embd, 2])?,
        f16_hidden_bytes: product(what, &[slots, n_ff, 2])?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_copies_round_to_groups_and_align_their_scales() {
        assert_eq!(q8_capacity(100), 96);
        assert_eq!(q8_shadow_bytes(96), 96 + 3 * 4);
        assert_eq!(q8_scales_offset(40), 48);
        assert_eq!(q8_input_capacity(2, 0, 64, 1000), 128);
        assert_eq!(q8_input_capacity(2, 0, 64, 100), 96);
    }

    #[test]
    fn q8_copies_cover_the_rows_of_the_int8_matrix_core_kernel() {
        // Off: the matrix-vector kernels' eight rows at most.
        assert_eq!(int8_rows(512, 0), MAX_TOKENS);
        // On: up to its cap, and never more than a step's rows.
        assert_eq!(int8_rows(512, 64), 64);
        assert_eq!(int8_rows(33, 64), 33);
        assert_eq!(q8_input_capacity(512, 64, 4096, usize::MAX), 64 * 4096);
        // It takes the steps the matrix-vector kernels leave, up to the cap, on matrix cores.
        assert!(!int8_matrix_cores_take(MAX_TOKENS, 64, true));
        assert!(int8_matrix_cores_take(MAX_TOKENS + 1, 64, true));
        assert!(int8_matrix_cores_take(64, 64, true));
        assert!(!int8_matrix_cores_take(65, 64, true));
        assert!(!int8_matrix_cores_take(32, 64, false));
        assert!(!int8_matrix_cores_take(32, 0, true));
    }

    #[test]
    fn moe_slots_keep_row_blocks_aligned() {
        // 64-wide f16 rows are 128 bytes: two slots per 256 bytes.
        assert_eq!(moe_slot_alignment(64, 64), 2);
        assert_eq!(moe_prefill_slots(10, 4, 64, 64), 14);
        assert_eq!(moe_slot_alignment(4096, 1536), 1);
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        assert!(moe_scratch(usize::MAX, 2, 2, 2).is_err());
        assert!(vendor_gemm_buffers(usize::MAX, 1, 2).is_err());
        assert!(step_block_bytes(usize::MAX / 2).is_err());
        assert!(step_block_bytes(usize::MAX / 3).is_err());
    }

    #[test]
    fn the_step_block_holds_positions_tokens_and_a_next_token_per_row() {
        assert_eq!(step_block_ints(1), 3);
        assert_eq!(step_block_ints(512), 3 * 512);
        assert_eq!(step_block_bytes(64).unwrap(), 3 * 64 * 4);
    }
}

//! Mixture-of-experts on the device, with no host synchronisation between routing and the
//! expert products (like ggml's `mul_mat_id`):
//!
//! * [`route_top_k`]: router logits `[rows][n_expert]` to expert ids `[rows][k]` and weights
//!   `[rows][k]`, with the CPU backend's `route_top_k` rule (crates/decode/src/backend/cpu.rs):
//!   experts ordered by logit descending in `f32::total_cmp` order (so -0.0 ranks below +0.0,
//!   and a NaN of positive sign above +inf), ties to the lower index (a stable sort); the
//!   weights are a softmax over the k selected logits (max-subtracted, in f32). That equals
//!   Qwen3-MoE's softmax over all experts renormalised over the top k (`norm_topk_prob`).
//! * [`matvec_id`]: for each (token, slot) pair `p = t * k + s`, the matrix-vector product of
//!   expert `ids[p]` of a stacked `[n_expert][rows][cols]` tensor ([`QuantExperts`]), reading
//!   the ids from device memory. The input row is the token's ([`ExpertInput::PerToken`]: gate
//!   and up) or the pair's own ([`ExpertInput::PerSlot`]: down). An id outside `[0, n_expert)`
//!   reads no weights and gives a zero row.
//! * [`weighted_sum`]: `out[t] (+)= sum_s weights[t][s] * y[t * k + s]`, summed in slot order
//!   from zero then stored or added ([`Accumulate`]), as the CPU backend's zero-then-
//!   `add_scaled_row` sequence.

use super::matvec::{format_entry, shape_error, QuantMatrix, ROW_BLOCK_THREADS};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use gguf_loader::GgmlType;
use hip_ffi::{LaunchConfig, Stream};

/// Largest grid y dimension every device takes.
const MAX_GRID_Y: u32 = 65_535;
/// Threads per block of the weighted sum.
pub(crate) const SUM_THREADS: u32 = 256;

/// Where each (token, slot) pair of [`matvec_id`] takes its input row from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertInput {
    /// `x` is `[n_tokens][cols]`: every slot of token t reads row t (gate and up projections).
    PerToken,
    /// `x` is `[n_tokens * k][cols]`: pair p reads row p (the down projection).
    PerSlot,
}

/// Whether [`weighted_sum`] overwrites its output or adds to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulate {
    /// `out[t] = sum`.
    Store,
    /// `out[t] += sum` (into the residual stream).
    Add,
}

/// A stacked expert tensor in device memory: `n_expert` matrices of `rows` x `cols`, one after
/// the other, as GGUF stores `ffn_{gate,up,down}_exps` (ggml dims `[cols, rows, n_expert]`).
#[derive(Clone, Copy, Debug)]
pub struct QuantExperts {
    data: DeviceSlice<u8>,
    format: GgmlType,
    n_expert: usize,
    rows: usize,
    cols: usize,
}

impl QuantExperts {
    /// Describes `data` as `n_expert` stacked `rows` x `cols` matrices of `format`. Errors as
    /// [`QuantMatrix::new`] does for the whole `n_expert * rows` x `cols` stack.
    pub fn new(
        data: DeviceSlice<u8>,
        format: GgmlType,
        n_expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<QuantExperts> {
        check_shape(
            n_expert > 0 && n_expert <= i32::MAX as usize,
            "QuantExperts",
            || format!("{n_expert} experts: need 1 ..= i32::MAX (ids are i32)"),
        )?;
        let all_rows = n_expert.checked_mul(rows).ok_or_else(|| {
            shape_error("QuantExperts", format!("{n_expert} x {rows} rows overflow"))
        })?;
        // The whole stack obeys the single-matrix rules (format, length, alignment, u32 rows).
        QuantMatrix::new(data, format, all_rows, cols)?;
        Ok(QuantExperts {
            data,
            format,
            n_expert,
            rows,
            cols,
        })
    }

    /// Expert `e`'s matrix, or `None` when `e >= n_expert`.
    pub fn expert(&self, e: usize) -> Option<QuantMatrix> {
        if e >= self.n_expert {
            return None;
        }
        let bytes = self.data.len() / self.n_expert;
        let data = self.data.slice(e * bytes, bytes)?;
        QuantMatrix::new(data, self.format, self.rows, self.cols).ok()
    }

    /// The raw blocks of the whole stack.
    pub fn data(&self) -> DeviceSlice<u8> {
        self.data
    }

    /// The storage format.
    pub fn format(&self) -> GgmlType {
        self.format
    }

    /// Number of experts.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Rows (outputs) of each expert.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs) of each expert.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// Checks a routing shape; shared with the CPU reference. `max_experts` is the kernel's limit
/// (`64 * wave size`), or `usize::MAX` for the reference.
pub fn check_route(rows: usize, n_expert: usize, k: usize, max_experts: usize) -> Result<()> {
    const OP: &str = "route_top_k";
    check_shape(k >= 1 && k <= n_expert, OP, || {
        format!("cannot route to {k} of {n_expert} experts")
    })?;
    check_shape(n_expert <= max_experts, OP, || {
        format!("{n_expert} experts are more than the {max_experts} one warp's lanes hold")
    })?;
    check_shape(rows.checked_mul(n_expert).is_some(), OP, || {
        format!("{rows} rows of {n_expert} logits overflow")
    })
}

/// Routes each of `rows` rows of `n_expert` logits to its `k` best experts: writes
/// `ids[row * k + s]` (i32 expert index) and `weights[row * k + s]` (softmax over the k
/// selected logits), `s < k` in descending logit order (see the module docs for ties).
///
/// Reads `rows * n_expert` values of `logits`; writes `rows * k` of `ids` and `weights`.
/// `rows == 0` queues nothing. Errors (nothing queued) unless `1 <= k <= n_expert <= 64 *`
/// wave size, or when a view is too short.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn route_top_k(
    kernels: &Kernels,
    stream: &Stream,
    logits: DeviceSlice<f32>,
    rows: usize,
    n_expert: usize,
    k: usize,
    ids: &mut DeviceSliceMut<i32>,
    weights: &mut DeviceSliceMut<f32>,
) -> Result<()> {
    const OP: &str = "route_top_k";
    let wave = kernels.wave_size();
    check_route(rows, n_expert, k, 64 * wave as usize)?;
    check_shape(logits.len() >= rows * n_expert, OP, || {
        format!(
            "logits hold {}; {rows} rows of {n_expert} need {}",
            logits.len(),
            rows * n_expert
        )
    })?;
    let need = rows.saturating_mul(k);
    check_shape(ids.len() >= need && weights.len() >= need, OP, || {
        format!(
            "ids hold {} and weights {}; {rows} rows of {k} need {need}",
            ids.len(),
            weights.len()
        )
    })?;
    check_shape(rows <= u32::MAX as usize, OP, || format!("{rows} rows"))?;
    if rows == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Moe, "moe_route_top_k")?;
    let rows_per_block = ROW_BLOCK_THREADS / wave;
    let (rows_u, n_expert_u, k_u) = (rows as u32, n_expert as u32, k as u32);
    let (logits_p, ids_p, weights_p) = (logits.ptr(), ids.ptr(), weights.ptr());
    let mut l = function.builder(stream);
    l.arg(&logits_p)
        .arg(&ids_p)
        .arg(&weights_p)
        .arg(&rows_u)
        .arg(&n_expert_u)
        .arg(&k_u);
    // SAFETY: the arguments match `moe_route_top_k(const float*, i32*, float*, u32, u32, u32)`.
    // Warp `row < rows` reads logits[row * n_expert .. + n_expert] and writes ids and weights
    // [row * k .. + k], inside the views (checked above); n_expert <= 64 * wave size keeps the
    // per-lane chosen mask within 64 bits.
    unsafe {
        l.launch(LaunchConfig {
            grid: [rows_u.div_ceil(rows_per_block), 1, 1],
            block: [ROW_BLOCK_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// For every pair `p = t * k + s` (`t < n_tokens`, `s < k`), writes
/// `out[p][r] = sum_c W[ids[p]][r][c] * x[xrow][c]` with `xrow` = `t` ([`ExpertInput::PerToken`])
/// or `p` ([`ExpertInput::PerSlot`]); a zero row where `ids[p]` is not in `[0, n_expert)`.
///
/// Reads `n_tokens * k` ids (device memory, read when the kernel runs) and the rows of `x`;
/// writes `n_tokens * k * rows` values of `out`. `n_tokens == 0` queues nothing. Errors
/// (nothing queued) when a view is too short, the format has no kernel, or the grid would be
/// too large (more than 2^31 pairs, or more than 65535 row blocks).
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn matvec_id(
    kernels: &Kernels,
    stream: &Stream,
    experts: &QuantExperts,
    ids: DeviceSlice<i32>,
    n_tokens: usize,
    k: usize,
    x: DeviceSlice<f32>,
    input: ExpertInput,
    out: &mut DeviceSliceMut<f32>,
) -> Result<()> {
    const OP: &str = "matvec_id";
    let pairs = n_tokens.saturating_mul(k);
    check_matvec_id(
        experts.rows,
        experts.cols,
        ids.len(),
        n_tokens,
        k,
        x.len(),
        input,
        out.len(),
    )?;
    if pairs == 0 {
        return Ok(());
    }
    let rows_per_block = ROW_BLOCK_THREADS / kernels.wave_size();
    let row_blocks = (experts.rows as u32).div_ceil(rows_per_block);
    check_shape(
        pairs < i32::MAX as usize && row_blocks <= MAX_GRID_Y,
        OP,
        || {
            format!(
                "{pairs} pairs of {} rows are more than one launch takes",
                experts.rows
            )
        },
    )?;
    let entry = format_entry(KernelModule::Moe, 2, OP, experts.format)?;
    let function = kernels.function(KernelModule::Moe, entry)?;
    let n_expert = experts.n_expert as u32;
    let rows = experts.rows as u32;
    let cols = experts.cols as u32;
    let k_u = k as u32;
    let per_slot = u32::from(input == ExpertInput::PerSlot);
    let (w_p, ids_p, x_p, out_p) = (experts.data.ptr(), ids.ptr(), x.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&w_p)
        .arg(&ids_p)
        .arg(&x_p)
        .arg(&out_p)
        .arg(&n_expert)
        .arg(&rows)
        .arg(&cols)
        .arg(&k_u)
        .arg(&per_slot);
    // SAFETY: the arguments match `matvec_id_<format>(const u8*, const i32*, const float*,
    // float*, u32, u32, u32, u32, u32)`. Block (p, y) reads ids[p], p < pairs <= ids.len();
    // weights only of an id in [0, n_expert), whose rows QuantExperts::new checked are in the
    // data; x row t or p and out[p * rows + r], r < rows, inside the views (checked).
    unsafe {
        l.launch(LaunchConfig {
            grid: [pairs as u32, row_blocks, 1],
            block: [ROW_BLOCK_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Checks the views of [`matvec_id`]; shared with the CPU reference.
#[allow(clippy::too_many_arguments)]
pub fn check_matvec_id(
    rows: usize,
    cols: usize,
    ids_len: usize,
    n_tokens: usize,
    k: usize,
    x_len: usize,
    input: ExpertInput,
    out_len: usize,
) -> Result<()> {
    const OP: &str = "matvec_id";
    let pairs = n_tokens.checked_mul(k);
    check_shape(pairs.is_some_and(|p| ids_len >= p), OP, || {
        format!("ids hold {ids_len}; {n_tokens} tokens x {k} slots need {pairs:?}")
    })?;
    let pairs = pairs.unwrap_or(usize::MAX);
    let x_rows = match input {
        ExpertInput::PerToken => n_tokens,
        ExpertInput::PerSlot => pairs,
    };
    let need_x = x_rows.checked_mul(cols);
    check_shape(need_x.is_some_and(|n| x_len >= n), OP, || {
        format!("x holds {x_len}; {x_rows} rows of {cols} ({input:?}) need {need_x:?}")
    })?;
    let need_out = pairs.checked_mul(rows);
    check_shape(need_out.is_some_and(|n| out_len >= n), OP, || {
        format!("out holds {out_len}; {pairs} pairs of {rows} need {need_out:?}")
    })
}

/// Checks the views of [`weighted_sum`]; shared with the CPU reference.
pub fn check_weighted_sum(
    y_len: usize,
    weights_len: usize,
    n_tokens: usize,
    k: usize,
    dim: usize,
    out_len: usize,
) -> Result<()> {
    const OP: &str = "moe_weighted_sum";
    let pairs = n_tokens.checked_mul(k);
    check_shape(pairs.is_some_and(|p| weights_len >= p), OP, || {
        format!("weights hold {weights_len}; {n_tokens} tokens x {k} slots need {pairs:?}")
    })?;
    let need_y = pairs.and_then(|p| p.checked_mul(dim));
    check_shape(need_y.is_some_and(|n| y_len >= n), OP, || {
        format!("y holds {y_len}; need {need_y:?}")
    })?;
    let need_out = n_tokens.checked_mul(dim);
    check_shape(need_out.is_some_and(|n| out_len >= n), OP, || {
        format!("out holds {out_len}; {n_tokens} rows of {dim} need {need_out:?}")
    })
}

/// `out[t][c] (+)= sum_s weights[t * k + s] * y[(t * k + s) * dim + c]` for `t < n_tokens`,
/// `c < dim`: the expert outputs `y` (`[n_tokens * k][dim]`, as [`matvec_id`] writes them)
/// combined with the routing weights (read from device memory when the kernel runs).
///
/// `out` must not overlap `y` or `weights`. `n_tokens == 0` or `dim == 0` queues nothing.
/// Errors (nothing queued) when a view is too short or `n_tokens * dim` is 2^40 or more.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn weighted_sum(
    kernels: &Kernels,
    stream: &Stream,
    y: DeviceSlice<f32>,
    weights: DeviceSlice<f32>,
    n_tokens: usize,
    k: usize,
    dim: usize,
    out: &mut DeviceSliceMut<f32>,
    mode: Accumulate,
) -> Result<()> {
    const OP: &str = "moe_weighted_sum";
    check_weighted_sum(y.len(), weights.len(), n_tokens, k, dim, out.len())?;
    let total = n_tokens * dim;
    if total == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(total.div_ceil(SUM_THREADS as usize))
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or_else(|| shape_error(OP, format!("{total} values are more than one launch takes")))?;
    let to_u32 = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| shape_error(OP, format!("{what} {v} does not fit 32 bits")))
    };
    let (nt, k_u, dim_u) = (
        to_u32(n_tokens, "n_tokens")?,
        to_u32(k, "k")?,
        to_u32(dim, "dim")?,
    );
    let acc = u32::from(mode == Accumulate::Add);
    let function = kernels.function(KernelModule::Moe, "moe_weighted_sum")?;
    let (y_p, weights_p, out_p) = (y.ptr(), weights.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&y_p)
        .arg(&weights_p)
        .arg(&out_p)
        .arg(&nt)
        .arg(&k_u)
        .arg(&dim_u)
        .arg(&acc);
    // SAFETY: the arguments match `moe_weighted_sum(const float*, const float*, float*, u32,
    // u32, u32, u32)`. Thread i < n_tokens * dim reads weights[t * k + s] and
    // y[(t * k + s) * dim + c] and reads/writes out[i], all inside the views (checked above).
    unsafe {
        l.launch(LaunchConfig {
            grid: [blocks, 1, 1],
            block: [SUM_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

//! Embedding lookup: `out[t] = table[tokens[t]] * scale`, from a quantized (or F16/BF16/F32)
//! table that stays in its GGUF format in device memory.
//!
//! The table is a [`QuantMatrix`] of `vocab` rows by `dim` columns. Token ids are read from a
//! `DeviceSlice<i32>` (the step block), so a captured step replays with new ids.
//!
//! Out-of-range ids (negative, or `>= vocab`) read no table memory: their output row is all
//! zeros, and when an error flag is passed the kernel stores 1 into it. The kernel never clears
//! the flag; the caller zeroes it when it wants to know about one step. `scale` multiplies
//! every value in f32 (Gemma's `sqrt(n_embd)`; 1.0 for the others).

use super::matvec::{format_entry, QuantMatrix};
use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{DevicePtr, LaunchConfig, Stream};

const OP: &str = "embed";
/// Threads per block (one block per token).
pub(crate) const THREADS: u32 = 256;

/// Writes `out[t][c] = table[tokens[t]][c] * scale` for `t < n_tokens`, `c < dim` (the
/// table's columns); an out-of-range id gives a zero row and sets `error_flag[0] = 1` when a
/// flag is given.
///
/// Reads `n_tokens` ids of `tokens` and the rows they name; writes `n_tokens * dim` values of
/// `out`. `n_tokens == 0` queues nothing. Errors (nothing queued) when a view is too short, the
/// flag view is empty, or `n_tokens` is 2^31 or more.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn embed(
    kernels: &Kernels,
    stream: &Stream,
    table: &QuantMatrix,
    tokens: DeviceSlice<i32>,
    n_tokens: usize,
    scale: f32,
    out: &mut DeviceSliceMut<f32>,
    error_flag: Option<&mut DeviceSliceMut<i32>>,
) -> Result<()> {
    let dim = table.cols();
    check_shape(tokens.len() >= n_tokens, OP, || {
        format!("tokens hold {} ids, {n_tokens} asked for", tokens.len())
    })?;
    check_shape(n_tokens < i32::MAX as usize, OP, || {
        format!("{n_tokens} tokens are more than one launch takes")
    })?;
    let need = n_tokens.checked_mul(dim);
    check_shape(need.is_some_and(|n| out.len() >= n), OP, || {
        format!(
            "out holds {} values; {n_tokens} rows of {dim} need {need:?}",
            out.len()
        )
    })?;
    let flag = match error_flag {
        Some(f) => {
            check_shape(!f.is_empty(), OP, || "the error flag view is empty".into())?;
            f.ptr()
        }
        None => DevicePtr(0),
    };
    if n_tokens == 0 {
        return Ok(());
    }
    let entry = format_entry(KernelModule::Embed, 0, OP, table.format())?;
    let function = kernels.function(KernelModule::Embed, entry)?;
    let vocab = table.rows() as u32;
    let dim_u = dim as u32;
    let (table_p, tokens_p, out_p) = (table.data().ptr(), tokens.ptr(), out.ptr());
    let mut l = function.builder(stream);
    l.arg(&table_p)
        .arg(&tokens_p)
        .arg(&out_p)
        .arg(&flag)
        .arg(&vocab)
        .arg(&dim_u)
        .arg(&scale);
    // SAFETY: the arguments match `embed_<format>(const u8*, const i32*, float*, i32*, u32,
    // u32, float)`. Block t reads tokens[t] (t < n_tokens <= tokens.len()), then only a row
    // id < vocab of the table (QuantMatrix::new checked it holds vocab whole rows), writes
    // out[t * dim .. (t + 1) * dim] (checked above) and, for a bad id, flag[0] of a non-empty
    // view or nothing when the flag is null.
    unsafe {
        l.launch(LaunchConfig {
            grid: [n_tokens as u32, 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

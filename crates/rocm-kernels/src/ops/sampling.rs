//! Choosing the next token on the device: argmax, and temperature / top-k / top-p sampling with
//! the decode crate's seeded sampler's rule.
//!
//! [`argmax`] and [`sample`] read one row of `n` f32 logits and write the chosen token id into
//! a one-element `DeviceSliceMut<i32>` (the step block's next-token slot), so nothing comes back
//! to the host between steps; [`argmax_rows`] does the same for every row of a batched step,
//! one token per row.
//!
//! * [`argmax`]: the first index of the largest value; NaN and -inf never win, -0 equals +0,
//!   and a row with no winner gives 0 (the CPU `argmax`). Two launches: up to
//!   [`ARGMAX_WORKSPACE`] blocks reduce parts of the row into the workspace, one block reduces
//!   those.
//! * [`argmax_rows`]: [`argmax`]'s rule for each of `n_rows` consecutive rows of `n` values,
//!   in one launch of one block of 1024 threads per row and no workspace, so greedy decoding
//!   of a batch costs one launch and one read of `n_rows` ids instead of two launches and a
//!   read per row. A row is read by one block only, so a single long row is faster through
//!   [`argmax`].
//! * [`sample`]: at temperature 0, [`argmax`]; else the rule of `Sampler::sample`
//!   (crates/decode/src/sampler.rs) for the uniform draw `u` that it reads from a one-element
//!   `DeviceSlice<f32>` (filled by the host from the seeded generator each step, so a captured
//!   graph replays with a new draw): candidates are the non-NaN logits, the `top_k` largest are
//!   kept (0: all), ordered by value descending then index ascending, weighted
//!   `exp((v - max) / temperature)`, cut to the shortest prefix whose probability reaches
//!   `top_p`, and the first token whose running weight exceeds `u` times the kept weight is
//!   chosen. One block walks the row's 64-bit order keys 8 bits at a time (no sort, no size
//!   limit from the block), a pass over the row per digit.
//!
//! Agreement with the CPU sampler, for the same `u`: the same token except at float ties. Where
//! the top-k cut falls inside a run of equal logits the GPU keeps the lowest indices (the CPU
//! keeps an unspecified part of the run). Weights are computed as f32 from a double `exp`, as
//! the CPU's (nearly always correctly rounded) `expf` gives, and summed exactly in fixed point
//! (units of 2^-40), so a token can differ only when `u * total` or the top-p cut is within
//! about 1e-12 (relative) of a boundary, or where `expf` rounds differently. A draw of 1 or
//! more is taken as the largest f32 below 1, a NaN or negative draw as 0. Where the CPU's
//! weights turn NaN (a +inf logit, or `1 / temperature` overflowing to inf) its walk returns the
//! last candidate; here the largest logits share the mass instead.
//!
//! The CPU sampler draws `u` as an f64; the device reads an f32. Rounding the f64 draw down to
//! f32 moves `u * total` by at most 2^-24 of the total, which changes the token only when the
//! draw falls that close to a boundary.

use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "sampling";
/// Length (u64 values) of the workspace [`argmax`] and [`sample`] need, whatever `n`.
pub const ARGMAX_WORKSPACE: usize = 256;
/// Threads per argmax block: a multiple of both wave sizes.
pub(crate) const ARGMAX_BLOCK: u32 = 256;
/// Values per thread of an argmax block before another block is worth its launch share.
const ARGMAX_PER_THREAD: u32 = 8;
/// Threads per [`argmax_rows`] block (one block per row): the most a block may have, so each
/// row is read with the most loads in flight (a step's rows are usually fewer than the
/// device's compute units).
pub(crate) const ARGMAX_ROWS_BLOCK: u32 = 1024;
/// Threads of the one sampling block.
pub(crate) const SAMPLE_BLOCK: u32 = 1024;
/// Longest row [`sample`] takes: the fixed-point weights (2^40 per unit) of every candidate
/// must sum within 2^64.
pub const MAX_SAMPLE_VOCAB: usize = 1 << 23;

/// Sampling settings, as the decode crate's `SamplerConfig` without the seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy; else finite and > 0.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the shortest prefix of most likely tokens whose probability reaches `top_p`, in
    /// (0, 1]; 1 keeps all.
    pub top_p: f32,
}

/// Checks a row of `n` logits and the settings; shared with the CPU reference.
pub fn check(n: usize, params: &SamplingParams) -> Result<()> {
    check_shape(
        params.temperature.is_finite() && params.temperature >= 0.0,
        OP,
        || {
            format!(
                "temperature must be a finite number >= 0, got {}",
                params.temperature
            )
        },
    )?;
    check_shape(params.top_p > 0.0 && params.top_p <= 1.0, OP, || {
        format!("top_p must be in (0, 1], got {}", params.top_p)
    })?;
    let limit = if params.temperature == 0.0 {
        i32::MAX as usize
    } else {
        MAX_SAMPLE_VOCAB
    };
    check_shape(n <= limit, OP, || {
        format!("a row of {n} logits is longer than the {limit} this op takes")
    })
}

/// Writes the index of the largest of the first `n` values of `logits` into `out[0]` (0 when
/// none wins: `n == 0`, or only NaN and -inf).
///
/// Reads `n` values of `logits`; uses the first [`ARGMAX_WORKSPACE`] values of `workspace`
/// (scratch, overwritten); writes `out[0]`. Views must be long enough and `n < 2^31`.
pub fn argmax(
    kernels: &Kernels,
    stream: &Stream,
    logits: DeviceSlice<f32>,
    n: usize,
    workspace: &mut DeviceSliceMut<u64>,
    out: &mut DeviceSliceMut<i32>,
) -> Result<()> {
    check_shape(n <= i32::MAX as usize, OP, || {
        format!("argmax over {n} values: token ids are i32")
    })?;
    check_views(logits.len(), n, workspace.len(), out.len())?;
    let n_u = n as u32;
    let (logits_p, workspace_p, out_p) = (logits.ptr(), workspace.ptr(), out.ptr());
    let blocks = n_u
        .div_ceil(ARGMAX_BLOCK * ARGMAX_PER_THREAD)
        .min(ARGMAX_WORKSPACE as u32);
    if blocks > 0 {
        let partial = kernels.function(KernelModule::Sampling, "argmax_partial")?;
        let mut l = partial.builder(stream);
        l.arg(&logits_p).arg(&n_u).arg(&workspace_p);
        // SAFETY: the arguments match `argmax_partial(const float*, u32, u64*)`; the grid-stride
        // loop reads indices < n of logits, which holds n values, and block b writes
        // workspace[b], b < blocks <= ARGMAX_WORKSPACE <= workspace.len().
        unsafe {
            l.launch(LaunchConfig {
                grid: [blocks, 1, 1],
                block: [ARGMAX_BLOCK, 1, 1],
                shared_bytes: 0,
            })
        }?;
    }
    let last = kernels.function(KernelModule::Sampling, "argmax_final")?;
    let mut l = last.builder(stream);
    l.arg(&workspace_p).arg(&blocks).arg(&out_p);
    // SAFETY: the arguments match `argmax_final(const u64*, u32, i32*)`; it reads the `blocks`
    // partial keys the launch above wrote (same stream, so in order) and writes out[0].
    unsafe {
        l.launch(LaunchConfig {
            grid: [1, 1, 1],
            block: [ARGMAX_BLOCK, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Writes the index of the largest of the `n` values of each row `r < n_rows` of `logits`
/// (row `r` is `logits[r * n..(r + 1) * n]`) into `out[r]`, with [`argmax`]'s rule (0 for a row
/// with no winner, and for every row when `n == 0`).
///
/// Reads `n_rows * n` values of `logits`; writes `out[..n_rows]`. One launch; `n_rows == 0`
/// queues nothing. Errors (nothing queued) when a view is too short, `n >= 2^31` or `n_rows`
/// is above a grid's `i32::MAX` blocks.
pub fn argmax_rows(
    kernels: &Kernels,
    stream: &Stream,
    logits: DeviceSlice<f32>,
    n: usize,
    n_rows: usize,
    out: &mut DeviceSliceMut<i32>,
) -> Result<()> {
    check_shape(n <= i32::MAX as usize, OP, || {
        format!("argmax over rows of {n} values: token ids are i32")
    })?;
    check_shape(n_rows <= i32::MAX as usize, OP, || {
        format!(
            "argmax over {n_rows} rows: more than a grid's {} blocks",
            i32::MAX
        )
    })?;
    let values = n.checked_mul(n_rows);
    check_shape(values.is_some_and(|v| v <= logits.len()), OP, || {
        format!(
            "logits hold {} values, {n_rows} rows of {n} need more",
            logits.len()
        )
    })?;
    check_shape(out.len() >= n_rows, OP, || {
        format!(
            "out holds {} values, {n_rows} rows need one each",
            out.len()
        )
    })?;
    if n_rows == 0 {
        return Ok(());
    }
    let (n_u, rows_u) = (n as u32, n_rows as u32);
    let (logits_p, out_p) = (logits.ptr(), out.ptr());
    let function = kernels.function(KernelModule::Sampling, "argmax_rows")?;
    let mut l = function.builder(stream);
    l.arg(&logits_p).arg(&n_u).arg(&out_p);
    // SAFETY: the arguments match `argmax_rows(const float*, u32, i32*)`; block r reads
    // logits[r * n..(r + 1) * n], inside the n_rows * n values checked above, and writes out[r],
    // r < n_rows <= out.len(); the block of ARGMAX_ROWS_BLOCK threads fits its
    // __launch_bounds__.
    unsafe {
        l.launch(LaunchConfig {
            grid: [rows_u, 1, 1],
            block: [ARGMAX_ROWS_BLOCK, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Writes the token the CPU sampler would pick from the first `n` values of `logits` with the
/// draw `draw[0]` into `out[0]` (see the module docs for the rule and where it can differ).
///
/// Reads `n` values of `logits` and, unless greedy, `draw[0]` (device memory, read when the
/// kernel runs); at temperature 0 uses [`ARGMAX_WORKSPACE`] values of `workspace` as
/// [`argmax`] does (otherwise it is untouched); writes `out[0]`. Errors (nothing queued) on
/// settings `SamplerConfig::validate` refuses, views too short, or `n` above
/// [`MAX_SAMPLE_VOCAB`].
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn sample(
    kernels: &Kernels,
    stream: &Stream,
    logits: DeviceSlice<f32>,
    n: usize,
    params: &SamplingParams,
    draw: DeviceSlice<f32>,
    workspace: &mut DeviceSliceMut<u64>,
    out: &mut DeviceSliceMut<i32>,
) -> Result<()> {
    check(n, params)?;
    if params.temperature == 0.0 {
        return argmax(kernels, stream, logits, n, workspace, out);
    }
    check_views(logits.len(), n, workspace.len(), out.len())?;
    check_shape(!draw.is_empty(), OP, || "draw holds no value".to_string())?;
    let n_u = n as u32;
    // `top_k` at or above the candidate count keeps all, as 0 does.
    let top_k = u32::try_from(params.top_k).unwrap_or(0).min(n_u);
    let top_k = if top_k == n_u { 0 } else { top_k };
    // As the CPU sampler: the reciprocal once, in f32.
    let inv_t = 1.0f32 / params.temperature;
    let function = kernels.function(KernelModule::Sampling, "sample_logits")?;
    let mut l = function.builder(stream);
    let (logits_p, draw_p, out_p) = (logits.ptr(), draw.ptr(), out.ptr());
    l.arg(&logits_p)
        .arg(&n_u)
        .arg(&top_k)
        .arg(&params.top_p)
        .arg(&inv_t)
        .arg(&draw_p)
        .arg(&out_p);
    // SAFETY: the arguments match `sample_logits(const float*, u32, u32, float, float, const
    // float*, i32*)`; the kernel reads indices < n of logits (which holds n), draw[0] and
    // writes out[0]; the block of 1024 threads fits its __launch_bounds__.
    unsafe {
        l.launch(LaunchConfig {
            grid: [1, 1, 1],
            block: [SAMPLE_BLOCK, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

fn check_views(logits_len: usize, n: usize, workspace_len: usize, out_len: usize) -> Result<()> {
    check_shape(logits_len >= n, OP, || {
        format!("logits hold {logits_len} values, n is {n}")
    })?;
    check_shape(workspace_len >= ARGMAX_WORKSPACE, OP, || {
        format!("workspace holds {workspace_len} u64, needs {ARGMAX_WORKSPACE}")
    })?;
    check_shape(out_len >= 1, OP, || "out holds no value".to_string())
}

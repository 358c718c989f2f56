//! Elementwise f32 ops: gated activations, residual add, bias over rows, scaled row
//! accumulation with a device-side factor, scale, row copies and zeroing.
//!
//! Every op works on the first `len` values of its views (or on whole rows of `dim`), checks
//! that the views are long enough and that views it writes do not overlap views it reads, and
//! queues one grid-stride kernel. Shapes and the constant factor of [`scale`] are launch
//! arguments; the factor of [`add_scaled_row`] is read from device memory, so a captured graph
//! replays with new MoE routing weights. Values are limited to 2^32 - 1 per launch.

use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{LaunchConfig, Stream};

/// Threads per block: a multiple of both wave sizes.
pub(crate) const BLOCK: u32 = 256;
/// Threads per block of `gated_q8`: one per value, a multiple of 32 so that the 32 values of
/// a quantization group are whole on 32 lanes.
pub(crate) const GATED_Q8_THREADS: u32 = 256;
/// `spin_cycles` runs on one thread.
pub(crate) const SPIN_THREADS: u32 = 1;
/// Most blocks of one launch; the kernels loop over what remains.
const MAX_BLOCKS: u32 = 8192;

/// The gate activation of a gated feed-forward block, as in the decode crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateActivation {
    /// `x / (1 + exp(-x))` (Llama, Qwen).
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))` (Gemma).
    GeluTanh,
}

impl GateActivation {
    /// The activation of one value, in f32 as the CPU reference computes it.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            GateActivation::Silu => x / (1.0 + (-x).exp()),
            GateActivation::GeluTanh => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                0.5 * x * (1.0 + inner.tanh())
            }
        }
    }

    fn entry_point(self) -> &'static str {
        match self {
            GateActivation::Silu => "gated_silu",
            GateActivation::GeluTanh => "gated_gelu_tanh",
        }
    }
}

/// `gate = act(gate) * up` over `len` values.
///
/// Reads `len` values of `gate` and `up`, writes `len` of `gate`; the two must not overlap.
pub fn gated(
    kernels: &Kernels,
    stream: &Stream,
    gate: &mut DeviceSliceMut<f32>,
    up: DeviceSlice<f32>,
    len: usize,
    act: GateActivation,
) -> Result<()> {
    const OP: &str = "gated";
    let n = count(OP, len)?;
    fits(OP, "gate", gate.len(), len)?;
    fits(OP, "up", up.len(), len)?;
    disjoint(OP, ("gate", gate.addr()), ("up", up.addr()), len)?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Elementwise, act.entry_point())?;
    let mut l = function.builder(stream);
    let (gate_p, up_p) = (gate.ptr(), up.ptr());
    l.arg(&gate_p).arg(&up_p).arg(&n);
    // SAFETY: the arguments match `gated_silu` / `gated_gelu_tanh(float*, const float*, u32)`;
    // both views hold `len` values and do not overlap (the kernel's `__restrict__`).
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// [`gated`] that also quantizes the result for the next matrix-vector product, exactly as
/// [`crate::ops::matvec_q8::quantize`] would: one launch instead of two. `len` is a multiple
/// of 32 and `q8` holds `len` values and `len / 32` scales.
pub fn gated_q8(
    kernels: &Kernels,
    stream: &Stream,
    gate: &mut DeviceSliceMut<f32>,
    up: DeviceSlice<f32>,
    len: usize,
    act: GateActivation,
    q8: &mut crate::ops::matvec_q8::Q8ActivationsMut,
) -> Result<()> {
    const OP: &str = "gated_q8";
    let n = count(OP, len)?;
    fits(OP, "gate", gate.len(), len)?;
    fits(OP, "up", up.len(), len)?;
    disjoint(OP, ("gate", gate.addr()), ("up", up.addr()), len)?;
    check_shape(len.is_multiple_of(32), OP, || {
        format!("{len} values are not whole groups of 32")
    })?;
    fits(OP, "the quantized values", q8.values.len(), len)?;
    fits(OP, "the quantized scales", q8.scales.len(), len / 32)?;
    if n == 0 {
        return Ok(());
    }
    let groups = n / 32;
    let act_code: u32 = match act {
        GateActivation::Silu => 0,
        GateActivation::GeluTanh => 1,
    };
    let function = kernels.function(KernelModule::Elementwise, "gated_q8")?;
    let mut l = function.builder(stream);
    let (gate_p, up_p, q_p, d_p) = (gate.ptr(), up.ptr(), q8.values.ptr(), q8.scales.ptr());
    l.arg(&gate_p)
        .arg(&up_p)
        .arg(&q_p)
        .arg(&d_p)
        .arg(&groups)
        .arg(&act_code);
    const THREADS: u32 = GATED_Q8_THREADS;
    // SAFETY: the arguments match `gated_q8(float*, const float*, i8*, float*, u32, u32)`;
    // thread k < 32 * groups = n touches value k of gate, up and the quantized values and
    // scale k / 32, all inside the views checked above; gate and up do not overlap. THREADS
    // is a multiple of 32, as the kernel's group shuffles need.
    unsafe {
        l.launch(LaunchConfig {
            grid: [n.div_ceil(THREADS), 1, 1],
            block: [THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// The residual add `x += y` over `len` values.
///
/// Reads `len` values of `x` and `y`, writes `len` of `x`; the two must not overlap.
pub fn add(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    y: DeviceSlice<f32>,
    len: usize,
) -> Result<()> {
    const OP: &str = "add";
    let n = count(OP, len)?;
    fits(OP, "x", x.len(), len)?;
    fits(OP, "y", y.len(), len)?;
    disjoint(OP, ("x", x.addr()), ("y", y.addr()), len)?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Elementwise, "add_inplace")?;
    let mut l = function.builder(stream);
    let (x_p, y_p) = (x.ptr(), y.ptr());
    l.arg(&x_p).arg(&y_p).arg(&n);
    // SAFETY: the arguments match `add_inplace(float*, const float*, u32)`; both views hold
    // `len` values and do not overlap.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// `x[r] += bias` for `rows` rows of `dim` (`bias` holds `dim` values).
///
/// Reads `rows * dim` values of `x` and `dim` of `bias`, writes `rows * dim` of `x`; `x` must
/// not overlap `bias`.
pub fn add_bias(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    bias: DeviceSlice<f32>,
    rows: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "add_bias";
    check_shape(dim > 0 || rows == 0, OP, || "dim is 0".to_string())?;
    let len = rows.saturating_mul(dim);
    let n = count(OP, len)?;
    fits(OP, "bias", bias.len(), dim)?;
    fits(OP, "x", x.len(), len)?;
    if n == 0 {
        return Ok(());
    }
    let x_bytes = len * 4;
    let b_bytes = dim * 4;
    let (xa, ba) = (x.addr(), bias.addr());
    check_shape(
        xa + x_bytes as u64 <= ba || ba + b_bytes as u64 <= xa,
        OP,
        || format!("x at {xa:#x} overlaps bias at {ba:#x}"),
    )?;
    let dim_u = dim as u32;
    let function = kernels.function(KernelModule::Elementwise, "add_bias_rows")?;
    let mut l = function.builder(stream);
    let (x_p, bias_p) = (x.ptr(), bias.ptr());
    l.arg(&x_p).arg(&bias_p).arg(&n).arg(&dim_u);
    // SAFETY: the arguments match `add_bias_rows(float*, const float*, u32 n, u32 dim)`; x holds
    // n = rows * dim values, bias dim (indexed i % dim), and they do not overlap.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// `x[x_row] += alpha[0] * y` over one row of `dim` (MoE: an expert's output weighted by its
/// routing probability, which stays on the device).
///
/// Reads `dim` values of `y`, one of `alpha` (device memory, read when the kernel runs) and
/// row `x_row` of `x` (values `x_row * dim .. (x_row + 1) * dim`), which it writes. `y` and
/// `alpha` must not overlap that row.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn add_scaled_row(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    x_row: usize,
    y: DeviceSlice<f32>,
    alpha: DeviceSlice<f32>,
    dim: usize,
) -> Result<()> {
    const OP: &str = "add_scaled_row";
    let n = count(OP, dim)?;
    let end = x_row
        .checked_add(1)
        .and_then(|r| r.checked_mul(dim))
        .unwrap_or(usize::MAX);
    fits(OP, "x", x.len(), end)?;
    fits(OP, "y", y.len(), dim)?;
    check_shape(!alpha.is_empty(), OP, || "alpha holds no value".to_string())?;
    if n == 0 {
        return Ok(());
    }
    let x_len = x.len();
    let row = x
        .slice_mut(x_row * dim, dim)
        .ok_or_else(|| short(OP, "x", x_len, x_row * dim, dim))?;
    disjoint(OP, ("x row", row.addr()), ("y", y.addr()), dim)?;
    let (ra, aa) = (row.addr(), alpha.addr());
    check_shape(aa + 4 <= ra || ra + (dim * 4) as u64 <= aa, OP, || {
        format!("alpha at {aa:#x} lies inside the x row at {ra:#x}")
    })?;
    let function = kernels.function(KernelModule::Elementwise, "add_scaled")?;
    let mut l = function.builder(stream);
    let (row_p, y_p, alpha_p) = (row.ptr(), y.ptr(), alpha.ptr());
    l.arg(&row_p).arg(&y_p).arg(&alpha_p).arg(&n);
    // SAFETY: the arguments match `add_scaled(float*, const float*, const float*, u32)`; the
    // row holds dim values inside x, y holds dim, alpha at least one, and none overlaps the row.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// `x *= factor` over `len` values.
///
/// Reads and writes `len` values of `x`.
pub fn scale(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    len: usize,
    factor: f32,
) -> Result<()> {
    const OP: &str = "scale";
    let n = count(OP, len)?;
    fits(OP, "x", x.len(), len)?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Elementwise, "scale_inplace")?;
    let mut l = function.builder(stream);
    let x_p = x.ptr();
    l.arg(&x_p).arg(&factor).arg(&n);
    // SAFETY: the arguments match `scale_inplace(float*, float, u32)`; x holds `len` values.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// `x = cap * tanh(x / cap)` over `len` values: soft-capped logits (Gemma 2's final ones).
/// `cap` must be finite and positive.
pub fn softcap(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    len: usize,
    cap: f32,
) -> Result<()> {
    const OP: &str = "softcap";
    let n = count(OP, len)?;
    fits(OP, "x", x.len(), len)?;
    check_shape(cap.is_finite() && cap > 0.0, OP, || {
        format!("cap = {cap} must be finite and positive")
    })?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Elementwise, "softcap_inplace")?;
    let mut l = function.builder(stream);
    let x_p = x.ptr();
    l.arg(&x_p).arg(&cap).arg(&n);
    // SAFETY: the arguments match `softcap_inplace(float*, float, u32)`; x holds `len` values.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// Copies `rows` rows of `dim` starting at row `src_row` of `src` to row `dst_row` of `dst`.
///
/// Reads `rows * dim` values of `src` from value `src_row * dim`, writes as many of `dst` from
/// value `dst_row * dim`; the two ranges must not overlap.
// The op's shape is plain arguments, as in the decode crate's backend interface.
#[allow(clippy::too_many_arguments)]
pub fn copy_rows(
    kernels: &Kernels,
    stream: &Stream,
    src: DeviceSlice<f32>,
    src_row: usize,
    dst: &mut DeviceSliceMut<f32>,
    dst_row: usize,
    rows: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "copy_rows";
    let len = rows.saturating_mul(dim);
    let n = count(OP, len)?;
    let s0 = src_row.saturating_mul(dim);
    let d0 = dst_row.saturating_mul(dim);
    let src = src
        .slice(s0, len)
        .ok_or_else(|| short(OP, "src", src.len(), s0, len))?;
    let dst_len = dst.len();
    let dst = dst
        .slice_mut(d0, len)
        .ok_or_else(|| short(OP, "dst", dst_len, d0, len))?;
    if n == 0 {
        return Ok(());
    }
    disjoint(OP, ("src", src.addr()), ("dst", dst.addr()), len)?;
    let function = kernels.function(KernelModule::Elementwise, "copy_f32")?;
    let mut l = function.builder(stream);
    let (src_p, dst_p) = (src.ptr(), dst.ptr());
    l.arg(&src_p).arg(&dst_p).arg(&n);
    // SAFETY: the arguments match `copy_f32(const float*, float*, u32)`; both sub-views hold
    // n values inside the caller's views and do not overlap.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// Zeroes the first `len` values of `x` (writes `len` values).
pub fn zero(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    len: usize,
) -> Result<()> {
    const OP: &str = "zero";
    let n = count(OP, len)?;
    fits(OP, "x", x.len(), len)?;
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function(KernelModule::Elementwise, "zero_f32")?;
    let mut l = function.builder(stream);
    let x_p = x.ptr();
    l.arg(&x_p).arg(&n);
    // SAFETY: the arguments match `zero_f32(float*, u32)`; x holds `len` values.
    unsafe { l.launch(config(n)) }?;
    Ok(())
}

/// Queues a one-thread kernel that busy-waits about `cycles` device clock ticks (profiling: the
/// host queues the rest of a step while the device waits, so events time kernels alone).
pub fn spin(kernels: &Kernels, stream: &Stream, cycles: u64) -> Result<()> {
    let function = kernels.function(KernelModule::Elementwise, "spin_cycles")?;
    let mut l = function.builder(stream);
    l.arg(&cycles);
    // SAFETY: the argument matches `spin_cycles(u64)`; the kernel touches no memory.
    unsafe {
        l.launch(hip_ffi::LaunchConfig {
            grid: [1, 1, 1],
            block: [SPIN_THREADS, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// `len` as the kernels' u32 count, or an error naming the op.
fn count(op: &'static str, len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| crate::error::KernelError::Shape {
        op,
        message: format!("{len} values do not fit one launch (at most 2^32 - 1)"),
    })
}

fn fits(op: &'static str, what: &str, have: usize, need: usize) -> Result<()> {
    check_shape(have >= need, op, || {
        format!("{what} holds {have} values, the shape needs {need}")
    })
}

fn short(
    op: &'static str,
    what: &str,
    have: usize,
    start: usize,
    len: usize,
) -> crate::error::KernelError {
    crate::error::KernelError::Shape {
        op,
        message: format!("{what} holds {have} values, the rows need {len} from value {start}"),
    }
}

/// An error unless `len` f32 values at `a` and at `b` are disjoint.
fn disjoint(op: &'static str, a: (&str, u64), b: (&str, u64), len: usize) -> Result<()> {
    let bytes = (len as u64) * 4;
    check_shape(
        bytes == 0 || a.1 + bytes <= b.1 || b.1 + bytes <= a.1,
        op,
        || format!("{} at {:#x} and {} at {:#x} overlap", a.0, a.1, b.0, b.1),
    )
}

/// A grid-stride launch over `n > 0` values (callers return early on 0).
fn config(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [n.div_ceil(BLOCK).clamp(1, MAX_BLOCKS), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    }
}

//! Rotary position embedding, in place over `[rows][n_heads][head_dim]` f32 (Q and K are
//! rotated by separate calls).
//!
//! Row r is at position `positions[r]`, read from device memory. Pair i (`i < n_rot / 2`) turns
//! by `theta_i = (p / position_scale) * freq_base^(-2i / n_rot)`, divided by `freq_factors[i]`
//! when given; the dimensions from `n_rot` on pass through. Normal rope rotates `(2i, 2i + 1)`,
//! NeoX `(i, i + n_rot / 2)`. The same semantics as the decode crate's `rope_head`.
//!
//! Precision: the kernel forms the angle in f32 with the same operations as the CPU, and
//! evaluates `freq_base^e`, `sin` and `cos` in double, rounded once. Against the f32 CPU
//! reference the difference is therefore the CPU's own libm rounding: a one-ulp difference in
//! a frequency turns into an angle difference of about `p * 1.2e-7`, so outputs agree to about
//! `(1e-6 + 2.5e-7 * p / position_scale) * |x|` (the tests use twice that).

use crate::error::{check_shape, KernelError, Result};
use crate::kernels::Kernels;
use crate::ops::kv_cache::to_u32;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{DevicePtr, LaunchConfig, Stream};

const OP: &str = "rope";
/// Most threads per block (blocks per row cover the row's (head, pair) items).
pub(crate) const MAX_BLOCK: u32 = 256;
/// Most blocks per row (grid y); a row with more items loops over them.
const MAX_ROW_BLOCKS: u32 = 64;
/// Most rotated dimensions per head: the kernel keeps one angle per pair in shared memory
/// (`ROPE_MAX_PAIRS` in `rope.hip`).
pub const MAX_ROT: usize = 512;

/// Rotary embedding parameters of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotate pairs `(i, i + n_rot / 2)` (NeoX: Qwen, Gemma) instead of `(2i, 2i + 1)` (Llama).
    pub neox: bool,
    /// Frequency base (10000, 1e6, ...).
    pub freq_base: f32,
    /// Linear position scaling (positions are divided by this); 1 for none.
    pub position_scale: f32,
    /// Number of leading dimensions of each head that rotate (even, at most `head_dim`).
    pub n_rot: usize,
}

/// Shape of a rope call: `rows` tokens of `n_heads` heads of `head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeShape {
    /// Tokens (one position each).
    pub rows: usize,
    /// Heads per token.
    pub n_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

/// Checks `shape` and `params` against the views' lengths (shared with the CPU reference).
pub fn check(
    x_len: usize,
    positions_len: usize,
    freq_factors_len: Option<usize>,
    shape: RopeShape,
    params: &RopeParams,
) -> Result<()> {
    let RopeShape {
        rows,
        n_heads,
        head_dim,
    } = shape;
    check_shape(params.n_rot.is_multiple_of(2), OP, || {
        format!("n_rot = {} must be even (it rotates pairs)", params.n_rot)
    })?;
    check_shape(params.n_rot <= MAX_ROT, OP, || {
        format!(
            "n_rot = {} exceeds the kernel's {MAX_ROT} rotated dimensions per head",
            params.n_rot
        )
    })?;
    check_shape(params.n_rot <= head_dim, OP, || {
        format!("n_rot = {} exceeds head_dim = {head_dim}", params.n_rot)
    })?;
    check_shape(
        params.freq_base.is_finite() && params.freq_base > 0.0,
        OP,
        || {
            format!(
                "freq_base = {} must be finite and positive",
                params.freq_base
            )
        },
    )?;
    check_shape(
        params.position_scale.is_finite() && params.position_scale > 0.0,
        OP,
        || {
            format!(
                "position_scale = {} must be finite and positive",
                params.position_scale
            )
        },
    )?;
    let need = rows
        .checked_mul(n_heads)
        .and_then(|n| n.checked_mul(head_dim));
    check_shape(need.is_some_and(|n| n <= x_len), OP, || {
        format!("{rows} rows of {n_heads} heads of {head_dim} do not fit a view of {x_len} values")
    })?;
    check_shape(positions_len >= rows, OP, || {
        format!("{rows} rows need {rows} positions, the positions view has {positions_len}")
    })?;
    if let Some(len) = freq_factors_len {
        check_shape(len >= params.n_rot / 2, OP, || {
            format!(
                "n_rot = {} needs {} frequency factors, the view has {len}",
                params.n_rot,
                params.n_rot / 2
            )
        })?;
    }
    Ok(())
}

/// Rotates `x` in place; see the module docs. A no-op when there is nothing to rotate.
///
/// Errors when `n_rot` is odd or exceeds `head_dim`, when `freq_base` or `position_scale` is
/// not finite and positive, or when a view is too short for the shape.
pub fn rope(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    positions: &DeviceSlice<i32>,
    freq_factors: Option<&DeviceSlice<f32>>,
    shape: RopeShape,
    params: &RopeParams,
) -> Result<()> {
    rope_launch(
        kernels,
        stream,
        x,
        None,
        positions,
        freq_factors,
        shape,
        params,
        None,
    )
}

/// [`rope`] of two tensors with the same rows, head size and angles in one launch (a layer's
/// queries `x` and keys `x2`, the latter of `n_heads2` heads per row).
#[allow(clippy::too_many_arguments)]
pub fn rope_pair(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    x2: &mut DeviceSliceMut<f32>,
    n_heads2: usize,
    positions: &DeviceSlice<i32>,
    freq_factors: Option<&DeviceSlice<f32>>,
    shape: RopeShape,
    params: &RopeParams,
) -> Result<()> {
    rope_pair_store(
        kernels,
        stream,
        x,
        x2,
        n_heads2,
        positions,
        freq_factors,
        shape,
        params,
        None,
    )
}

/// The device pointers and sizes of a fused K/V store, as the kernel takes them.
struct StoreArgs {
    v: DevicePtr,
    dim_v: u32,
    k_cache: DevicePtr,
    v_cache: DevicePtr,
    slots: u32,
    pages: crate::ops::kv_cache::PageArgs,
    entry: &'static str,
}

/// Launches `rope_f32`, or with `store` (only given with a second tensor, already checked by
/// the caller) `rope_store_{f16,f32}`, which also writes the rotated keys and the values into
/// the caches.
#[allow(clippy::too_many_arguments)]
fn rope_launch(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    second: Option<(&mut DeviceSliceMut<f32>, usize)>,
    positions: &DeviceSlice<i32>,
    freq_factors: Option<&DeviceSlice<f32>>,
    shape: RopeShape,
    params: &RopeParams,
    store: Option<(KvStore<'_>, crate::ops::kv_cache::PageArgs)>,
) -> Result<()> {
    check(
        x.len(),
        positions.len(),
        freq_factors.map(|f| f.len()),
        shape,
        params,
    )?;
    let (x2_ptr, n_heads2) = match second {
        Some((x2, n)) => (x2.ptr(), to_u32(OP, "n_heads2", n)?),
        None => (DevicePtr(0), 0),
    };
    let store = match store {
        Some((kv, pages)) => Some(StoreArgs {
            v: kv.v.ptr(),
            dim_v: to_u32(OP, "dim_v", kv.dim_v)?,
            k_cache: kv.k_cache.ptr(),
            v_cache: kv.v_cache.ptr(),
            slots: to_u32(OP, "slots", kv.slots)?,
            pages,
            entry: match kv.k_cache.elem() {
                crate::ops::kv_cache::KvElem::F16 => "rope_store_f16",
                crate::ops::kv_cache::KvElem::F32 => "rope_store_f32",
                crate::ops::kv_cache::KvElem::Q8_0 => return Err(q8_0_store_refused()),
            },
        }),
        None => None,
    };
    // Nothing to rotate is nothing to do, unless rows are to be stored.
    let rotates = shape.n_heads + n_heads2 as usize > 0 && params.n_rot > 0;
    if shape.rows == 0 || (!rotates && store.is_none()) {
        return Ok(());
    }
    let rows = to_u32(OP, "rows", shape.rows)?;
    let n_heads = to_u32(OP, "n_heads", shape.n_heads)?;
    let head_dim = to_u32(OP, "head_dim", shape.head_dim)?;
    let n_rot = to_u32(OP, "n_rot", params.n_rot)?;
    let wave = kernels.wave_size().max(1);
    // One thread per item up to MAX_BLOCK, in whole waves: the (head, pair) rotations, and with
    // a store the keys' unrotated values and the value row.
    let mut items = (n_heads + n_heads2) * (n_rot / 2);
    if let Some(st) = &store {
        items += n_heads2 * (head_dim - n_rot) + st.dim_v;
    }
    let block = items
        .div_ceil(wave)
        .max(1)
        .saturating_mul(wave)
        .min(MAX_BLOCK);
    let row_blocks = items.div_ceil(block).clamp(1, MAX_ROW_BLOCKS);
    let (ff_ptr, has_ff) = match freq_factors {
        Some(f) => (f.ptr(), 1u32),
        None => (DevicePtr(0), 0u32),
    };
    let neox = u32::from(params.neox);
    let (x_ptr, positions_ptr) = (x.ptr(), positions.ptr());
    let entry = store.as_ref().map_or("rope_f32", |st| st.entry);
    let function = kernels.function(KernelModule::Rope, entry)?;
    let mut launch = function.builder(stream);
    launch
        .arg(&x_ptr)
        .arg(&positions_ptr)
        .arg(&ff_ptr)
        .arg(&has_ff)
        .arg(&rows)
        .arg(&n_heads)
        .arg(&head_dim)
        .arg(&n_rot)
        .arg(&params.freq_base)
        .arg(&params.position_scale)
        .arg(&neox)
        .arg(&x2_ptr)
        .arg(&n_heads2);
    if let Some(st) = &store {
        launch
            .arg(&st.v)
            .arg(&st.dim_v)
            .arg(&st.k_cache)
            .arg(&st.v_cache)
            .arg(&st.slots);
        st.pages.push(&mut launch);
    }
    // SAFETY: the arguments match `rope_f32` in order and type, or with a store
    // `rope_store_{f16,f32}` (the same, then v, dim_v, k_cache, v_cache, slots and the six
    // paging arguments), the caches' element type picking the entry point. The checks keep every access inside the views: rows
    // * n_heads * head_dim values of x (and rows * n_heads2 * head_dim of x2, null with no
    // heads, not overlapping x), `rows` positions, n_rot / 2 frequency factors (read only when
    // has_freq_factors is 1), and with a store (checked by `rope_pair_store`) rows * dim_v
    // values of v and cache rows of both caches: slots (position % slots < slots) unpaged, and
    // paged, rows the kernel clamps to the caches' row count, which `PageArgs` checked.
    unsafe {
        launch.launch(LaunchConfig {
            grid: [rows, row_blocks, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
        })
    }?;
    Ok(())
}

/// Why [`rope_pair_store`] takes no q8_0 cache: its threads own single rotation pairs, while a
/// q8_0 block's scale needs the block's 32 values together, so the fused store would be a
/// different kernel; rotating, then storing with the K/V store, leaves the same bytes.
fn q8_0_store_refused() -> KernelError {
    KernelError::Shape {
        op: OP,
        message: "rope's fused K/V store does not write q8_0 caches: rotate with rope_pair, then \
                  store with kv_cache::store_kv"
            .to_string(),
    }
}

/// The new K and V rows [`rope_pair_store`] writes into a layer's caches.
pub struct KvStore<'a> {
    /// The value rows (`rows * dim_v` values).
    pub v: &'a DeviceSlice<f32>,
    /// Values per value row.
    pub dim_v: usize,
    /// The layer's K cache (`slots` rows of `n_heads2 * head_dim`).
    pub k_cache: &'a mut crate::ops::kv_cache::KvSliceMut,
    /// The layer's V cache (`slots` rows of `dim_v`), of the K cache's element type.
    pub v_cache: &'a mut crate::ops::kv_cache::KvSliceMut,
    /// Slots of each sequence; row r goes to slot `positions[r] % slots`.
    pub slots: usize,
    /// The caches' block tables, when they are paged.
    pub pages: Option<crate::ops::kv_cache::KvPages>,
}

/// [`rope_pair`] of a layer's queries `x` and keys `x2`, with (given `store`) the rotated key
/// rows and the value rows stored in the layer's caches in the same launch: what [`rope_pair`]
/// followed by [`crate::ops::kv_cache::store_kv`] leave, bit for bit, in one kernel instead of
/// two. With no store it is [`rope_pair`]. Errors (nothing queued) as either of those would,
/// and on q8_0 caches, which this fused store does not write: for those, call [`rope_pair`] and
/// then [`crate::ops::kv_cache::store_kv`].
#[allow(clippy::too_many_arguments)]
pub fn rope_pair_store(
    kernels: &Kernels,
    stream: &Stream,
    x: &mut DeviceSliceMut<f32>,
    x2: &mut DeviceSliceMut<f32>,
    n_heads2: usize,
    positions: &DeviceSlice<i32>,
    freq_factors: Option<&DeviceSlice<f32>>,
    shape: RopeShape,
    params: &RopeParams,
    store: Option<KvStore<'_>>,
) -> Result<()> {
    let shape2 = RopeShape {
        n_heads: n_heads2,
        ..shape
    };
    check(
        x2.len(),
        positions.len(),
        freq_factors.map(|f| f.len()),
        shape2,
        params,
    )?;
    let bytes = (shape.rows * shape.n_heads * shape.head_dim * 4) as u64;
    let bytes2 = (shape.rows * n_heads2 * shape.head_dim * 4) as u64;
    let (a, b) = (x.addr(), x2.addr());
    crate::error::check_shape(a + bytes <= b || b + bytes2 <= a, OP, || {
        "the two tensors overlap".to_string()
    })?;
    if store
        .as_ref()
        .is_some_and(|kv| kv.k_cache.elem() == crate::ops::kv_cache::KvElem::Q8_0)
    {
        return Err(q8_0_store_refused());
    }
    let store = match store {
        Some(kv) => Some({
            let pages = crate::ops::kv_cache::check_kv_store(
                &x2.as_const(),
                kv.v,
                kv.k_cache,
                kv.v_cache,
                positions,
                kv.pages.as_ref(),
                crate::ops::kv_cache::KvStoreShape {
                    rows: shape.rows,
                    dim_k: n_heads2 * shape.head_dim,
                    dim_v: kv.dim_v,
                    slots: kv.slots,
                },
            )?;
            (kv, pages)
        }),
        None => None,
    };
    rope_launch(
        kernels,
        stream,
        x,
        Some((x2, n_heads2)),
        positions,
        freq_factors,
        shape,
        params,
        store,
    )
}

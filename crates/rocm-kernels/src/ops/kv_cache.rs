//! Stores of new K/V rows into a layer's cache.
//!
//! The cache of a layer is `[slots][dim]` with `dim = n_head_kv * head_dim`, in f16 (IEEE half,
//! stored as `u16` bits, rounded to nearest even), f32, or q8_0 (blocks of 32 values in 34
//! bytes, quantized bit for bit as [`crate::reference::kv_q8::quantize_q8_0`]; `dim` a multiple
//! of 32). The row of position p goes to slot
//! `p % slots`: a full-length cache is never wrapped, a sliding-window layer's cache is a ring.
//! Positions are read from device memory (the step block), so a captured step replays at new
//! positions.
//!
//! A cache may be paged ([`KvPages`]): then it is a pool of blocks, and each token's sequence
//! has a block table that maps its slots to cache rows, so sequences of one step share one
//! buffer per layer and take blocks as they grow.

use crate::error::{check_shape, KernelError, Result};
use crate::kernels::Kernels;
use crate::reference::kv_q8::{q8_0_row_bytes, Q8_0_BLOCK, Q8_0_BLOCK_BYTES};
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{DevicePtr, LaunchBuilder, LaunchConfig, Stream};

const OP: &str = "kv_store";
/// Threads per block of the store kernels (a multiple of both wave sizes).
pub(crate) const BLOCK: u32 = 256;

/// Element type of a K/V cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvElem {
    /// IEEE half, stored as `u16` bits (round to nearest even on store).
    F16,
    /// f32, stored as is.
    F32,
    /// ggml's q8_0 blocks (`reference::kv_q8`): per 32 values an f16 scale and 32 signed
    /// bytes, 34 bytes in all. Rows (and, for attention, heads) are whole blocks.
    Q8_0,
}

impl KvElem {
    /// Bytes of a row of `dim` values, or `None` where `dim` is not a whole number of the
    /// type's blocks (q8_0: a multiple of 32) or the size overflows.
    pub fn row_bytes(self, dim: usize) -> Option<usize> {
        match self {
            KvElem::F16 => dim.checked_mul(2),
            KvElem::F32 => dim.checked_mul(4),
            KvElem::Q8_0 => q8_0_row_bytes(dim),
        }
    }

    /// Values per block: the granularity of a row (1 for f16 and f32, 32 for q8_0).
    pub fn block_values(self) -> usize {
        match self {
            KvElem::F16 | KvElem::F32 => 1,
            KvElem::Q8_0 => Q8_0_BLOCK,
        }
    }

    /// Alignment, in bytes, the kernels need of a cache's address: the element's (q8_0: its
    /// 2-byte scale, the most a 34-byte block is aligned to).
    pub fn align(self) -> usize {
        match self {
            KvElem::F16 | KvElem::Q8_0 => 2,
            KvElem::F32 => 4,
        }
    }
}

/// Read-only view of a K or V cache in any element type.
#[derive(Clone, Copy, Debug)]
pub enum KvSlice {
    /// f16 elements as `u16` bits.
    F16(DeviceSlice<u16>),
    /// f32 elements.
    F32(DeviceSlice<f32>),
    /// q8_0 blocks as bytes (34 per 32 values); [`KvSlice::len`] counts the values of its
    /// whole blocks.
    Q8_0(DeviceSlice<u8>),
}

/// Writable view of a K or V cache in any element type.
#[derive(Debug)]
pub enum KvSliceMut {
    /// f16 elements as `u16` bits.
    F16(DeviceSliceMut<u16>),
    /// f32 elements.
    F32(DeviceSliceMut<f32>),
    /// q8_0 blocks as bytes (34 per 32 values); [`KvSliceMut::len`] counts values.
    Q8_0(DeviceSliceMut<u8>),
}

/// Values held by `bytes` bytes of q8_0 blocks (a trailing partial block holds none).
pub fn q8_0_values(bytes: usize) -> usize {
    bytes / Q8_0_BLOCK_BYTES * Q8_0_BLOCK
}

impl KvSlice {
    /// The element type.
    pub fn elem(&self) -> KvElem {
        match self {
            KvSlice::F16(_) => KvElem::F16,
            KvSlice::F32(_) => KvElem::F32,
            KvSlice::Q8_0(_) => KvElem::Q8_0,
        }
    }

    /// Number of values (for q8_0, those of its whole blocks, not bytes), so shapes check in
    /// values whatever the element type.
    pub fn len(&self) -> usize {
        match self {
            KvSlice::F16(s) => s.len(),
            KvSlice::F32(s) => s.len(),
            KvSlice::Q8_0(s) => q8_0_values(s.len()),
        }
    }

    /// True when the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address as the launch builder takes it.
    pub fn ptr(&self) -> DevicePtr {
        match self {
            KvSlice::F16(s) => s.ptr(),
            KvSlice::F32(s) => s.ptr(),
            KvSlice::Q8_0(s) => s.ptr(),
        }
    }
}

impl KvSliceMut {
    /// The element type.
    pub fn elem(&self) -> KvElem {
        match self {
            KvSliceMut::F16(_) => KvElem::F16,
            KvSliceMut::F32(_) => KvElem::F32,
            KvSliceMut::Q8_0(_) => KvElem::Q8_0,
        }
    }

    /// Number of values (for q8_0, those of its whole blocks, not bytes).
    pub fn len(&self) -> usize {
        match self {
            KvSliceMut::F16(s) => s.len(),
            KvSliceMut::F32(s) => s.len(),
            KvSliceMut::Q8_0(s) => q8_0_values(s.len()),
        }
    }

    /// True when the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address as the launch builder takes it.
    pub fn ptr(&self) -> DevicePtr {
        match self {
            KvSliceMut::F16(s) => s.ptr(),
            KvSliceMut::F32(s) => s.ptr(),
            KvSliceMut::Q8_0(s) => s.ptr(),
        }
    }

    /// The same memory, read-only (for attention after a store).
    pub fn as_const(&self) -> KvSlice {
        match self {
            KvSliceMut::F16(s) => KvSlice::F16(s.as_const()),
            KvSliceMut::F32(s) => KvSlice::F32(s.as_const()),
            KvSliceMut::Q8_0(s) => KvSlice::Q8_0(s.as_const()),
        }
    }
}

/// The block tables of a paged cache (`kv_pages.h`): token t of a call belongs to sequence
/// `seqs[t]`, whose slot s (position p is slot `p % slots`) is cache row `tables[seqs[t] *
/// table_len + s / block] * block + s % block`.
///
/// The caller keeps sequence ids below `tables.len() / table_len` and block ids below the
/// cache's rows / `block`; the kernels clamp either that is not, so a bad table stays inside the
/// views (wrong values, never a stray access).
#[derive(Clone, Copy, Debug)]
pub struct KvPages {
    /// Per token, the sequence (row of `tables`) it reads and writes.
    pub seqs: DeviceSlice<i32>,
    /// `[n_tables][table_len]` block ids.
    pub tables: DeviceSlice<i32>,
    /// Blocks per table; `table_len * block` covers the call's `slots`.
    pub table_len: usize,
    /// Rows per block, a power of two.
    pub block: usize,
}

/// The six kernel arguments of `KV_PAGES_PARAMS`, checked; null tables for an unpaged cache.
#[derive(Debug)]
pub(crate) struct PageArgs {
    seqs: DevicePtr,
    tables: DevicePtr,
    table_len: u32,
    n_tables: u32,
    shift: u32,
    rows: u32,
}

impl PageArgs {
    /// The arguments for a call of `n_tokens` tokens over caches of `cache_rows` rows whose
    /// sequences have `slots` slots each. Unpaged, the cache must hold `slots` rows.
    pub(crate) fn new(
        op: &'static str,
        pages: Option<&KvPages>,
        n_tokens: usize,
        slots: usize,
        cache_rows: usize,
    ) -> Result<PageArgs> {
        let Some(p) = pages else {
            check_shape(slots <= cache_rows, op, || {
                format!("{slots} slots do not fit a cache of {cache_rows} rows")
            })?;
            return Ok(PageArgs {
                seqs: DevicePtr(0),
                tables: DevicePtr(0),
                table_len: 0,
                n_tables: 0,
                shift: 0,
                rows: to_u32(op, "cache rows", cache_rows)?,
            });
        };
        check_shape(p.block.is_power_of_two(), op, || {
            format!("a block of {} rows is not a power of two", p.block)
        })?;
        check_shape(p.table_len > 0 && p.tables.len() >= p.table_len, op, || {
            format!(
                "tables of {} blocks in a view of {}",
                p.table_len,
                p.tables.len()
            )
        })?;
        check_shape(
            p.table_len.checked_mul(p.block).is_some_and(|n| n >= slots),
            op,
            || {
                format!(
                    "{slots} slots need more than a table of {} blocks of {}",
                    p.table_len, p.block
                )
            },
        )?;
        check_shape(cache_rows >= p.block, op, || {
            format!("a cache of {cache_rows} rows holds no block of {}", p.block)
        })?;
        check_shape(p.seqs.len() >= n_tokens, op, || {
            format!(
                "{n_tokens} tokens need {n_tokens} sequence ids, the view has {}",
                p.seqs.len()
            )
        })?;
        Ok(PageArgs {
            seqs: p.seqs.ptr(),
            tables: p.tables.ptr(),
            table_len: to_u32(op, "table length", p.table_len)?,
            n_tables: to_u32(op, "tables", p.tables.len() / p.table_len)?,
            shift: p.block.trailing_zeros(),
            rows: to_u32(op, "cache rows", cache_rows)?,
        })
    }

    /// Appends the six arguments, in `KV_PAGES_PARAMS` order.
    pub(crate) fn push<'a>(&'a self, l: &mut LaunchBuilder<'a>) {
        l.arg(&self.seqs)
            .arg(&self.tables)
            .arg(&self.table_len)
            .arg(&self.n_tables)
            .arg(&self.shift)
            .arg(&self.rows);
    }
}

/// `value` as the `u32` a kernel takes, or a shape error naming it.
pub(crate) fn to_u32(op: &'static str, what: &str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| KernelError::Shape {
        op,
        message: format!("{what} = {value} does not fit the kernels' 32-bit indices"),
    })
}

/// One tensor of a store: the new rows and the cache they go to.
struct Store<'a> {
    src: &'a DeviceSlice<f32>,
    cache: &'a KvSliceMut,
    dim: usize,
}

/// Whether a cache of `elem` at `addr` takes rows of `dim` values: q8_0 rows are whole blocks
/// of 32, and every cache sits at an address its kernels may load its elements from. `what`
/// names the width in the message ("K: dim", "head_dim_k").
pub(crate) fn check_elem(
    op: &'static str,
    elem: KvElem,
    addr: u64,
    what: &str,
    dim: usize,
) -> Result<()> {
    check_shape(elem.row_bytes(dim).is_some(), op, || {
        format!(
            "{what} = {dim} is not a multiple of {}: a {elem:?} cache stores whole blocks of {} \
             values",
            elem.block_values(),
            elem.block_values()
        )
    })?;
    check_shape(addr.is_multiple_of(elem.align() as u64), op, || {
        format!(
            "a {elem:?} cache at {addr:#x} is not {}-byte aligned",
            elem.align()
        )
    })
}

fn check_store(
    store: &Store<'_>,
    name: &str,
    rows: usize,
    slots: usize,
    paged: bool,
) -> Result<()> {
    check_elem(
        OP,
        store.cache.elem(),
        store.cache.ptr().0,
        &format!("{name}: dim"),
        store.dim,
    )?;
    let src_need = rows.checked_mul(store.dim);
    check_shape(src_need.is_some_and(|n| n <= store.src.len()), OP, || {
        format!(
            "{name}: {rows} rows of {} need {} values, the source view has {}",
            store.dim,
            rows.saturating_mul(store.dim),
            store.src.len()
        )
    })?;
    // A paged cache's size is its pool's, which `PageArgs` checks.
    let cache_need = if paged {
        Some(0)
    } else {
        slots.checked_mul(store.dim)
    };
    check_shape(
        cache_need.is_some_and(|n| n <= store.cache.len()),
        OP,
        || {
            format!(
                "{name}: {slots} slots of {} need {} elements, the cache view has {}",
                store.dim,
                slots.saturating_mul(store.dim),
                store.cache.len()
            )
        },
    )?;
    Ok(())
}

/// The checks of [`store_kv`], for an op that stores K and V rows in its own kernel (rope's
/// fused store): the sources, caches and positions are long enough for `shape` and the two
/// caches have one element type.
pub(crate) fn check_kv_store(
    k_src: &DeviceSlice<f32>,
    v_src: &DeviceSlice<f32>,
    k_cache: &KvSliceMut,
    v_cache: &KvSliceMut,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    shape: KvStoreShape,
) -> Result<PageArgs> {
    let (k, v) = kv_stores(k_src, v_src, k_cache, v_cache, shape);
    check_stores(&k, Some(&v), positions, pages, shape.rows, shape.slots)
}

/// The K and V halves of a store of `shape`.
fn kv_stores<'a>(
    k_src: &'a DeviceSlice<f32>,
    v_src: &'a DeviceSlice<f32>,
    k_cache: &'a KvSliceMut,
    v_cache: &'a KvSliceMut,
    shape: KvStoreShape,
) -> (Store<'a>, Store<'a>) {
    let k = Store {
        src: k_src,
        cache: k_cache,
        dim: shape.dim_k,
    };
    let v = Store {
        src: v_src,
        cache: v_cache,
        dim: shape.dim_v,
    };
    (k, v)
}

/// The checks of one store; returns the paging arguments of its launch.
fn check_stores(
    first: &Store<'_>,
    second: Option<&Store<'_>>,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    rows: usize,
    slots: usize,
) -> Result<PageArgs> {
    check_shape(slots > 0, OP, || "the cache has 0 slots".to_string())?;
    // Rows of several sequences may share a slot number; unpaged, they are one sequence's.
    check_shape(pages.is_some() || rows <= slots, OP, || {
        format!("{rows} rows do not fit a cache of {slots} slots (two rows would share a slot)")
    })?;
    check_shape(positions.len() >= rows, OP, || {
        format!(
            "{rows} rows need {rows} positions, the positions view has {}",
            positions.len()
        )
    })?;
    let paged = pages.is_some();
    check_store(first, "K", rows, slots, paged)?;
    let mut cache_rows = first.cache.len() / first.dim.max(1);
    if let Some(second) = second {
        check_store(second, "V", rows, slots, paged)?;
        cache_rows = cache_rows.min(second.cache.len() / second.dim.max(1));
        check_shape(second.cache.elem() == first.cache.elem(), OP, || {
            format!(
                "the K cache is {:?} but the V cache is {:?}",
                first.cache.elem(),
                second.cache.elem()
            )
        })?;
    }
    PageArgs::new(OP, pages, rows, slots, cache_rows)
}

#[allow(clippy::too_many_arguments)]
fn launch_store(
    kernels: &Kernels,
    stream: &Stream,
    first: Store<'_>,
    second: Option<Store<'_>>,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    rows: usize,
    slots: usize,
) -> Result<()> {
    let page_args = check_stores(&first, second.as_ref(), positions, pages, rows, slots)?;
    let max_dim = second.as_ref().map_or(first.dim, |s| s.dim.max(first.dim));
    if rows == 0 || max_dim == 0 {
        return Ok(());
    }
    let entry = match first.cache.elem() {
        KvElem::F16 => "kv_store_f16",
        KvElem::F32 => "kv_store_f32",
        KvElem::Q8_0 => "kv_store_q8_0",
    };
    let function = kernels.function(KernelModule::KvCache, entry)?;
    let other = second.as_ref().unwrap_or(&first);
    let (dst0, src0, dim0) = (
        first.cache.ptr(),
        first.src.ptr(),
        to_u32(OP, "dim", first.dim)?,
    );
    let (dst1, src1, dim1) = (
        other.cache.ptr(),
        other.src.ptr(),
        to_u32(OP, "dim", other.dim)?,
    );
    let rows_u32 = to_u32(OP, "rows", rows)?;
    let slots_u32 = to_u32(OP, "slots", slots)?;
    let column_blocks = to_u32(OP, "dim", max_dim.div_ceil(BLOCK as usize))?;
    let positions_ptr = positions.ptr();
    let config = LaunchConfig {
        grid: [
            rows_u32,
            column_blocks,
            if second.is_some() { 2 } else { 1 },
        ],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let mut launch = function.builder(stream);
    launch
        .arg(&dst0)
        .arg(&src0)
        .arg(&dim0)
        .arg(&dst1)
        .arg(&src1)
        .arg(&dim1)
        .arg(&positions_ptr)
        .arg(&rows_u32)
        .arg(&slots_u32);
    page_args.push(&mut launch);
    // SAFETY: the arguments match `kv_store_{f16,f32,q8_0}` in order and type (two
    // pointer/pointer/u32 triples, the positions pointer, rows, slots, then the six paging
    // arguments). The views vouch for their memory; the checks above make every source row
    // r < rows lie inside the sources, and every cache row inside the caches (counted in values,
    // which for q8_0 are those of whole blocks, and a q8_0 row of dim values, a multiple of 32
    // that `check_elem` enforced, is dim / 32 whole blocks): unpaged, rows are slots (< slots, by
    // the kernel's modulo); paged, `PageArgs` gave the kernel the caches' row count, which it
    // clamps every row to, and a sequence id per token. The caches are aligned for the kernel's
    // element (2-byte scale) stores; for q8_0 the 256-thread blocks and dims that are multiples
    // of 32 keep each block's 32 lanes together in one wave, as its shuffles need. The kernel
    // reads `rows` positions, which exist.
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// Writes `rows` rows of `dim` f32 values from `src` into `cache` (`[slots][dim]`), row r at
/// slot `positions[r] % slots` (through its block table when `pages` is given), converting to
/// the cache's element type (for q8_0, quantized bit for bit as
/// [`crate::reference::kv_q8::quantize_q8_0`]).
///
/// Errors when a view is too short for the shape, when `rows > slots` (two rows would race for
/// one slot), when a size exceeds the kernels' 32-bit indices, or, for a q8_0 cache, when `dim`
/// is not a multiple of 32 or the cache is at an odd address.
#[allow(clippy::too_many_arguments)]
pub fn store_rows(
    kernels: &Kernels,
    stream: &Stream,
    src: &DeviceSlice<f32>,
    cache: &mut KvSliceMut,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    let store = Store { src, cache, dim };
    launch_store(kernels, stream, store, None, positions, pages, rows, slots)
}

/// Shape of a K and V store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvStoreShape {
    /// New rows (tokens of the step).
    pub rows: usize,
    /// Values per K row: `n_head_kv * head_dim_k`.
    pub dim_k: usize,
    /// Values per V row: `n_head_kv * head_dim_v`.
    pub dim_v: usize,
    /// Rows of each cache.
    pub slots: usize,
}

/// [`store_rows`] of K and V in one launch. Both caches must have the same element type.
#[allow(clippy::too_many_arguments)]
pub fn store_kv(
    kernels: &Kernels,
    stream: &Stream,
    k_src: &DeviceSlice<f32>,
    v_src: &DeviceSlice<f32>,
    k_cache: &mut KvSliceMut,
    v_cache: &mut KvSliceMut,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    shape: KvStoreShape,
) -> Result<()> {
    let (k, v) = kv_stores(k_src, v_src, k_cache, v_cache, shape);
    launch_store(
        kernels,
        stream,
        k,
        Some(v),
        positions,
        pages,
        shape.rows,
        shape.slots,
    )
}

//! Causal attention against a layer's K/V cache: grouped KV heads (GQA), an optional sliding
//! window, ring slots, and an f16, f32 or q8_0 cache (q8_0: head sizes multiples of 32, so
//! each head starts on a block).
//!
//! Shapes: `q` is `[n_tokens][n_head][head_dim_k]` f32, the K cache `[slots][n_head_kv]
//! [head_dim_k]` and the V cache `[slots][n_head_kv][head_dim_v]` (see [`KvSlice`]), `out`
//! `[n_tokens][n_head][head_dim_v]` f32. Query head h reads KV head `h / (n_head /
//! n_head_kv)`. Query token t is at `positions[t]` (device memory) and sees the keys at
//! positions `first..=p`, `first = p + 1 - window` (clamped at 0) with a window, 0 without;
//! position j lives in slot `j % slots`. The cache must already hold every key a query sees
//! (the store of the step's own rows comes first). The same semantics as the decode crate's
//! `attention`, with positions read on the device so a captured graph replays at any position.
//! A paged cache ([`KvPages`]) holds many sequences' slots in one pool: each token reads its
//! own sequence's, through that sequence's block table.
//!
//! Two entry points share one kernel that streams keys in tiles with an online softmax:
//! * [`attention_decode`] (flash-decoding): the key range is split into at most [`MAX_SPLITS`]
//!   parts sized for the most keys a query can ever see (`min(slots, window)`), never for the
//!   current length; each (token, head group, split) block writes a partial max, sum and
//!   weighted V into a workspace, and a second kernel combines them. Splits past the current
//!   length write neutral partials. Size the workspace with [`decode_workspace_floats`].
//! * [`attention_prefill`]: one block per (token, head group) walks all of that token's keys;
//!   no workspace.
//!
//! Both take any number of tokens; decode is meant for a few, prefill for many. Decode of heads
//! of 64, 128 or 256 values (dk = dv) runs on one of the kernels with the same splits and
//! partials ([`DecodeKernel`]): key streams for f16 and q8_0 caches, one warp per key for f32
//! caches.

use crate::error::{check_shape, Result};
use crate::kernels::Kernels;
use crate::ops::kv_cache::{check_elem, to_u32, KvElem, KvPages, KvSlice, PageArgs};
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use hip_ffi::{DevicePtr, LaunchConfig, Stream};

const OP: &str = "attention";
/// Threads per attention block, which is also the keys per tile (one key per thread). A
/// multiple of both wave sizes.
pub(crate) const BLOCK: u32 = 256;
/// Query heads per block; `ATTN_MAX_HEADS` in `attention.hip`.
const MAX_HEADS_PER_BLOCK: usize = 8;
/// V dimensions per thread; `ATTN_MAX_ITEMS` in `attention.hip`.
const MAX_ITEMS: usize = 2;
/// Largest `head_dim_v` the kernel takes.
pub const MAX_HEAD_DIM_V: usize = MAX_ITEMS * BLOCK as usize;
/// Most splits of the key range in [`attention_decode`]; `ATTN_MAX_SPLITS` in
/// `attention.hip`, where the combine keeps one factor per split in shared memory.
pub const MAX_SPLITS: usize = 256;
/// Fewest splits a call of many tokens is cut to: with that many tokens' blocks the device is
/// busy, and each token's splits cost workspace and a combine.
const MIN_SPLITS_PER_TOKEN: usize = 4;
/// Blocks a decode call aims for over its tokens, head blocks and splits: what the 8B shape's
/// one token had under the earlier flat cap of 64 splits (8 KV heads of 64), so its plans and
/// the 30B-A3B shape's stay as they were. A model with fewer KV heads (Gemma 3's one) gets more
/// splits, up to [`MAX_SPLITS`], instead of leaving most of the device idle (measured:
/// docs/benchmark_results/decode-streams-h100-2026-12-06.md, third lease).
const TARGET_BLOCKS: usize = 512;

/// Splits a call of `n_tokens` may cut each token's keys into, with `head_blocks` blocks per
/// token for its heads: enough for [`TARGET_BLOCKS`] in all, fewer as the tokens' own blocks
/// fill the device, so the grid (and the workspace) grows with the batch no faster than the
/// batch.
fn max_splits(n_tokens: usize, head_blocks: usize) -> usize {
    (TARGET_BLOCKS / (n_tokens.max(1) * head_blocks.max(1))).clamp(MIN_SPLITS_PER_TOKEN, MAX_SPLITS)
}
/// Static shared memory of the kernel: `red`, ATTN_MAX_HEADS * 32 floats.
const STATIC_SHARED_BYTES: usize = MAX_HEADS_PER_BLOCK * 32 * 4;
/// Dynamic shared memory the kernel may ask for: with the static part, the 48 KiB every
/// supported device gives a block without opting in.
const MAX_SHARED_BYTES: usize = 48 * 1024 - STATIC_SHARED_BYTES;
/// Largest grid y/z extent accepted everywhere.
const MAX_GRID_YZ: usize = 65_535;

/// Shape of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Query tokens.
    pub n_tokens: usize,
    /// Query heads per token.
    pub n_head: usize,
    /// KV heads; divides `n_head`.
    pub n_head_kv: usize,
    /// Values per query/key head.
    pub head_dim_k: usize,
    /// Values per value/output head (at most [`MAX_HEAD_DIM_V`]).
    pub head_dim_v: usize,
    /// Factor applied to every `q · k`.
    pub scale: f32,
    /// Gemma 2's soft-capping of the scaled scores, `cap * tanh(s / cap)`, before the softmax;
    /// `None` leaves them as they are.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<usize>,
    /// Rows of the K and V caches; position p is in slot `p % slots`.
    pub slots: usize,
}

impl AttentionShape {
    /// A scaled score after the shape's soft-capping (itself when there is none): what the
    /// kernels' `softcap_logit` computes, for the CPU implementations.
    pub fn cap_score(&self, s: f32) -> f32 {
        crate::reference::elementwise::softcap_logit(s, self.softcap.unwrap_or(0.0))
    }
}

/// Checks `shape` against the lengths of the views (in elements); shared with the CPU reference.
/// A paged cache (`paged`) is a pool whose size its tables' checks cover, not `slots` rows.
pub fn check(
    q_len: usize,
    k_len: usize,
    v_len: usize,
    positions_len: usize,
    out_len: usize,
    shape: &AttentionShape,
    paged: bool,
) -> Result<()> {
    let s = shape;
    check_shape(s.n_head > 0 && s.n_head_kv > 0, OP, || {
        format!(
            "n_head = {} and n_head_kv = {} must be positive",
            s.n_head, s.n_head_kv
        )
    })?;
    check_shape(s.n_head.is_multiple_of(s.n_head_kv), OP, || {
        format!(
            "n_head = {} is not a multiple of n_head_kv = {}",
            s.n_head, s.n_head_kv
        )
    })?;
    check_shape(s.head_dim_k > 0 && s.head_dim_v > 0, OP, || {
        format!(
            "head_dim_k = {} and head_dim_v = {} must be positive",
            s.head_dim_k, s.head_dim_v
        )
    })?;
    check_shape(s.head_dim_v <= MAX_HEAD_DIM_V, OP, || {
        format!(
            "head_dim_v = {} exceeds the kernel's {MAX_HEAD_DIM_V}",
            s.head_dim_v
        )
    })?;
    check_shape(s.slots > 0, OP, || "the cache has 0 slots".to_string())?;
    check_shape(s.window != Some(0), OP, || {
        "window = 0 would hide even the query's own key".to_string()
    })?;
    check_shape(s.scale.is_finite(), OP, || {
        format!("scale = {} is not finite", s.scale)
    })?;
    check_shape(
        s.softcap.is_none_or(|c| c.is_finite() && c > 0.0),
        OP,
        || {
            format!(
                "softcap = {:?} must be a finite positive cap, or None for no capping",
                s.softcap
            )
        },
    )?;
    let fits = |what: &str, parts: &[usize], len: usize| -> Result<()> {
        let need = parts.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        check_shape(need.is_some_and(|n| n <= len), OP, || {
            let dims: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
            format!(
                "{what} of [{}] does not fit a view of {len}",
                dims.join("][")
            )
        })
    };
    fits("q", &[s.n_tokens, s.n_head, s.head_dim_k], q_len)?;
    fits("out", &[s.n_tokens, s.n_head, s.head_dim_v], out_len)?;
    if !paged {
        fits("the K cache", &[s.slots, s.n_head_kv, s.head_dim_k], k_len)?;
        fits("the V cache", &[s.slots, s.n_head_kv, s.head_dim_v], v_len)?;
    }
    check_shape(positions_len >= s.n_tokens, OP, || {
        format!(
            "{} tokens need {} positions, the positions view has {positions_len}",
            s.n_tokens, s.n_tokens
        )
    })?;
    Ok(())
}

/// The element type's rules for `shape`, shared with the CPU reference: a q8_0 cache's heads are
/// whole blocks of 32 values (each head starts on a block, which the kernels' per-head reads
/// assume), and the caches are at addresses the kernels may load their elements from.
pub fn check_cache_elem(
    elem: KvElem,
    k_addr: u64,
    v_addr: u64,
    shape: &AttentionShape,
) -> Result<()> {
    check_elem(OP, elem, k_addr, "head_dim_k", shape.head_dim_k)?;
    check_elem(OP, elem, v_addr, "head_dim_v", shape.head_dim_v)
}

/// How one call is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Query heads per block (of one KV group).
    heads_per_block: usize,
    /// Blocks per KV group.
    n_sub: usize,
    /// Splits of the key range (1: the kernel writes the output itself).
    n_split: usize,
    /// Key offsets per split (a multiple of the tile; `u32::MAX` with one split).
    keys_per_split: u32,
    /// Dynamic shared memory per block.
    shared_bytes: usize,
    /// Which kernel: `attn_decode_*` (one warp per key) or `attn_*` (one thread per key).
    /// [`launch`] takes `attn_decode_streams_*` instead where the call asks for it and the
    /// cache is f16 or q8_0: the same splits and partials.
    warp_per_key: bool,
}

/// Output dimensions per block of the split combine (`ATTN_CB_DIMS`): one quantization group.
const COMBINE_DIMS: u32 = 32;
/// Threads per block of the split combine: `ATTN_CB_LANES` groups of [`COMBINE_DIMS`], each
/// summing every eighth split.
pub(crate) const COMBINE_THREADS: u32 = 256;
/// Threads per block of the key-stream decode kernel (`ATTN_DS_THREADS`).
pub(crate) const DECODE_STREAM_THREADS: u32 = 128;

/// Which kernel [`attention_decode_on`] runs for a shape whose heads split evenly over a warp
/// (`head_dim_k == head_dim_v`, 64, 128 or 256). Other shapes always take the
/// one-thread-per-key kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// [`DecodeKernel::KeyStreams`] for f16 caches at 16-byte aligned addresses and q8_0
    /// caches, [`DecodeKernel::WarpPerKey`] otherwise (f32 caches).
    Auto,
    /// Streams of keys: each row of `head_dim / 8` threads walks its own keys of the split
    /// with its own online softmax, four rows in flight at a time, and the block meets once at
    /// the end. f16 caches at 16-byte aligned addresses and q8_0 caches; an f32 cache is an
    /// error.
    KeyStreams,
    /// One warp per key, with an online-softmax step per key and head.
    WarpPerKey,
}

/// Warps per block of the one-warp-per-key decode kernel (`ATTN_DEC_WARPS`).
pub(crate) const DECODE_WARPS: u32 = 4;
/// Query heads per block of that kernel (`ATTN_DEC_HEADS`).
const DECODE_HEADS: usize = 4;
/// Keys per split unit of the decode plan: small, so the key range spreads over many blocks
/// even at short lengths (a decode step's attention is latency-bound, not bandwidth-bound,
/// until the cache is long). A 512-slot cache makes 64 splits for the 8B shape's 8 KV heads;
/// the kernels spread the current keys over all of them.
const DECODE_TILE: usize = 8;

/// Whether the one-warp-per-key decode kernel takes `shape`: equal K and V head sizes that a
/// warp of 32 or 64 lanes splits into at most eight values per lane. Only 64, 128 and 256: the
/// kernel has a case for 1, 2, 4 and 8 values per lane (a head of 192 would be 6 or 3, and
/// write nothing), and the key-stream kernel's rows of d / 8 lanes must be a power of two for
/// its shuffle sums.
fn warp_per_key_applies(shape: &AttentionShape) -> bool {
    shape.head_dim_k == shape.head_dim_v && matches!(shape.head_dim_k, 64 | 128 | 256)
}

/// The decode plan: the one-warp-per-key kernel where it applies, else [`plan`].
fn decode_plan(shape: &AttentionShape) -> Result<Plan> {
    if !warp_per_key_applies(shape) {
        return plan(shape, true);
    }
    let group = shape.n_head / shape.n_head_kv;
    let n_sub = group.div_ceil(DECODE_HEADS);
    let heads_per_block = group.div_ceil(n_sub);
    check_shape(shape.n_head_kv * n_sub <= MAX_GRID_YZ, OP, || {
        format!(
            "{} KV heads in {n_sub} blocks each exceed the grid limit of {MAX_GRID_YZ}",
            shape.n_head_kv
        )
    })?;
    check_shape(shape.n_head <= MAX_GRID_YZ, OP, || {
        format!(
            "{} heads exceed the combine grid limit of {MAX_GRID_YZ}",
            shape.n_head
        )
    })?;
    let max_keys = shape.window.map_or(shape.slots, |w| w.min(shape.slots));
    let tiles = max_keys.div_ceil(DECODE_TILE);
    let most = max_splits(shape.n_tokens, shape.n_head_kv * n_sub);
    let tiles_per_split = tiles.div_ceil(tiles.min(most));
    let n_split = tiles.div_ceil(tiles_per_split);
    let (n_split, keys_per_split) = if n_split > 1 {
        let keys = to_u32(OP, "keys per split", tiles_per_split * DECODE_TILE)?;
        (n_split, keys)
    } else {
        (1, u32::MAX)
    };
    Ok(Plan {
        heads_per_block,
        n_sub,
        n_split,
        keys_per_split,
        shared_bytes: 0,
        warp_per_key: true,
    })
}

fn shared_bytes(heads_per_block: usize, shape: &AttentionShape) -> usize {
    let per_head = shape.head_dim_k + shape.head_dim_v.max(BLOCK as usize);
    heads_per_block * per_head * std::mem::size_of::<f32>()
}

fn plan(shape: &AttentionShape, split: bool) -> Result<Plan> {
    let group = shape.n_head / shape.n_head_kv;
    let mut n_sub = group.div_ceil(MAX_HEADS_PER_BLOCK);
    let heads_per_block = loop {
        let hpb = group.div_ceil(n_sub);
        if shared_bytes(hpb, shape) <= MAX_SHARED_BYTES {
            break hpb;
        }
        check_shape(hpb > 1, OP, || {
            format!(
                "head_dim_k = {} with head_dim_v = {} needs {} bytes of shared memory per head, \
                 more than {MAX_SHARED_BYTES}",
                shape.head_dim_k,
                shape.head_dim_v,
                shared_bytes(1, shape)
            )
        })?;
        n_sub += 1;
    };
    let n_sub = group.div_ceil(heads_per_block);
    check_shape(shape.n_head_kv * n_sub <= MAX_GRID_YZ, OP, || {
        format!(
            "{} KV heads in {n_sub} blocks each exceed the grid limit of {MAX_GRID_YZ}",
            shape.n_head_kv
        )
    })?;
    check_shape(!split || shape.n_head <= MAX_GRID_YZ, OP, || {
        format!(
            "{} heads exceed the combine grid limit of {MAX_GRID_YZ}",
            shape.n_head
        )
    })?;
    let (n_split, keys_per_split) = if split {
        let max_keys = shape.window.map_or(shape.slots, |w| w.min(shape.slots));
        let tiles = max_keys.div_ceil(BLOCK as usize);
        let most = max_splits(shape.n_tokens, shape.n_head_kv * n_sub);
        let tiles_per_split = tiles.div_ceil(tiles.min(most));
        let n_split = tiles.div_ceil(tiles_per_split);
        let keys = to_u32(OP, "keys per split", tiles_per_split * BLOCK as usize)?;
        if n_split > 1 {
            (n_split, keys)
        } else {
            (1, u32::MAX)
        }
    } else {
        (1, u32::MAX)
    };
    Ok(Plan {
        heads_per_block,
        n_sub,
        n_split,
        keys_per_split,
        shared_bytes: shared_bytes(heads_per_block, shape),
        warp_per_key: false,
    })
}

/// Number of splits [`attention_decode`] cuts the key range into for `shape` (1 when one block
/// per head group covers every key a query can see; then no workspace is used).
pub fn decode_splits(shape: &AttentionShape) -> Result<usize> {
    check_shape(shape.n_head_kv > 0 && shape.slots > 0, OP, || {
        format!(
            "n_head_kv = {} and slots = {} must be positive",
            shape.n_head_kv, shape.slots
        )
    })?;
    Ok(decode_plan(shape)?.n_split)
}

/// f32 values of workspace [`attention_decode`] needs for `shape` (0 with one split). It does
/// not depend on the positions, so the backend can reserve it up front. The split count
/// falls as tokens are added, so a call of fewer tokens may need more than `shape`'s; see
/// [`decode_workspace_floats_up_to`].
pub fn decode_workspace_floats(shape: &AttentionShape) -> Result<usize> {
    let n_split = decode_splits(shape)?;
    if n_split == 1 {
        return Ok(0);
    }
    let per_split = shape.head_dim_v + 2;
    shape
        .n_tokens
        .checked_mul(shape.n_head)
        .and_then(|n| n.checked_mul(n_split))
        .and_then(|n| n.checked_mul(per_split))
        .ok_or_else(|| crate::error::KernelError::Shape {
            op: OP,
            message: format!("the workspace for {shape:?} overflows usize"),
        })
}

/// The most workspace a decode call of 1 to `shape.n_tokens` tokens of `shape` needs: what a
/// backend reserves for steps of up to that many rows.
pub fn decode_workspace_floats_up_to(shape: &AttentionShape) -> Result<usize> {
    (1..=shape.n_tokens.max(1)).try_fold(0usize, |most, n| {
        let s = AttentionShape {
            n_tokens: n,
            ..*shape
        };
        Ok(most.max(decode_workspace_floats(&s)?))
    })
}

/// The views of one call.
struct Io<'a> {
    q: &'a DeviceSlice<f32>,
    k: &'a KvSlice,
    v: &'a KvSlice,
    positions: &'a DeviceSlice<i32>,
    pages: Option<&'a KvPages>,
    out: &'a DeviceSliceMut<f32>,
}

/// Checks the views of a call; returns its paging arguments.
fn check_io(io: &Io<'_>, shape: &AttentionShape) -> Result<PageArgs> {
    check(
        io.q.len(),
        io.k.len(),
        io.v.len(),
        io.positions.len(),
        io.out.len(),
        shape,
        io.pages.is_some(),
    )?;
    check_shape(io.k.elem() == io.v.elem(), OP, || {
        format!(
            "the K cache is {:?} but the V cache is {:?}",
            io.k.elem(),
            io.v.elem()
        )
    })?;
    check_cache_elem(io.k.elem(), io.k.ptr().0, io.v.ptr().0, shape)?;
    let k_rows = io.k.len() / (shape.n_head_kv * shape.head_dim_k);
    let v_rows = io.v.len() / (shape.n_head_kv * shape.head_dim_v);
    PageArgs::new(
        OP,
        io.pages,
        shape.n_tokens,
        shape.slots,
        k_rows.min(v_rows),
    )
}

/// A shape's sizes as the kernels take them (u32), checked to fit.
struct KernelDims {
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    dk: u32,
    dv: u32,
    slots: u32,
    /// 0 for none.
    window: u32,
}

impl KernelDims {
    fn of(shape: &AttentionShape) -> Result<KernelDims> {
        Ok(KernelDims {
            n_tokens: to_u32(OP, "n_tokens", shape.n_tokens)?,
            n_head: to_u32(OP, "n_head", shape.n_head)?,
            n_head_kv: to_u32(OP, "n_head_kv", shape.n_head_kv)?,
            dk: to_u32(OP, "head_dim_k", shape.head_dim_k)?,
            dv: to_u32(OP, "head_dim_v", shape.head_dim_v)?,
            slots: to_u32(OP, "slots", shape.slots)?,
            // Positions are i32, so a window of 2^31 or more hides nothing: the same as none.
            window: match shape.window {
                Some(w) if w <= i32::MAX as usize => w as u32,
                _ => 0,
            },
        })
    }
}

/// `q8`: the quantized views (values, scales) the combine also writes, already checked against
/// the output's size; only given with more than one split and `head_dim_v` a multiple of 32.
#[allow(clippy::too_many_arguments)]
fn launch(
    kernels: &Kernels,
    stream: &Stream,
    io: &Io<'_>,
    pages: &PageArgs,
    workspace: Option<&DeviceSliceMut<f32>>,
    shape: &AttentionShape,
    plan: &Plan,
    decode_kernel: DecodeKernel,
    q8: Option<(DevicePtr, DevicePtr)>,
) -> Result<()> {
    let KernelDims {
        n_tokens,
        n_head,
        n_head_kv,
        dk,
        dv,
        slots,
        window,
    } = KernelDims::of(shape)?;
    let heads_per_block = plan.heads_per_block as u32;
    let n_split = plan.n_split as u32;
    let (part_ms, part_acc) = match workspace {
        Some(ws) => {
            let ms_floats = shape.n_tokens * shape.n_head * plan.n_split * 2;
            (ws.ptr(), ws.ptr().offset((ms_floats * 4) as u64))
        }
        None => (DevicePtr(0), DevicePtr(0)),
    };
    let decode_kernel = if plan.warp_per_key {
        Some(decode_kernel)
    } else {
        None
    };
    let entry = match (io.k.elem(), decode_kernel) {
        (KvElem::F16, None) => "attn_f16",
        (KvElem::F32, None) => "attn_f32",
        (KvElem::Q8_0, None) => "attn_q8_0",
        (KvElem::F16, Some(DecodeKernel::KeyStreams)) => "attn_decode_streams_f16",
        (KvElem::Q8_0, Some(DecodeKernel::KeyStreams)) => "attn_decode_streams_q8_0",
        (KvElem::F16, Some(_)) => "attn_decode_f16",
        (KvElem::F32, Some(_)) => "attn_decode_f32",
        (KvElem::Q8_0, Some(_)) => "attn_decode_q8_0",
    };
    let threads = match decode_kernel {
        Some(DecodeKernel::KeyStreams) => DECODE_STREAM_THREADS,
        Some(_) => DECODE_WARPS * kernels.wave_size().max(1),
        None => BLOCK,
    };
    let (q_ptr, k_ptr, v_ptr) = (io.q.ptr(), io.k.ptr(), io.v.ptr());
    let (positions_ptr, out_ptr) = (io.positions.ptr(), io.out.ptr());
    let grid_y = to_u32(
        OP,
        "KV heads x blocks per group",
        shape.n_head_kv * plan.n_sub,
    )?;
    let shared_bytes = to_u32(OP, "shared bytes", plan.shared_bytes)?;
    let function = kernels.function(KernelModule::Attention, entry)?;
    // The kernels take 0 for "no cap".
    let softcap = shape.softcap.unwrap_or(0.0);
    let mut l = function.builder(stream);
    l.arg(&q_ptr)
        .arg(&k_ptr)
        .arg(&v_ptr)
        .arg(&positions_ptr)
        .arg(&out_ptr)
        .arg(&part_ms)
        .arg(&part_acc)
        .arg(&n_head)
        .arg(&n_head_kv)
        .arg(&dk);
    if !plan.warp_per_key {
        // attn_decode_* takes one head size (dk == dv).
        l.arg(&dv);
    }
    l.arg(&slots)
        .arg(&window)
        .arg(&shape.scale)
        .arg(&softcap)
        .arg(&heads_per_block)
        .arg(&n_split)
        .arg(&plan.keys_per_split);
    pages.push(&mut l);
    let config = LaunchConfig {
        grid: [n_tokens, grid_y, n_split],
        block: [threads, 1, 1],
        shared_bytes,
    };
    // SAFETY: the arguments match `attn_{f16,f32,q8_0}` (or, with one head size, the
    // `attn_decode_*` kernels, which take d = dk = dv and static shared memory only; their
    // plan keeps at most DECODE_HEADS heads per block and dk / wave <= 8; the key-stream kernel
    // runs DECODE_STREAM_THREADS threads, reads an f16 cache 16 bytes at a time at offsets
    // that are multiples of 8 values from 16-byte aligned caches, which `attention_decode_on`
    // checked, or a q8_0 cache 2 bytes at a time, and d of 64, 128 or 256 keeps its rows of
    // d / 8 threads, a power of two, inside one wave) in order and type. `check_io` made q,
    // out, both caches and the positions long enough for the shape; cache rows are slots
    // (position % slots < slots) unpaged, and paged the rows of the token's table, which the
    // kernel clamps to the caches' row count that `PageArgs` took from the views (in values; a
    // q8_0 row and head are whole blocks, and the caches are 2-byte aligned for its scale and
    // 2-byte quant loads, both checked by `check_cache_elem`). With more
    // than one split the caller passed a workspace
    // of `decode_workspace_floats` values, which holds the n_tokens * n_head * n_split
    // (max, sum) pairs followed by as many rows of head_dim_v; with one split the null
    // workspace pointers are never read. The shared memory asked for is what the kernel uses.
    unsafe { l.launch(config) }?;
    if n_split > 1 {
        let combine = kernels.function(KernelModule::Attention, "attn_combine")?;
        let dim_blocks = dv.div_ceil(COMBINE_DIMS);
        let (q_values, q_scales) = q8.unwrap_or((DevicePtr(0), DevicePtr(0)));
        let mut l = combine.builder(stream);
        l.arg(&part_ms)
            .arg(&part_acc)
            .arg(&out_ptr)
            .arg(&n_head)
            .arg(&dv)
            .arg(&n_split)
            .arg(&q_values)
            .arg(&q_scales);
        // SAFETY: the arguments match `attn_combine`; it reads the partials the launch above
        // wrote (same stream, so in order) for n_tokens x n_head rows and writes that many rows
        // of head_dim_v into out, which `check_io` sized, and (when not null) as many quantized
        // values and a scale per 32, which the caller checked; dv is then a multiple of 32, so
        // each block's 32 dimensions are one whole group. n_split <= MAX_SPLITS (both plans cap
        // it), the size of the kernel's shared factors; the block is COMBINE_THREADS, the
        // kernel's shared reduction size and whole waves of 32 or 64, so its first wave is
        // complete for the shuffles; grid z covers dv in blocks of COMBINE_DIMS.
        unsafe {
            l.launch(LaunchConfig {
                grid: [n_tokens, n_head, dim_blocks],
                block: [COMBINE_THREADS, 1, 1],
                shared_bytes: 0,
            })
        }?;
    }
    Ok(())
}

/// Decode attention (flash-decoding, see the module docs) for a few query tokens. `workspace`
/// must hold at least [`decode_workspace_floats`]`(shape)` values (none when that is 0).
///
/// Errors when a view is too short, the K and V caches differ in element type, `n_head` is not
/// a multiple of `n_head_kv`, `window` is 0, `head_dim_v` exceeds [`MAX_HEAD_DIM_V`], the
/// heads need more shared memory than a block has, or (q8_0) a head size is not a multiple of
/// 32 or a cache is at an odd address.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    kernels: &Kernels,
    stream: &Stream,
    q: &DeviceSlice<f32>,
    k_cache: &KvSlice,
    v_cache: &KvSlice,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    out: &mut DeviceSliceMut<f32>,
    workspace: &mut DeviceSliceMut<f32>,
    shape: &AttentionShape,
) -> Result<()> {
    attention_decode_q8(
        kernels, stream, q, k_cache, v_cache, positions, pages, out, workspace, shape, None,
    )
    .map(|_| ())
}

/// [`attention_decode`] that also leaves the output quantized in `q8` (when given) for the next
/// int8 matrix-vector product, as [`crate::ops::matvec_q8::quantize`] would, when it can do so
/// in its combine step: with more than one split and `head_dim_v` a multiple of 32. Returns
/// whether it did; when not, `q8` is untouched and the caller quantizes. `q8` must hold
/// `n_tokens * n_head * head_dim_v` values and a scale per 32 of them.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_q8(
    kernels: &Kernels,
    stream: &Stream,
    q: &DeviceSlice<f32>,
    k_cache: &KvSlice,
    v_cache: &KvSlice,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    out: &mut DeviceSliceMut<f32>,
    workspace: &mut DeviceSliceMut<f32>,
    shape: &AttentionShape,
    q8: Option<&mut crate::ops::matvec_q8::Q8ActivationsMut>,
) -> Result<bool> {
    attention_decode_on(
        kernels,
        stream,
        DecodeKernel::Auto,
        q,
        k_cache,
        v_cache,
        positions,
        pages,
        out,
        workspace,
        shape,
        q8,
    )
}

/// [`attention_decode_q8`] on a chosen kernel (the same results up to summation order; the
/// choice is for measuring one against another). [`DecodeKernel::KeyStreams`] with an f32
/// cache, or with f16 caches not at 16-byte aligned addresses, is an error.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_on(
    kernels: &Kernels,
    stream: &Stream,
    kernel: DecodeKernel,
    q: &DeviceSlice<f32>,
    k_cache: &KvSlice,
    v_cache: &KvSlice,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    out: &mut DeviceSliceMut<f32>,
    workspace: &mut DeviceSliceMut<f32>,
    shape: &AttentionShape,
    q8: Option<&mut crate::ops::matvec_q8::Q8ActivationsMut>,
) -> Result<bool> {
    let io = Io {
        q,
        k: k_cache,
        v: v_cache,
        positions,
        pages,
        out,
    };
    let page_args = check_io(&io, shape)?;
    let need = decode_workspace_floats(shape)?;
    check_shape(workspace.len() >= need, OP, || {
        format!(
            "decode needs {need} workspace values for {shape:?}, the view has {}",
            workspace.len()
        )
    })?;
    let plan = decode_plan(shape)?;
    let aligned = k_cache.ptr().0.is_multiple_of(16) && v_cache.ptr().0.is_multiple_of(16);
    let f16 = k_cache.elem() == KvElem::F16;
    let streams_apply = (f16 && aligned) || k_cache.elem() == KvElem::Q8_0;
    check_shape(
        kernel != DecodeKernel::KeyStreams || streams_apply,
        OP,
        || {
            format!(
                "the key-stream decode kernel takes f16 caches at 16-byte aligned addresses or \
                 q8_0 caches, not {:?} caches at {:#x} and {:#x}; use the warp-per-key kernel",
                k_cache.elem(),
                k_cache.ptr().0,
                v_cache.ptr().0
            )
        },
    )?;
    let kernel = match kernel {
        // Measured on an H100 (docs/benchmark_results/decode-streams-h100-2026-12-06.md): key
        // streams are 1.25x and 1.45x the key-tile kernel they replaced at 4k and 16k of
        // context on the 8B shape (f16), 1.25x and 1.73x one warp per key there with a q8_0
        // cache, and 1.03x and 1.08x one warp per key on Gemma 3's single KV head of 256.
        DecodeKernel::Auto if streams_apply => DecodeKernel::KeyStreams,
        DecodeKernel::Auto => DecodeKernel::WarpPerKey,
        chosen => chosen,
    };
    let fused = plan.n_split > 1
        && shape
            .head_dim_v
            .is_multiple_of(crate::ops::matvec_q8::GROUP);
    let q8_ptrs = match q8.filter(|_| fused) {
        Some(q8) => {
            let values = shape.n_tokens * shape.n_head * shape.head_dim_v;
            let scales = values / crate::ops::matvec_q8::GROUP;
            check_shape(
                q8.values.len() >= values && q8.scales.len() >= scales,
                OP,
                || format!("the quantized views are too short for {values} values"),
            )?;
            Some((q8.values.ptr(), q8.scales.ptr()))
        }
        None => None,
    };
    if shape.n_tokens == 0 {
        return Ok(q8_ptrs.is_some());
    }
    let ws = (plan.n_split > 1).then_some(&*workspace);
    launch(
        kernels, stream, &io, &page_args, ws, shape, &plan, kernel, q8_ptrs,
    )?;
    Ok(q8_ptrs.is_some())
}

/// Causal prefill attention (see the module docs) for any number of query tokens.
///
/// Errors as [`attention_decode`].
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill(
    kernels: &Kernels,
    stream: &Stream,
    q: &DeviceSlice<f32>,
    k_cache: &KvSlice,
    v_cache: &KvSlice,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    out: &mut DeviceSliceMut<f32>,
    shape: &AttentionShape,
) -> Result<()> {
    attention_prefill_on(
        kernels,
        stream,
        PrefillKernel::Auto,
        q,
        k_cache,
        v_cache,
        positions,
        pages,
        out,
        shape,
    )
}

/// Which kernel [`attention_prefill_on`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// [`PrefillKernel::Flash`] where the device has native matrix cores and the call fits it
    /// ([`flash_fits`]), [`PrefillKernel::Tiled`] otherwise.
    Auto,
    /// Flash attention on the matrix cores (`attention_mma.hip`): 64 or 32 queries of a head
    /// against 32-key tiles, queries and probabilities rounded to f16. f16 caches (16-byte
    /// aligned) or q8_0 caches (dequantized to f16 tiles) and heads of 64, 128 or 256 (dk = dv)
    /// only; anything else is an error.
    Flash,
    /// [`PrefillKernel::Flash`]'s second kernel (`attn_prefill_mma_regs_*`), for the same
    /// calls: the scores and probabilities in registers, K and V tiles copied while the block
    /// computes, 64-key tiles for heads up to 128. Not yet run on a GPU, so `Auto` does not
    /// take it.
    FlashRegs,
    /// 16 queries of a head against 16-key tiles (heads up to [`PREFILL_TILED_MAX_HEAD_DIM`];
    /// larger ones fall back to the other).
    Tiled,
    /// One block per query token and head group, streaming every key it sees.
    PerQuery,
}

/// [`attention_prefill`] on a chosen kernel (the same results, up to the flash kernel's f16
/// rounding; the choice is for measuring one against another). The tiled kernel reads a tile of 16 tokens through its
/// first token's block table, so with `pages` the call's tokens must be one sequence's (the
/// per-query kernel takes any mix).
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_on(
    kernels: &Kernels,
    stream: &Stream,
    kernel: PrefillKernel,
    q: &DeviceSlice<f32>,
    k_cache: &KvSlice,
    v_cache: &KvSlice,
    positions: &DeviceSlice<i32>,
    pages: Option<&KvPages>,
    out: &mut DeviceSliceMut<f32>,
    shape: &AttentionShape,
) -> Result<()> {
    let io = Io {
        q,
        k: k_cache,
        v: v_cache,
        positions,
        pages,
        out,
    };
    let page_args = check_io(&io, shape)?;
    let flash = flash_fits(k_cache, v_cache, shape);
    if matches!(kernel, PrefillKernel::Flash | PrefillKernel::FlashRegs) && !flash {
        return Err(crate::ops::matvec::shape_error(
            OP,
            format!(
                "the flash prefill kernel takes f16 caches at 16-byte aligned addresses or \
                 q8_0 caches, and heads of 64, 128 or 256 values (dk = dv), not {:?} caches \
                 with dk {} and dv {}; use the tiled kernel",
                k_cache.elem(),
                shape.head_dim_k,
                shape.head_dim_v
            ),
        ));
    }
    if shape.n_tokens == 0 {
        return Ok(());
    }
    let on_matrix_cores = match kernel {
        PrefillKernel::Flash => Some(FlashBody::Shared),
        PrefillKernel::FlashRegs => Some(FlashBody::Registers),
        PrefillKernel::Auto => {
            (flash && kernels.mma_variant().is_native()).then_some(FlashBody::Shared)
        }
        PrefillKernel::Tiled | PrefillKernel::PerQuery => None,
    };
    if let Some(body) = on_matrix_cores {
        return launch_prefill_flash(kernels, stream, body, &io, &page_args, shape);
    }
    let tiled = shape.head_dim_k <= PREFILL_TILED_MAX_HEAD_DIM
        && shape.head_dim_v <= PREFILL_TILED_MAX_HEAD_DIM;
    if tiled && matches!(kernel, PrefillKernel::Tiled | PrefillKernel::Auto) {
        return launch_prefill_tiled(kernels, stream, &io, &page_args, shape);
    }
    let plan = plan(shape, false)?;
    launch(
        kernels,
        stream,
        &io,
        &page_args,
        None,
        shape,
        &plan,
        DecodeKernel::WarpPerKey,
        None,
    )
}

/// Whether [`PrefillKernel::Flash`] takes a call: f16 caches whose rows can be copied 16 bytes
/// at a time, or q8_0 caches at even addresses (their rows are dequantized two bytes at a time),
/// and equal K and V heads of one of the sizes it is built for.
pub fn flash_fits(k_cache: &KvSlice, v_cache: &KvSlice, shape: &AttentionShape) -> bool {
    let elem = k_cache.elem();
    let aligned = |a: u64| k_cache.ptr().0.is_multiple_of(a) && v_cache.ptr().0.is_multiple_of(a);
    let caches = match elem {
        KvElem::F16 => aligned(16),
        KvElem::Q8_0 => aligned(2),
        KvElem::F32 => false,
    };
    caches
        && v_cache.elem() == elem
        && shape.head_dim_k == shape.head_dim_v
        && flash_kernel(FlashBody::Shared, elem, shape.head_dim_k).is_some()
}

/// Which of `attention_mma.hip`'s two flash kernels runs a call (the same calls, shapes and
/// blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlashBody {
    /// `attn_prefill_mma_*`: the scores and probabilities through shared memory.
    Shared,
    /// `attn_prefill_mma_regs_*`: the scores and probabilities in registers.
    Registers,
}

/// A flash kernel's entry point for a cache type and head size and its queries per block
/// (`attention_mma.hip`), or `None` for a pair it is not built for.
fn flash_kernel(body: FlashBody, elem: KvElem, head_dim: usize) -> Option<(&'static str, usize)> {
    let (shared, registers, queries) = match (elem, head_dim) {
        (KvElem::F16, 64) => ("attn_prefill_mma_d64", "attn_prefill_mma_regs_d64", 64),
        (KvElem::F16, 128) => ("attn_prefill_mma_d128", "attn_prefill_mma_regs_d128", 64),
        (KvElem::F16, 256) => ("attn_prefill_mma_d256", "attn_prefill_mma_regs_d256", 32),
        (KvElem::Q8_0, 64) => (
            "attn_prefill_mma_q8_0_d64",
            "attn_prefill_mma_regs_q8_0_d64",
            64,
        ),
        (KvElem::Q8_0, 128) => (
            "attn_prefill_mma_q8_0_d128",
            "attn_prefill_mma_regs_q8_0_d128",
            64,
        ),
        (KvElem::Q8_0, 256) => (
            "attn_prefill_mma_q8_0_d256",
            "attn_prefill_mma_regs_q8_0_d256",
            32,
        ),
        _ => return None,
    };
    Some(match body {
        FlashBody::Shared => (shared, queries),
        FlashBody::Registers => (registers, queries),
    })
}

/// Warps per block of the flash kernel `entry` (its queries / 16, as [`launch_prefill_flash`]
/// launches it), for the launch-bounds table; `None` for another name.
pub(crate) fn flash_warps(entry: &str) -> Option<u32> {
    [FlashBody::Shared, FlashBody::Registers]
        .into_iter()
        .flat_map(|body| [KvElem::F16, KvElem::Q8_0].map(|elem| (body, elem)))
        .flat_map(|(body, elem)| [64, 128, 256].map(|d| flash_kernel(body, elem, d)))
        .flatten()
        .find(|(name, _)| *name == entry)
        .map(|(_, queries)| (queries / 16) as u32)
}

fn launch_prefill_flash(
    kernels: &Kernels,
    stream: &Stream,
    body: FlashBody,
    io: &Io<'_>,
    pages: &PageArgs,
    shape: &AttentionShape,
) -> Result<()> {
    let KernelDims {
        n_tokens,
        n_head,
        n_head_kv,
        slots,
        window,
        ..
    } = KernelDims::of(shape)?;
    check_shape(shape.n_head <= MAX_GRID_YZ, OP, || {
        format!(
            "{} heads exceed the grid limit of {MAX_GRID_YZ}",
            shape.n_head
        )
    })?;
    let d = shape.head_dim_k;
    let (entry, queries) = flash_kernel(body, io.k.elem(), d).ok_or_else(|| {
        crate::ops::matvec::shape_error(OP, format!("no flash prefill kernel for heads of {d}"))
    })?;
    let function = kernels.function(KernelModule::AttentionMma, entry)?;
    let (q_ptr, k_ptr, v_ptr) = (io.q.ptr(), io.k.ptr(), io.v.ptr());
    let (positions_ptr, out_ptr) = (io.positions.ptr(), io.out.ptr());
    // The kernels take 0 for "no cap".
    let softcap = shape.softcap.unwrap_or(0.0);
    let mut l = function.builder(stream);
    l.arg(&q_ptr)
        .arg(&k_ptr)
        .arg(&v_ptr)
        .arg(&positions_ptr)
        .arg(&out_ptr)
        .arg(&n_tokens)
        .arg(&n_head)
        .arg(&n_head_kv)
        .arg(&slots)
        .arg(&window)
        .arg(&shape.scale)
        .arg(&softcap);
    pages.push(&mut l);
    let warps = (queries / 16) as u32;
    let config = LaunchConfig {
        grid: [n_tokens.div_ceil(queries as u32), n_head, 1],
        block: [warps * kernels.wave_size(), 1, 1],
        shared_bytes: 0,
    };
    // SAFETY: the arguments match `attn_prefill_mma_d<D>` (f16) or `attn_prefill_mma_q8_0_d<D>`
    // (q8_0, chosen by the caches' element type), or their `_regs_` twins, which take the same
    // arguments, in order and type, with D the head size of both caches (flash_fits).
    // `check_io` made q, out, both caches and the positions long enough for the shape
    // (n_tokens > 0, so every block has a query); cache rows are slots (position % slots <
    // slots) unpaged, and paged rows of the tile's table, clamped to the caches' rows; the
    // caches are f16 at 16-byte aligned addresses, as the kernels' 16-byte row copies need, or
    // q8_0 at even addresses, as their 2-byte loads need (rows and heads of D, a multiple of
    // 32, are whole blocks); the block is the queries / 16 warps their tiling assumes, and
    // their shared memory is static.
    unsafe { l.launch(config) }?;
    Ok(())
}

/// Head sizes up to which prefill runs on the tiled kernel (`attn_prefill_*`: 16 queries of one
/// head against 16 keys at a time, each key row read once per 16 queries); larger heads take
/// the one-query-per-block kernel.
pub const PREFILL_TILED_MAX_HEAD_DIM: usize = 256;
/// Queries and keys per tile of `attn_prefill_*` (ATTN_TQ, ATTN_TK in attention.hip).
const PREFILL_TILE: usize = 16;
/// Threads per block of `attn_prefill_*`: one per (query, key) of a tile (ATTN_T_THREADS).
pub(crate) const PREFILL_THREADS: u32 = (PREFILL_TILE * PREFILL_TILE) as u32;

fn launch_prefill_tiled(
    kernels: &Kernels,
    stream: &Stream,
    io: &Io<'_>,
    pages: &PageArgs,
    shape: &AttentionShape,
) -> Result<()> {
    let KernelDims {
        n_tokens,
        n_head,
        n_head_kv,
        dk,
        dv,
        slots,
        window,
    } = KernelDims::of(shape)?;
    check_shape(shape.n_head <= MAX_GRID_YZ, OP, || {
        format!(
            "{} heads exceed the grid limit of {MAX_GRID_YZ}",
            shape.n_head
        )
    })?;
    let t = PREFILL_TILE;
    let (dk_, dv_) = (shape.head_dim_k, shape.head_dim_v);
    let floats = t * (dk_ + 1) + t * (dk_ + 1).max(dv_) + t * t;
    let shared_bytes = to_u32(OP, "shared bytes", floats * 4)?;
    let entry = match io.k.elem() {
        KvElem::F16 => "attn_prefill_f16",
        KvElem::F32 => "attn_prefill_f32",
        KvElem::Q8_0 => "attn_prefill_q8_0",
    };
    let function = kernels.function(KernelModule::Attention, entry)?;
    let (q_ptr, k_ptr, v_ptr) = (io.q.ptr(), io.k.ptr(), io.v.ptr());
    let (positions_ptr, out_ptr) = (io.positions.ptr(), io.out.ptr());
    // The kernels take 0 for "no cap".
    let softcap = shape.softcap.unwrap_or(0.0);
    let mut l = function.builder(stream);
    l.arg(&q_ptr)
        .arg(&k_ptr)
        .arg(&v_ptr)
        .arg(&positions_ptr)
        .arg(&out_ptr)
        .arg(&n_tokens)
        .arg(&n_head)
        .arg(&n_head_kv)
        .arg(&dk)
        .arg(&dv)
        .arg(&slots)
        .arg(&window)
        .arg(&shape.scale)
        .arg(&softcap);
    pages.push(&mut l);
    let config = LaunchConfig {
        grid: [n_tokens.div_ceil(t as u32), n_head, 1],
        block: [PREFILL_THREADS, 1, 1],
        shared_bytes,
    };
    // SAFETY: the arguments match `attn_prefill_{f16,f32,q8_0}` in order and type (q8_0 caches
    // with whole-block heads at even addresses, which `check_io` checked).
    // `check_io` made q, out, both caches and the positions long enough for the shape (n_tokens
    // > 0, so every block has at least one query); cache rows are slots (position % slots <
    // slots) unpaged, and paged rows of the tile's table, clamped to the caches' rows; head sizes are at most PREFILL_TILED_MAX_HEAD_DIM, which the kernel's
    // per-thread output items cover, and the shared memory asked for is the layout it uses.
    unsafe { l.launch(config) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n_head: usize, n_head_kv: usize, dk: usize, dv: usize) -> AttentionShape {
        AttentionShape {
            n_tokens: 1,
            n_head,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dv,
            scale: 0.125,
            softcap: None,
            window: None,
            slots: 4096,
        }
    }

    #[test]
    fn plan_groups_heads_of_one_kv_head_and_splits_for_the_cache_not_the_position() {
        let s = shape(32, 8, 128, 128);
        let p = plan(&s, true).unwrap();
        assert_eq!((p.heads_per_block, p.n_sub), (4, 1));
        assert_eq!((p.n_split, p.keys_per_split), (16, 256));
        // A group of 12 is cut into two even blocks of 6, not 8 + 4.
        let p = plan(&shape(12, 1, 64, 64), false).unwrap();
        assert_eq!((p.heads_per_block, p.n_sub, p.n_split), (6, 2, 1));
        assert_eq!(p.keys_per_split, u32::MAX);
        // Many slots: at most MAX_SPLITS splits of whole tiles that cover every slot.
        let mut big = shape(8, 8, 64, 64);
        big.slots = 40_000;
        let p = plan(&big, true).unwrap();
        assert!(p.n_split <= MAX_SPLITS);
        assert!(p.n_split * p.keys_per_split as usize >= 40_000);
        assert_eq!(p.keys_per_split % BLOCK, 0);
        // A window bounds the keys: 128 fit one tile of the one-thread-per-key kernel (head
        // size 80), so no split and no workspace; the one-warp-per-key kernel (64) cuts them
        // into sixteen splits of 8.
        let mut odd = big;
        odd.head_dim_k = 80;
        odd.head_dim_v = 80;
        odd.window = Some(128);
        assert_eq!(decode_splits(&odd).unwrap(), 1);
        assert_eq!(decode_workspace_floats(&odd).unwrap(), 0);
        big.window = Some(128);
        assert_eq!(decode_splits(&big).unwrap(), 16);
        let p = decode_plan(&big).unwrap();
        assert!(p.warp_per_key && !decode_plan(&odd).unwrap().warp_per_key);
        assert_eq!(p.keys_per_split, 8);
        // A multiple of 64 that is not 64, 128 or 256 has no warp-per-key instance.
        let mut d192 = big;
        d192.head_dim_k = 192;
        d192.head_dim_v = 192;
        assert!(!decode_plan(&d192).unwrap().warp_per_key);
    }

    #[test]
    fn the_warp_per_key_plan_keeps_four_heads_per_block_and_bounded_splits() {
        let mut s = shape(12, 1, 256, 256);
        s.slots = 100_000;
        let p = decode_plan(&s).unwrap();
        assert_eq!((p.heads_per_block, p.n_sub), (4, 3));
        assert!(p.n_split <= MAX_SPLITS);
        assert!(p.n_split * p.keys_per_split as usize >= 100_000);
        assert_eq!(p.keys_per_split as usize % DECODE_TILE, 0);
        let p = decode_plan(&shape(6, 1, 128, 128)).unwrap();
        assert_eq!((p.heads_per_block, p.n_sub), (3, 2));
    }

    #[test]
    fn many_tokens_take_fewer_splits_and_the_bound_covers_every_count() {
        let mut s = shape(32, 8, 128, 128);
        s.slots = 4096;
        // One token of 8 KV heads: 64 splits make the 512 blocks aimed for.
        assert_eq!(decode_splits(&s).unwrap(), TARGET_BLOCKS / 8);
        s.n_tokens = 8;
        assert_eq!(decode_splits(&s).unwrap(), 8);
        s.n_tokens = 64;
        assert_eq!(decode_splits(&s).unwrap(), MIN_SPLITS_PER_TOKEN);
        let most = decode_workspace_floats_up_to(&s).unwrap();
        for n in 1..=64 {
            let one = AttentionShape { n_tokens: n, ..s };
            assert!(decode_workspace_floats(&one).unwrap() <= most, "{n} tokens");
        }
        assert_eq!(most, decode_workspace_floats(&s).unwrap());
    }

    #[test]
    fn few_kv_heads_take_more_splits_up_to_the_most() {
        // Gemma 3 270M's one KV head of 256 values: 64 splits would be 64 blocks, so a token
        // takes the most splits the target allows.
        let mut s = shape(4, 1, 256, 256);
        s.slots = 16_384;
        let p = decode_plan(&s).unwrap();
        assert_eq!((p.n_sub, p.n_split), (1, MAX_SPLITS));
        assert!(p.n_split * p.keys_per_split as usize >= 16_384);
        // Eight tokens share the target: 64 splits each.
        s.n_tokens = 8;
        assert_eq!(decode_splits(&s).unwrap(), TARGET_BLOCKS / 8);
        // A short cache still takes at most one split per 8-key unit.
        s.n_tokens = 1;
        s.slots = 512;
        assert_eq!(decode_splits(&s).unwrap(), 512 / DECODE_TILE);
    }

    #[test]
    fn workspace_is_tokens_heads_splits_times_dv_plus_two() {
        let mut s = shape(16, 8, 80, 80);
        s.n_tokens = 3;
        s.slots = 300; // two tiles of 256
        assert_eq!(decode_splits(&s).unwrap(), 2);
        assert_eq!(decode_workspace_floats(&s).unwrap(), 3 * 16 * 2 * 82);
    }

    #[test]
    fn shared_memory_limits_heads_per_block_and_huge_heads_are_refused() {
        assert_eq!(
            plan(&shape(8, 1, 512, 512), false).unwrap().heads_per_block,
            8
        );
        // 8 heads of (2048 + 512) floats need 80 KiB: two blocks of 4 heads.
        let p = plan(&shape(8, 1, 2048, 512), false).unwrap();
        assert!(p.shared_bytes <= MAX_SHARED_BYTES, "{p:?}");
        assert_eq!((p.heads_per_block, p.n_sub), (4, 2), "{p:?}");
        let err = plan(&shape(1, 1, 20_000, 64), false).unwrap_err();
        assert!(err.to_string().contains("shared memory"), "{err}");
    }

    #[test]
    fn bad_shapes_are_refused_with_the_numbers() {
        let s = shape(6, 4, 64, 64);
        let err = check(1 << 20, 1 << 30, 1 << 30, 1, 1 << 20, &s, false).unwrap_err();
        assert!(err.to_string().contains("not a multiple"), "{err}");
        let s = shape(8, 2, 64, 64);
        let err = check(8 * 64 - 1, 1 << 30, 1 << 30, 1, 1 << 20, &s, false).unwrap_err();
        assert!(err.to_string().contains("q of [1][8][64]"), "{err}");
        let err = check(8 * 64, 4096 * 2 * 64 - 1, 1 << 30, 1, 1 << 20, &s, false).unwrap_err();
        assert!(err.to_string().contains("K cache"), "{err}");
        let err = check(8 * 64, 1 << 30, 1 << 30, 0, 1 << 20, &s, false).unwrap_err();
        assert!(err.to_string().contains("positions"), "{err}");
        let mut w = s;
        w.window = Some(0);
        assert!(check(1 << 20, 1 << 30, 1 << 30, 1, 1 << 20, &w, false).is_err());
        let big_v = shape(8, 2, 64, MAX_HEAD_DIM_V + 2);
        assert!(check(1 << 20, 1 << 30, 1 << 30, 1, 1 << 20, &big_v, false).is_err());
        assert!(check(8 * 64, 1 << 30, 1 << 30, 1, 8 * 64, &s, false).is_ok());
    }
}

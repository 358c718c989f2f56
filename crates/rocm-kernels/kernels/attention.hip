// Causal attention against a layer's K/V cache, with grouped KV heads (GQA), an optional sliding
// window and ring slots.
//
// Shapes: q `[n_tokens][n_head][dk]` f32; the K cache `[slots][n_head_kv][dk]` and the V cache
// `[slots][n_head_kv][dv]` in f16 (u16 bits), f32 or q8_0 (kv_q8.h; dk and dv multiples of
// 32, so every head starts on a block); out `[n_tokens][n_head][dv]` f32. Query head h reads KV
// head h / (n_head / n_head_kv). Query token t is at positions[t] (device
// memory) and sees the keys at positions [first, p] with first = max(0, p - window + 1) (or 0
// without a window); position j lives in slot j % slots, and slot s in the cache row that the
// token's block table gives when the cache is paged (kv_pages.h).
//
// One kernel serves both paths. A block takes one query token (grid x), a group of at most
// ATTN_MAX_HEADS query heads that share one KV head (grid y), and one split of the key range
// (grid z). It streams its keys in tiles of blockDim.x keys with an online softmax:
//  - prefill (n_split = 1): each block covers all the keys of its token and writes the output;
//  - decode (n_split > 1, flash-decoding): split s covers key offsets [s * keys_per_split,
//    (s + 1) * keys_per_split) from `first`, and writes its partial max, sum of exponentials
//    and unnormalised weighted V; `attn_combine` merges the splits. The grid is sized on the
//    host for the most keys a query can see (min(slots, window)), never for the current
//    length, so a captured graph replays at any position: a split past the current length
//    writes a neutral partial (max = -inf, sum = 0) that the combine skips.
#include "portability.h"
#include "kv_pages.h"
#include "kv_q8.h"

// Query heads per block (the GQA group is split into sub-groups of at most this many).
#define ATTN_MAX_HEADS 8
// V dimensions per thread: dv <= ATTN_MAX_ITEMS * blockDim.x.
#define ATTN_MAX_ITEMS 2

DEVICE float attn_neg_inf() { return __int_as_float((int)0xff800000u); }

// The templates below take a cache as P: `const float*`, `const u16*` (f16 bits) or KvQ8
// (kv_q8.h, whose kv_load is there), each with `+ offset` and kv_load(P, i).
DEVICE float kv_load(const float* p, u64 i) { return p[i]; }
DEVICE float kv_load(const u16* p, u64 i) { return f16_to_f32(p[i]); }

// A kernel argument as the templates take it.
DEVICE const float* kv_ptr(const float* p) { return p; }
DEVICE const u16* kv_ptr(const u16* p) { return p; }
DEVICE KvQ8 kv_ptr(const u8* p) { return kv_q8_at(p); }

// Max (IS_MAX) or sum of v[0..nh) over the block; every thread gets the results. `red` holds
// ATTN_MAX_HEADS * 32 floats; blockDim.x is a multiple of WARP_SIZE.
template <bool IS_MAX>
DEVICE void attn_block_reduce(float* v, u32 nh, float* red) {
    const u32 lane = threadIdx.x % WARP_SIZE;
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 n_warps = blockDim.x / WARP_SIZE;
#pragma unroll
    for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
        if (g < nh) v[g] = IS_MAX ? warp_max(v[g]) : warp_sum(v[g]);
    }
    __syncthreads();  // `red` may still be read by an earlier call
    if (lane == 0) {
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
            if (g < nh) red[g * 32 + warp] = v[g];
        }
    }
    __syncthreads();
#pragma unroll
    for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
        if (g < nh) {
            float r = IS_MAX ? attn_neg_inf() : 0.0f;
            for (u32 w = 0; w < n_warps; ++w) {
                r = IS_MAX ? fmaxf(r, red[g * 32 + w]) : r + red[g * 32 + w];
            }
            v[g] = r;
        }
    }
}

// Dynamic shared memory: heads_per_block * dk floats of q, then heads_per_block *
// max(blockDim.x, rows_par * dv) floats for the tile's probabilities (and, at the end, the
// partial V sums), where rows_par = dv <= blockDim.x ? blockDim.x / dv : 1.
template <typename P>
DEVICE void attn_core(const float* q, P k_cache, P v_cache, const i32* positions,
                      float* out, float* part_ms, float* part_acc, u32 n_head, u32 n_head_kv,
                      u32 dk, u32 dv, u32 slots, u32 window, float scale, float softcap, u32 heads_per_block,
                      u32 n_split, u32 keys_per_split, float* smem, float* red,
                      KV_PAGES_PARAMS) {
    const u32 n_threads = blockDim.x;
    const u32 tid = threadIdx.x;
    const u32 t = blockIdx.x;
    const u32 split = blockIdx.z;
    const u32 group = n_head / n_head_kv;
    const u32 n_sub = (group + heads_per_block - 1) / heads_per_block;
    const u32 kvh = blockIdx.y / n_sub;
    const u32 h0 = kvh * group + (blockIdx.y % n_sub) * heads_per_block;
    const u32 group_end = kvh * group + group;
    const u32 nh = heads_per_block < group_end - h0 ? heads_per_block : group_end - h0;

    // The keys this query sees, as offsets [0, n_keys) from `first`, and this split's share.
    const i64 pos = (i64)positions[t];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t);
    i64 first = 0;
    if (window > 0 && pos - (i64)window + 1 > 0) first = pos - (i64)window + 1;
    const i64 n_keys = pos - first + 1;
    const i64 k_begin = (i64)split * (i64)keys_per_split;
    i64 k_end = k_begin + (i64)keys_per_split;
    if (k_end > n_keys) k_end = n_keys;

    const u64 row_q = (u64)t * n_head + h0;  // first (token, head) row of this block
    if (k_begin >= k_end) {
        // Nothing to see: a neutral partial, or zeros (only for an invalid position).
        if (n_split > 1) {
            if (tid < nh) {
                float* ms = part_ms + ((row_q + tid) * n_split + split) * 2;
                ms[0] = attn_neg_inf();
                ms[1] = 0.0f;
            }
        } else {
            for (u32 i = tid; i < nh * dv; i += n_threads) out[row_q * dv + i] = 0.0f;
        }
        return;
    }

    float* q_sh = smem;
    float* p_sh = smem + heads_per_block * dk;
    for (u32 i = tid; i < nh * dk; i += n_threads) q_sh[i] = q[row_q * dk + i];
    __syncthreads();

    const u64 k_row = (u64)n_head_kv * dk;
    const u64 v_row = (u64)n_head_kv * dv;
    P k_head = k_cache + (u64)kvh * dk;
    P v_head = v_cache + (u64)kvh * dv;
    const u32 rows_par = dv <= n_threads ? n_threads / dv : 1;

    float m_run[ATTN_MAX_HEADS];
    float l_run[ATTN_MAX_HEADS];
    float acc[ATTN_MAX_ITEMS][ATTN_MAX_HEADS];
#pragma unroll
    for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
        m_run[g] = attn_neg_inf();
        l_run[g] = 0.0f;
#pragma unroll
        for (u32 it = 0; it < ATTN_MAX_ITEMS; ++it) acc[it][g] = 0.0f;
    }

    for (i64 tile = k_begin; tile < k_end; tile += n_threads) {
        // Scores: one key per thread.
        const i64 jj = tile + tid;
        const bool valid = jj < k_end;
        float s[ATTN_MAX_HEADS];
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) s[g] = 0.0f;
        if (valid) {
            const u64 row = kv_row(pages, (u32)(first + jj) % slots);
            P kr = k_head + row * k_row;
            for (u32 d = 0; d < dk; ++d) {
                const float kd = kv_load(kr, d);
#pragma unroll
                for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
                    if (g < nh) s[g] += q_sh[g * dk + d] * kd;
                }
            }
#pragma unroll
            for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) s[g] = softcap_logit(s[g] * scale, softcap);
        } else {
#pragma unroll
            for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) s[g] = attn_neg_inf();
        }

        // Online softmax: new running max, rescale factor, this tile's probabilities.
        float m_tile[ATTN_MAX_HEADS];
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) m_tile[g] = s[g];
        attn_block_reduce<true>(m_tile, nh, red);
        float alpha[ATTN_MAX_HEADS];
        float p[ATTN_MAX_HEADS];
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
            const float m_new = fmaxf(m_run[g], m_tile[g]);
            const bool finite = m_new > attn_neg_inf();
            alpha[g] = (m_run[g] > attn_neg_inf()) ? expf(m_run[g] - m_new) : 0.0f;
            p[g] = (valid && finite) ? expf(s[g] - m_new) : 0.0f;
            m_run[g] = m_new;
            if (g < nh) p_sh[g * n_threads + tid] = p[g];
        }
        attn_block_reduce<false>(p, nh, red);  // its barriers also publish p_sh
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) l_run[g] = l_run[g] * alpha[g] + p[g];

        // Weighted V: item (d, r) sums the keys r, r + rows_par, ... of the tile.
        const i64 left = k_end - tile;
        const u32 n_tile = left < (i64)n_threads ? (u32)left : n_threads;
        const u32 slot0 = (u32)(first + tile) % slots;
#pragma unroll
        for (u32 it = 0; it < ATTN_MAX_ITEMS; ++it) {
            const u32 idx = tid + it * n_threads;
            const u32 d = idx % dv;
            const u32 r = idx / dv;
            if (r < rows_par) {
#pragma unroll
                for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) acc[it][g] *= alpha[g];
                for (u32 j = r; j < n_tile; j += rows_par) {
                    const u64 row = kv_row(pages, (slot0 + j) % slots);
                    const float vd = kv_load(v_head + row * v_row, d);
#pragma unroll
                    for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
                        if (g < nh) acc[it][g] += p_sh[g * n_threads + j] * vd;
                    }
                }
            }
        }
        __syncthreads();  // p_sh is rewritten by the next tile
    }

    // Sum the items' partial sums over r, then write the output or the partial.
    float* acc_sh = p_sh;
#pragma unroll
    for (u32 it = 0; it < ATTN_MAX_ITEMS; ++it) {
        const u32 idx = tid + it * n_threads;
        const u32 d = idx % dv;
        const u32 r = idx / dv;
        if (r < rows_par) {
#pragma unroll
            for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
                if (g < nh) acc_sh[(g * rows_par + r) * dv + d] = acc[it][g];
            }
        }
    }
    __syncthreads();
    for (u32 i = tid; i < nh * dv; i += n_threads) {
        const u32 g = i / dv;
        const u32 d = i % dv;
        float a = 0.0f;
        for (u32 r = 0; r < rows_par; ++r) a += acc_sh[(g * rows_par + r) * dv + d];
        if (n_split > 1) {
            part_acc[((row_q + g) * n_split + split) * dv + d] = a;
        } else {
            float l = 0.0f;
#pragma unroll
            for (u32 gg = 0; gg < ATTN_MAX_HEADS; ++gg) {
                if (gg == g) l = l_run[gg];
            }
            out[(row_q + g) * dv + d] = l > 0.0f ? a / l : 0.0f;
        }
    }
    if (n_split > 1) {
#pragma unroll
        for (u32 g = 0; g < ATTN_MAX_HEADS; ++g) {
            if (g < nh && tid == g) {
                float* ms = part_ms + ((row_q + g) * n_split + split) * 2;
                ms[0] = m_run[g];
                ms[1] = l_run[g];
            }
        }
    }
}

KERNEL void LAUNCH_BOUNDS(256) attn_f16(const float* q, const u16* k_cache, const u16* v_cache,
                     const i32* positions, float* out, float* part_ms, float* part_acc,
                     u32 n_head, u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window,
                     float scale, float softcap, u32 heads_per_block, u32 n_split, u32 keys_per_split,
                     KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    __shared__ float red[ATTN_MAX_HEADS * 32];
    attn_core<const u16*>(q, k_cache, v_cache, positions, out, part_ms, part_acc, n_head,
                          n_head_kv, dk, dv, slots, window, scale, softcap, heads_per_block, n_split,
                          keys_per_split, attn_smem, red, KV_PAGES_ARGS);
}

KERNEL void LAUNCH_BOUNDS(256) attn_f32(const float* q, const float* k_cache, const float* v_cache,
                     const i32* positions, float* out, float* part_ms, float* part_acc,
                     u32 n_head, u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window,
                     float scale, float softcap, u32 heads_per_block, u32 n_split, u32 keys_per_split,
                     KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    __shared__ float red[ATTN_MAX_HEADS * 32];
    attn_core<const float*>(q, k_cache, v_cache, positions, out, part_ms, part_acc, n_head,
                            n_head_kv, dk, dv, slots, window, scale, softcap, heads_per_block, n_split,
                            keys_per_split, attn_smem, red, KV_PAGES_ARGS);
}

KERNEL void LAUNCH_BOUNDS(256) attn_q8_0(const float* q, const u8* k_cache, const u8* v_cache,
                      const i32* positions, float* out, float* part_ms, float* part_acc,
                      u32 n_head, u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window,
                      float scale, float softcap, u32 heads_per_block, u32 n_split, u32 keys_per_split,
                      KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    __shared__ float red[ATTN_MAX_HEADS * 32];
    attn_core<KvQ8>(q, kv_q8_at(k_cache), kv_q8_at(v_cache), positions, out, part_ms, part_acc,
                    n_head, n_head_kv, dk, dv, slots, window, scale, softcap, heads_per_block, n_split,
                    keys_per_split, attn_smem, red, KV_PAGES_ARGS);
}

// Prefill, tiled: a block takes ATTN_TQ consecutive query tokens of one head (grid x: token
// tiles, grid y: heads) and streams the keys the tile can see in tiles of ATTN_TK, so each key
// row is read once per query tile instead of once per query. 256 threads: thread (r, c) =
// (tid / 16, tid % 16) scores query r against key c of the tile, then owns output dimensions
// c, c + 16, ... of query r. A row's 16 threads are an aligned group of lanes in a wave of 32
// or of 64, so its shuffles stay inside one wave either way. The launch's tokens are one
// sequence's, at ascending positions (the host launches each sequence's run of a step apart),
// so the tile sees the keys from its first query's first visible position to its last query's
// position, through its first token's block table.
//
// Dynamic shared memory (floats): q [ATTN_TQ][dk + 1], the K then V tile [ATTN_TK][max(dk + 1,
// dv)], and the probabilities [ATTN_TQ][ATTN_TK]. The rows of dk + 1 keep the 16 keys' reads of
// one dimension in distinct banks. Thread (r, c) loads row r of each tile (its slot computed
// once) and the softmax of a row runs on its 16 threads with lane shuffles, so no thread
// divides per element and none waits on a serial loop.
#define ATTN_TQ 16
#define ATTN_TK 16
#define ATTN_T_THREADS (ATTN_TQ * ATTN_TK)
// Output dimensions per thread: dv <= ATTN_TK * ATTN_T_ITEMS.
#define ATTN_T_ITEMS 16

template <typename P>
DEVICE void attn_prefill_tiled(const float* q, P k_cache, P v_cache,
                               const i32* positions, float* out, u32 n_tokens, u32 n_head,
                               u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window,
                               float scale, float softcap, float* smem, KV_PAGES_PARAMS) {
    const u32 tid = threadIdx.x;
    const u32 r = tid / ATTN_TK;  // this thread's query row (and the K/V row it loads)
    const u32 c = tid % ATTN_TK;  // this thread's key column (and first dimension it loads)
    const u32 t0 = blockIdx.x * ATTN_TQ;
    const u32 h = blockIdx.y;
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 n_rows = n_tokens - t0 < ATTN_TQ ? n_tokens - t0 : ATTN_TQ;
    const u32 q_stride = dk + 1;
    const u32 kv_stride = dk + 1 > dv ? dk + 1 : dv;

    float* q_sh = smem;
    float* kv_sh = q_sh + ATTN_TQ * q_stride;
    float* p_sh = kv_sh + ATTN_TK * kv_stride;

    const bool row_valid = r < n_rows;
    {
        const float* qr = q + ((u64)(t0 + r) * n_head + h) * dk;
        for (u32 d = c; d < dk; d += ATTN_TK) q_sh[r * q_stride + d] = row_valid ? qr[d] : 0.0f;
    }
    // This thread's query: its position and the first position it sees.
    const i64 pos = row_valid ? (i64)positions[t0 + r] : -1;
    i64 first = 0;
    if (window > 0 && pos - (i64)window + 1 > 0) first = pos - (i64)window + 1;
    // The tile's key range: from its first query's first visible position to its last query.
    const i64 pos_lo = (i64)positions[t0];
    const i64 k_lo = (window > 0 && pos_lo - (i64)window + 1 > 0) ? pos_lo - (i64)window + 1 : 0;
    const i64 k_hi = (i64)positions[t0 + n_rows - 1];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t0);

    const u64 k_row = (u64)n_head_kv * dk;
    const u64 v_row = (u64)n_head_kv * dv;
    P k_head = k_cache + (u64)kvh * dk;
    P v_head = v_cache + (u64)kvh * dv;
    const u32 n_items = (dv + ATTN_TK - 1) / ATTN_TK;
    // The row's running max and sum: the 16 threads of a row hold the same values.
    float m_run = attn_neg_inf();
    float l_run = 0.0f;
    float acc[ATTN_T_ITEMS];
#pragma unroll
    for (u32 i = 0; i < ATTN_T_ITEMS; ++i) acc[i] = 0.0f;
    __syncthreads();

    for (i64 kt = k_lo; kt <= k_hi; kt += ATTN_TK) {
        // This thread loads key row r of the tile (positions are i32, so u32 slot math).
        const i64 lp = kt + r;
        const bool load_valid = lp <= k_hi;
        const u64 slot = load_valid ? kv_row(pages, (u32)lp % slots) : 0;
        {
            P kr = k_head + slot * k_row;
            for (u32 d = c; d < dk; d += ATTN_TK)
                kv_sh[r * kv_stride + d] = load_valid ? kv_load(kr, d) : 0.0f;
        }
        __syncthreads();
        // Score of query r against key c, or -inf where the query must not see it.
        const i64 kp = kt + c;
        const bool visible = row_valid && kp <= pos && kp >= first;
        float s = attn_neg_inf();
        if (visible) {
            float dot = 0.0f;
            const float* qr = q_sh + r * q_stride;
            const float* kr = kv_sh + c * kv_stride;
            for (u32 d = 0; d < dk; ++d) dot += qr[d] * kr[d];
            s = softcap_logit(dot * scale, softcap);
        }
        // Online softmax over the row's 16 threads (an aligned group of lanes in any wave).
        float m_tile = s;
#pragma unroll
        for (int m = ATTN_TK / 2; m > 0; m >>= 1) m_tile = fmaxf(m_tile, warp_shfl_xor(m_tile, m));
        const float m_new = fmaxf(m_run, m_tile);
        const bool finite = m_new > attn_neg_inf();
        const float alpha = m_run > attn_neg_inf() ? expf(m_run - m_new) : 0.0f;
        const float p = (finite && s > attn_neg_inf()) ? expf(s - m_new) : 0.0f;
        float sum = p;
#pragma unroll
        for (int m = ATTN_TK / 2; m > 0; m >>= 1) sum += warp_shfl_xor(sum, m);
        l_run = l_run * alpha + sum;
        m_run = m_new;
        p_sh[r * ATTN_TK + c] = p;
        __syncthreads();  // every score is taken: the K tile may be overwritten
        {
            P vr = v_head + slot * v_row;
            for (u32 d = c; d < dv; d += ATTN_TK)
                kv_sh[r * kv_stride + d] = load_valid ? kv_load(vr, d) : 0.0f;
        }
        __syncthreads();
        // Weighted V for query r, dimensions c, c + 16, ...
        const float* pr = p_sh + r * ATTN_TK;
#pragma unroll
        for (u32 i = 0; i < ATTN_T_ITEMS; ++i) {
            if (i < n_items) {
                const u32 d = c + i * ATTN_TK;
                float a = acc[i] * alpha;
                if (d < dv) {
#pragma unroll
                    for (u32 j = 0; j < ATTN_TK; ++j) a += pr[j] * kv_sh[j * kv_stride + d];
                }
                acc[i] = a;
            }
        }
        __syncthreads();  // the next tile rewrites the K/V tile and the probabilities
    }

    if (row_valid) {
        float* o = out + ((u64)(t0 + r) * n_head + h) * dv;
#pragma unroll
        for (u32 i = 0; i < ATTN_T_ITEMS; ++i) {
            const u32 d = c + i * ATTN_TK;
            if (i < n_items && d < dv) o[d] = l_run > 0.0f ? acc[i] / l_run : 0.0f;
        }
    }
}

KERNEL void LAUNCH_BOUNDS(ATTN_T_THREADS) attn_prefill_f16(const float* q, const u16* k_cache, const u16* v_cache,
                             const i32* positions, float* out, u32 n_tokens, u32 n_head,
                             u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window, float scale, float softcap,
                             KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    attn_prefill_tiled<const u16*>(q, k_cache, v_cache, positions, out, n_tokens, n_head,
                                   n_head_kv, dk, dv, slots, window, scale, softcap, attn_smem,
                                   KV_PAGES_ARGS);
}

KERNEL void LAUNCH_BOUNDS(ATTN_T_THREADS) attn_prefill_f32(const float* q, const float* k_cache, const float* v_cache,
                             const i32* positions, float* out, u32 n_tokens, u32 n_head,
                             u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window, float scale, float softcap,
                             KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    attn_prefill_tiled<const float*>(q, k_cache, v_cache, positions, out, n_tokens, n_head,
                                     n_head_kv, dk, dv, slots, window, scale, softcap, attn_smem,
                                     KV_PAGES_ARGS);
}

KERNEL void LAUNCH_BOUNDS(ATTN_T_THREADS) attn_prefill_q8_0(const float* q, const u8* k_cache, const u8* v_cache,
                              const i32* positions, float* out, u32 n_tokens, u32 n_head,
                              u32 n_head_kv, u32 dk, u32 dv, u32 slots, u32 window, float scale, float softcap,
                              KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    extern __shared__ float attn_smem[];
    attn_prefill_tiled<KvQ8>(q, kv_q8_at(k_cache), kv_q8_at(v_cache), positions, out, n_tokens,
                             n_head, n_head_kv, dk, dv, slots, window, scale, softcap, attn_smem,
                             KV_PAGES_ARGS);
}

// Merges the splits of one (token, head) for 32 dimensions per block (grid z), out = sum_s acc_s
// e^(m_s - M) / sum_s l_s e^(m_s - M) with M the largest split max; splits with max = -inf are
// skipped. The first wave reads the n_split <= ATTN_MAX_SPLITS (max, sum) pairs lane-parallel
// and leaves each split's factor e^(m_s - M) in shared memory, so no thread walks the splits'
// maxima one after another. Then the block's ATTN_CB_LANES groups of 32 threads take every
// ATTN_CB_LANES-th split each, so a thread's loads (8 with 64 splits, at most 32) are in flight
// eight at a time, and the groups' sums meet in shared memory. (One thread per dimension walking all the
// splits took eight dependent rounds of loads, in 32 blocks for the 8B shape's heads.) A skipped
// split's acc was never written, so its value is selected away, never multiplied.
#define ATTN_MAX_SPLITS 256
#define ATTN_CB_DIMS 32
#define ATTN_CB_LANES 8
//
// With xq (dv a multiple of 32), the output is also quantized for the next int8 product as
// quantize_q8 would, so that product needs no quantizing launch of its own: the block's 32
// dimensions are one group.
KERNEL void LAUNCH_BOUNDS(ATTN_CB_DIMS * ATTN_CB_LANES)
    attn_combine(const float* part_ms, const float* part_acc, float* out, u32 n_head, u32 dv,
                 u32 n_split, i8* xq, float* xd) {
    KERNEL_PROLOGUE();
    __shared__ float factor[ATTN_MAX_SPLITS];
    __shared__ float total;
    __shared__ float red[ATTN_CB_LANES][ATTN_CB_DIMS];
    const u64 row = (u64)blockIdx.x * n_head + blockIdx.y;
    const float* ms = part_ms + row * n_split * 2;
    const float* acc = part_acc + row * n_split * dv;
    if (threadIdx.x < WARP_SIZE) {
        const u32 lane = threadIdx.x;
        float m = attn_neg_inf();
        for (u32 s = lane; s < n_split; s += WARP_SIZE) m = fmaxf(m, ms[2 * s]);
        m = warp_max(m);
        float l = 0.0f;
        for (u32 s = lane; s < n_split; s += WARP_SIZE) {
            const float ms_s = ms[2 * s];
            const float f = ms_s > attn_neg_inf() ? expf(ms_s - m) : 0.0f;
            factor[s] = f;
            l += ms[2 * s + 1] * f;
        }
        l = warp_sum(l);
        if (lane == 0) total = l;
    }
    __syncthreads();
    const u32 dl = threadIdx.x % ATTN_CB_DIMS;
    const u32 group = threadIdx.x / ATTN_CB_DIMS;
    const u32 d = blockIdx.z * ATTN_CB_DIMS + dl;
    float a = 0.0f;
    if (d < dv) {
        // Loads with no branch around them, so the unrolled loop keeps them all in flight.
#pragma unroll 8
        for (u32 s = group; s < n_split; s += ATTN_CB_LANES) {
            const float v = acc[(u64)s * dv + d];
            const float f = factor[s];
            a += f != 0.0f ? v * f : 0.0f;
        }
    }
    red[group][dl] = a;
    __syncthreads();
    // The first 32 threads: one whole quantization group, inside one wave of 32 or 64, whose
    // shuffles (masks below 32) read only these lanes.
    if (group == 0) {
        float sum = 0.0f;
#pragma unroll
        for (u32 g = 0; g < ATTN_CB_LANES; ++g) sum += red[g][dl];
        const float l = total;
        const float o = l > 0.0f ? sum / l : 0.0f;
        if (d < dv) out[row * dv + d] = o;
        // With xq, dv is a multiple of 32, so every lane of the group holds a dimension.
        if (xq) q8_quantize_lane(o, row * dv + d, xq, xd);
    }
}

// ---- Decode attention, one warp per key: the fast path for head sizes that split evenly
// over a warp (dk == dv, a multiple of 64, at most 256).
//
// A block of ATTN_DEC_WARPS warps takes one query token (grid x), at most ATTN_DEC_HEADS query
// heads of one KV head (grid y) and one split of the key range (grid z), as attn_core does.
// Its warps take the split's keys in turn; each lane holds DPL = dk / WARP_SIZE consecutive
// dimensions, so a key row is read with one coalesced load per lane and its scores are
// warp sums. Each warp keeps an online softmax per head; the warps meet in shared memory at
// the end and write the split's partial (or, with one split, the output), in attn_core's
// layout, so attn_combine merges them.
#define ATTN_DEC_WARPS 4
#define ATTN_DEC_HEADS 4

// A lane's DPL consecutive values of a key or value row, with the widest load their
// alignment allows: rows start at multiples of 64 values (d is), so a lane's slice is aligned
// to its own size.
template <typename P, int DPL>
struct KvRowPart {
    static DEVICE void load(P row, u32 lane, float* out) {
#pragma unroll
        for (int i = 0; i < DPL; ++i) out[i] = kv_load(row, (u64)lane * DPL + i);
    }
};

template <>
struct KvRowPart<const u16*, 8> {
    static DEVICE void load(const u16* row, u32 lane, float* out) {
        const uint4 v = *(const uint4*)(row + (u64)lane * 8);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[2 * i] = f16_to_f32((u16)(w[i] & 0xFFFFu));
            out[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
        }
    }
};

template <>
struct KvRowPart<const u16*, 4> {
    static DEVICE void load(const u16* row, u32 lane, float* out) {
        const uint2 v = *(const uint2*)(row + (u64)lane * 4);
        out[0] = f16_to_f32((u16)(v.x & 0xFFFFu));
        out[1] = f16_to_f32((u16)(v.x >> 16));
        out[2] = f16_to_f32((u16)(v.y & 0xFFFFu));
        out[3] = f16_to_f32((u16)(v.y >> 16));
    }
};

template <>
struct KvRowPart<const float*, 8> {
    static DEVICE void load(const float* row, u32 lane, float* out) {
        const float4 a = *(const float4*)(row + (u64)lane * 8);
        const float4 b = *(const float4*)(row + (u64)lane * 8 + 4);
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    }
};

template <>
struct KvRowPart<const float*, 4> {
    static DEVICE void load(const float* row, u32 lane, float* out) {
        const float4 a = *(const float4*)(row + (u64)lane * 4);
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    }
};

// q8_0: a lane's DPL <= 8 values lie in one block (DPL divides 32 and the row starts on a
// block), so it reads the block's scale once and its quants two at a time: a block is only
// 2-byte aligned (34-byte blocks put its quants at 2 or 0 mod 4, alternating from block to
// block), so a wider load would need an alignment the lanes of one wave do not share.
template <int DPL>
struct KvRowPart<KvQ8, DPL> {
    static DEVICE void load(KvQ8 row, u32 lane, float* out) {
        const u64 v = row.off + (u64)lane * DPL;
        const u8* b = kv_q8_block(row, v);
        const float d = kv_q8_scale(b);
        const u8* qs = b + 2 + v % KV_Q8_BLOCK;
        if (DPL == 1) {
            out[0] = d * (float)(i8)qs[0];
        } else {
#pragma unroll
            for (int i = 0; i < DPL / 2; ++i) {
                const u16 w = ((const u16*)qs)[i];
                out[2 * i] = d * (float)(i8)(u8)(w & 0xffu);
                out[2 * i + 1] = d * (float)(i8)(u8)(w >> 8);
            }
        }
    }
};

template <typename P, int DPL>
DEVICE void kv_row_part(P row, u32 lane, float* out) {
    KvRowPart<P, DPL>::load(row, lane, out);
}

// One key's online-softmax update of every head of the block: the score is a warp sum of
// the lanes' slices.
template <int DPL>
DEVICE void attn_key_update(const float (*qv)[DPL], const float* kr, const float* vr, u32 nh,
                            float softcap, float* m, float* l, float (*acc)[DPL]) {
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
        if (g >= nh) break;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += qv[g][i] * kr[i];
        s = softcap_logit(warp_sum(s), softcap);
        const float m_new = fmaxf(m[g], s);
        const float alpha = m[g] > attn_neg_inf() ? expf(m[g] - m_new) : 0.0f;
        const float p = expf(s - m_new);
        l[g] = l[g] * alpha + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[g][i] = acc[g][i] * alpha + p * vr[i];
        m[g] = m_new;
    }
}

template <typename P, int DPL>
DEVICE void attn_decode_core(const float* q, P k_cache, P v_cache,
                             const i32* positions, float* out, float* part_ms, float* part_acc,
                             u32 n_head, u32 n_head_kv, u32 d, u32 slots, u32 window,
                             float scale, float softcap, u32 heads_per_block, u32 n_split,
                             u32 keys_per_split, float* sm_acc, float* sm_ml,
                             KV_PAGES_PARAMS) {
    const u32 lane = threadIdx.x % WARP_SIZE;
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 n_warps = blockDim.x / WARP_SIZE;
    const u32 t = blockIdx.x;
    const u32 split = blockIdx.z;
    const u32 group = n_head / n_head_kv;
    const u32 n_sub = (group + heads_per_block - 1) / heads_per_block;
    const u32 kvh = blockIdx.y / n_sub;
    const u32 h0 = kvh * group + (blockIdx.y % n_sub) * heads_per_block;
    const u32 group_end = kvh * group + group;
    const u32 nh = heads_per_block < group_end - h0 ? heads_per_block : group_end - h0;

    const i64 pos = (i64)positions[t];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t);
    i64 first = 0;
    if (window > 0 && pos - (i64)window + 1 > 0) first = pos - (i64)window + 1;
    const i64 n_keys = pos - first + 1;
    // The host sized the splits for the longest key range the cache allows, so a captured step
    // replays at any position. At the current position most of them would be empty, and the few
    // that are not would walk their keys one warp after another. Instead the current keys are
    // spread over all splits, at least one key per warp (never more than the host's size, which
    // already covers every key).
    i64 per_split = (i64)keys_per_split;
    if (n_split > 1) {
        i64 even = (n_keys + (i64)n_split - 1) / (i64)n_split;
        if (even < (i64)n_warps) even = (i64)n_warps;
        if (even < per_split) per_split = even;
    }
    const i64 k_begin = (i64)split * per_split;
    i64 k_end = k_begin + per_split;
    if (k_end > n_keys) k_end = n_keys;
    const u64 row_q = (u64)t * n_head + h0;
    if (k_begin >= k_end) {
        if (n_split > 1) {
            if (threadIdx.x < nh) {
                float* ms = part_ms + ((row_q + threadIdx.x) * n_split + split) * 2;
                ms[0] = attn_neg_inf();
                ms[1] = 0.0f;
            }
        } else {
            for (u32 i = threadIdx.x; i < nh * d; i += blockDim.x) out[row_q * d + i] = 0.0f;
        }
        return;
    }

    float qv[ATTN_DEC_HEADS][DPL];
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            qv[g][i] = g < nh ? q[(row_q + g) * d + (u64)lane * DPL + i] * scale : 0.0f;
        }
    }
    float m[ATTN_DEC_HEADS], l[ATTN_DEC_HEADS], acc[ATTN_DEC_HEADS][DPL];
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
        m[g] = attn_neg_inf();
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
    }
    const u64 row = (u64)n_head_kv * d;
    P k_head = k_cache + (u64)kvh * d;
    P v_head = v_cache + (u64)kvh * d;
    // Two keys per warp and iteration: both keys' rows are loaded before either is used, so
    // twice the loads are in flight (a short cache makes this loop latency-bound).
    for (i64 j = k_begin + warp; j < k_end; j += 2 * (i64)n_warps) {
        const i64 j2 = j + n_warps;
        const bool two = j2 < k_end;
        const u64 slot = kv_row(pages, (u32)((first + j) % (i64)slots));
        const u64 slot2 = kv_row(pages, (u32)((first + (two ? j2 : j)) % (i64)slots));
        float kr[DPL], vr[DPL], kr2[DPL], vr2[DPL];
        kv_row_part<P, DPL>(k_head + slot * row, lane, kr);
        kv_row_part<P, DPL>(v_head + slot * row, lane, vr);
        kv_row_part<P, DPL>(k_head + slot2 * row, lane, kr2);
        kv_row_part<P, DPL>(v_head + slot2 * row, lane, vr2);
        attn_key_update<DPL>(qv, kr, vr, nh, softcap, m, l, acc);
        if (two) attn_key_update<DPL>(qv, kr2, vr2, nh, softcap, m, l, acc);
    }
    // The warps' partials meet in shared memory.
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
        if (g >= nh) break;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            sm_acc[(warp * ATTN_DEC_HEADS + g) * (8 * WARP_SIZE) + lane * DPL + i] = acc[g][i];
        }
        if (lane == 0) {
            sm_ml[(warp * ATTN_DEC_HEADS + g) * 2] = m[g];
            sm_ml[(warp * ATTN_DEC_HEADS + g) * 2 + 1] = l[g];
        }
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < nh * d; i += blockDim.x) {
        const u32 g = i / d;
        const u32 dd = i % d;
        float mx = attn_neg_inf();
        for (u32 w = 0; w < n_warps; ++w) mx = fmaxf(mx, sm_ml[(w * ATTN_DEC_HEADS + g) * 2]);
        float a = 0.0f, ls = 0.0f;
        for (u32 w = 0; w < n_warps; ++w) {
            const float mw = sm_ml[(w * ATTN_DEC_HEADS + g) * 2];
            if (mw > attn_neg_inf()) {
                const float f = expf(mw - mx);
                a += sm_acc[(w * ATTN_DEC_HEADS + g) * (8 * WARP_SIZE) + dd] * f;
                ls += sm_ml[(w * ATTN_DEC_HEADS + g) * 2 + 1] * f;
            }
        }
        if (n_split > 1) {
            part_acc[((row_q + g) * n_split + split) * d + dd] = a;
            if (dd == 0) {
                float* ms = part_ms + ((row_q + g) * n_split + split) * 2;
                ms[0] = mx;
                ms[1] = ls;
            }
        } else {
            out[(row_q + g) * d + dd] = ls > 0.0f ? a / ls : 0.0f;
        }
    }
}

#define ATTN_DECODE_ENTRY(name, T, P)                                                           \
    KERNEL void LAUNCH_BOUNDS(ATTN_DEC_WARPS * WARP_SIZE)                                 \
    name(const float* q, const T* k_cache, const T* v_cache, const i32* positions, \
                     float* out, float* part_ms, float* part_acc, u32 n_head, u32 n_head_kv,   \
                     u32 d, u32 slots, u32 window, float scale, float softcap, u32 heads_per_block, \
                     u32 n_split, u32 keys_per_split, KV_PAGES_PARAMS) {                       \
        KERNEL_PROLOGUE();                                                                     \
        /* Declared here once: per instantiation below they would add up. */                  \
        __shared__ float sm_acc[ATTN_DEC_WARPS * ATTN_DEC_HEADS * 8 * WARP_SIZE];              \
        __shared__ float sm_ml[ATTN_DEC_WARPS * ATTN_DEC_HEADS * 2];                           \
        switch (d / WARP_SIZE) {                                                               \
            case 1:                                                                            \
                attn_decode_core<P, 1>(q, kv_ptr(k_cache), kv_ptr(v_cache), positions, out,    \
                                       part_ms, part_acc, n_head, n_head_kv, d, slots, window, \
                                       scale, softcap, heads_per_block, n_split, keys_per_split, \
                                       sm_acc, sm_ml, KV_PAGES_ARGS);                          \
                break;                                                                         \
            case 2:                                                                            \
                attn_decode_core<P, 2>(q, kv_ptr(k_cache), kv_ptr(v_cache), positions, out,    \
                                       part_ms, part_acc, n_head, n_head_kv, d, slots, window, \
                                       scale, softcap, heads_per_block, n_split, keys_per_split, \
                                       sm_acc, sm_ml, KV_PAGES_ARGS);                          \
                break;                                                                         \
            case 4:                                                                            \
                attn_decode_core<P, 4>(q, kv_ptr(k_cache), kv_ptr(v_cache), positions, out,    \
                                       part_ms, part_acc, n_head, n_head_kv, d, slots, window, \
                                       scale, softcap, heads_per_block, n_split, keys_per_split, \
                                       sm_acc, sm_ml, KV_PAGES_ARGS);                          \
                break;                                                                         \
            case 8:                                                                            \
                attn_decode_core<P, 8>(q, kv_ptr(k_cache), kv_ptr(v_cache), positions, out,    \
                                       part_ms, part_acc, n_head, n_head_kv, d, slots, window, \
                                       scale, softcap, heads_per_block, n_split, keys_per_split, \
                                       sm_acc, sm_ml, KV_PAGES_ARGS);                          \
                break;                                                                         \
            default:                                                                           \
                break;                                                                         \
        }                                                                                      \
    }

// Entry points attn_decode_f16, attn_decode_f32 and attn_decode_q8_0.
ATTN_DECODE_ENTRY(attn_decode_f16, u16, const u16*)
ATTN_DECODE_ENTRY(attn_decode_f32, float, const float*)
ATTN_DECODE_ENTRY(attn_decode_q8_0, u8, KvQ8)

// Eight f16 values of a 16-byte load as floats.
DEVICE void f16x8_to_f32(uint4 raw, float* out) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = f16_to_f32((u16)(w[i] & 0xFFFFu));
        out[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
    }
}

// ---- Decode attention in key streams: the fast path for f16 and q8_0 caches (dk == dv = 64,
// 128 or 256).
//
// The one-warp-per-key kernel above updates its online softmax once per key, a chain of warp
// sums and exponentials with few rows in flight, so at depth it waits on latency. (A key-tile
// kernel before this one met in shared memory three times per tile and held about 190
// registers a thread, two blocks per H100 multiprocessor: 536 GB/s of KV at 16k keys on the 8B
// shape against this kernel's 1094, docs/benchmark_results/decode-streams-h100-2026-12-06.md.)
// Here a row of d / 8 threads (8, 16 or 32: a power of two inside one wave of
// 32 or 64) is a stream: it walks its own keys of the split with its own online softmax, and
// the block meets only once, at the end. Each thread holds 8 dimensions of every head of the
// block. A step loads ATTN_DS_KEYS key and value rows per stream (16 bytes a thread each for
// f16, the block's scale and 8 quants for q8_0) before any is used, scores them with shuffle
// sums inside the row, and takes one softmax step per head for all of them. Same grid, splits
// and partials as the other decode kernels, so attn_combine and the captured graph are
// unchanged.
#define ATTN_DS_THREADS 128
#define ATTN_DS_KEYS 4
// Blocks an NVIDIA multiprocessor holds at once: four (128 registers a thread, with an 8 to 16
// byte stack frame under NVRTC 13 for sm_90) keep a one-token step of the 8B shape (8 KV heads
// x 63 splits) in one wave on 132 multiprocessors; left to itself the compiler took 167
// registers, three blocks. Chosen by that arithmetic; no A/B of the bound alone was run.
#define ATTN_DS_RESIDENT 4
// Most streams of a block: rows of 8 threads (d = 64).
#define ATTN_DS_MAX_STREAMS (ATTN_DS_THREADS / 8)

// Eight consecutive values of a cache row (the first a multiple of 8), as loaded: f16 bits in
// 16 bytes; or a q8_0 block's scale and the 8 quants (2-byte loads: a block is only 2-byte
// aligned), packed as {q0..q3, q4..q7, scale bits, 0}.
DEVICE uint4 kv8_load(const u16* p, u64 v) { return *(const uint4*)(p + v); }

DEVICE uint4 kv8_load(KvQ8 p, u64 v) {
    const u64 at = p.off + v;
    const u8* b = kv_q8_block(p, at);
    const u16* qs = (const u16*)(b + 2 + at % KV_Q8_BLOCK);
    uint4 r;
    r.x = (u32)qs[0] | ((u32)qs[1] << 16);
    r.y = (u32)qs[2] | ((u32)qs[3] << 16);
    r.z = (u32) * (const u16*)b;
    r.w = 0;
    return r;
}

template <typename P>
DEVICE void kv8_to_f32(uint4 raw, float* out);

template <>
DEVICE void kv8_to_f32<const u16*>(uint4 raw, float* out) {
    f16x8_to_f32(raw, out);
}

// As kv_load rounds it: the scale times the quant, one product per value.
template <>
DEVICE void kv8_to_f32<KvQ8>(uint4 raw, float* out) {
    const float d = f16_to_f32((u16)raw.z);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[i] = d * (float)(i8)(u8)(raw.x >> (8 * i));
        out[4 + i] = d * (float)(i8)(u8)(raw.y >> (8 * i));
    }
}

template <typename P>
DEVICE void attn_decode_streams_core(const float* q, P k_cache, P v_cache, const i32* positions,
                                     float* out, float* part_ms, float* part_acc, u32 n_head,
                                     u32 n_head_kv, u32 d, u32 slots, u32 window, float scale,
                                     float softcap, u32 heads_per_block, u32 n_split,
                                     u32 keys_per_split, KV_PAGES_PARAMS) {
    // Each stream's running max and sum per head, then its weighted V sums:
    // acc_sh[(stream * heads + g) * d + dimension] (ATTN_DS_THREADS * 8 values per head).
    __shared__ float ml_sh[ATTN_DS_MAX_STREAMS][ATTN_DEC_HEADS][2];
    __shared__ float acc_sh[ATTN_DEC_HEADS * ATTN_DS_THREADS * 8];

    const u32 tid = threadIdx.x;
    const u32 lpr = d / 8;                       // threads per row
    const u32 c = tid % lpr;                     // this thread's 8 dimensions: c * 8 ..
    const u32 r = tid / lpr;                     // this thread's stream
    const u32 n_streams = ATTN_DS_THREADS / lpr;

    const u32 t = blockIdx.x;
    const u32 split = blockIdx.z;
    const u32 group = n_head / n_head_kv;
    const u32 n_sub = (group + heads_per_block - 1) / heads_per_block;
    const u32 kvh = blockIdx.y / n_sub;
    const u32 h0 = kvh * group + (blockIdx.y % n_sub) * heads_per_block;
    const u32 group_end = kvh * group + group;
    const u32 nh = heads_per_block < group_end - h0 ? heads_per_block : group_end - h0;

    const i64 pos = (i64)positions[t];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t);
    i64 first = 0;
    if (window > 0 && pos - (i64)window + 1 > 0) first = pos - (i64)window + 1;
    const i64 n_keys = pos - first + 1;
    // The current keys spread over all splits (see attn_decode_core), at least one per stream.
    i64 per_split = (i64)keys_per_split;
    if (n_split > 1) {
        i64 even = (n_keys + (i64)n_split - 1) / (i64)n_split;
        if (even < (i64)n_streams) even = (i64)n_streams;
        if (even < per_split) per_split = even;
    }
    const i64 k_begin = (i64)split * per_split;
    i64 k_end = k_begin + per_split;
    if (k_end > n_keys) k_end = n_keys;
    const u64 row_q = (u64)t * n_head + h0;
    if (k_begin >= k_end) {
        if (n_split > 1) {
            if (tid < nh) {
                float* ms = part_ms + ((row_q + tid) * n_split + split) * 2;
                ms[0] = attn_neg_inf();
                ms[1] = 0.0f;
            }
        } else {
            for (u32 i = tid; i < nh * d; i += ATTN_DS_THREADS) out[row_q * d + i] = 0.0f;
        }
        return;
    }

    float qv[ATTN_DEC_HEADS][8];
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            qv[g][i] = g < nh ? q[(row_q + g) * d + (u64)c * 8 + i] * scale : 0.0f;
        }
    }
    float m_run[ATTN_DEC_HEADS], l_run[ATTN_DEC_HEADS], acc[ATTN_DEC_HEADS][8];
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
        m_run[g] = attn_neg_inf();
        l_run[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
    }
    const u64 row = (u64)n_head_kv * d;
    const P k_head = k_cache + ((u64)kvh * d + (u64)c * 8);
    const P v_head = v_cache + ((u64)kvh * d + (u64)c * 8);
    // The block's keys of one step: stream r takes keys kb + j * n_streams + r. Every stream
    // runs the same steps, so the rows' shuffles always find their lanes.
    // Key offsets in 32 bits from here: positions are i32, so first + k_end fits.
    const i32 kr_end = (i32)k_end;
    const u32 slot0 = (u32)first + r;
    const i32 step = (i32)(n_streams * ATTN_DS_KEYS);
    for (i32 kb = (i32)k_begin; kb < kr_end; kb += step) {
        // All of the step's rows in flight before any is used; keys past the split read as
        // zeros, never as whatever the cache holds there (a NaN would survive a zero weight).
        uint4 k_raw[ATTN_DS_KEYS], v_raw[ATTN_DS_KEYS];
#pragma unroll
        for (int j = 0; j < ATTN_DS_KEYS; ++j) {
            const i32 key = kb + j * (i32)n_streams + (i32)r;
            k_raw[j] = make_uint4(0, 0, 0, 0);
            v_raw[j] = make_uint4(0, 0, 0, 0);
            if (key < kr_end) {
                const u64 slot = kv_row(pages, (slot0 + (u32)(kb + j * (i32)n_streams)) % slots);
                k_raw[j] = kv8_load(k_head, slot * row);
                v_raw[j] = kv8_load(v_head, slot * row);
            }
        }
        float s[ATTN_DS_KEYS][ATTN_DEC_HEADS];
#pragma unroll
        for (int j = 0; j < ATTN_DS_KEYS; ++j) {
            float kf[8];
            kv8_to_f32<P>(k_raw[j], kf);
#pragma unroll
            for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) sum += qv[g][i] * kf[i];
                s[j][g] = sum;
            }
        }
        // The row's partial scores meet across its lanes (every lane gets the sums).
        for (u32 m = lpr / 2; m > 0; m >>= 1) {
#pragma unroll
            for (int j = 0; j < ATTN_DS_KEYS; ++j) {
#pragma unroll
                for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) s[j][g] += warp_shfl_xor(s[j][g], (int)m);
            }
        }
        // One online-softmax step per head for the step's keys; a key past the split weighs 0.
#pragma unroll
        for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
            float m_new = m_run[g];
#pragma unroll
            for (int j = 0; j < ATTN_DS_KEYS; ++j) {
                const bool valid = kb + j * (i32)n_streams + (i32)r < kr_end;
                s[j][g] = valid ? softcap_logit(s[j][g], softcap) : attn_neg_inf();
                m_new = fmaxf(m_new, s[j][g]);
            }
            // A stream whose keys so far all lie past the split keeps m = -inf, and its
            // weights stay 0 (never exp(-inf + inf)).
            const float alpha = m_run[g] > attn_neg_inf() ? expf(m_run[g] - m_new) : 0.0f;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_DS_KEYS; ++j) {
                s[j][g] = s[j][g] > attn_neg_inf() ? expf(s[j][g] - m_new) : 0.0f;
                sum += s[j][g];
            }
            l_run[g] = l_run[g] * alpha + sum;
            m_run[g] = m_new;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < ATTN_DS_KEYS; ++j) {
            float vf[8];
            kv8_to_f32<P>(v_raw[j], vf);
#pragma unroll
            for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += s[j][g] * vf[i];
            }
        }
    }

    // The streams meet once: each leaves its max, sum and weighted V per head.
#pragma unroll
    for (u32 g = 0; g < ATTN_DEC_HEADS; ++g) {
        if (g < nh) {
#pragma unroll
            for (int i = 0; i < 8; ++i) acc_sh[(r * ATTN_DEC_HEADS + g) * d + c * 8 + i] = acc[g][i];
            if (c == 0) {
                ml_sh[r][g][0] = m_run[g];
                ml_sh[r][g][1] = l_run[g];
            }
        }
    }
    __syncthreads();
    for (u32 i = tid; i < nh * d; i += ATTN_DS_THREADS) {
        const u32 g = i / d;
        const u32 dd = i % d;
        float mx = attn_neg_inf();
        for (u32 rr = 0; rr < n_streams; ++rr) mx = fmaxf(mx, ml_sh[rr][g][0]);
        float a = 0.0f, ls = 0.0f;
        for (u32 rr = 0; rr < n_streams; ++rr) {
            const float mr = ml_sh[rr][g][0];
            if (mr > attn_neg_inf()) {
                const float f = expf(mr - mx);
                a += acc_sh[(rr * ATTN_DEC_HEADS + g) * d + dd] * f;
                ls += ml_sh[rr][g][1] * f;
            }
        }
        if (n_split > 1) {
            part_acc[((row_q + g) * n_split + split) * d + dd] = a;
            if (dd == 0) {
                float* ms = part_ms + ((row_q + g) * n_split + split) * 2;
                ms[0] = mx;
                ms[1] = ls;
            }
        } else {
            out[(row_q + g) * d + dd] = ls > 0.0f ? a / ls : 0.0f;
        }
    }
}

#define ATTN_DECODE_STREAMS_ENTRY(name, T, P)                                                   \
    KERNEL void LAUNCH_BOUNDS_RESIDENT(ATTN_DS_THREADS, ATTN_DS_RESIDENT)                       \
    name(const float* q, const T* k_cache, const T* v_cache, const i32* positions, float* out,  \
         float* part_ms, float* part_acc, u32 n_head, u32 n_head_kv, u32 d, u32 slots,          \
         u32 window, float scale, float softcap, u32 heads_per_block, u32 n_split,              \
         u32 keys_per_split, KV_PAGES_PARAMS) {                                                 \
        KERNEL_PROLOGUE();                                                                      \
        attn_decode_streams_core<P>(q, kv_ptr(k_cache), kv_ptr(v_cache), positions, out,        \
                                    part_ms, part_acc, n_head, n_head_kv, d, slots, window,     \
                                    scale, softcap, heads_per_block, n_split, keys_per_split,   \
                                    KV_PAGES_ARGS);                                             \
    }

// Entry points attn_decode_streams_f16 and attn_decode_streams_q8_0.
ATTN_DECODE_STREAMS_ENTRY(attn_decode_streams_f16, u16, const u16*)
ATTN_DECODE_STREAMS_ENTRY(attn_decode_streams_q8_0, u8, KvQ8)

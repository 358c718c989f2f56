// Causal prefill attention on the matrix cores (mma.h), flash style: f16 or q8_0 K/V caches
// (q8_0 rows are dequantized to f16 as they are copied into the tiles), grouped KV
// heads (GQA), an optional sliding window, ring slots and paged caches, as attention.hip's
// prefill kernels (the same shapes, arguments and visibility rule).
//
// A block takes FA_BQ consecutive query tokens of one head (grid x: query tiles, grid y: heads)
// and streams the keys its tile can see in tiles of FA_BKV keys. Per key tile:
//   1. the K tile is copied from the cache into shared memory (rows of D halves, as stored);
//   2. warp w computes the scores of its 16 queries against the tile, S = Q K^T, with the
//      queries pre-scaled and rounded to f16 once at the start, and leaves them in shared memory;
//   3. the softmax runs on FA_TPR threads per query row (its running max and sum in their
//      registers): probabilities P, rounded to f16, and the row's rescale factor go to shared
//      memory, while the V tile is copied in transposed (Vt[d][key]) over the K tile;
//   4. warp w rescales its output rows and adds P V, its 16 queries by all D dimensions held in
//      registers as D / 16 accumulator tiles.
// The per-row factors go through shared memory because which lane holds which row of an
// accumulator tile differs between mma.h's variants (mma_m names it).
//
// Numerics: scores and the output accumulate in f32; queries and probabilities are rounded to
// f16 (keys and values already are, or are rounded to it from q8_0), so results differ from
// the f32 kernels by about 1e-3 of the output's magnitude.
//
// The launch's tokens are one sequence's, at ascending positions, as for attn_prefill_*: the
// tile reads keys from its first query's first visible position to its last query's position,
// through its first token's block table.
//
// Entry points: attn_prefill_mma_d64, attn_prefill_mma_d128, attn_prefill_mma_d256 (f16) and
// attn_prefill_mma_q8_0_d64, _d128, _d256 (q8_0), and the same six as attn_prefill_mma_regs_*
// (the second kernel below), for head sizes dk = dv = D; blocks of FA_BQ / 16 warps (4 for
// D <= 128, 2 for D = 256 so the tiles fit the 48 KiB of static shared memory every device
// gives).
#include "portability.h"
#include "kv_pages.h"
#include "kv_q8.h"
#include "mma.h"

#define FA_BKV 32
#define FA_LDP (FA_BKV + 8)  // row stride (halves) of P and of Vt
#define FA_LDS (FA_BKV + 1)  // row stride (floats) of S
#define FA_TPR (WARP_SIZE / 16)  // threads per query row in the softmax: a warp holds 16 rows

DEVICE float fa_neg_inf() { return __int_as_float((int)0xff800000u); }

// Eight values of a cache row from value `off` (a multiple of 8) as eight halves, 16 bytes for
// the tiles: an f16 row as stored (one 16-byte load), a q8_0 row dequantized and rounded to f16
// (its 8 values lie in one block, as rows and heads start on blocks; 2-byte loads, as a block
// is only 2-byte aligned).
DEVICE uint4 fa_row8(const u16* row, u64 off) { return *(const uint4*)(row + off); }
DEVICE uint4 fa_row8(KvQ8 row, u64 off) {
    const u64 v = row.off + off;
    const u8* b = kv_q8_block(row, v);
    const float d = kv_q8_scale(b);
    const u16* qs = (const u16*)(b + 2 + v % KV_Q8_BLOCK);
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const u16 x = qs[k];
        w[k] = pack_f16x2(d * (float)(i8)(u8)(x & 0xffu), d * (float)(i8)(u8)(x >> 8));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// P: the caches as `const u16*` (f16) or KvQ8 (q8_0), with fa_row8 reading them.
template <typename P, int D, int BQ>
DEVICE void attn_prefill_mma(const float* __restrict__ q, P k_cache, P v_cache,
                             const i32* __restrict__ positions,
                             float* __restrict__ out, u32 n_tokens, u32 n_head, u32 n_head_kv,
                             u32 slots, u32 window, float scale, float softcap, KV_PAGES_PARAMS) {
    constexpr u32 LDQ = D + 8;  // row stride (halves) of Q and K
    constexpr u32 WARPS = BQ / 16;
    constexpr u32 KV_HALVES = (FA_BKV * LDQ > D * FA_LDP) ? FA_BKV * LDQ : D * FA_LDP;
    __shared__ u16 q_sh[BQ * LDQ] __attribute__((aligned(16)));
    // The K tile, then the transposed V tile over it.
    __shared__ u16 kv_sh[KV_HALVES] __attribute__((aligned(16)));
    __shared__ float s_sh[BQ * FA_LDS];
    __shared__ u16 p_sh[BQ * FA_LDP] __attribute__((aligned(16)));
    __shared__ float row_sh[BQ];  // each row's rescale factor, then its sum

    const u32 tid = threadIdx.x;
    const u32 n_threads = WARPS * WARP_SIZE;
    const u32 warp = tid / WARP_SIZE;
    const u32 t0 = blockIdx.x * BQ;
    const u32 h = blockIdx.y;
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 n_rows = n_tokens - t0 < BQ ? n_tokens - t0 : BQ;

    // Queries, scaled and rounded to f16; rows past the launch are zeros.
    for (u32 i = tid; i < BQ * (D / 8); i += n_threads) {
        const u32 r = i / (D / 8), d0 = (i % (D / 8)) * 8;
        float v[8];
        const float* src = q + ((u64)(t0 + r) * n_head + h) * D + d0;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = r < n_rows ? src[k] * scale : 0.0f;
        store8_f16_aligned(q_sh + r * LDQ + d0, v);
    }

    // This thread's softmax row: its query's position and first visible position.
    const u32 sr = tid / FA_TPR, sc = (tid % FA_TPR) * (FA_BKV / FA_TPR);
    const bool row_valid = sr < n_rows;
    const i64 pos = row_valid ? (i64)positions[t0 + sr] : -1;
    const i64 first = (window > 0 && pos - (i64)window + 1 > 0) ? pos - (i64)window + 1 : 0;
    float m_run = fa_neg_inf(), l_run = 0.0f;

    const i64 pos_lo = (i64)positions[t0];
    const i64 k_lo = (window > 0 && pos_lo - (i64)window + 1 > 0) ? pos_lo - (i64)window + 1 : 0;
    const i64 k_hi = (i64)positions[t0 + n_rows - 1];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t0);
    const u64 kv_row_len = (u64)n_head_kv * D;
    const P k_head = k_cache + (u64)kvh * D;
    const P v_head = v_cache + (u64)kvh * D;

    MmaAcc o[D / 16];
#pragma unroll
    for (int i = 0; i < D / 16; ++i) mma_zero(o[i]);

    for (i64 kt = k_lo; kt <= k_hi; kt += FA_BKV) {
        // 1. The K tile; keys past the last query's position are zeros (and masked below).
        for (u32 i = tid; i < FA_BKV * (D / 8); i += n_threads) {
            const u32 j = i / (D / 8), d0 = (i % (D / 8)) * 8;
            const i64 kp = kt + j;
            u16* dst = kv_sh + j * LDQ + d0;
            if (kp <= k_hi) {
                *(uint4*)dst = fa_row8(k_head, kv_row(pages, (u32)kp % slots) * kv_row_len + d0);
            } else {
                *(uint4*)dst = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        __syncthreads();
        // 2. Scores of warp w's 16 queries against the tile's keys.
#pragma unroll
        for (u32 nt = 0; nt < FA_BKV / 16; ++nt) {
            MmaAcc s;
            mma_zero(s);
#pragma unroll
            for (u32 kk = 0; kk < D; kk += 16) {
                mma_16x16x16(s, q_sh + warp * 16 * LDQ + kk, LDQ, kv_sh + nt * 16 * LDQ + kk, LDQ);
            }
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) {
                s_sh[(warp * 16 + mma_m(i)) * FA_LDS + nt * 16 + mma_n(i)] = s.v[i];
            }
        }
        __syncthreads();
        // 3a. The V tile, transposed, over the K tile (every score is taken).
        for (u32 i = tid; i < FA_BKV * (D / 8); i += n_threads) {
            const u32 j = i / (D / 8), d0 = (i % (D / 8)) * 8;
            const i64 kp = kt + j;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (kp <= k_hi) {
                v = fa_row8(v_head, kv_row(pages, (u32)kp % slots) * kv_row_len + d0);
            }
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                kv_sh[(d0 + 2 * k) * FA_LDP + j] = (u16)(w[k] & 0xffffu);
                kv_sh[(d0 + 2 * k + 1) * FA_LDP + j] = (u16)(w[k] >> 16);
            }
        }
        // 3b. Online softmax of row sr over the tile, FA_TPR threads per row (adjacent lanes).
        {
            float s[FA_BKV / FA_TPR];
            float m_tile = fa_neg_inf();
#pragma unroll
            for (u32 c = 0; c < FA_BKV / FA_TPR; ++c) {
                const i64 kp = kt + sc + c;
                const bool visible = row_valid && kp <= pos && kp >= first;
                s[c] = visible ? softcap_logit(s_sh[sr * FA_LDS + sc + c], softcap) : fa_neg_inf();
                m_tile = fmaxf(m_tile, s[c]);
            }
#pragma unroll
            for (int m = FA_TPR / 2; m > 0; m >>= 1) m_tile = fmaxf(m_tile, warp_shfl_xor(m_tile, m));
            const float m_new = fmaxf(m_run, m_tile);
            const float alpha = m_run > fa_neg_inf() ? expf(m_run - m_new) : 0.0f;
            float sum = 0.0f;
#pragma unroll
            for (u32 c = 0; c < FA_BKV / FA_TPR; ++c) {
                const float p = s[c] > fa_neg_inf() ? expf(s[c] - m_new) : 0.0f;
                sum += p;
                p_sh[sr * FA_LDP + sc + c] = f32_to_f16_rn(p);
            }
#pragma unroll
            for (int m = FA_TPR / 2; m > 0; m >>= 1) sum += warp_shfl_xor(sum, m);
            l_run = l_run * alpha + sum;
            m_run = m_new;
            if (tid % FA_TPR == 0) row_sh[sr] = alpha;
        }
        __syncthreads();
        // 4. Rescale warp w's output rows, then add P V.
#pragma unroll
        for (u32 dt = 0; dt < D / 16; ++dt) {
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) o[dt].v[i] *= row_sh[warp * 16 + mma_m(i)];
#pragma unroll
            for (u32 kk = 0; kk < FA_BKV; kk += 16) {
                mma_16x16x16(o[dt], p_sh + warp * 16 * FA_LDP + kk, FA_LDP,
                             kv_sh + dt * 16 * FA_LDP + kk, FA_LDP);
            }
        }
        __syncthreads();  // the next tile rewrites K/V, the scores and the factors
    }

    if (tid % FA_TPR == 0) row_sh[sr] = l_run;
    __syncthreads();
#pragma unroll
    for (u32 dt = 0; dt < D / 16; ++dt) {
#pragma unroll
        for (int i = 0; i < MMA_ACC; ++i) {
            const u32 r = warp * 16 + mma_m(i);
            if (r < n_rows) {
                const float l = row_sh[r];
                out[((u64)(t0 + r) * n_head + h) * D + dt * 16 + mma_n(i)] =
                    l > 0.0f ? o[dt].v[i] / l : 0.0f;
            }
        }
    }
}

#define ATTN_PREFILL_MMA_ENTRY(D, BQ)                                                        \
    KERNEL void LAUNCH_BOUNDS(BQ / 16 * WARP_SIZE)                                      \
    attn_prefill_mma_d##D(const float* q, const u16* k_cache, const u16* v_cache, \
                                      const i32* positions, float* out, u32 n_tokens,        \
                                      u32 n_head, u32 n_head_kv, u32 slots, u32 window,      \
                                      float scale, float softcap, KV_PAGES_PARAMS) {         \
        KERNEL_PROLOGUE();                                                                   \
        attn_prefill_mma<const u16*, D, BQ>(q, k_cache, v_cache, positions, out, n_tokens,   \
                                            n_head, n_head_kv, slots, window, scale, softcap, \
                                            KV_PAGES_ARGS);                                  \
    }
ATTN_PREFILL_MMA_ENTRY(64, 64)
ATTN_PREFILL_MMA_ENTRY(128, 64)
ATTN_PREFILL_MMA_ENTRY(256, 32)

// The same over q8_0 caches: attn_prefill_mma_q8_0_d64, _d128 and _d256.
#define ATTN_PREFILL_MMA_Q8_ENTRY(D, BQ)                                                     \
    KERNEL void LAUNCH_BOUNDS(BQ / 16 * WARP_SIZE)                                      \
    attn_prefill_mma_q8_0_d##D(const float* q, const u8* k_cache,               \
                                           const u8* v_cache, const i32* positions,         \
                                           float* out, u32 n_tokens, u32 n_head,            \
                                           u32 n_head_kv, u32 slots, u32 window,            \
                                           float scale, float softcap, KV_PAGES_PARAMS) {   \
        KERNEL_PROLOGUE();                                                                   \
        attn_prefill_mma<KvQ8, D, BQ>(q, kv_q8_at(k_cache), kv_q8_at(v_cache), positions,    \
                                      out, n_tokens, n_head, n_head_kv, slots, window,       \
                                      scale, softcap, KV_PAGES_ARGS);                        \
    }
ATTN_PREFILL_MMA_Q8_ENTRY(64, 64)
ATTN_PREFILL_MMA_Q8_ENTRY(128, 64)
ATTN_PREFILL_MMA_Q8_ENTRY(256, 32)

// ---- The same attention with the scores and probabilities in registers
// (attn_prefill_mma_regs_*; HIPDECODE_GPU_ATTN_PREFILL=flash-regs, not yet run on a GPU, so
// not the default). Same arguments, grid and blocks as the kernels above.
//
// A block takes BQ consecutive query tokens of one head (grid x: query tiles, the last tile
// first so the longest blocks start first; grid y: heads), 16 per warp, and streams the keys
// its tile can see in tiles of BKV keys. K and V tiles have buffers of their own, and each is
// copied while the block computes on the other (copy_async16: in flight without registers on
// NVIDIA; a plain copy elsewhere, and for q8_0 rows, which are dequantized on the way). Per key
// tile, warp w:
//   1. computes the scores of its 16 queries, S = Q K^T, into accumulator tiles (the queries
//      pre-scaled and rounded to f16 once, held as A operands for D <= 128);
//   2. runs the online softmax on those registers: each lane's rows' max over the lanes that
//      share them (mma_row_max), the probabilities P, rounded to f16 as the A operands of the
//      next product (mma_a_from_acc), and its share of each row's sum, reduced once at the end;
//   3. rescales its output rows and adds P V, reading V as stored ([key][d], mma_16x16x16_a_kn).
// Three barriers a tile: K is in, every warp is done with K (the next K tile may be copied),
// V is in (and after the product, every warp is done with V).
//
// Numerics as above: queries and probabilities rounded to f16, sums in f32; the probabilities
// use exp2 (fa_exp) and the key tiles are longer, so results differ from the kernels above by
// rounding only.

// e^x for x <= 0 (a score less its row's max) as 2^(x log2 e): one hardware instruction where
// expf takes several. The product's rounding (2^-24 of x) is far below the f16 rounding the
// probabilities then take.
DEVICE float fa_exp(float x) { return exp2f(x * 1.44269504088896341f); }

// Keys per tile, and whether the queries stay in registers (as A operands). D = 256 keeps its
// queries in shared memory (sixteen operands would take 64 registers beside the output's 128)
// and takes 16 keys a tile to fit beside them. So does the SIMT variant, whose operands are only
// places in shared memory and whose lanes hold 256 / WARP_SIZE rows each (it is never picked
// for prefill on its own: PrefillKernel::Auto takes flash on native matrix cores only).
// (fa_row8 above reads q8_0 rows; an f16 row is copied as stored.)
template <int D>
struct FaTiles {
    static constexpr bool Q_REGS = D <= 128 && MMA_A_IN_REGS;
    static constexpr u32 BKV = Q_REGS ? 64 : 16;
};

// Eight values of a cache row from value `off` into a tile: an f16 row copied as stored
// (copy_async16), a q8_0 row dequantized by this thread.
DEVICE void fa_copy8(u16* dst, const u16* row, u64 off) { copy_async16(dst, row + off); }
DEVICE void fa_copy8(u16* dst, KvQ8 row, u64 off) { *(uint4*)dst = fa_row8(row, off); }

// P: the caches as `const u16*` (f16) or KvQ8 (q8_0), with fa_copy8 reading them.
template <typename P, int D, int BQ>
DEVICE void attn_prefill_mma_regs(const float* __restrict__ q, P k_cache, P v_cache,
                             const i32* __restrict__ positions,
                             float* __restrict__ out, u32 n_tokens, u32 n_head, u32 n_head_kv,
                             u32 slots, u32 window, float scale, float softcap, KV_PAGES_PARAMS) {
    constexpr bool Q_REGS = FaTiles<D>::Q_REGS;
    constexpr u32 BKV = FaTiles<D>::BKV;
    constexpr u32 LD = D + 8;        // row stride (halves) of the Q, K and V tiles
    constexpr u32 LDP = BKV + 8;     // row stride (halves) of the probabilities' scratch
    constexpr u32 WARPS = BQ / 16;
    constexpr u32 NT = BKV / 16;     // 16-key blocks of a tile
    constexpr u32 DT = D / 16;       // 16-wide blocks of a head
    static_assert(!Q_REGS || BQ <= BKV, "the queries are staged in the V tile");
    __shared__ u16 k_sh[BKV * LD] __attribute__((aligned(16)));
    __shared__ u16 v_sh[BKV * LD] __attribute__((aligned(16)));
    __shared__ u16 q_sh[Q_REGS ? 8 : BQ * LD] __attribute__((aligned(16)));
    __shared__ u16 p_sh[MMA_A_FROM_ACC_SCRATCH ? BQ * LDP : 8] __attribute__((aligned(16)));

    const u32 tid = threadIdx.x;
    const u32 n_threads = WARPS * WARP_SIZE;
    const u32 warp = tid / WARP_SIZE;
    const u32 t0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const u32 h = blockIdx.y;
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 n_rows = n_tokens - t0 < BQ ? n_tokens - t0 : BQ;

    // Queries, scaled and rounded to f16; rows past the launch are zeros. Held in registers,
    // they are staged in the V tile, which is not copied before the barrier below.
    u16* q_tile = Q_REGS ? v_sh : q_sh;
    for (u32 i = tid; i < BQ * (D / 8); i += n_threads) {
        const u32 r = i / (D / 8), d0 = (i % (D / 8)) * 8;
        float v[8];
        const float* src = q + ((u64)(t0 + r) * n_head + h) * D + d0;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = r < n_rows ? src[k] * scale : 0.0f;
        store8_f16_aligned(q_tile + r * LD + d0, v);
    }
    __syncthreads();
    const u16* q_warp = q_tile + warp * 16 * LD;
    MmaA qa[Q_REGS ? DT : 1];
    if (Q_REGS) {
#pragma unroll
        for (u32 dt = 0; dt < (Q_REGS ? DT : 0); ++dt) mma_load_a(qa[dt], q_warp + dt * 16, LD);
        __syncthreads();
    }

    // This lane's rows of the warp's 16: their positions and first visible positions (rows
    // past the launch see nothing), running max and this lane's share of the running sum.
    i32 pos[MMA_ROWS], first[MMA_ROWS];
    float m_run[MMA_ROWS], l_run[MMA_ROWS];
#pragma unroll
    for (int r = 0; r < MMA_ROWS; ++r) {
        const u32 row = warp * 16 + mma_row(r);
        pos[r] = row < n_rows ? positions[t0 + row] : -1;
        const i64 w0 = (i64)pos[r] - (i64)window + 1;
        first[r] = (window > 0 && w0 > 0) ? (i32)w0 : 0;
        m_run[r] = fa_neg_inf();
        l_run[r] = 0.0f;
    }

    const i64 pos_lo = (i64)positions[t0];
    const i64 k_lo = (window > 0 && pos_lo - (i64)window + 1 > 0) ? pos_lo - (i64)window + 1 : 0;
    const i64 k_hi = (i64)positions[t0 + n_rows - 1];
    const KvPages pages = kv_pages(KV_PAGES_ARGS, t0);
    const u64 kv_row_len = (u64)n_head_kv * D;
    const P k_head = k_cache + (u64)kvh * D;
    const P v_head = v_cache + (u64)kvh * D;
    // Keys kt .. kt + BKV - 1 of one cache into a tile; keys past the last query's position are
    // zeros (masked below, and finite for P V).
    auto copy_tile = [&](u16* tile, P head, i64 kt) {
        for (u32 i = tid; i < BKV * (D / 8); i += n_threads) {
            const u32 j = i / (D / 8), d0 = (i % (D / 8)) * 8;
            const i64 kp = kt + j;
            u16* dst = tile + j * LD + d0;
            if (kp <= k_hi) {
                fa_copy8(dst, head, kv_row(pages, (u32)kp % slots) * kv_row_len + d0);
            } else {
                *(uint4*)dst = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };

    MmaAcc o[DT];
#pragma unroll
    for (u32 dt = 0; dt < DT; ++dt) mma_zero(o[dt]);

    copy_tile(k_sh, k_head, k_lo);
    copy_async_commit();
    for (i64 kt = k_lo; kt <= k_hi; kt += BKV) {
        copy_tile(v_sh, v_head, kt);
        copy_async_commit();
        copy_async_wait<1>();  // this K tile (its V tile may still be in flight)
        __syncthreads();
        // 1. Scores of the warp's 16 queries against the tile's keys.
        MmaAcc s[NT];
#pragma unroll
        for (u32 nt = 0; nt < NT; ++nt) {
            mma_zero(s[nt]);
#pragma unroll
            for (u32 dt = 0; dt < DT; ++dt) {
                MmaA a;
                if (Q_REGS) {
                    a = qa[Q_REGS ? dt : 0];
                } else {
                    mma_load_a(a, q_warp + dt * 16, LD);
                }
                mma_16x16x16_a(s[nt], a, k_sh + nt * 16 * LD + dt * 16, LD);
            }
        }
        __syncthreads();  // every warp is done with this K tile
        if (kt + BKV <= k_hi) copy_tile(k_sh, k_head, kt + BKV);
        copy_async_commit();

        // 2. Online softmax of the lane's rows over the tile.
        float m_new[MMA_ROWS], alpha[MMA_ROWS], l_tile[MMA_ROWS];
#pragma unroll
        for (int r = 0; r < MMA_ROWS; ++r) m_new[r] = fa_neg_inf();
#pragma unroll
        for (u32 nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) {
                const int r = mma_row_of(i);
                const i64 kp = kt + nt * 16 + mma_n(i);
                const bool visible = kp <= (i64)pos[r] && kp >= (i64)first[r];
                const float x = visible ? softcap_logit(s[nt].v[i], softcap) : fa_neg_inf();
                s[nt].v[i] = x;
                m_new[r] = fmaxf(m_new[r], x);
            }
        }
#pragma unroll
        for (int r = 0; r < MMA_ROWS; ++r) {
            m_new[r] = fmaxf(m_run[r], mma_row_max(m_new[r]));
            alpha[r] = m_run[r] > fa_neg_inf() ? fa_exp(m_run[r] - m_new[r]) : 0.0f;
            m_run[r] = m_new[r];
            l_tile[r] = 0.0f;
        }
        MmaA pa[NT];
#pragma unroll
        for (u32 nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) {
                const int r = mma_row_of(i);
                const float x = s[nt].v[i];
                const float p = x > fa_neg_inf() ? fa_exp(x - m_new[r]) : 0.0f;
                s[nt].v[i] = p;
                l_tile[r] += p;
            }
            mma_a_from_acc(pa[nt], s[nt], p_sh + warp * 16 * LDP + nt * 16, LDP);
        }
#pragma unroll
        for (int r = 0; r < MMA_ROWS; ++r) l_run[r] = l_run[r] * alpha[r] + l_tile[r];

        // 3. Rescale the output rows, then add P V once the V tile is in.
#pragma unroll
        for (u32 dt = 0; dt < DT; ++dt) {
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) o[dt].v[i] *= alpha[mma_row_of(i)];
        }
        copy_async_wait<1>();  // this V tile (the next K tile may still be in flight)
        __syncthreads();
#pragma unroll
        for (u32 dt = 0; dt < DT; ++dt) {
#pragma unroll
            for (u32 nt = 0; nt < NT; ++nt) {
                mma_16x16x16_a_kn(o[dt], pa[nt], v_sh + nt * 16 * LD + dt * 16, LD);
            }
        }
        __syncthreads();  // every warp is done with this V tile (and the probabilities' scratch)
    }

#pragma unroll
    for (int r = 0; r < MMA_ROWS; ++r) l_run[r] = mma_row_sum(l_run[r]);
#pragma unroll
    for (u32 dt = 0; dt < DT; ++dt) {
#pragma unroll
        for (int i = 0; i < MMA_ACC; ++i) {
            const u32 row = warp * 16 + mma_m(i);
            if (row < n_rows) {
                const float l = l_run[mma_row_of(i)];
                out[((u64)(t0 + row) * n_head + h) * D + dt * 16 + mma_n(i)] =
                    l > 0.0f ? o[dt].v[i] / l : 0.0f;
            }
        }
    }
}

#define ATTN_PREFILL_MMA_REGS_ENTRY(D, BQ)                                                        \
    KERNEL void LAUNCH_BOUNDS(BQ / 16 * WARP_SIZE)                                      \
    attn_prefill_mma_regs_d##D(const float* q, const u16* k_cache, const u16* v_cache, \
                                      const i32* positions, float* out, u32 n_tokens,        \
                                      u32 n_head, u32 n_head_kv, u32 slots, u32 window,      \
                                      float scale, float softcap, KV_PAGES_PARAMS) {         \
        KERNEL_PROLOGUE();                                                                   \
        attn_prefill_mma_regs<const u16*, D, BQ>(q, k_cache, v_cache, positions, out, n_tokens,   \
                                            n_head, n_head_kv, slots, window, scale, softcap, \
                                            KV_PAGES_ARGS);                                  \
    }
ATTN_PREFILL_MMA_REGS_ENTRY(64, 64)
ATTN_PREFILL_MMA_REGS_ENTRY(128, 64)
ATTN_PREFILL_MMA_REGS_ENTRY(256, 32)

// The same over q8_0 caches: attn_prefill_mma_regs_q8_0_d64, _d128 and _d256.
#define ATTN_PREFILL_MMA_REGS_Q8_ENTRY(D, BQ)                                                     \
    KERNEL void LAUNCH_BOUNDS(BQ / 16 * WARP_SIZE)                                      \
    attn_prefill_mma_regs_q8_0_d##D(const float* q, const u8* k_cache,               \
                                           const u8* v_cache, const i32* positions,         \
                                           float* out, u32 n_tokens, u32 n_head,            \
                                           u32 n_head_kv, u32 slots, u32 window,            \
                                           float scale, float softcap, KV_PAGES_PARAMS) {   \
        KERNEL_PROLOGUE();                                                                   \
        attn_prefill_mma_regs<KvQ8, D, BQ>(q, kv_q8_at(k_cache), kv_q8_at(v_cache), positions,    \
                                      out, n_tokens, n_head, n_head_kv, slots, window,       \
                                      scale, softcap, KV_PAGES_ARGS);                        \
    }
ATTN_PREFILL_MMA_REGS_Q8_ENTRY(64, 64)
ATTN_PREFILL_MMA_REGS_Q8_ENTRY(128, 64)
ATTN_PREFILL_MMA_REGS_Q8_ENTRY(256, 32)

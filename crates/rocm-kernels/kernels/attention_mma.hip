// Causal prefill attention on the matrix cores (mma.h), flash style: f16 or q8_0 K/V caches
// (q8_0 rows are dequantized to f16 as they are copied into the tiles), grouped KV heads (GQA),
// an optional sliding window, ring slots and paged caches, as attention.hip's prefill kernels
// (the same shapes, arguments and visibility rule).
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
// Numerics: scores and the output accumulate in f32; queries and probabilities are rounded to
// f16 (keys and values already are, or are rounded to it from q8_0), so results differ from
// the f32 kernels by about 1e-3 of the output's magnitude.
//
// The launch's tokens are one sequence's, at ascending positions, as for attn_prefill_*: the
// tile reads keys from its first query's first visible position to its last query's position,
// through its first token's block table.
//
// Entry points: attn_prefill_mma_d64, attn_prefill_mma_d128, attn_prefill_mma_d256 (f16) and
// attn_prefill_mma_q8_0_d64, _d128, _d256 (q8_0), for head sizes dk = dv = D; blocks of BQ / 16
// warps (BQ = 64 for D <= 128, 32 for D = 256), which the host's flash_kernel table repeats. The
// tiles fit the 48 KiB of static shared memory every device gives.
#include "portability.h"
#include "kv_pages.h"
#include "kv_q8.h"
#include "mma.h"

DEVICE float fa_neg_inf() { return __int_as_float((int)0xff800000u); }

// e^x for x <= 0 (a score less its row's max) as 2^(x log2 e): one hardware instruction where
// expf takes several. The product's rounding (2^-24 of x) is far below the f16 rounding the
// probabilities then take.
DEVICE float fa_exp(float x) { return exp2f(x * 1.44269504088896341f); }

// Eight values of a q8_0 cache row from value `off` (a multiple of 8), dequantized and rounded
// to f16, 16 bytes for the tiles (its 8 values lie in one block, as rows and heads start on
// blocks; 2-byte loads, as a block is only 2-byte aligned).
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

// Keys per tile, and whether the queries stay in registers (as A operands). D = 256 keeps its
// queries in shared memory (sixteen operands would take 64 registers beside the output's 128)
// and takes 16 keys a tile to fit beside them. So does the SIMT variant, whose operands are only
// places in shared memory and whose lanes hold 256 / WARP_SIZE rows each (it is never picked
// for prefill on its own: PrefillKernel::Auto takes flash on native matrix cores only).
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
DEVICE void attn_prefill_mma(const float* __restrict__ q, P k_cache, P v_cache,
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

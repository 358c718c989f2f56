// Products of quantized weights by 8-bit activations on the matrix cores' integer path (mma.h's
// mma_i8_16x16x32 and mma_i8_16x16x16), for batched decode steps of a few dozen token rows.
//
// out[t * rows + r] = sum_c W[r][c] * x[t][c], with x given as matvec_q8's quantize_q8 leaves it:
// per group of 32 values a scale xd and 32 signed bytes xq. Weights stay in their GGUF blocks.
// Per step of BK columns (MqStep) a block of MQ_WARPS warps unpacks MQ_BR weight rows into
// shared memory as signed bytes (a group of 32 values with its scales per item), with per row
// and group one MqScales entry:
//   an integer scale per 16 values (s_lo, s_hi; Q4_K's and Q5_K's 6-bit scales, Q6_K's 8-bit
//   ones), a float factor d (the block's d) and a float offset m (the minimum's weight,
//   dmin * m; minus m for Q4_1),
// so that W[r][c] = d * s * q - m for the group's bytes q. Beside them go the activations'
// bytes, and per token and group the scale xd with, for formats with an offset, the sum
// x_s = xd * sum(xq). Warp w owns weight rows 16 w .. 16 w + 15 and, for every 16-token tile,
// takes the exact i32 sum of q * xq over each 32 values (each 16 where the scale changes
// there) on the matrix cores, then adds d * xd * (scaled integer sum) - m * x_s to its f32
// accumulator once per group of 32. So the integer part is exact and only the per-group
// scaling rounds, as in the int8 matrix-vector kernels; each weight byte is read from memory
// once per BT tokens and nothing is written back but the result.
//
// The scale tables are one wide load per lane and group, padded so that the rows a fragment's
// lanes read fall on different banks: as separate tables of 32-bit words they were the
// kernel's largest share of shared-memory traffic, every load a four-way bank conflict
// (docs/benchmark_results/int8-mma-tiles-h100-2026-12-07.md).
//
// Tokens are the products' m, weight rows their n. Grid: (ceil(n_tokens / BT),
// ceil(rows / MQ_BR), splits); split z covers columns [z * k_split, (z + 1) * k_split) (k_split a
// multiple of BK) and writes dst + z * n_tokens * rows, added in order by matmul_mma_reduce
// (matmul_mma.hip), as matmul_mma's splits are. Rows, tokens and groups past the matrix are
// zeros. Block: MQ_WARPS * WARP_SIZE threads.
//
// Alignment: x's values 16-byte aligned (and cols a multiple of 32, so every row is); Q4_K and
// Q5_K weights 16-byte aligned (their 144- and 176-byte blocks then keep 16-byte quant runs);
// the other formats 2-byte aligned.
//
// Entry points, each per format of ops::matmul_q8_mma::FORMATS in its order (q4_0, q4_1, q8_0,
// q4_k, q5_k, q6_k): matmul_q8_mma_<fmt> (tiles of MQ_BT_LARGE tokens), matmul_q8_mma_grouped_<fmt>
// (mixtures of experts, below) and matmul_q8_mma_small_<fmt> (tiles of MQ_BT_SMALL tokens, for
// steps of up to that many).
#include "portability.h"
#include "quant.h"
#include "mma.h"

#define MQ_WARPS 4
#define MQ_BR (16 * MQ_WARPS)  // weight rows per block: 16 per warp
// Tokens per block (BT, a template parameter): 64 (four 16-token tiles), or 32 for steps of
// fewer tokens, whose smaller tiles leave room for more blocks on a multiprocessor. Columns per
// step (BK): 128, whose smaller tiles likewise fit more blocks, except for Q6_K, whose heavier
// unpacking measured faster over 256 (docs/benchmark_results/int8-mma-tiles-h100-2026-12-07.md).
#define MQ_BT_LARGE 64
#define MQ_BT_SMALL 32
template <int FMT> struct MqStep { enum { BK = FMT == FMT_Q6_K ? 256 : 128 }; };

// A weight row's scales for one group of 32: w = d * s * q - m, s = s_lo for values 0-15 and
// s_hi for 16-31.
struct __attribute__((aligned(16))) MqScales {
    float d, m;
    int s_lo, s_hi;
};

// q - 32 (or - 8) in every byte of a word of values below 64, without borrows between bytes.
DEVICE u32 bytes_minus(u32 q, u32 k) { return ((q | 0x80808080u) - k) ^ 0x80808080u; }

// One group of 32 weight values of a row, unpacked: 32 signed bytes (8 words) and the group's
// scales. `b` is the row's block holding column c (the group's first), g the group's place in
// the step. Every format below fills `q` and w_d; SCALE16 formats two integer scales (values
// 0-15, 16-31), INT_SCALE ones one, HAS_MIN ones w_m.
struct MqGroup {
    u32 q[8];
    int s_lo, s_hi;
    float d, m;
};

template <int FMT> struct MqUnpack;

// Q4_0: d, 16 bytes; value j the low nibble of byte j, value 16 + j its high one; w = d (q - 8).
template <> struct MqUnpack<FMT_Q4_0> {
    enum { SCALE16 = 0, INT_SCALE = 0, HAS_MIN = 0 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) {
        const u8* b = row + (u64)(c / 32) * 18;
        o.d = load_half(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 v = load_u32_from_u16(b + 2 + 4 * i);
            o.q[i] = bytes_minus(v & 0x0F0F0F0Fu, 0x08080808u);
            o.q[4 + i] = bytes_minus((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
    }
};

// Q4_1: d, m, 16 bytes as Q4_0's; w = d q + m.
template <> struct MqUnpack<FMT_Q4_1> {
    enum { SCALE16 = 0, INT_SCALE = 0, HAS_MIN = 1 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) {
        const u8* b = row + (u64)(c / 32) * 20;
        o.d = load_half(b);
        o.m = -load_half(b + 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 v = load_u32_from_u16(b + 4 + 4 * i);
            o.q[i] = v & 0x0F0F0F0Fu;
            o.q[4 + i] = (v >> 4) & 0x0F0F0F0Fu;
        }
    }
};

// Q8_0: d, 32 signed bytes; w = d q.
template <> struct MqUnpack<FMT_Q8_0> {
    enum { SCALE16 = 0, INT_SCALE = 0, HAS_MIN = 0 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) {
        const u8* b = row + (u64)(c / 32) * 34;
        o.d = load_half(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = load_u32_from_u16(b + 2 + 4 * i);
    }
};

// Q4_K / Q5_K: group g of a block is the low (even g) or high (odd g) nibbles of the 32 quant
// bytes 32 (g / 2) ..; Q5_K's fifth bit is bit g of qh[0..31]. w = (d sc) q - dmin m.
template <int FMT>
DEVICE void mq_k4_group(const u8* row, u32 c, MqGroup& o) {
    enum { BYTES = FMT == FMT_Q5_K ? 176 : 144, QS = FMT == FMT_Q5_K ? 48 : 16 };
    const u8* b = row + (u64)(c / QK_K) * BYTES;
    const int g = (int)(c % QK_K) / 32;
    // d, dmin and the 12 bytes of packed scales as four aligned words (blocks are 16-byte
    // aligned), the scales taken apart as k4_scale_min does: fewer, wider loads.
    const uint4 head = *(const uint4*)b;
    const u32 shift8 = 8 * (g & 3);
    const u32 lo = (head.y >> shift8) & 0xFF, mid = (head.z >> shift8) & 0xFF;
    int sc, mn;
    if (g < 4) {
        sc = (int)(lo & 0x3F);
        mn = (int)(mid & 0x3F);
    } else {
        const u32 hi = (head.w >> shift8) & 0xFF;
        sc = (int)((hi & 0x0F) | ((lo >> 6) << 4));
        mn = (int)((hi >> 4) | ((mid >> 6) << 4));
    }
    o.d = f16_to_f32((u16)(head.x & 0xFFFF));
    o.m = f16_to_f32((u16)(head.x >> 16)) * (float)mn;
    o.s_lo = sc;
    const int shift = 4 * (g & 1);
    const uint4* qs = (const uint4*)(b + QS + 32 * (g >> 1));
    const uint4 v0 = qs[0], v1 = qs[1];
    const u32 w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) o.q[i] = (w[i] >> shift) & 0x0F0F0F0Fu;
    if (FMT == FMT_Q5_K) {
        const uint4* qh = (const uint4*)(b + 16);
        const uint4 h0 = qh[0], h1 = qh[1];
        const u32 h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] |= ((h[i] >> g) & 0x01010101u) << 4;
    }
}

template <> struct MqUnpack<FMT_Q4_K> {
    enum { SCALE16 = 0, INT_SCALE = 1, HAS_MIN = 1 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) { mq_k4_group<FMT_Q4_K>(row, c, o); }
};

template <> struct MqUnpack<FMT_Q5_K> {
    enum { SCALE16 = 0, INT_SCALE = 1, HAS_MIN = 1 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) { mq_k4_group<FMT_Q5_K>(row, c, o); }
};

// Q6_K: group g (half h = g / 4, gg = g % 4) takes the low (gg < 2) or high nibbles of
// ql[64 h + 32 (gg % 2) ..] and bits 2 gg, 2 gg + 1 of qh[32 h ..]; scales per 16 values,
// signed; w = (d sc) (q - 32).
template <> struct MqUnpack<FMT_Q6_K> {
    enum { SCALE16 = 1, INT_SCALE = 1, HAS_MIN = 0 };
    static DEVICE void group(const u8* row, u32 c, MqGroup& o) {
        const u8* b = row + (u64)(c / QK_K) * 210;
        const int g = (int)(c % QK_K) / 32;
        const int h = g >> 2, gg = g & 3;
        const u8* ql = b + 64 * h + 32 * (gg & 1);
        const u8* qh = b + 128 + 32 * h;
        const int lshift = 4 * (gg >> 1), hshift = 2 * gg;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 lo = (load_u32_from_u16(ql + 4 * i) >> lshift) & 0x0F0F0F0Fu;
            const u32 hi = ((load_u32_from_u16(qh + 4 * i) >> hshift) & 0x03030303u) << 4;
            o.q[i] = bytes_minus(lo | hi, 0x20202020u);
        }
        o.d = load_half(b + 208);
        o.s_lo = (int)(i8)b[192 + 2 * g];
        o.s_hi = (int)(i8)b[193 + 2 * g];
    }
};

// The block's tile: tokens t0 .. t0 + MQ_BT - 1 of the n_tokens rows of xq / xd / dst, weight
// rows blockIdx.y * MQ_BR .., columns of split blockIdx.z.
template <int FMT, int BT>
DEVICE void matmul_q8_mma_impl(const u8* __restrict__ w, const i8* __restrict__ xq,
                               const float* __restrict__ xd, float* __restrict__ dst, u32 rows,
                               u32 cols, u32 n_tokens, u32 k_split, u32 t0) {
    typedef MqUnpack<FMT> U;
    enum {
        BK = MqStep<FMT>::BK,
        G = BK / 32,  // groups of 32 per step
        // Row stride of the byte tiles: 16 bytes of padding put the eight rows a warp's lanes
        // read at once on different banks and keep rows 16-byte aligned.
        LDS = BK + 16,
        // Entries per row of the scale tables: one per group, and one of padding.
        SCALE_LD = G + 1,
    };
    __shared__ i8 w_q[MQ_BR * LDS] __attribute__((aligned(16)));
    __shared__ i8 x_q[BT * LDS] __attribute__((aligned(16)));
    // A row's or token's scales for a group, one wide load each. Rows are SCALE_LD entries
    // apart (one more than the groups) so that the lanes of a fragment, which read rows 2 apart
    // (NVIDIA) or 1 apart, fall on different banks.
    __shared__ MqScales w_sc[MQ_BR * SCALE_LD];
    __shared__ float2 x_ds[BT * SCALE_LD];

    const u32 tid = threadIdx.x;
    const u32 n_threads = MQ_WARPS * WARP_SIZE;
    const u32 warp = tid / WARP_SIZE;
    const u32 r0 = blockIdx.y * MQ_BR;
    const u32 k_begin = blockIdx.z * k_split;
    const u32 k_end = k_begin + k_split < cols ? k_begin + k_split : cols;
    float* __restrict__ out = dst + (u64)blockIdx.z * n_tokens * rows;
    const u64 wrow_bytes = row_bytes<FMT>(cols);
    const u32 groups_per_row = cols / 32;
    // 16-token tiles of this block that hold tokens (uniform over the block).
    const u32 tiles_left = (n_tokens - t0 + 15) / 16;
    const u32 live_tiles = tiles_left < BT / 16 ? tiles_left : BT / 16;

    MmaAcc acc[BT / 16];
#pragma unroll
    for (int i = 0; i < BT / 16; ++i) mma_zero(acc[i]);

    for (u32 k0 = k_begin; k0 < k_end; k0 += BK) {
        // Weights: one group of 32 per item.
        for (u32 i = tid; i < MQ_BR * G; i += n_threads) {
            const u32 rl = i / G, g = i % G;
            const u32 r = r0 + rl, c = k0 + 32 * g;
            MqGroup o;
            o.s_lo = 1;
            o.s_hi = 0;
            o.m = 0.0f;
            if (r < rows && c < k_end) {
                U::group(w + (u64)r * wrow_bytes, c, o);
            } else {
                o.d = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; ++k) o.q[k] = 0;
            }
            uint4* dq = (uint4*)(w_q + rl * LDS + 32 * g);
            dq[0] = make_uint4(o.q[0], o.q[1], o.q[2], o.q[3]);
            dq[1] = make_uint4(o.q[4], o.q[5], o.q[6], o.q[7]);
            MqScales sc;
            sc.d = o.d;
            sc.m = o.m;
            sc.s_lo = o.s_lo;
            sc.s_hi = U::SCALE16 ? o.s_hi : o.s_lo;
            w_sc[rl * SCALE_LD + g] = sc;
        }
        // Activations of the live token tiles: one group of 32 per item.
        for (u32 i = tid; i < live_tiles * 16 * G; i += n_threads) {
            const u32 tl = i / G, g = i % G;
            const u32 t = t0 + tl, c = k0 + 32 * g;
            int4 a = make_int4(0, 0, 0, 0), b = make_int4(0, 0, 0, 0);
            float d = 0.0f;
            if (t < n_tokens && c < k_end) {
                const int4* src = (const int4*)(xq + (u64)t * cols + c);
                a = src[0];
                b = src[1];
                d = xd[(u64)t * groups_per_row + c / 32];
            }
            int4* dq = (int4*)(x_q + tl * LDS + 32 * g);
            dq[0] = a;
            dq[1] = b;
            float x_sum = 0.0f;
            if (U::HAS_MIN) {
                // The group's sum of activations, for the weights' offset: sum(w_m * x) =
                // w_m * xd * sum(xq).
                const int ones = 0x01010101;
                int sum = dot4_i8(ones, a.x, dot4_i8(ones, a.y, dot4_i8(ones, a.z, dot4_i8(ones, a.w, 0))));
                sum = dot4_i8(ones, b.x, dot4_i8(ones, b.y, dot4_i8(ones, b.z, dot4_i8(ones, b.w, sum))));
                x_sum = d * (float)sum;
            }
            x_ds[tl * SCALE_LD + g] = make_float2(d, x_sum);
        }
        __syncthreads();
        const u32 wr = warp * 16;
        const i8* wb = w_q + wr * LDS;
        // Two groups in flight, except in the SIMT build (parts without matrix cores, and the
        // self-test's comparison), where the grouped entry then needed more than gfx1030's 256
        // registers a lane and spilled.
#if MMA_VARIANT == MMA_SIMT
#pragma unroll 1
#else
#pragma unroll 2
#endif
        for (u32 g = 0; g < G; ++g) {
            // This lane's rows' scales for the group.
            int s_lo[MMA_ACC], s_hi[MMA_ACC];
            float wd[MMA_ACC], wm[MMA_ACC];
#pragma unroll
            for (int i = 0; i < MMA_ACC; ++i) {
                const MqScales sc = w_sc[(wr + mma_n(i)) * SCALE_LD + g];
                s_lo[i] = sc.s_lo;
                s_hi[i] = sc.s_hi;
                wd[i] = sc.d;
                wm[i] = U::HAS_MIN ? sc.m : 0.0f;
            }
#pragma unroll
            for (u32 tile = 0; tile < BT / 16; ++tile) {
                if (tile >= live_tiles) continue;
                const i8* xa = x_q + tile * 16 * LDS + 32 * g;
                MmaAccI lo, hi;
                if (U::SCALE16) {
                    mma_zero_i(lo);
                    mma_i8_16x16x16(lo, xa, LDS, wb + 32 * g, LDS);
                }
                if (U::SCALE16) {
                    mma_zero_i(hi);
                    mma_i8_16x16x16(hi, xa + 16, LDS, wb + 32 * g + 16, LDS);
                } else {
                    mma_zero_i(lo);
                    mma_i8_16x16x32(lo, xa, LDS, wb + 32 * g, LDS);
                }
#pragma unroll
                for (int i = 0; i < MMA_ACC; ++i) {
                    const float2 xs = x_ds[(tile * 16 + mma_m(i)) * SCALE_LD + g];
                    int v = lo.v[i];
                    if (U::SCALE16) {
                        v = s_lo[i] * lo.v[i] + s_hi[i] * hi.v[i];
                    } else if (U::INT_SCALE) {
                        v *= s_lo[i];
                    }
                    float a = acc[tile].v[i] + wd[i] * xs.x * (float)v;
                    if (U::HAS_MIN) a -= wm[i] * xs.y;
                    acc[tile].v[i] = a;
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (u32 tile = 0; tile < BT / 16; ++tile) {
#pragma unroll
        for (int i = 0; i < MMA_ACC; ++i) {
            const u32 t = t0 + tile * 16 + mma_m(i);
            const u32 r = r0 + warp * 16 + mma_n(i);
            if (t < n_tokens && r < rows) out[(u64)t * rows + r] = acc[tile].v[i];
        }
    }
}

// Mixture-of-experts products in one launch for all experts: w holds n_expert matrices of rows
// x cols one after the other, the activations are slots rows in expert order (each expert's
// rows contiguous), and tiles lists, three i32 per block, (expert, first slot, rows <= MQ_BT_LARGE):
// block x multiplies those rows by that expert's matrix and writes rows x rows values at
// dst + first slot * rows. No split (the experts' tiles fill the device). A tile naming an
// expert or slots outside the launch's is skipped, so the table cannot send a read or write
// out of bounds. Grid: (tiles, ceil(rows / MQ_BR), 1).
template <int FMT>
DEVICE void matmul_q8_mma_grouped_impl(const u8* __restrict__ w, const i32* __restrict__ tiles,
                                       const i8* __restrict__ xq, const float* __restrict__ xd,
                                       float* __restrict__ dst, u32 rows, u32 cols, u32 n_expert,
                                       u32 slots) {
    const i32* tile = tiles + 3 * (u64)blockIdx.x;
    const u32 e = (u32)tile[0], first = (u32)tile[1], count = (u32)tile[2];
    if (e >= n_expert || first > slots || count == 0 || count > slots - first || count > MQ_BT_LARGE)
        return;
    // The tile is tokens first .. first + count - 1 of rows that end there, so the rows keep
    // their places in xq, xd and dst, and the tile's first token is a run-time value as in the
    // plain entry (with a constant 0 the SIMT build for gfx1030 spilled).
    matmul_q8_mma_impl<FMT, MQ_BT_LARGE>(w + (u64)e * rows * row_bytes<FMT>(cols), xq, xd, dst,
                                         rows, cols, first + count, cols, first);
}

#define MATMUL_Q8_MMA_ENTRY(suffix, FMT)                                                          \
    KERNEL void LAUNCH_BOUNDS(MQ_WARPS * WARP_SIZE)                                               \
        matmul_q8_mma_##suffix(const u8* w, const i8* xq, const float* xd, float* dst, u32 rows, \
                               u32 cols, u32 n_tokens, u32 k_split) {                            \
        KERNEL_PROLOGUE();                                                                        \
        matmul_q8_mma_impl<FMT, MQ_BT_LARGE>(w, xq, xd, dst, rows, cols, n_tokens, k_split,       \
                                             blockIdx.x * MQ_BT_LARGE);                           \
    }                                                                                             \
    KERNEL void LAUNCH_BOUNDS(MQ_WARPS * WARP_SIZE)                                               \
        matmul_q8_mma_small_##suffix(const u8* w, const i8* xq, const float* xd, float* dst,     \
                                     u32 rows, u32 cols, u32 n_tokens, u32 k_split) {            \
        KERNEL_PROLOGUE();                                                                        \
        matmul_q8_mma_impl<FMT, MQ_BT_SMALL>(w, xq, xd, dst, rows, cols, n_tokens, k_split,       \
                                             blockIdx.x * MQ_BT_SMALL);                           \
    }                                                                                             \
    KERNEL void LAUNCH_BOUNDS(MQ_WARPS * WARP_SIZE) matmul_q8_mma_grouped_##suffix(               \
        const u8* w, const i32* tiles, const i8* xq, const float* xd, float* dst, u32 rows,       \
        u32 cols, u32 n_expert, u32 slots) {                                                      \
        KERNEL_PROLOGUE();                                                                        \
        matmul_q8_mma_grouped_impl<FMT>(w, tiles, xq, xd, dst, rows, cols, n_expert, slots);      \
    }
MATMUL_Q8_MMA_ENTRY(q4_0, FMT_Q4_0)
MATMUL_Q8_MMA_ENTRY(q4_1, FMT_Q4_1)
MATMUL_Q8_MMA_ENTRY(q8_0, FMT_Q8_0)
MATMUL_Q8_MMA_ENTRY(q4_k, FMT_Q4_K)
MATMUL_Q8_MMA_ENTRY(q5_k, FMT_Q5_K)
MATMUL_Q8_MMA_ENTRY(q6_k, FMT_Q6_K)

// Matrix-matrix products over quantized weights on the matrix cores (mma.h).
//
// out[t * rows + r] = sum_c W[r][c] * x[t * cols + c] for t < n_tokens, r < rows: the same op as
// matmul.hip, for steps of a few dozen to a few hundred token rows (batched decode, short
// prefill), where the vendor GEMM's f16 copy of every weight costs more than the product.
//
// A block of MMA_WARPS warps computes MM_BT tokens by MM_BR weight rows. For each step of MM_BK
// columns it dequantizes the weight tile into shared memory as f16 (quant.h's dequant_run8, the
// float operations of every other kernel, then the hardware rounding to half) and converts the
// activation tile beside it, so each quantized weight byte is read from memory once per token
// tile and never written back. Warp w then owns weight rows 16 w .. 16 w + 15 and accumulates
// one 16 x 16 f32 tile per 16 tokens with mma_16x16x16 (tokens are the product's m, weight rows
// its n). Token tiles past n_tokens are skipped; rows, tokens and (dense formats, or quantized
// rows that end within a step) columns past the matrix are zeros.
//
// Activations and weights are rounded to f16 before the products (as for the vendor GEMM);
// accumulation is f32. Grid: (ceil(n_tokens / MM_BT), ceil(rows / MM_BR), splits), token tiles
// along x so the blocks that read the same weight rows run together and share them through the
// cache.
//
// Split K: a decode step's matrix has few tiles (a 1024-row projection at 16 tokens is 16
// blocks on a device of 132 multiprocessors), and one block keeps only one tile's loads in
// flight, so the columns are also split over grid z. Split z covers columns
// [z * k_split, (z + 1) * k_split) (k_split a multiple of MM_BK) and writes its sums to
// dst + z * n_tokens * rows; with one split dst is out itself. matmul_mma_reduce then adds the
// splits in order, so the result does not depend on which block finishes first.
// Block: MMA_WARPS * WARP_SIZE threads.
//
// Entry points, one per format (FOR_EACH_WEIGHT_FORMAT in quant.h): matmul_mma_f32,
// matmul_mma_f16, matmul_mma_bf16, matmul_mma_q4_0, matmul_mma_q4_1, matmul_mma_q5_0,
// matmul_mma_q5_1, matmul_mma_q8_0, matmul_mma_q4_k, matmul_mma_q5_k, matmul_mma_q6_k; and
// matmul_mma_reduce.
#include "portability.h"
#include "quant.h"
#include "mma.h"

#define MMA_WARPS 4
#define MM_BR (16 * MMA_WARPS)  // weight rows per block: 16 per warp
#define MM_BT 64                // tokens per block: four 16-token tiles
#define MM_BK 128               // columns per step
// Row stride of both shared tiles in halves: 8 halves of padding put the 8 rows a warp reads
// at once on different banks, and keep every row start 16-byte aligned.
#define MM_LDS (MM_BK + 8)
#define MM_RUNS (MM_BK / 8)  // runs of eight columns per tile row

template <int FMT>
DEVICE void matmul_mma_impl(const u8* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ dst, u32 rows, u32 cols, u32 n_tokens,
                            u32 k_split) {
    __shared__ u16 w_tile[MM_BR * MM_LDS] __attribute__((aligned(16)));
    __shared__ u16 x_tile[MM_BT * MM_LDS] __attribute__((aligned(16)));

    const u32 tid = threadIdx.x;
    const u32 n_threads = MMA_WARPS * WARP_SIZE;
    const u32 warp = tid / WARP_SIZE;
    const u32 t0 = blockIdx.x * MM_BT;
    const u32 r0 = blockIdx.y * MM_BR;
    const u32 k_begin = blockIdx.z * k_split;
    const u32 k_end = k_begin + k_split < cols ? k_begin + k_split : cols;
    float* __restrict__ out = dst + (u64)blockIdx.z * n_tokens * rows;
    const u64 wrow_bytes = row_bytes<FMT>(cols);
    // 16-token tiles of this block that hold tokens (uniform over the block).
    const u32 tiles_left = (n_tokens - t0 + 15) / 16;
    const u32 live_tiles = tiles_left < MM_BT / 16 ? tiles_left : MM_BT / 16;
    // Runs of x start 16-byte aligned (two 16-byte loads each) when rows of x are whole runs
    // and x itself is aligned; uniform over the grid.
    const bool x_wide = (cols & 7u) == 0 && ((u64)x & 15u) == 0;
    // Q4_K blocks (144 bytes) start 8-byte aligned when the matrix does: its runs of quants
    // are then read in one load each (dq8_q4_k_aligned).
    const bool w_wide = ((u64)w & 7u) == 0;

    MmaAcc acc[MM_BT / 16];
#pragma unroll
    for (int i = 0; i < MM_BT / 16; ++i) mma_zero(acc[i]);

    for (u32 k0 = k_begin; k0 < k_end; k0 += MM_BK) {
        // Weight tile: MM_BR rows x MM_RUNS runs of eight.
        for (u32 i = tid; i < MM_BR * MM_RUNS; i += n_threads) {
            const u32 rl = i / MM_RUNS, run = i % MM_RUNS;
            const u32 r = r0 + rl, c0 = k0 + run * 8;
            float v[8];
            if (FMT == FMT_Q4_K && w_wide && r < rows && c0 + 8 <= cols) {
                const u8* b = w + (u64)r * wrow_bytes + (u64)(c0 / QK_K) * 144;
                dq8_q4_k_aligned(b, (int)(c0 % QK_K), v);
            } else if (r < rows && c0 + 8 <= cols) {
                dequant_run8<FMT>(w + (u64)r * wrow_bytes, c0 / 8, v);
            } else {
                // Past the matrix, or the partial last run of a dense row.
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    v[k] = (r < rows && c0 + k < cols)
                               ? dequant_one<FMT>(w + (u64)r * wrow_bytes, c0 + k)
                               : 0.0f;
                }
            }
            store8_f16_aligned(w_tile + rl * MM_LDS + run * 8, v);
        }
        // Activation tile: the live token tiles' rows, runs of eight.
        for (u32 i = tid; i < live_tiles * 16 * MM_RUNS; i += n_threads) {
            const u32 tl = i / MM_RUNS, run = i % MM_RUNS;
            const u32 t = t0 + tl, c0 = k0 + run * 8;
            float v[8];
            const float* src = x + (u64)t * cols + c0;
            if (t < n_tokens && x_wide && c0 + 8 <= cols) {
                const float4 a = *(const float4*)src;
                const float4 b = *(const float4*)(src + 4);
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            } else {
#pragma unroll
                for (int k = 0; k < 8; ++k) v[k] = (t < n_tokens && c0 + k < cols) ? src[k] : 0.0f;
            }
            store8_f16_aligned(x_tile + tl * MM_LDS + run * 8, v);
        }
        __syncthreads();
        const u16* wb = w_tile + warp * 16 * MM_LDS;
#pragma unroll
        for (u32 kk = 0; kk < MM_BK; kk += 16) {
#pragma unroll
            for (u32 tile = 0; tile < MM_BT / 16; ++tile) {
                if (tile < live_tiles) {
                    mma_16x16x16(acc[tile], x_tile + tile * 16 * MM_LDS + kk, MM_LDS, wb + kk,
                                 MM_LDS);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (u32 tile = 0; tile < MM_BT / 16; ++tile) {
#pragma unroll
        for (int i = 0; i < MMA_ACC; ++i) {
            const u32 t = t0 + tile * 16 + mma_m(i);
            const u32 r = r0 + warp * 16 + mma_n(i);
            if (t < n_tokens && r < rows) out[(u64)t * rows + r] = acc[tile].v[i];
        }
    }
}

#define MATMUL_MMA_ENTRY(suffix, FMT)                                                       \
    KERNEL void LAUNCH_BOUNDS(MMA_WARPS * WARP_SIZE) matmul_mma_##suffix(const u8* w, const float* x, float* dst, u32 rows,      \
                                    u32 cols, u32 n_tokens, u32 k_split) {                  \
        KERNEL_PROLOGUE();                                                                  \
        matmul_mma_impl<FMT>(w, x, dst, rows, cols, n_tokens, k_split);                     \
    }
FOR_EACH_WEIGHT_FORMAT(MATMUL_MMA_ENTRY)

// out[i] = sum over s < splits of partials[s * n + i], s in order: the split-K sums of
// matmul_mma_* added the same way on every run. Grid-stride over i < n.
KERNEL void LAUNCH_BOUNDS(256) matmul_mma_reduce(const float* __restrict__ partials, float* __restrict__ out,
                              u32 n, u32 splits) {
    KERNEL_PROLOGUE();
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float sum = partials[i];
        for (u32 s = 1; s < splits; ++s) sum += partials[(u64)s * n + i];
        out[i] = sum;
    }
}

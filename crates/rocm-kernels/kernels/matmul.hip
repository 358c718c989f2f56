// Matrix-matrix products over quantized weights (prefill).
//
// out[t * rows + r] = sum_c W[r][c] * x[t * cols + c] for t < n_tokens, r < rows.
// Tiled: a block of MATMUL_THREADS (256) threads computes a tile of MATMUL_BT tokens by
// MATMUL_BR rows; for each step of MATMUL_BK columns it dequantizes the weight tile into shared
// memory (one run of eight values per thread for quantized formats) and stages the activation
// tile beside it, then every thread accumulates a 4 x 4 sub-tile in f32 registers. Partial tiles
// (rows, tokens, and for dense formats columns) are bounds-checked and padded with zeros.
// Grid: (ceil(rows / MATMUL_BR), ceil(n_tokens / MATMUL_BT)). Nothing depends on the wave size.
// Entry points, one per format (FOR_EACH_WEIGHT_FORMAT in quant.h): matmul_f32, matmul_f16,
// matmul_bf16, matmul_q4_0, matmul_q4_1, matmul_q5_0, matmul_q5_1, matmul_q8_0, matmul_q4_k,
// matmul_q5_k, matmul_q6_k.
#include "portability.h"
#include "quant.h"

#define MATMUL_THREADS 256
#define MATMUL_BT 64
#define MATMUL_BR 64
#define MATMUL_BK 32
#define MATMUL_PAD (MATMUL_BK + 1)  // one float of padding per row: no shared-bank conflicts
#define MATMUL_TT (MATMUL_BT / 16)  // tokens per thread
#define MATMUL_TR (MATMUL_BR / 16)  // rows per thread

template <int FMT>
DEVICE void matmul_impl(const u8* __restrict__ w, const float* __restrict__ x,
                        float* __restrict__ out, u32 rows, u32 cols, u32 n_tokens) {
    __shared__ float w_tile[MATMUL_BR][MATMUL_PAD];
    __shared__ float x_tile[MATMUL_BT][MATMUL_PAD];

    const u32 tid = threadIdx.x;
    const u32 r0 = blockIdx.x * MATMUL_BR;
    const u32 t0 = blockIdx.y * MATMUL_BT;
    const u64 wrow_bytes = row_bytes<FMT>(cols);
    // This thread's outputs: tokens t0 + ty + 16 i, rows r0 + tx + 16 j.
    const u32 ty = tid / 16;
    const u32 tx = tid % 16;

    float acc[MATMUL_TT][MATMUL_TR];
#pragma unroll
    for (int i = 0; i < MATMUL_TT; ++i) {
#pragma unroll
        for (int j = 0; j < MATMUL_TR; ++j) acc[i][j] = 0.0f;
    }

    for (u32 k0 = 0; k0 < cols; k0 += MATMUL_BK) {
        // Weight tile: MATMUL_BR rows x MATMUL_BK columns = 256 runs of eight, one per thread.
        {
            const u32 rl = tid / (MATMUL_BK / 8);
            const u32 run = tid % (MATMUL_BK / 8);
            const u32 r = r0 + rl;
            float v[8];
            if (r < rows) {
                const u8* row = w + (u64)r * wrow_bytes;
                if (FormatInfo<FMT>::dense) {
#pragma unroll
                    for (int k = 0; k < 8; ++k) {
                        const u32 c = k0 + run * 8 + k;
                        v[k] = (c < cols) ? dequant_one<FMT>(row, c) : 0.0f;
                    }
                } else {
                    // Quantized rows are whole blocks of 32 or 256, so the tile is never partial.
                    dequant_run8<FMT>(row, (k0 / 8) + run, v);
                }
            } else {
#pragma unroll
                for (int k = 0; k < 8; ++k) v[k] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) w_tile[rl][run * 8 + k] = v[k];
        }
        // Activation tile: MATMUL_BT tokens x MATMUL_BK columns, eight per thread, coalesced.
#pragma unroll
        for (int i = 0; i < (MATMUL_BT * MATMUL_BK) / MATMUL_THREADS; ++i) {
            const u32 idx = tid + (u32)i * MATMUL_THREADS;
            const u32 tl = idx / MATMUL_BK;
            const u32 cl = idx % MATMUL_BK;
            const u32 t = t0 + tl;
            const u32 c = k0 + cl;
            x_tile[tl][cl] = (t < n_tokens && c < cols) ? x[(u64)t * cols + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < MATMUL_BK; ++kk) {
            float a[MATMUL_TT];
            float b[MATMUL_TR];
#pragma unroll
            for (int i = 0; i < MATMUL_TT; ++i) a[i] = x_tile[ty + 16 * i][kk];
#pragma unroll
            for (int j = 0; j < MATMUL_TR; ++j) b[j] = w_tile[tx + 16 * j][kk];
#pragma unroll
            for (int i = 0; i < MATMUL_TT; ++i) {
#pragma unroll
                for (int j = 0; j < MATMUL_TR; ++j) acc[i][j] += a[i] * b[j];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < MATMUL_TT; ++i) {
        const u32 t = t0 + ty + 16 * i;
        if (t >= n_tokens) continue;
#pragma unroll
        for (int j = 0; j < MATMUL_TR; ++j) {
            const u32 r = r0 + tx + 16 * j;
            if (r < rows) out[(u64)t * rows + r] = acc[i][j];
        }
    }
}

#define MATMUL_ENTRY(suffix, FMT)                                                        \
    KERNEL void LAUNCH_BOUNDS(MATMUL_THREADS) matmul_##suffix(const u8* w, const float* x, float* out, u32 rows, u32 cols, \
                                u32 n_tokens) {                                          \
        KERNEL_PROLOGUE();                                                               \
        matmul_impl<FMT>(w, x, out, rows, cols, n_tokens);                               \
    }
FOR_EACH_WEIGHT_FORMAT(MATMUL_ENTRY)

// Matrix-vector products over quantized weights, for a few tokens (decode).
//
// out[t * rows + r] = sum_c W[r][c] * x[t * cols + c], for t < n_tokens <= MATVEC_MAX_TOKENS.
// `warps_per_row` warps share each output row (a power of two dividing the block's warps; more
// than one where a matrix has too few rows to fill the device), their sums meeting in shared
// memory: row r = blockIdx.x * (warps / warps_per_row) + warp / warps_per_row. The weight rows
// are read once for all tokens of the launch.
// Entry points, one per format (FOR_EACH_WEIGHT_FORMAT in quant.h): matvec_f32, matvec_f16,
// matvec_bf16, matvec_q4_0, matvec_q4_1, matvec_q5_0, matvec_q5_1, matvec_q8_0, matvec_q4_k,
// matvec_q5_k, matvec_q6_k.
#include "portability.h"
#include "quant.h"

#define MATVEC_MAX_TOKENS 8

// MAXT: the most tokens the instance handles; decode's one-token launches take the MAXT = 1
// instance (see MATVEC_ENTRY), which keeps one accumulator instead of eight guarded ones.
template <int FMT, int MAXT>
DEVICE void matvec_impl(const u8* __restrict__ w, const float* __restrict__ x,
                        float* __restrict__ out, u32 rows, u32 cols, u32 n_tokens,
                        u32 warps_per_row, float (*partial)[MATVEC_MAX_TOKENS]) {
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 lane = threadIdx.x % WARP_SIZE;
    const u32 rows_per_block = (blockDim.x / WARP_SIZE) / warps_per_row;
    const u32 r = blockIdx.x * rows_per_block + warp / warps_per_row;
    const u32 sub = warp % warps_per_row;
    float acc[MAXT];
    if (r < rows) {
        const u8* row = w + (u64)r * row_bytes<FMT>(cols);
        warp_row_dot_strided<FMT, MAXT>(row, x, cols, (int)n_tokens, cols, acc,
                                        sub * WARP_SIZE + lane, warps_per_row * WARP_SIZE);
    } else {
#pragma unroll
        for (int t = 0; t < MAXT; ++t) acc[t] = 0.0f;
    }
    if (warps_per_row == 1) {
        if (lane == 0 && r < rows) {
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                if ((u32)t < n_tokens) out[(u64)t * rows + r] = acc[t];
            }
        }
        return;  // the same for the whole block: no thread waits below
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < MAXT; ++t) partial[warp][t] = acc[t];
    }
    __syncthreads();
    if (sub == 0 && lane == 0 && r < rows) {
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if ((u32)t >= n_tokens) break;
            float s = 0.0f;
            for (u32 k = 0; k < warps_per_row; ++k) s += partial[warp + k][t];
            out[(u64)t * rows + r] = s;
        }
    }
}

#define MATVEC_ENTRY(suffix, FMT)                                                        \
    KERNEL void LAUNCH_BOUNDS(256) matvec_##suffix(const u8* w, const float* x, float* out, u32 rows, u32 cols, \
                                u32 n_tokens, u32 warps_per_row) {                       \
        KERNEL_PROLOGUE();                                                               \
        __shared__ float partial[32][MATVEC_MAX_TOKENS];                                 \
        if (n_tokens == 1) {                                                             \
            matvec_impl<FMT, 1>(w, x, out, rows, cols, 1, warps_per_row, partial);       \
        } else {                                                                         \
            matvec_impl<FMT, MATVEC_MAX_TOKENS>(w, x, out, rows, cols, n_tokens,         \
                                                warps_per_row, partial);                 \
        }                                                                                \
    }
FOR_EACH_WEIGHT_FORMAT(MATVEC_ENTRY)

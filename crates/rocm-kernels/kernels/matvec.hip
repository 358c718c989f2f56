// Matrix-vector products over quantized weights, for a few tokens (decode).
//
// out[t * rows + r] = sum_c W[r][c] * x[t * cols + c], for t < n_tokens <= MATVEC_MAX_TOKENS.
// One warp per output row; a block holds blockDim.x / WARP_SIZE warps, so row
// r = blockIdx.x * (blockDim.x / WARP_SIZE) + warp. The weight rows are read once for all
// tokens of the launch.
// Entry points, one per format (FOR_EACH_WEIGHT_FORMAT in quant.h): matvec_f32, matvec_f16,
// matvec_bf16, matvec_q4_0, matvec_q4_1, matvec_q5_0, matvec_q5_1, matvec_q8_0, matvec_q4_k,
// matvec_q5_k, matvec_q6_k.
#include "portability.h"
#include "quant.h"

#define MATVEC_MAX_TOKENS 8

template <int FMT>
DEVICE void matvec_impl(const u8* __restrict__ w, const float* __restrict__ x,
                        float* __restrict__ out, u32 rows, u32 cols, u32 n_tokens) {
    const u32 warps = blockDim.x / WARP_SIZE;
    const u32 r = blockIdx.x * warps + threadIdx.x / WARP_SIZE;
    if (r >= rows) return;  // the whole warp leaves together
    const u8* row = w + (u64)r * row_bytes<FMT>(cols);
    float acc[MATVEC_MAX_TOKENS];
    warp_row_dot<FMT, MATVEC_MAX_TOKENS>(row, x, cols, (int)n_tokens, cols, acc);
    if (threadIdx.x % WARP_SIZE == 0) {
#pragma unroll
        for (int t = 0; t < MATVEC_MAX_TOKENS; ++t) {
            if ((u32)t < n_tokens) out[(u64)t * rows + r] = acc[t];
        }
    }
}

#define MATVEC_ENTRY(suffix, FMT)                                                        \
    KERNEL void matvec_##suffix(const u8* w, const float* x, float* out, u32 rows, u32 cols, \
                                u32 n_tokens) {                                          \
        matvec_impl<FMT>(w, x, out, rows, cols, n_tokens);                               \
    }
FOR_EACH_WEIGHT_FORMAT(MATVEC_ENTRY)

// Embedding rows gathered from a (quantized) table.
//
// out[t * dim + c] = table[tokens[t]][c] * scale for t < n_tokens; the table has `vocab` rows
// of `dim` values. The token ids are read from device memory (the step block), so a captured
// step replays with new ids. An id outside [0, vocab) reads nothing: its output row is zeros,
// and, when `error_flag` is not null, 1 is stored there (never cleared here; the host clears it).
// One block per token; threads stride over runs of eight values (quantized) or single values
// (dense).
// Entry points, one per format (FOR_EACH_WEIGHT_FORMAT in quant.h): embed_f32, embed_f16,
// embed_bf16, embed_q4_0, embed_q4_1, embed_q5_0, embed_q5_1, embed_q8_0, embed_q4_k, embed_q5_k,
// embed_q6_k.
#include "portability.h"
#include "quant.h"

template <int FMT>
DEVICE void embed_impl(const u8* __restrict__ table, const i32* __restrict__ tokens,
                       float* __restrict__ out, i32* error_flag, u32 vocab, u32 dim,
                       float scale) {
    const u32 t = blockIdx.x;
    const i32 id = tokens[t];
    float* dst = out + (u64)t * dim;
    if (id < 0 || (u32)id >= vocab) {
        for (u32 c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = 0.0f;
        if (threadIdx.x == 0 && error_flag != 0) *error_flag = 1;
        return;
    }
    const u8* row = table + (u64)id * row_bytes<FMT>(dim);
    if (FormatInfo<FMT>::dense) {
        for (u32 c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = dequant_one<FMT>(row, c) * scale;
    } else {
        for (u32 u = threadIdx.x; u < dim / 8; u += blockDim.x) {
            float v[8];
            dequant_run8<FMT>(row, u, v);
#pragma unroll
            for (int k = 0; k < 8; ++k) dst[u * 8 + k] = v[k] * scale;
        }
    }
}

#define EMBED_ENTRY(suffix, FMT)                                                          \
    KERNEL void LAUNCH_BOUNDS(256) embed_##suffix(const u8* table, const i32* tokens, float* out, i32* error_flag, \
                               u32 vocab, u32 dim, float scale) {                         \
        KERNEL_PROLOGUE();                                                                \
        embed_impl<FMT>(table, tokens, out, error_flag, vocab, dim, scale);               \
    }
FOR_EACH_WEIGHT_FORMAT(EMBED_ENTRY)

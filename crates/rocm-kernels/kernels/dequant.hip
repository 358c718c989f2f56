// Weight rows dequantized to IEEE half, and f32 -> f16 conversion: prefill's inputs to a vendor
// GEMM (cuBLASLt / hipBLASLt), which takes f16 operands, not GGUF blocks.
//
// dequant_f16_<fmt>(w, out, cols, runs_per_row, total_runs): `w` is the first row to convert,
// `out` is [rows][cols] halves, densely packed. The (rows x runs_per_row) runs of eight columns
// are numbered row-major and thread t takes run t, so neighbouring threads write neighbouring
// 16-byte pieces of the output (fully coalesced) and read neighbouring weight bytes. The values
// come from quant.h's dequant_run8 (the same float operations as every other kernel), each run
// is converted with the hardware f32 -> f16 conversion and written with one 16-byte store when
// the output row starts allow it (cols a multiple of 8 and `out` 16-byte aligned); otherwise,
// and for the partial last run of a dense row whose length is not a multiple of 8, with 16-bit
// stores. Values beyond the f16 range become +-inf (round to nearest even, as IEEE says).
//
// convert_f32_to_f16(x, out, n): out[i] = half(x[i]), round to nearest even; thread t takes
// values 8t .. 8t+7, with two 16-byte loads and one 16-byte store when both views are 16-byte
// aligned.
//
// Entry points: dequant_f16_f32, dequant_f16_f16, dequant_f16_bf16, dequant_f16_q4_0,
// dequant_f16_q4_1, dequant_f16_q5_0, dequant_f16_q5_1, dequant_f16_q8_0, dequant_f16_q4_k,
// dequant_f16_q5_k, dequant_f16_q6_k (FOR_EACH_WEIGHT_FORMAT in quant.h), convert_f32_to_f16.
#include "portability.h"
#include "quant.h"

// Eight values as halves at `dst`: one 16-byte store when `wide` (the caller vouches that dst
// is 16-byte aligned), else eight 16-bit stores.
DEVICE void store8_f16(u16* dst, const float* v, bool wide) {
    if (wide) {
        store8_f16_aligned(dst, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) dst[k] = f32_to_f16_rn(v[k]);
    }
}

template <int FMT>
DEVICE void dequant_f16_impl(const u8* __restrict__ w, u16* __restrict__ out, u32 cols,
                             u32 runs_per_row, u32 total_runs) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total_runs) return;
    const u32 r = (u32)t / runs_per_row;
    const u32 u = (u32)t - r * runs_per_row;
    const u8* row = w + (u64)r * row_bytes<FMT>(cols);
    const u32 c0 = u * 8;
    u16* dst = out + (u64)r * cols + c0;
    if (c0 + 8 <= cols) {
        float v[8];
        dequant_run8<FMT>(row, u, v);
        // Uniform over the grid: every run starts at a multiple of 8 halves from `out`.
        const bool wide = (cols & 7u) == 0 && ((u64)out & 15u) == 0;
        store8_f16(dst, v, wide);
    } else {
        // Only dense rows have a partial run (quantized rows are whole blocks of 32 or 256).
        for (u32 c = c0; c < cols; ++c) dst[c - c0] = f32_to_f16_rn(dequant_one<FMT>(row, c));
    }
}

#define DEQUANT_F16_ENTRY(suffix, FMT)                                                       \
    KERNEL void LAUNCH_BOUNDS(256) dequant_f16_##suffix(const u8* w, u16* out, u32 cols, u32 runs_per_row,     \
                                     u32 total_runs) {                                      \
        KERNEL_PROLOGUE();                                                                  \
        dequant_f16_impl<FMT>(w, out, cols, runs_per_row, total_runs);                      \
    }
FOR_EACH_WEIGHT_FORMAT(DEQUANT_F16_ENTRY)

KERNEL void LAUNCH_BOUNDS(256) convert_f32_to_f16(const float* __restrict__ x, u16* __restrict__ out, u32 n) {
    KERNEL_PROLOGUE();
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 i0 = t * 8;
    if (i0 >= n) return;
    if (i0 + 8 <= n) {
        float v[8];
        // Uniform over the grid: 8t values from both starts keep their 16-byte alignment.
        const bool wide = (((u64)x | (u64)out) & 15u) == 0;
        if (wide) {
            const float4 a = *(const float4*)(x + i0);
            const float4 b = *(const float4*)(x + i0 + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = x[i0 + k];
        }
        store8_f16(out + i0, v, wide);
    } else {
        for (u64 i = i0; i < n; ++i) out[i] = f32_to_f16_rn(x[i]);
    }
}

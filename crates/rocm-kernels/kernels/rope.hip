// Rotary position embedding, in place over `[rows][n_heads][head_dim]` f32.
//
// Row r is at position positions[r] (read from device memory, so a captured step replays at new
// positions). Pair i (i < n_rot / 2) rotates by theta_i = (p / position_scale) *
// freq_base^(-2i / n_rot), divided by freq_factors[i] when given; dimensions from n_rot on pass
// through. Normal rope pairs (2i, 2i + 1), NeoX pairs (i, i + n_rot / 2).
//
// Precision: the angle is formed in f32 exactly as the CPU reference does (same operations in
// the same order), except that freq_base^e and sin/cos are evaluated in double and rounded once,
// so they are at least as accurate as the CPU's f32 libm calls.
#include "portability.h"

// One block per row; threads stride over the pairs, each computes its angle once and rotates
// that pair in every head of the row.
KERNEL void rope_f32(float* x, const i32* positions, const float* freq_factors,
                     u32 has_freq_factors, u32 rows, u32 n_heads, u32 head_dim, u32 n_rot,
                     float freq_base, float position_scale, u32 neox) {
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const u32 n_pairs = n_rot / 2;
    const float p = (float)positions[row] / position_scale;
    float* xr = x + (u64)row * n_heads * head_dim;
    for (u32 i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        // Same exponent as the CPU: (-2 i) / n_rot in f32.
        const float e = -2.0f * (float)i / (float)n_rot;
        const float freq = (float)pow((double)freq_base, (double)e);
        float theta = p * freq;
        if (has_freq_factors) theta = theta / freq_factors[i];
        const float s = (float)sin((double)theta);
        const float c = (float)cos((double)theta);
        const u32 a = neox ? i : 2 * i;
        const u32 b = neox ? i + n_pairs : 2 * i + 1;
        for (u32 h = 0; h < n_heads; ++h) {
            float* xh = xr + (u64)h * head_dim;
            const float x0 = xh[a];
            const float x1 = xh[b];
            xh[a] = x0 * c - x1 * s;
            xh[b] = x0 * s + x1 * c;
        }
    }
}

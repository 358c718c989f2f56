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
#include "kv_pages.h"

// Blocks (row, chunk): grid.x is the row, grid.y cuts the row's (head, pair) items into chunks
// of blockDim.x. Each block first computes every pair's angle once into shared memory
// (n_rot / 2 <= ROPE_MAX_PAIRS), then each thread rotates one item of its chunk. A decode row
// is a few thousand items: one block walking them in turn spent its time waiting on a chain of
// dependent loads, where a few blocks side by side finish in one round trip.
#define ROPE_MAX_PAIRS 256

// A second tensor x2 of `n_heads2` heads per row (may be null with 0 heads) rotates by the same
// angles in the same launch: a layer's queries and keys.
KERNEL void LAUNCH_BOUNDS(256) rope_f32(float* x, const i32* positions, const float* freq_factors,
                     u32 has_freq_factors, u32 rows, u32 n_heads, u32 head_dim, u32 n_rot,
                     float freq_base, float position_scale, u32 neox, float* x2, u32 n_heads2) {
    KERNEL_PROLOGUE();
    __shared__ float sin_sh[ROPE_MAX_PAIRS];
    __shared__ float cos_sh[ROPE_MAX_PAIRS];
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const u32 n_pairs = n_rot / 2;
    const float p = (float)positions[row] / position_scale;
    for (u32 i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        // Same exponent as the CPU: (-2 i) / n_rot in f32.
        const float e = -2.0f * (float)i / (float)n_rot;
        const float freq = (float)pow((double)freq_base, (double)e);
        float theta = p * freq;
        if (has_freq_factors) theta = theta / freq_factors[i];
        sin_sh[i] = (float)sin((double)theta);
        cos_sh[i] = (float)cos((double)theta);
    }
    __syncthreads();
    const u32 items = (n_heads + n_heads2) * n_pairs;
    for (u32 k = blockIdx.y * blockDim.x + threadIdx.x; k < items; k += gridDim.y * blockDim.x) {
        const u32 h = k / n_pairs;
        const u32 i = k % n_pairs;
        float* xh = h < n_heads ? x + ((u64)row * n_heads + h) * head_dim
                                : x2 + ((u64)row * n_heads2 + (h - n_heads)) * head_dim;
        const u32 a = neox ? i : 2 * i;
        const u32 b = neox ? i + n_pairs : 2 * i + 1;
        const float s = sin_sh[i];
        const float c = cos_sh[i];
        const float x0 = xh[a];
        const float x1 = xh[b];
        xh[a] = x0 * c - x1 * s;
        xh[b] = x0 * s + x1 * c;
    }
}

// rope_f32 of a layer's queries (x, n_heads) and keys (x2, n_heads2) with the new K and V rows
// stored in the layer's caches in the same launch, so decode spends one kernel, not two, between
// the Q/K/V products and attention. Row r goes to slot positions[r] % slots (through its block
// table when the cache is paged, kv_pages.h): the rotated key
// row (rotated pairs, then the dimensions from n_rot on as they are) to k_cache, the value row
// v[r] (dim_v values) to v_cache. The keys stay rotated in x2 too, as rope_f32 leaves them.
// Items per row: the (head, pair) rotations of both tensors, then n_heads2 * (head_dim - n_rot)
// unrotated key values, then dim_v value values; grid as rope_f32's.
DEVICE void kv_put(u16* cache, u64 i, float v) { cache[i] = f32_to_f16(v); }
DEVICE void kv_put(float* cache, u64 i, float v) { cache[i] = v; }

template <typename T>
DEVICE void rope_store_impl(float* x, const i32* positions, const float* freq_factors,
                            u32 has_freq_factors, u32 rows, u32 n_heads, u32 head_dim, u32 n_rot,
                            float freq_base, float position_scale, u32 neox, float* x2,
                            u32 n_heads2, const float* v, u32 dim_v, T* k_cache, T* v_cache,
                            u32 slots, KV_PAGES_PARAMS) {
    __shared__ float sin_sh[ROPE_MAX_PAIRS];
    __shared__ float cos_sh[ROPE_MAX_PAIRS];
    const u32 row = blockIdx.x;
    // A padding row's block leaves its queries unrotated too: nobody reads them.
    if (row >= rows || kv_padding_row(kv_seqs, kv_tables, row)) return;
    const u32 n_pairs = n_rot / 2;
    const i32 pos = positions[row];
    const float p = (float)pos / position_scale;
    for (u32 i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        // As rope_f32: the CPU's exponent in f32, then double-precision evaluation.
        const float e = -2.0f * (float)i / (float)n_rot;
        const float freq = (float)pow((double)freq_base, (double)e);
        float theta = p * freq;
        if (has_freq_factors) theta = theta / freq_factors[i];
        sin_sh[i] = (float)sin((double)theta);
        cos_sh[i] = (float)cos((double)theta);
    }
    __syncthreads();
    // Positions are never negative; the unsigned remainder keeps even a bad one in range.
    const u64 slot = kv_row(kv_pages(KV_PAGES_ARGS, row), (u32)pos % slots);
    const u32 k_dim = n_heads2 * head_dim;
    const u32 rot_items = (n_heads + n_heads2) * n_pairs;
    const u32 pass = head_dim - n_rot;
    const u32 pass_items = n_heads2 * pass;
    const u32 items = rot_items + pass_items + dim_v;
    for (u32 k = blockIdx.y * blockDim.x + threadIdx.x; k < items; k += gridDim.y * blockDim.x) {
        if (k < rot_items) {
            const u32 h = k / n_pairs;
            const u32 i = k % n_pairs;
            const bool key = h >= n_heads;
            const u32 hh = key ? h - n_heads : h;
            float* xh = key ? x2 + ((u64)row * n_heads2 + hh) * head_dim
                            : x + ((u64)row * n_heads + hh) * head_dim;
            const u32 a = neox ? i : 2 * i;
            const u32 b = neox ? i + n_pairs : 2 * i + 1;
            const float s = sin_sh[i];
            const float c = cos_sh[i];
            const float x0 = xh[a];
            const float x1 = xh[b];
            const float r0 = x0 * c - x1 * s;
            const float r1 = x0 * s + x1 * c;
            xh[a] = r0;
            xh[b] = r1;
            if (key) {
                const u64 base = slot * k_dim + (u64)hh * head_dim;
                kv_put(k_cache, base + a, r0);
                kv_put(k_cache, base + b, r1);
            }
        } else if (k < rot_items + pass_items) {
            const u32 j = k - rot_items;
            const u32 hh = j / pass;
            const u32 d = n_rot + j % pass;
            const float val = x2[((u64)row * n_heads2 + hh) * head_dim + d];
            kv_put(k_cache, slot * k_dim + (u64)hh * head_dim + d, val);
        } else {
            const u32 c = k - rot_items - pass_items;
            kv_put(v_cache, slot * dim_v + c, v[(u64)row * dim_v + c]);
        }
    }
}

#define ROPE_STORE_ENTRY(name, T)                                                               \
    KERNEL void LAUNCH_BOUNDS(256) name(float* x, const i32* positions, const float* freq_factors,                 \
                     u32 has_freq_factors, u32 rows, u32 n_heads, u32 head_dim, u32 n_rot,      \
                     float freq_base, float position_scale, u32 neox, float* x2, u32 n_heads2,  \
                     const float* v, u32 dim_v, T* k_cache, T* v_cache, u32 slots,              \
                     KV_PAGES_PARAMS) {                                                         \
        KERNEL_PROLOGUE();                                                                      \
        rope_store_impl<T>(x, positions, freq_factors, has_freq_factors, rows, n_heads,         \
                           head_dim, n_rot, freq_base, position_scale, neox, x2, n_heads2, v,   \
                           dim_v, k_cache, v_cache, slots, KV_PAGES_ARGS);                      \
    }

// Entry points rope_store_f16 and rope_store_f32.
ROPE_STORE_ENTRY(rope_store_f16, u16)
ROPE_STORE_ENTRY(rope_store_f32, float)

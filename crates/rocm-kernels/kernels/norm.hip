// RMSNorm: out = x / sqrt(mean(x^2) + eps) * w, over vectors of `dim` f32.
//
// Gemma's `(1 + w)` needs no variant: the GGUF converter already stores 1 + w in every Gemma norm
// weight (docs/decode.md), so every norm is this plain multiply.
//
// Both kernels may run in place (out == x): each element is read and written by one thread only,
// and every read that feeds the sum happens before the reduction's barrier / shuffles.
// The arithmetic follows the CPU reference: ss = sum(x^2) / dim; inv = 1 / sqrt(ss + eps);
// out = x * inv * w (only the order of the sum differs).
#include "portability.h"

// One block per vector (row); blockDim.x is any multiple of WARP_SIZE up to 1024.
// Grid: (n_vectors, 1, 1).
KERNEL void LAUNCH_BOUNDS(1024) rms_norm_rows(const float* x, const float* w, float* out, u32 dim, float eps) {
    KERNEL_PROLOGUE();
    __shared__ float scratch[32];
    const u64 base = (u64)blockIdx.x * dim;
    const float* xr = x + base;
    float* orow = out + base;
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * inv * w[i];
}

// One warp per vector, for short vectors (per-head Q/K norm, head_dim 64..256): blockDim.x is a
// multiple of WARP_SIZE and each block handles blockDim.x / WARP_SIZE consecutive vectors.
// Vectors n_vectors .. n_vectors + n_vectors2 are those of a second tensor, normalized in
// place with w2 (a layer's keys beside its queries: one launch for both).
// Grid: (ceil((n_vectors + n_vectors2) / (blockDim.x / WARP_SIZE)), 1, 1).
KERNEL void LAUNCH_BOUNDS(256) rms_norm_warp(const float* x, const float* w, float* out, u32 n_vectors, u32 dim,
                          float eps, float* x2, const float* w2, u32 n_vectors2) {
    KERNEL_PROLOGUE();
    const u32 warps_per_block = blockDim.x / WARP_SIZE;
    u32 vec = blockIdx.x * warps_per_block + threadIdx.x / WARP_SIZE;
    const u32 lane = threadIdx.x % WARP_SIZE;
    // The tests depend on the warp index only, so whole warps leave together and the shuffles
    // below always see every lane of a warp.
    if (vec >= n_vectors + n_vectors2) return;
    if (vec >= n_vectors) {
        vec -= n_vectors;
        x = x2;
        out = x2;
        w = w2;
    }
    const u64 base = (u64)vec * dim;
    const float* xv = x + base;
    float* ov = out + base;
    float ss = 0.0f;
    for (u32 i = lane; i < dim; i += WARP_SIZE) {
        const float v = xv[i];
        ss += v * v;
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (u32 i = lane; i < dim; i += WARP_SIZE) ov[i] = xv[i] * inv * w[i];
}

// The residual add, the norm and the activation quantization of decode in one launch:
// if yw: y[r] = y[r] / sqrt(mean(y[r]^2) + eps) * yw first (written back; Gemma 3's norm of a
// block's output before the residual add); if y: x[r] += y[r] (written back); out[r] = x[r] /
// sqrt(mean(x[r]^2) + eps) * w; if xq: out[r] quantized as quantize_q8 does (per group of 32:
// d = max|v| / 127, q = round(v / d)), into xq[r * dim ..] and xd[r * dim / 32 ..] (dim a
// multiple of 32 then). yw is only given with y.
// One block per row; blockDim.x a multiple of WARP_SIZE up to 1024. Grid: (rows, 1, 1).
//
// A decode row is one block on one multiprocessor, so the kernel is latency-bound: each thread
// loads its values of x, y and the weights up front (all in flight at once) and keeps them in
// registers across the reductions, instead of reading x and w again after them. Rows wider than
// NORM_REG_VALUES * blockDim.x take the loop form.
#define NORM_REG_VALUES 8

KERNEL void LAUNCH_BOUNDS(1024) add_rms_norm_q8(float* x, float* y, const float* yw, const float* w, float* out,
                            i8* xq, float* xd, u32 dim, float eps) {
    KERNEL_PROLOGUE();
    __shared__ float scratch[32];
    const u64 base = (u64)blockIdx.x * dim;
    float* xr = x + base;
    float* yr = y ? y + base : y;
    float* orow = out + base;
    float ss = 0.0f;
    if (dim <= NORM_REG_VALUES * blockDim.x) {
        float v[NORM_REG_VALUES], yv[NORM_REG_VALUES], wv[NORM_REG_VALUES], ywv[NORM_REG_VALUES];
#pragma unroll
        for (int k = 0; k < NORM_REG_VALUES; ++k) {
            const u32 i = threadIdx.x + k * blockDim.x;
            v[k] = yv[k] = wv[k] = ywv[k] = 0.0f;
            if (i < dim) {
                v[k] = xr[i];
                if (yr) yv[k] = yr[i];
                if (yw) ywv[k] = yw[i];
                wv[k] = w[i];
            }
        }
        if (yw) {
            float ssy = 0.0f;
#pragma unroll
            for (int k = 0; k < NORM_REG_VALUES; ++k) ssy += yv[k] * yv[k];
            ssy = block_sum(ssy, scratch);
            const float inv_y = 1.0f / sqrtf(ssy / (float)dim + eps);
#pragma unroll
            for (int k = 0; k < NORM_REG_VALUES; ++k) {
                const u32 i = threadIdx.x + k * blockDim.x;
                if (i < dim) {
                    yv[k] = yv[k] * inv_y * ywv[k];
                    yr[i] = yv[k];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NORM_REG_VALUES; ++k) {
            const u32 i = threadIdx.x + k * blockDim.x;
            if (i < dim) {
                if (yr) {
                    v[k] += yv[k];
                    xr[i] = v[k];
                }
                ss += v[k] * v[k];
            }
        }
        ss = block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < NORM_REG_VALUES; ++k) {
            const u32 i = threadIdx.x + k * blockDim.x;
            if (i < dim) {
                const float o = v[k] * inv * wv[k];
                orow[i] = o;
                if (xq) q8_quantize_lane(o, base + i, xq, xd);
            }
        }
        return;
    }
    if (yw) {
        float ssy = 0.0f;
        for (u32 i = threadIdx.x; i < dim; i += blockDim.x) ssy += yr[i] * yr[i];
        ssy = block_sum(ssy, scratch);
        const float inv_y = 1.0f / sqrtf(ssy / (float)dim + eps);
        for (u32 i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = yr[i] * inv_y * yw[i];
    }
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (yr) {
            v += yr[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * inv * w[i];
        orow[i] = v;
        if (xq) q8_quantize_lane(v, base + i, xq, xd);
    }
}

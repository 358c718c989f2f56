// Elementwise f32 kernels: gated activations, residual add, bias over rows, scaled row
// accumulation, scale, copy, zero.
//
// Every kernel is a grid-stride loop over `n` elements (any grid and block shape works; the host
// uses blocks of 256 threads and caps the grid). Indices are 64-bit so `i += stride` cannot wrap.
// The formulas follow crates/decode/src/backend/ops.rs `gated` and the CPU backend's ops.
#include "portability.h"

#define GRID_STRIDE_LOOP(i, n)                                                    \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n);       \
         i += (u64)gridDim.x * blockDim.x)

// gate = silu(gate) * up = gate / (1 + exp(-gate)) * up.
KERNEL void LAUNCH_BOUNDS(256) gated_silu(float* __restrict__ gate, const float* __restrict__ up, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// gate = gelu_tanh(gate) * up = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up.
KERNEL void LAUNCH_BOUNDS(256) gated_gelu_tanh(float* __restrict__ gate, const float* __restrict__ up, u32 n) {
    KERNEL_PROLOGUE();
    const float sqrt_2_over_pi = 0.7978846f;
    GRID_STRIDE_LOOP(i, n) {
        const float g = gate[i];
        const float inner = sqrt_2_over_pi * (g + 0.044715f * g * g * g);
        gate[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
    }
}

// The gated activation of decode with the next product's activation quantization: one thread
// per value computes gate = act(gate) * up as above (act 0: SiLU, 1: GELU-tanh), writes it,
// and the 32 threads of its group (32 consecutive lanes of one warp) quantize it as
// quantize_q8 does into xq / xd. A thread per value, not per group, keeps the loads coalesced
// and the grid wide enough to reach every multiprocessor: a decode row is only 448 groups.
// Grid: (ceil(32 * n_groups / blockDim.x), 1, 1), blockDim.x a multiple of 32.
KERNEL void LAUNCH_BOUNDS(256) gated_q8(float* __restrict__ gate, const float* __restrict__ up, i8* __restrict__ xq,
                     float* __restrict__ xd, u32 n_groups, u32 act) {
    KERNEL_PROLOGUE();
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // n is a multiple of 32 and so is blockDim.x: whole groups (whole warps on wave32) leave
    // together, and the shuffles below see only lanes of groups that stayed.
    if (k >= (u64)n_groups * 32) return;
    const float sqrt_2_over_pi = 0.7978846f;
    const float x = gate[k];
    float a;
    if (act == 0) {
        a = x / (1.0f + expf(-x));
    } else {
        const float inner = sqrt_2_over_pi * (x + 0.044715f * x * x * x);
        a = 0.5f * x * (1.0f + tanhf(inner));
    }
    const float v = a * up[k];
    gate[k] = v;
    q8_quantize_lane(v, k, xq, xd);
}

// x += y.
KERNEL void LAUNCH_BOUNDS(256) add_inplace(float* __restrict__ x, const float* __restrict__ y, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) x[i] += y[i];
}

// x[r][c] += bias[c] for n = rows * dim elements.
KERNEL void LAUNCH_BOUNDS(256) add_bias_rows(float* __restrict__ x, const float* __restrict__ bias, u32 n, u32 dim) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) x[i] += bias[i % dim];
}

// x += alpha[0] * y, with alpha read from device memory (an MoE routing weight).
KERNEL void LAUNCH_BOUNDS(256) add_scaled(float* __restrict__ x, const float* __restrict__ y,
                       const float* __restrict__ alpha, u32 n) {
    KERNEL_PROLOGUE();
    const float a = alpha[0];
    GRID_STRIDE_LOOP(i, n) x[i] += a * y[i];
}

// x *= s.
KERNEL void LAUNCH_BOUNDS(256) scale_inplace(float* __restrict__ x, float s, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) x[i] *= s;
}

// x = cap * tanh(x / cap): Gemma 2's soft-capped final logits (cap > 0; the host checks).
KERNEL void LAUNCH_BOUNDS(256) softcap_inplace(float* __restrict__ x, float cap, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) x[i] = softcap_logit(x[i], cap);
}

// dst = src (the ranges do not overlap; the host checks).
KERNEL void LAUNCH_BOUNDS(256) copy_f32(const float* __restrict__ src, float* __restrict__ dst, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) dst[i] = src[i];
}

// Busy-waits about `cycles` clock ticks (one thread). A profiler queues it first so the host has
// enqueued a whole step before the device reaches it, and events then time kernels, not the
// host's enqueue rate.
KERNEL void LAUNCH_BOUNDS(1) spin_cycles(u64 cycles) {
    KERNEL_PROLOGUE();
    const u64 start = (u64)clock64();
    while ((u64)clock64() - start < cycles) {
    }
}

// x = 0.
KERNEL void LAUNCH_BOUNDS(256) zero_f32(float* __restrict__ x, u32 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE_LOOP(i, n) x[i] = 0.0f;
}

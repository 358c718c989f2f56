// The one portability header: everything that differs between HIP (hiprtc, ROCm 5.2 .. 7.x)
// and CUDA (NVRTC) lives here, so kernel files use only the common subset plus these names.
//
// The host passes the device's wave size as -DWARP_SIZE=<32|64>; nothing hard-codes it.
// No standard headers are available under either run-time compiler, so the fixed-width
// integer names and the f16 conversions are defined here.
#pragma once

#ifndef WARP_SIZE
#error "WARP_SIZE must be defined by the host from the device's wave size"
#endif
#if WARP_SIZE != 32 && WARP_SIZE != 64
#error "WARP_SIZE must be 32 or 64"
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define DEVICE __device__ __forceinline__
#define KERNEL extern "C" __global__

// A kernel's largest block (the host's table, crate::launch_bounds), declared where it pays.
// On AMD the compiler otherwise budgets registers for 1024 threads, and CI reads the bound back
// from every code object (tests/compile_all.rs). On NVIDIA it is left out: declared there, the
// Llama 3.1 8B shape's tg128 was about 1.5 % lower on an H100
// (docs/benchmark_results/launch-bounds-h100-2026-12-06.md).
#if defined(__CUDACC__) && !defined(__HIP__)
#define LAUNCH_BOUNDS(threads)
#else
#define LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#endif

// LAUNCH_BOUNDS, and on NVIDIA also the fewest blocks a multiprocessor must hold at once, which
// caps the registers a thread may take: for a kernel whose grid should fit in one wave of
// resident blocks, where the compiler would otherwise spend registers on fewer of them. HIP's
// second argument means something else (waves per execution unit), so AMD keeps the plain
// bound.
#if defined(__CUDACC__) && !defined(__HIP__)
#define LAUNCH_BOUNDS_RESIDENT(threads, blocks) __launch_bounds__(threads, blocks)
#else
#define LAUNCH_BOUNDS_RESIDENT(threads, blocks) __launch_bounds__(threads)
#endif

// The first statement of every kernel. On NVIDIA compute capability 9.0 and later the host
// launches kernels with programmatic dependent launch (HIPDECODE_GPU_PDL): a kernel may start
// while the one ahead of it on the stream is still running, so it first waits for that grid to
// finish and its memory to be visible, then lets the next kernel begin its own launch. Every
// thread runs it before any memory access or early return, which keeps the chain of waits
// unbroken. Elsewhere (HIP, older NVIDIA) it is empty and launches are plain.
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KERNEL_PROLOGUE() \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define KERNEL_PROLOGUE() \
    do {                  \
    } while (0)
#endif

// Neither run-time compiler defines INFINITY without <math.h>, which neither can include.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#if defined(__CUDACC__)
// CUDA: shuffles take a mask of participating lanes (all of the warp here).
DEVICE float warp_shfl_xor(float v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, WARP_SIZE);
}
DEVICE int warp_shfl_xor_int(int v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, WARP_SIZE);
}
DEVICE float warp_shfl(float v, int src_lane) {
    return __shfl_sync(0xffffffffu, v, src_lane, WARP_SIZE);
}
#else
// HIP: the mask-free shuffles exist in every ROCm release (the _sync forms only from 6.2 on).
DEVICE float warp_shfl_xor(float v, int lane_mask) { return __shfl_xor(v, lane_mask, WARP_SIZE); }
DEVICE int warp_shfl_xor_int(int v, int lane_mask) { return __shfl_xor(v, lane_mask, WARP_SIZE); }
DEVICE float warp_shfl(float v, int src_lane) { return __shfl(v, src_lane, WARP_SIZE); }
#endif

DEVICE float warp_sum(float v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += warp_shfl_xor(v, m);
    return v;
}

DEVICE float warp_max(float v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v = fmaxf(v, warp_shfl_xor(v, m));
    return v;
}

// Quantizes value v, element i of a row of activations, as quantize_q8 (matvec_q8.hip) does:
// per group of 32 values, d = max|v| / 127 and q = round(v / d), into xq[i] and, from the
// group's first lane, xd[i / 32]. The 32 values of a group are held by 32 consecutive lanes of
// one warp, which all call it together (a wave of 64 holds two groups): the shuffles read only
// lanes of the caller's own group. Every kernel that leaves activations quantized for the next
// product uses this one definition, so all of them round alike.
DEVICE void q8_quantize_lane(float v, u64 i, i8* xq, float* xd) {
    float amax = fabsf(v);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, warp_shfl_xor(amax, m));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    xq[i] = (i8)__float2int_rn(v * id);
    if (i % 32 == 0) xd[i / 32] = d;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one float per warp
// (blockDim.x / WARP_SIZE <= 32, so 32 floats always suffice).
DEVICE float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < n_warps) ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

DEVICE float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < n_warps) ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

// Integer reductions (counts, and 64-bit ordered keys for argmax / selection). A 64-bit value
// crosses lanes as two 32-bit shuffles.
DEVICE u64 warp_shfl_xor_u64(u64 v, int lane_mask) {
    const u32 lo = (u32)warp_shfl_xor_int((int)(u32)v, lane_mask);
    const u32 hi = (u32)warp_shfl_xor_int((int)(u32)(v >> 32), lane_mask);
    return ((u64)hi << 32) | (u64)lo;
}

DEVICE u32 warp_sum_u32(u32 v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += (u32)warp_shfl_xor_int((int)v, m);
    return v;
}

DEVICE u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
        const u64 o = warp_shfl_xor_u64(v, m);
        v = o > v ? o : v;
    }
    return v;
}

// As block_sum, for u32; `scratch` holds 32 u32.
DEVICE u32 block_sum_u32(u32 v, u32* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_sum_u32(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < n_warps) ? scratch[lane] : 0u;
    return warp_sum_u32(v);
}

// As block_max, for u64; `scratch` holds 32 u64.
DEVICE u64 block_max_u64(u64 v, u64* scratch) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = warp_max_u64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < n_warps) ? scratch[lane] : 0ull;
    return warp_max_u64(v);
}

// Four signed 8-bit products summed into c: sum_i a.i8[i] * b.i8[i] + c (dp4a on NVIDIA, sdot4 on
// CDNA and RDNA2, sudot4 with both operands signed on RDNA3/4). Other targets take the
// portable byte loop, which gives the same result.
DEVICE int dot4_i8(int a, int b, int c) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1030__) ||   \
    defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1033__) ||                       \
    defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) ||                   \
    defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) ||                       \
    defined(__gfx1152__) || defined(__gfx1200__) || defined(__gfx1201__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        c += (int)(i8)(a >> (8 * i)) * (int)(i8)(b >> (8 * i));
    }
    return c;
#endif
}

// Gemma 2's soft-capping of a logit: cap * tanh(x / cap), which bounds it to (-cap, cap) and
// is about x for |x| << cap; cap = 0 leaves x as it is. Attention applies it to every scaled
// score before the softmax, and the output layer to the final logits.
// The capped path apart, not inlined: inlined, tanhf's code and registers sat in the attention
// loops of every model, capped or not, and the Llama 3.1 8B shape's tg128 fell from 283 to
// 264 tok/s on an H100; out of line it is 279.5 (launch-bounds-h100-2026-12-06.md). A kernel
// instance per case would take the rest back.
__device__ __noinline__ float softcap_capped(float x, float cap) { return cap * tanhf(x / cap); }
DEVICE float softcap_logit(float x, float cap) { return cap > 0.0f ? softcap_capped(x, cap) : x; }

// A float's bits mapped to an unsigned integer with the same order as Rust's `f32::total_cmp`
// (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN).
DEVICE u32 float_order_key(float v) {
    const u32 b = (u32)__float_as_int(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

DEVICE float float_from_order_key(u32 k) {
    const u32 b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __int_as_float((int)b);
}

// IEEE half -> float with the hardware conversion (exact: every half is a float): neither
// compiler offers its fp16 header without include paths, but both convert natively: PTX's
// cvt.f32.f16 on NVIDIA, clang's _Float16 on AMD. The scale fields of every quantized block
// go through here, so a software conversion (with a loop for subnormals) cost the
// matrix-vector kernels a good share of their issue slots.
#if defined(__CUDACC__)
DEVICE float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#else
DEVICE float f16_to_f32(u16 h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, sizeof(v));
    return (float)v;
}
#endif

// float -> half by bit manipulation, rounding to nearest even (the KV cache's stores; exact
// agreement with the CPU's `half` crate matters more there than speed).
DEVICE u16 f32_to_f16(float f) {
    const u32 x = (u32)__float_as_int(f);
    const u32 sign = (x >> 16) & 0x8000u;
    const u32 abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or NaN
        return (u16)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // overflows to inf
    if (abs < 0x38800000u) {  // result is subnormal or zero
        if (abs < 0x33000000u) return (u16)sign;
        // value = m * 2^(e - 150) and a half subnormal is r * 2^-24, so r = m >> (126 - e).
        const u32 e = abs >> 23;
        const u32 m = (abs & 0x7fffffu) | 0x800000u;
        const u32 shift = 126 - e;
        u32 r = m >> shift;
        const u32 rem = m & ((1u << shift) - 1u);
        const u32 halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1u))) r += 1;
        return (u16)(sign | r);
    }
    u32 r = ((abs >> 13) - (112u << 10));
    const u32 rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r += 1;
    return (u16)(sign | r);
}

// float -> half with the hardware conversion, rounding to nearest even: PTX's cvt.rn.f16.f32
// on NVIDIA, clang's _Float16 (v_cvt_f16_f32 in the default round-to-nearest-even mode, f16
// denormals kept) on AMD. It gives the same bits as f32_to_f16 above for every value except
// NaN, which stays NaN with an unspecified payload. For bulk conversions (weights dequantized
// to f16 for a vendor GEMM), where f32_to_f16's dozen integer operations per value would
// compete with the memory traffic for issue slots.
#if defined(__CUDACC__)
DEVICE u16 f32_to_f16_rn(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
DEVICE u16 f32_to_f16_rn(float f) {
    const _Float16 v = (_Float16)f;
    u16 h;
    __builtin_memcpy(&h, &v, sizeof(h));
    return h;
}
#endif

// Two halves (hardware rounding) in one 32-bit word, the lower column in the low half
// (little-endian memory order).
DEVICE u32 pack_f16x2(float lo, float hi) {
    return (u32)f32_to_f16_rn(lo) | ((u32)f32_to_f16_rn(hi) << 16);
}

// Eight values as halves at dst, which the caller vouches is 16-byte aligned: one 16-byte store.
DEVICE void store8_f16_aligned(u16* dst, const float* v) {
    *(uint4*)dst = make_uint4(pack_f16x2(v[0], v[1]), pack_f16x2(v[2], v[3]),
                              pack_f16x2(v[4], v[5]), pack_f16x2(v[6], v[7]));
}

// 16 bytes from global to shared memory (both 16-byte aligned) without holding registers for
// them where the target can (NVIDIA sm_80 and later: cp.async, in flight while the block
// computes), else a plain copy. copy_async_commit() closes the group of copies issued since the
// last one; copy_async_wait<N>() returns once at most N groups are still in flight, after which
// a __syncthreads() makes this thread's copies visible to the block. Where the copy is plain,
// both are empty and the __syncthreads() alone orders the stores.
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
DEVICE void copy_async16(void* dst_shared, const void* src_global) {
    u32 dst;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
        : "=r"(dst)
        : "l"(dst_shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src_global)
                 : "memory");
}
DEVICE void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
DEVICE void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
DEVICE void copy_async16(void* dst_shared, const void* src_global) {
    *(uint4*)dst_shared = *(const uint4*)src_global;
}
DEVICE void copy_async_commit() {}
template <int N>
DEVICE void copy_async_wait() {}
#endif

DEVICE float bf16_to_f32(u16 h) { return __int_as_float((int)((u32)h << 16)); }

// Argmax and temperature / top-k / top-p sampling over one row of f32 logits, writing the chosen
// token id to out[0], and argmax over many rows at once, writing out[row]. The rules are those
// of the CPU code, so both pick the same token: `argmax` in
// crates/rocm-kernels/src/reference/sampling.rs and `Sampler::sample` in
// crates/decode/src/sampler.rs.
#include "portability.h"

// ---------------------------------------------------------------------------------------------
// Argmax. The CPU loop starts from -inf and takes strictly larger values, so: the first index
// wins ties, NaN never wins, -inf never wins, -0 equals +0, and with no winner the answer is 0.
// Each element becomes a 64-bit key, (order of the value, -0 folded into +0) << 32 |
// (0xffffffff - index): the largest key is the largest value at the smallest index. NaN and -inf
// become key 0, "no winner".

DEVICE u64 argmax_key(float v, u32 i) {
    if (!(v > -INFINITY)) return 0ull;
    if (v == 0.0f) v = __int_as_float(0);  // -0 and +0 compare equal on the CPU
    return ((u64)float_order_key(v) << 32) | (u64)(0xffffffffu - i);
}

// Pass 1: each block reduces a grid-stride share of the row to its best key in partial[block].
// Grid: (n_partial, 1, 1), any block size that is a multiple of WARP_SIZE.
KERNEL void LAUNCH_BOUNDS(256) argmax_partial(const float* __restrict__ x, u32 n, u64* __restrict__ partial) {
    KERNEL_PROLOGUE();
    __shared__ u64 scratch[32];
    u64 best = 0ull;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 k = argmax_key(x[i], (u32)i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = best;
}

// Pass 2: one block reduces the partial keys and writes the index.
KERNEL void LAUNCH_BOUNDS(256) argmax_final(const u64* __restrict__ partial, u32 n_partial, i32* __restrict__ out) {
    KERNEL_PROLOGUE();
    __shared__ u64 scratch[32];
    u64 best = 0ull;
    for (u32 i = threadIdx.x; i < n_partial; i += blockDim.x) {
        const u64 k = partial[i];
        best = k > best ? k : best;
    }
    best = block_max_u64(best, scratch);
    if (threadIdx.x == 0) out[0] = best == 0ull ? 0 : (i32)(0xffffffffu - (u32)best);
}

// Every row of a batched step at once: block r reduces row r (x + r * n) and writes out[r]. One
// launch instead of two per row, and the host reads all the tokens with one copy.
// Grid: (n_rows, 1, 1). Blocks of 1024 threads: a decode step has tens of rows, fewer than the
// device has compute units, so one block's loads in flight bound how fast its row is read, and
// the largest block holds the most. Each thread issues ARGMAX_ROWS_UNROLL independent loads
// before reducing them, for the same reason; rows may be odd in length (no vector loads), so
// the loads are scalar, each warp's coalesced.
#define ARGMAX_ROWS_UNROLL 8

KERNEL void LAUNCH_BOUNDS(1024) argmax_rows(const float* __restrict__ x, u32 n, i32* __restrict__ out) {
    KERNEL_PROLOGUE();
    __shared__ u64 scratch[32];
    const float* __restrict__ row = x + (u64)blockIdx.x * n;
    const u32 stride = blockDim.x;
    u64 best = 0ull;
    u32 i = threadIdx.x;
    // n < 2^31 and stride <= 1024: i + ARGMAX_ROWS_UNROLL * stride does not wrap.
    for (; i + (ARGMAX_ROWS_UNROLL - 1) * stride < n; i += ARGMAX_ROWS_UNROLL * stride) {
        float v[ARGMAX_ROWS_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_ROWS_UNROLL; ++u) v[u] = row[i + u * stride];
#pragma unroll
        for (int u = 0; u < ARGMAX_ROWS_UNROLL; ++u) {
            const u64 k = argmax_key(v[u], i + u * stride);
            best = k > best ? k : best;
        }
    }
    for (; i < n; i += stride) {
        const u64 k = argmax_key(row[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, scratch);
    if (threadIdx.x == 0) out[blockIdx.x] = best == 0ull ? 0 : (i32)(0xffffffffu - (u32)best);
}

// ---------------------------------------------------------------------------------------------
// Sampling. The CPU sampler: candidates are the non-NaN logits (none: token 0); keep the top_k
// largest (0 keeps all); order them by value descending, index ascending; weights
// w = exp((v - max) * inv_t) in f32; keep the shortest prefix whose mass reaches top_p of the
// total; then with the draw u in [0, 1), r = u * (mass of the kept prefix), and the token is the
// first whose running mass exceeds r.
//
// Here the same order is a 64-bit key per candidate, (total order of the value) << 32 |
// (0xffffffff - index): distinct keys, descending key = the CPU order. Nothing is sorted: the
// top-k cut, the top-p cut and the draw are each found by walking down the key 8 bits at a time,
// one pass over the row per digit, keeping a 256-bin histogram (count, and mass where needed) of
// the candidates that share the digits chosen so far. A pass stops early once its bin holds one
// candidate. Masses are fixed point (units of 2^-40, summed with 64-bit integer atomics), so the
// result does not depend on the order threads add in, and weights are exp in double rounded to
// f32, as the CPU's correctly rounded expf gives. One block of up to 1024 threads does it all.

#define SAMPLE_BINS 256
#define SAMPLE_UNIT 1099511627776.0  // 2^40: one unit of weight in the fixed-point masses

struct SampleShared {
    u32 cnt[SAMPLE_BINS];
    u64 mass[SAMPLE_BINS];
    u32 idx[SAMPLE_BINS];  // some candidate of the bin (the only one when cnt == 1)
    u32 red32[32];
    u64 red64[32];
    u64 prefix;     // digits chosen so far (lower digits zero)
    u64 above;      // mass of the candidates ordered before the current bin range
    double target;  // the mass to reach
    u32 need;       // candidates still to take (top-k walk)
    u32 done;
    u32 found;
};

DEVICE u64 sample_key(float v, u32 i) {
    return ((u64)float_order_key(v) << 32) | (u64)(0xffffffffu - i);
}

// Fixed-point weight of a logit: round(f32(exp((v - vmax) * inv_t)) * 2^40). The f32 product is
// the CPU's. Only +inf - +inf is NaN here (vmax is the largest candidate): such a logit weighs 1.
DEVICE u64 sample_weight(float v, float vmax, float inv_t) {
    const float x = (v - vmax) * inv_t;
    if (x != x) return (u64)SAMPLE_UNIT;
    const float w = (float)exp((double)x);
    return (u64)((double)w * SAMPLE_UNIT + 0.5);
}

// One pass over the row: bins (by the 8 bits at `shift`) the candidates whose key is >= lo and
// agrees with `prefix` on the bits above that digit. Starts and ends with a barrier.
DEVICE void sample_histogram(SampleShared& sh, const float* __restrict__ logits, u32 n, int shift,
                             u64 prefix, u64 lo, bool with_mass, float vmax, float inv_t) {
    for (u32 b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x) {
        sh.cnt[b] = 0u;
        sh.mass[b] = 0ull;
    }
    __syncthreads();
    const u64 high = shift >= 56 ? 0ull : (~0ull << (shift + 8));
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = logits[i];
        if (v != v) continue;
        const u64 k = sample_key(v, i);
        if (k < lo || (k & high) != prefix) continue;
        const u32 b = (u32)(k >> shift) & 0xffu;
        atomicAdd(&sh.cnt[b], 1u);
        atomicExch(&sh.idx[b], i);
        if (with_mass) atomicAdd(&sh.mass[b], sample_weight(v, vmax, inv_t));
    }
    __syncthreads();
}

// The smallest key among the k largest candidates (0 < k < number of candidates).
DEVICE u64 sample_top_k_floor(SampleShared& sh, const float* __restrict__ logits, u32 n, u32 k) {
    if (threadIdx.x == 0) {
        sh.prefix = 0ull;
        sh.need = k;
        sh.done = 0u;
    }
    __syncthreads();
    for (int level = 0; level < 8; ++level) {
        const int shift = 56 - 8 * level;
        const u64 prefix = sh.prefix;
        sample_histogram(sh, logits, n, shift, prefix, 0ull, false, 0.0f, 0.0f);
        if (threadIdx.x == 0) {
            // Bins from the largest down: skip whole bins while they hold fewer than we need.
            u32 need = sh.need;
            int b = SAMPLE_BINS - 1;
            for (; b > 0; --b) {
                if (sh.cnt[b] >= need) break;
                need -= sh.cnt[b];
            }
            sh.prefix = prefix | ((u64)b << shift);
            sh.need = need;
            // When the bin holds exactly what is still needed, all of it is in: the cut is the
            // bin's lowest possible key. Keys are distinct, so this happens by the last digit.
            sh.done = sh.cnt[b] == need ? 1u : 0u;
        }
        __syncthreads();
        if (sh.done) break;
    }
    const u64 floor = sh.prefix;
    __syncthreads();  // everyone has read the state before the next walk resets it
    return floor;
}

// Over the candidates with key >= lo in descending key order, the index of the first at which
// the running mass M (including it) reaches `fraction` of their total mass: M >= fraction *
// total, or M > fraction * total when `strict`. If none does (rounding only), the last one, as
// the CPU walk falls back to the last kept token.
DEVICE u32 sample_mass_walk(SampleShared& sh, const float* __restrict__ logits, u32 n, u64 lo,
                            double fraction, bool strict, float vmax, float inv_t) {
    if (threadIdx.x == 0) {
        sh.prefix = 0ull;
        sh.above = 0ull;
        sh.done = 0u;
        sh.found = 0u;
    }
    __syncthreads();
    for (int level = 0; level < 8; ++level) {
        const int shift = 56 - 8 * level;
        const u64 prefix = sh.prefix;
        sample_histogram(sh, logits, n, shift, prefix, lo, true, vmax, inv_t);
        if (threadIdx.x == 0) {
            if (level == 0) {
                u64 total = 0ull;
                for (int b = 0; b < SAMPLE_BINS; ++b) total += sh.mass[b];
                sh.target = fraction * (double)total;
            }
            const double target = sh.target;
            u64 above = sh.above;
            int chosen = -1;
            int last = -1;
            for (int b = SAMPLE_BINS - 1; b >= 0; --b) {
                if (sh.cnt[b] == 0u) continue;
                last = b;
                const double reach = (double)(above + sh.mass[b]);
                if (strict ? reach > target : reach >= target) {
                    chosen = b;
                    break;
                }
                above += sh.mass[b];
            }
            if (chosen < 0) {
                // `last` >= 0: the range always holds a candidate (the row's largest at level 0,
                // the chosen bin's members below).
                chosen = last;
                above -= sh.mass[last];
            }
            sh.prefix = prefix | ((u64)chosen << shift);
            sh.above = above;
            if (sh.cnt[chosen] == 1u) {
                sh.done = 1u;
                sh.found = sh.idx[chosen];
            }
        }
        __syncthreads();
        if (sh.done) break;
    }
    const u32 found = sh.found;
    __syncthreads();
    return found;
}

// One block (blockDim.x a multiple of WARP_SIZE, at most 1024). `draw` points to one f32 in
// [0, 1) (clamped into it); temperature enters as inv_t = 1 / temperature, computed by the host
// as the CPU sampler does. 0 < top_p <= 1; top_k == 0 keeps all.
KERNEL void LAUNCH_BOUNDS(1024) sample_logits(const float* __restrict__ logits, u32 n,
                                                  u32 top_k, float top_p, float inv_t,
                                                  const float* __restrict__ draw,
                                                  i32* __restrict__ out) {
    KERNEL_PROLOGUE();
    __shared__ SampleShared sh;
    u32 count = 0u;
    u64 best = 0ull;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = logits[i];
        if (v != v) continue;
        ++count;
        const u64 k = (u64)float_order_key(v);
        best = k > best ? k : best;
    }
    count = block_sum_u32(count, sh.red32);
    best = block_max_u64(best, sh.red64);
    if (count == 0u) {  // block-uniform
        if (threadIdx.x == 0) out[0] = 0;
        return;
    }
    const float vmax = float_from_order_key((u32)best);
    float u = draw[0];
    if (!(u >= 0.0f)) u = 0.0f;
    const float below_one = __int_as_float(0x3f7fffff);  // 1 - 2^-24
    if (u > below_one) u = below_one;

    u64 lo = 0ull;
    if (top_k != 0u && top_k < count) lo = sample_top_k_floor(sh, logits, n, top_k);
    if (top_p < 1.0f) {
        const u32 last_kept = sample_mass_walk(sh, logits, n, lo, (double)top_p, false, vmax, inv_t);
        lo = sample_key(logits[last_kept], last_kept);
    }
    const u32 token = sample_mass_walk(sh, logits, n, lo, (double)u, true, vmax, inv_t);
    if (threadIdx.x == 0) out[0] = (i32)token;
}

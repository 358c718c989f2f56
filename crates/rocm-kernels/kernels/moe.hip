// Mixture-of-experts: routing, the selected experts' matrix-vector products, and their
// weighted sum. Expert ids and weights stay in device memory between the three kernels, so a
// step needs no host synchronisation.
//
// moe_route_top_k: for each of `rows` rows of `n_expert` router logits, the `k` largest
// logits in descending order (Rust's f32::total_cmp order: -0.0 below +0.0; ties keep the
// lower expert index first, as a stable sort does), written as ids[row * k + s], and
// weights[row * k + s] = softmax over those k logits (max-subtracted, sum, divide: the CPU
// backend's `route_top_k`, which equals a softmax over all experts renormalised over the top k).
// One warp per row; lane l holds experts l, l + WARP_SIZE, ... (n_expert <= 64 * WARP_SIZE).
//
// matvec_id_<format>: for pair p = t * k + s (grid.x = n_tokens * k),
// out[p * rows + r] = sum_c W[ids[p]][r][c] * x[xrow * cols + c], where W is a stacked
// `[n_expert][rows][cols]` tensor, and xrow = p when each slot has its own input (x_per_slot,
// e.g. the down projection) and t otherwise (gate and up read the token's row). An id outside
// [0, n_expert) reads no weights and gives zeros. One warp per output row, as matvec.
//
// moe_weighted_sum: out[t][c] (+)= sum_s weights[t * k + s] * y[(t * k + s) * dim + c], summed
// in slot order from zero, then stored (accumulate == 0) or added to out (accumulate != 0).
//
// moe_group_pairs: the grouped prefill's index, built on the device from the routing, so a
// prefill layer never waits for the host (see the kernel).
//
// Entry points: moe_route_top_k, moe_weighted_sum, moe_group_pairs, and one matvec_id per format
// (FOR_EACH_WEIGHT_FORMAT in quant.h): matvec_id_f32, matvec_id_f16, matvec_id_bf16,
// matvec_id_q4_0, matvec_id_q4_1, matvec_id_q5_0, matvec_id_q5_1, matvec_id_q8_0,
// matvec_id_q4_k, matvec_id_q5_k, matvec_id_q6_k.
#include "portability.h"
#include "quant.h"

// A key whose signed integer order is f32::total_cmp's order on the float bits.
DEVICE i32 total_order_key(float v) {
    const i32 bits = __float_as_int(v);
    return bits < 0 ? (bits ^ 0x7fffffff) : bits;
}

KERNEL void LAUNCH_BOUNDS(256) moe_route_top_k(const float* __restrict__ logits, i32* __restrict__ ids,
                            float* __restrict__ weights, u32 rows, u32 n_expert, u32 k) {
    KERNEL_PROLOGUE();
    const u32 warps = blockDim.x / WARP_SIZE;
    const u32 row = blockIdx.x * warps + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // the whole warp leaves together
    const u32 lane = threadIdx.x % WARP_SIZE;
    const float* lr = logits + (u64)row * n_expert;
    i32* row_ids = ids + (u64)row * k;
    float* row_w = weights + (u64)row * k;
    u64 taken = 0;  // bit i: expert lane + i * WARP_SIZE is already chosen
    for (u32 s = 0; s < k; ++s) {
        i32 best_key = (i32)0x80000000;
        i32 best_idx = 0x7fffffff;  // loses every comparison with a real expert
        u32 li = 0;
        for (u32 e = lane; e < n_expert; e += WARP_SIZE, ++li) {
            if ((taken >> li) & 1ull) continue;
            const i32 key = total_order_key(lr[e]);
            if (key > best_key || (key == best_key && (i32)e < best_idx)) {
                best_key = key;
                best_idx = (i32)e;
            }
        }
        // Butterfly all-reduce: (larger key, then smaller index) is a total order, so every
        // lane ends with the same winner.
#pragma unroll
        for (int m = WARP_SIZE / 2; m > 0; m >>= 1) {
            const i32 other_key = warp_shfl_xor_int(best_key, m);
            const i32 other_idx = warp_shfl_xor_int(best_idx, m);
            if (other_key > best_key || (other_key == best_key && other_idx < best_idx)) {
                best_key = other_key;
                best_idx = other_idx;
            }
        }
        if ((u32)best_idx % WARP_SIZE == lane) taken |= 1ull << ((u32)best_idx / WARP_SIZE);
        if (lane == 0) {
            row_ids[s] = best_idx;
            row_w[s] = lr[best_idx];
        }
    }
    if (lane == 0) {
        float max = -INFINITY;
        for (u32 s = 0; s < k; ++s) max = fmaxf(max, row_w[s]);
        float sum = 0.0f;
        for (u32 s = 0; s < k; ++s) {
            const float e = expf(row_w[s] - max);
            row_w[s] = e;
            sum += e;
        }
        for (u32 s = 0; s < k; ++s) row_w[s] = row_w[s] / sum;
    }
}

template <int FMT>
DEVICE void matvec_id_impl(const u8* __restrict__ w, const i32* __restrict__ ids,
                           const float* __restrict__ x, float* __restrict__ out, u32 n_expert,
                           u32 rows, u32 cols, u32 k, u32 x_per_slot) {
    const u32 pair = blockIdx.x;
    const u32 warps = blockDim.x / WARP_SIZE;
    const u32 r = blockIdx.y * warps + threadIdx.x / WARP_SIZE;
    if (r >= rows) return;  // the whole warp leaves together
    const u32 lane = threadIdx.x % WARP_SIZE;
    float* dst = out + (u64)pair * rows + r;
    const i32 e = ids[pair];
    if (e < 0 || (u32)e >= n_expert) {
        if (lane == 0) *dst = 0.0f;
        return;
    }
    const u64 rb = row_bytes<FMT>(cols);
    const u8* row = w + ((u64)e * rows + r) * rb;
    const u32 xrow = x_per_slot ? pair : pair / k;
    float acc[1];
    warp_row_dot<FMT, 1>(row, x + (u64)xrow * cols, cols, 1, cols, acc);
    if (lane == 0) *dst = acc[0];
}

#define MATVEC_ID_ENTRY(suffix, FMT)                                                           \
    KERNEL void LAUNCH_BOUNDS(256) matvec_id_##suffix(const u8* w, const i32* ids, const float* x, float* out,   \
                                   u32 n_expert, u32 rows, u32 cols, u32 k, u32 x_per_slot) { \
        KERNEL_PROLOGUE();                                                                    \
        matvec_id_impl<FMT>(w, ids, x, out, n_expert, rows, cols, k, x_per_slot);             \
    }
FOR_EACH_WEIGHT_FORMAT(MATVEC_ID_ENTRY)

KERNEL void LAUNCH_BOUNDS(256) moe_weighted_sum(const float* __restrict__ y, const float* __restrict__ weights,
                             float* out, u32 n_tokens, u32 k, u32 dim, u32 accumulate) {
    KERNEL_PROLOGUE();
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n_tokens * dim) return;
    const u64 t = i / dim;
    const u64 c = i % dim;
    float acc = 0.0f;
    for (u32 s = 0; s < k; ++s) {
        const u64 p = t * k + s;
        acc += weights[p] * y[p * dim + c];
    }
    out[i] = accumulate ? out[i] + acc : acc;
}

// moe_group_pairs: for the pairs p = t * k + s routed to ids[p], the slots of the grouped
// prefill (decode's ops::matmul_q8_mma::matmul_grouped), in one block:
// - expert e's pairs take slots starts[e] .. starts[e] + counts[e] - 1, where starts[0] = 0 and
//   starts[e + 1] is starts[e] + counts[e] rounded up to `align`;
// - slot_token[slot] = the pair's token p / k, and 0 for the padding slots;
// - pair_slot[p] = the pair's slot, or -1 for an id outside [0, n_expert) or a slot past
//   `slots` (the scatter back then gives a zero row, as matvec_id does for such an id);
// - tiles: (expert, first slot, rows <= tile_rows) for each expert's rows in order, then
//   (0, 0, 0) up to max_tiles, which the grouped kernel skips; a table longer than max_tiles
//   is cut there.
// Within an expert, pairs take slots in the order their shared-memory atomics land. Each slot's
// row is computed on its own and goes back to its own pair, so the order changes no value.
// n_expert <= MOE_GROUP_MAX_EXPERTS; blockDim.x any multiple of the warp size.
#define MOE_GROUP_MAX_EXPERTS 1024
KERNEL void LAUNCH_BOUNDS(256) moe_group_pairs(const i32* __restrict__ ids, i32* __restrict__ slot_token,
                                               i32* __restrict__ pair_slot, i32* __restrict__ tiles,
                                               u32 pairs, u32 k, u32 n_expert, u32 align, u32 slots,
                                               u32 tile_rows, u32 max_tiles) {
    KERNEL_PROLOGUE();
    __shared__ u32 counts[MOE_GROUP_MAX_EXPERTS];
    __shared__ u32 next[MOE_GROUP_MAX_EXPERTS];
    __shared__ u32 n_tiles;
    for (u32 e = threadIdx.x; e < n_expert; e += blockDim.x) counts[e] = 0;
    for (u32 s = threadIdx.x; s < slots; s += blockDim.x) slot_token[s] = 0;
    __syncthreads();
    for (u32 p = threadIdx.x; p < pairs; p += blockDim.x) {
        const i32 e = ids[p];
        if (e >= 0 && (u32)e < n_expert) atomicAdd(&counts[e], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // Serial over the experts: a few hundred shared-memory reads, against a launch.
        u32 end = 0, t = 0;
        for (u32 e = 0; e < n_expert; ++e) {
            const u32 count = counts[e];
            next[e] = end;
            for (u32 off = 0; off < count && t < max_tiles; off += tile_rows, ++t) {
                tiles[3 * t] = (i32)e;
                tiles[3 * t + 1] = (i32)(end + off);
                tiles[3 * t + 2] = (i32)min(tile_rows, count - off);
            }
            end = (end + count + align - 1) / align * align;
        }
        n_tiles = t;
    }
    __syncthreads();
    for (u32 i = 3 * n_tiles + threadIdx.x; i < 3 * max_tiles; i += blockDim.x) tiles[i] = 0;
    for (u32 p = threadIdx.x; p < pairs; p += blockDim.x) {
        const i32 e = ids[p];
        i32 slot = -1;
        if (e >= 0 && (u32)e < n_expert) {
            const u32 at = atomicAdd(&next[e], 1u);
            if (at < slots) {
                slot = (i32)at;
                slot_token[at] = (i32)(p / k);
            }
        }
        pair_slot[p] = slot;
    }
}

// Stores of new K/V rows into a layer's cache.
//
// The cache has `slots` rows; the row of position p goes to slot p % slots (a ring for
// sliding-window layers, never wrapped for a full-length cache), and the slot's row is found
// through the token's block table when the cache is paged (kv_pages.h). Positions are read from
// device memory. One launch stores up to two tensors (K and V): blockIdx.z picks which, blockIdx.x is
// the row, and y covers the row's `dim` values in blocks of blockDim.x.
#include "portability.h"
#include "kv_pages.h"
#include "kv_q8.h"

DEVICE u32 kv_slot(i32 pos, u32 slots) {
    // Positions are never negative; the unsigned remainder keeps even a bad one in range.
    return (u32)pos % slots;
}

KERNEL void LAUNCH_BOUNDS(256) kv_store_f16(u16* dst0, const float* src0, u32 dim0, u16* dst1, const float* src1,
                         u32 dim1, const i32* positions, u32 rows, u32 slots,
                         KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    const u32 row = blockIdx.x;
    const bool second = blockIdx.z == 1;
    u16* dst = second ? dst1 : dst0;
    const float* src = second ? src1 : src0;
    const u32 dim = second ? dim1 : dim0;
    const u32 c = blockIdx.y * blockDim.x + threadIdx.x;
    if (row >= rows || c >= dim || kv_padding_row(kv_seqs, kv_tables, row)) return;
    const u64 slot = kv_row(kv_pages(KV_PAGES_ARGS, row), kv_slot(positions[row], slots));
    dst[slot * dim + c] = f32_to_f16(src[(u64)row * dim + c]);
}

KERNEL void LAUNCH_BOUNDS(256) kv_store_f32(float* dst0, const float* src0, u32 dim0, float* dst1,
                         const float* src1, u32 dim1, const i32* positions, u32 rows,
                         u32 slots, KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    const u32 row = blockIdx.x;
    const bool second = blockIdx.z == 1;
    float* dst = second ? dst1 : dst0;
    const float* src = second ? src1 : src0;
    const u32 dim = second ? dim1 : dim0;
    const u32 c = blockIdx.y * blockDim.x + threadIdx.x;
    if (row >= rows || c >= dim || kv_padding_row(kv_seqs, kv_tables, row)) return;
    const u64 slot = kv_row(kv_pages(KV_PAGES_ARGS, row), kv_slot(positions[row], slots));
    dst[slot * dim + c] = src[(u64)row * dim + c];
}

// q8_0 (kv_q8.h): a row of dim values is dim / 32 blocks of 34 bytes. Thread c quantizes value
// c; the host makes dim and blockDim.x multiples of 32, so the 32 values of a block are 32
// consecutive lanes of one wave and a block's lanes return (or not) together.
KERNEL void LAUNCH_BOUNDS(256) kv_store_q8_0(u8* dst0, const float* src0, u32 dim0, u8* dst1, const float* src1,
                          u32 dim1, const i32* positions, u32 rows, u32 slots,
                          KV_PAGES_PARAMS) {
    KERNEL_PROLOGUE();
    const u32 row = blockIdx.x;
    const bool second = blockIdx.z == 1;
    u8* dst = second ? dst1 : dst0;
    const float* src = second ? src1 : src0;
    const u32 dim = second ? dim1 : dim0;
    const u32 c = blockIdx.y * blockDim.x + threadIdx.x;
    if (row >= rows || c >= dim || kv_padding_row(kv_seqs, kv_tables, row)) return;
    const u64 slot = kv_row(kv_pages(KV_PAGES_ARGS, row), kv_slot(positions[row], slots));
    const u64 row_bytes = (u64)(dim / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
    u8* block = dst + slot * row_bytes + (u64)(c / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
    kv_q8_store_lane(src[(u64)row * dim + c], c % KV_Q8_BLOCK, block);
}

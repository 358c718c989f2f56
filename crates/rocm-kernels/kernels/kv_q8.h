// The q8_0 K/V cache format on the device: what reference/kv_q8.rs defines on the host.
//
// A row of dim values (a multiple of 32) is dim / 32 blocks of 34 bytes: the scale d as IEEE
// half bits (little endian), then 32 signed bytes q; value i of a block reads back as
// d * q[i]. Blocks are only 2-byte aligned (34 = 2 * 17), so nothing here loads more than two
// bytes at once; the host keeps q8_0 caches at even addresses.
//
// Readers see a cache through KvQ8, a byte base and a value offset with `+` and kv_load as a
// pointer has, so attention's templates take a q8_0 cache as they take a `const u16*`.
// Writers quantize with kv_q8_store_lane, bit for bit as quantize_q8_0 on the host.
#pragma once

#define KV_Q8_BLOCK 32
#define KV_Q8_BLOCK_BYTES 34

struct KvQ8 {
    const u8* base;
    // Values from `base`; a row or head always starts on a block (the host checks that dim
    // and head sizes are multiples of 32), but the arithmetic does not rely on it.
    u64 off;
};

DEVICE KvQ8 kv_q8_at(const u8* base) {
    KvQ8 p;
    p.base = base;
    p.off = 0;
    return p;
}

DEVICE KvQ8 operator+(KvQ8 p, u64 i) {
    p.off += i;
    return p;
}

// The block holding value v.
DEVICE const u8* kv_q8_block(KvQ8 p, u64 v) {
    return p.base + (v / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
}

DEVICE float kv_q8_scale(const u8* block) { return f16_to_f32(*(const u16*)block); }

// One product d * q, as q8_0_value rounds it on the host.
DEVICE float kv_load(KvQ8 p, u64 i) {
    const u64 v = p.off + i;
    const u8* b = kv_q8_block(p, v);
    return kv_q8_scale(b) * (float)(i8)b[2 + v % KV_Q8_BLOCK];
}

// A float's conversion to i8 as Rust's `as i8` does it: NaN to 0, out of range saturated (the
// device's own conversion of an out-of-range value is undefined).
DEVICE i8 kv_q8_saturate(float r) {
    if (r != r) return 0;
    if (r >= 127.0f) return 127;
    if (r <= -128.0f) return -128;
    return (i8)(int)r;
}

// Quantizes x, value j (0..32) of the block at `block`. The 32 values of a block are held by
// 32 consecutive lanes of one wave (an aligned half of a wave of 64), which all call this
// together: the shuffles (masks below 32) read only lanes of the caller's own block. The
// arithmetic is quantize_q8_0_block's: amax = max |x|, d = amax / 127, id = 1 / d (0 where d
// is 0), q = round half away from zero of x * id, d stored rounded to nearest even, with IEEE
// division (no fast-math intrinsics). A block with a NaN or an infinity gets a NaN scale
// (0x7e00) and zeros: max |x| would skip a NaN, so finiteness is reduced separately.
DEVICE void kv_q8_store_lane(float x, u32 j, u8* block) {
    float amax = fabsf(x);
    int bad = ((u32)__float_as_int(x) & 0x7f800000u) == 0x7f800000u ? 1 : 0;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        amax = fmaxf(amax, warp_shfl_xor(amax, m));
        bad |= warp_shfl_xor_int(bad, m);
    }
    i8 q = 0;
    u16 d_bits = 0x7e00u;
    if (!bad) {
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        q = kv_q8_saturate(roundf(x * id));
        d_bits = f32_to_f16(d);
    }
    block[2 + j] = (u8)q;
    if (j == 0) *(u16*)block = d_bits;
}

// Block layouts and in-register dequantization of the ggml weight formats.
//
// Weights are raw GGUF bytes in device memory: a matrix is `rows` rows of `cols` values, each
// row a whole number of blocks (dense formats: one value per "block"). Byte layouts follow
// ggml's `block_*` structs (crates/gguf-loader/src/quant/blocks.rs), and the float operations
// follow gguf-loader's CPU dequantizer, e.g. `(d * sc) * q - (dmin * m)` for Q4_K.
//
// Two ways to read values, for every format:
//   dequant_one<FMT>(row, c)      one value, column c of the row;
//   dequant_run8<FMT>(row, u, v)  the eight values of columns 8u .. 8u+7 (quantized formats:
//                                 a run never straddles a block or a scale group, since every
//                                 block and sub-block size here is a multiple of 8).
// Dense formats (F32, F16, BF16) have rows of any length; quantized rows are whole blocks, so
// their `cols` is a multiple of FMT_BLOCK_ELEMS (32 or 256), hence of 8.
//
// Bytes are read one at a time (or as 16-bit words at even offsets): blocks of 18, 22, 34 or
// 210 bytes leave wider fields unaligned, and clarity comes first here.
#pragma once

// Format codes are ggml's type ids.
#define FMT_F32 0
#define FMT_F16 1
#define FMT_Q4_0 2
#define FMT_Q4_1 3
#define FMT_Q5_0 6
#define FMT_Q5_1 7
#define FMT_Q8_0 8
#define FMT_Q2_K 10
#define FMT_Q3_K 11
#define FMT_Q4_K 12
#define FMT_Q5_K 13
#define FMT_Q6_K 14
#define FMT_IQ4_NL 20
#define FMT_IQ4_XS 23
#define FMT_BF16 30

#define QK_K 256

template <int FMT> struct FormatInfo;
template <> struct FormatInfo<FMT_F32> { enum { elems = 1, bytes = 4, dense = 1 }; };
template <> struct FormatInfo<FMT_F16> { enum { elems = 1, bytes = 2, dense = 1 }; };
template <> struct FormatInfo<FMT_BF16> { enum { elems = 1, bytes = 2, dense = 1 }; };
template <> struct FormatInfo<FMT_Q4_0> { enum { elems = 32, bytes = 18, dense = 0 }; };
template <> struct FormatInfo<FMT_Q4_1> { enum { elems = 32, bytes = 20, dense = 0 }; };
template <> struct FormatInfo<FMT_Q5_0> { enum { elems = 32, bytes = 22, dense = 0 }; };
template <> struct FormatInfo<FMT_Q5_1> { enum { elems = 32, bytes = 24, dense = 0 }; };
template <> struct FormatInfo<FMT_Q8_0> { enum { elems = 32, bytes = 34, dense = 0 }; };
template <> struct FormatInfo<FMT_Q2_K> { enum { elems = QK_K, bytes = 84, dense = 0 }; };
template <> struct FormatInfo<FMT_Q3_K> { enum { elems = QK_K, bytes = 110, dense = 0 }; };
template <> struct FormatInfo<FMT_Q4_K> { enum { elems = QK_K, bytes = 144, dense = 0 }; };
template <> struct FormatInfo<FMT_Q5_K> { enum { elems = QK_K, bytes = 176, dense = 0 }; };
template <> struct FormatInfo<FMT_Q6_K> { enum { elems = QK_K, bytes = 210, dense = 0 }; };
template <> struct FormatInfo<FMT_IQ4_NL> { enum { elems = 32, bytes = 18, dense = 0 }; };
template <> struct FormatInfo<FMT_IQ4_XS> { enum { elems = QK_K, bytes = 136, dense = 0 }; };

// Bytes of one row of `cols` values (cols a multiple of the block size for quantized formats).
template <int FMT> DEVICE u64 row_bytes(u32 cols) {
    return (u64)(cols / FormatInfo<FMT>::elems) * (u64)FormatInfo<FMT>::bytes;
}

// The little-endian 16-bit word at an even byte offset of a block.
DEVICE u16 load_u16(const u8* p) { return *(const u16*)p; }
DEVICE float load_half(const u8* p) { return f16_to_f32(load_u16(p)); }

// ---- Loads. Blocks of 18, 22, 34 and 210 bytes are only 2-byte aligned, so their 32-bit words
// are put together from 16-bit loads; 20- and 24-byte blocks allow 32-bit loads, and the
// 144- and 176-byte k-quant blocks 128-bit loads.
DEVICE u32 load_u32_from_u16(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}
DEVICE u32 load_u32_aligned(const u8* p) { return *(const u32*)p; }

// The 8 bytes at p, an address that is even but maybe not a multiple of 4 (the 210-byte Q6_K
// blocks alternate): two aligned 32-bit loads, and a third only when p is misaligned, shifted
// into place. That is half the load instructions of 16-bit loads, which kept the Q6_K product
// waiting on its load pipeline. A misaligned p reads 2 bytes past its 8, so p + 10 must lie in
// the same buffer: every Q6_K chunk read this way is followed by at least 2 bytes of its own
// block (the last, the scales at 200-207, by d at 208-209).
DEVICE void load8_from_even(const u8* p, u32* out) {
    const u64 addr = (u64)p;
    const u32* w = (const u32*)(addr & ~(u64)3);
    const u32 shift = (u32)(addr & 2) * 8;  // 0 or 16
    const u32 w0 = w[0], w1 = w[1];
    const u32 w2 = shift ? w[2] : 0u;
    out[0] = (u32)((((u64)w1 << 32) | w0) >> shift);
    out[1] = (u32)((((u64)w2 << 32) | w1) >> shift);
}

// ---- Q4_0: d (f16), qs[16]; element j < 16 is the low nibble of qs[j], j >= 16 the high
// nibble of qs[j - 16]; w = d * (q - 8).
DEVICE float dq_q4_0(const u8* b, int j) {
    const float d = load_half(b);
    const u8 byte = b[2 + (j & 15)];
    const int q = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    return d * (float)(q - 8);
}
DEVICE void dq8_q4_0(const u8* b, int j0, float* v) {
    const float d = load_half(b);
    const u8* qs = b + 2 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * (float)(((qs[i] >> shift) & 0x0F) - 8);
}

// ---- Q4_1: d, m (f16), qs[16]; w = d * q + m.
DEVICE float dq_q4_1(const u8* b, int j) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const u8 byte = b[4 + (j & 15)];
    const int q = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    return d * (float)q + m;
}
DEVICE void dq8_q4_1(const u8* b, int j0, float* v) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const u8* qs = b + 4 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * (float)((qs[i] >> shift) & 0x0F) + m;
}

// ---- Q5_0: d (f16), qh (u32, little-endian, bit j is bit 4 of element j), qs[16] as Q4_0;
// w = d * (q - 16).
DEVICE u32 load_qh32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
DEVICE float dq_q5_0(const u8* b, int j) {
    const float d = load_half(b);
    const u32 qh = load_qh32(b + 2);
    const u8 byte = b[6 + (j & 15)];
    const int low = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    const int q = low | (int)(((qh >> j) & 1u) << 4);
    return d * (float)(q - 16);
}
DEVICE void dq8_q5_0(const u8* b, int j0, float* v) {
    const float d = load_half(b);
    const u32 qh = load_qh32(b + 2);
    const u8* qs = b + 6 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = ((qs[i] >> shift) & 0x0F) | (int)(((qh >> (j0 + i)) & 1u) << 4);
        v[i] = d * (float)(q - 16);
    }
}

// ---- Q5_1: d, m (f16), qh (u32), qs[16]; w = d * q + m.
DEVICE float dq_q5_1(const u8* b, int j) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const u32 qh = load_qh32(b + 4);
    const u8 byte = b[8 + (j & 15)];
    const int low = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    const int q = low | (int)(((qh >> j) & 1u) << 4);
    return d * (float)q + m;
}
DEVICE void dq8_q5_1(const u8* b, int j0, float* v) {
    const float d = load_half(b);
    const float m = load_half(b + 2);
    const u32 qh = load_qh32(b + 4);
    const u8* qs = b + 8 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = ((qs[i] >> shift) & 0x0F) | (int)(((qh >> (j0 + i)) & 1u) << 4);
        v[i] = d * (float)q + m;
    }
}

// ---- Q8_0: d (f16), qs[32] (i8); w = q * d.
DEVICE float dq_q8_0(const u8* b, int j) { return (float)(i8)b[2 + j] * load_half(b); }
DEVICE void dq8_q8_0(const u8* b, int j0, float* v) {
    const float d = load_half(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (float)(i8)b[2 + j0 + i] * d;
}

// ---- Q4_K / Q5_K scales: eight 6-bit scales and minimums packed in 12 bytes.
DEVICE void k4_scale_min(const u8* packed, int g, int* sc, int* mn) {
    if (g < 4) {
        *sc = packed[g] & 0x3F;
        *mn = packed[g + 4] & 0x3F;
    } else {
        *sc = (packed[g + 4] & 0x0F) | ((packed[g - 4] >> 6) << 4);
        *mn = (packed[g + 4] >> 4) | ((packed[g] >> 6) << 4);
    }
}

// ---- Q4_K: d, dmin (f16), scales[12], qs[128]. Element i: group g = i / 32 (scale g),
// byte qs[(i / 64) * 32 + i % 32], low nibble for even g, high for odd;
// w = (d * sc) * q - (dmin * m).
DEVICE float dq_q4_k(const u8* b, int i) {
    const int g = i >> 5;
    int sc, mn;
    k4_scale_min(b + 4, g, &sc, &mn);
    const float dl = load_half(b) * (float)sc;
    const float ml = load_half(b + 2) * (float)mn;
    const int q = (b[16 + (i >> 6) * 32 + (i & 31)] >> (4 * (g & 1))) & 0x0F;
    return dl * (float)q - ml;
}
DEVICE void dq8_q4_k(const u8* b, int i0, float* v) {
    const int g = i0 >> 5;
    int sc, mn;
    k4_scale_min(b + 4, g, &sc, &mn);
    const float dl = load_half(b) * (float)sc;
    const float ml = load_half(b + 2) * (float)mn;
    const u8* qs = b + 16 + (i0 >> 6) * 32 + (i0 & 31);
    const int shift = 4 * (g & 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = dl * (float)((qs[k] >> shift) & 0x0F) - ml;
}

// dq8_q4_k with the eight quant bytes read as one 8-byte load: for a block at an 8-byte
// aligned address (the run's bytes then are too, since i0 is a multiple of 8), where the
// byte-wise reads of dq8_q4_k would issue eight loads.
DEVICE void dq8_q4_k_aligned(const u8* b, int i0, float* v) {
    const int g = i0 >> 5;
    int sc, mn;
    k4_scale_min(b + 4, g, &sc, &mn);
    const float dl = load_half(b) * (float)sc;
    const float ml = load_half(b + 2) * (float)mn;
    const uint2 q = *(const uint2*)(b + 16 + (i0 >> 6) * 32 + (i0 & 31));
    const int shift = 4 * (g & 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = dl * (float)((q.x >> (8 * k + shift)) & 0x0F) - ml;
        v[4 + k] = dl * (float)((q.y >> (8 * k + shift)) & 0x0F) - ml;
    }
}

// ---- Q5_K: d, dmin (f16), scales[12], qh[32], qs[128]. As Q4_K, plus bit 4 of element i is
// bit g of qh[i % 32].
DEVICE float dq_q5_k(const u8* b, int i) {
    const int g = i >> 5;
    int sc, mn;
    k4_scale_min(b + 4, g, &sc, &mn);
    const float dl = load_half(b) * (float)sc;
    const float ml = load_half(b + 2) * (float)mn;
    const int low = (b[48 + (i >> 6) * 32 + (i & 31)] >> (4 * (g & 1))) & 0x0F;
    const int high = (b[16 + (i & 31)] >> g) & 1;
    return dl * (float)(low | (high << 4)) - ml;
}
DEVICE void dq8_q5_k(const u8* b, int i0, float* v) {
    const int g = i0 >> 5;
    int sc, mn;
    k4_scale_min(b + 4, g, &sc, &mn);
    const float dl = load_half(b) * (float)sc;
    const float ml = load_half(b + 2) * (float)mn;
    const u8* qs = b + 48 + (i0 >> 6) * 32 + (i0 & 31);
    const u8* qh = b + 16 + (i0 & 31);
    const int shift = 4 * (g & 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int q = ((qs[k] >> shift) & 0x0F) | (((qh[k] >> g) & 1) << 4);
        v[k] = dl * (float)q - ml;
    }
}

// ---- Q6_K: ql[128], qh[64], scales[16] (i8), d (f16). Element i: half h = i / 128, w = i % 128;
// low 4 bits: ql[h * 64 + w % 64] >> (4 * (w / 64)); high 2 bits: qh[h * 32 + w % 32] >>
// (2 * (w / 32)); w = (d * scales[i / 16]) * (q - 32).
DEVICE float dq_q6_k(const u8* b, int i) {
    const int h = i >> 7;
    const int w = i & 127;
    const int low = (b[h * 64 + (w & 63)] >> (4 * (w >> 6))) & 0x0F;
    const int high = (b[128 + h * 32 + (w & 31)] >> (2 * (w >> 5))) & 3;
    const float dl = load_half(b + 208) * (float)(i8)b[192 + (i >> 4)];
    return dl * (float)((low | (high << 4)) - 32);
}
DEVICE void dq8_q6_k(const u8* b, int i0, float* v) {
    const int h = i0 >> 7;
    const int w = i0 & 127;
    const u8* ql = b + h * 64 + (w & 63);
    const u8* qh = b + 128 + h * 32 + (w & 31);
    const int lshift = 4 * (w >> 6);
    const int hshift = 2 * (w >> 5);
    const float dl = load_half(b + 208) * (float)(i8)b[192 + (i0 >> 4)];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int q = ((ql[k] >> lshift) & 0x0F) | (((qh[k] >> hshift) & 3) << 4);
        v[k] = dl * (float)(q - 32);
    }
}

// ---- Q2_K: scales[16] (low nibble: scale, high nibble: minimum, one pair per 16 values),
// qs[64], d, dmin (f16). Element i: chunk n = i / 128, shift 2 * ((i % 128) / 32), byte
// qs[32 n + i % 32]; w = (d * sc) * q - (dmin * m) with (sc, m) = scales[i / 16].
DEVICE float dq_q2_k(const u8* b, int i) {
    const int q = (b[16 + (i >> 7) * 32 + (i & 31)] >> (2 * ((i >> 5) & 3))) & 3;
    const int sc = b[i >> 4];
    const float dl = load_half(b + 80) * (float)(sc & 0x0F);
    const float ml = load_half(b + 82) * (float)(sc >> 4);
    return dl * (float)q - ml;
}
// Eight values of one group of 16 (i0 a multiple of 8), so one scale and minimum.
DEVICE void dq8_q2_k(const u8* b, int i0, float* v) {
    const u8* qs = b + 16 + (i0 >> 7) * 32 + (i0 & 31);
    const int shift = 2 * ((i0 >> 5) & 3);
    const int sc = b[i0 >> 4];
    const float dl = load_half(b + 80) * (float)(sc & 0x0F);
    const float ml = load_half(b + 82) * (float)(sc >> 4);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = dl * (float)((qs[k] >> shift) & 3) - ml;
}

// ---- Q3_K: hmask[32], qs[64], scales[12], d (f16). Element i: the low two bits as Q2_K's
// (bytes qs at 32), the third from bit i / 32 of hmask[i % 32], set meaning "no offset" and
// clear subtracting 4; w = (d * s) * q with s the 6-bit scale i / 16, less 32. Scale k: low
// four bits from scales[k % 8] (high nibble for k >= 8), high two from scales[8 + k % 4] at
// bit 2 * (k / 4).
DEVICE int q3_k_scale(const u8* packed, int k) {
    const int low = (k < 8) ? (packed[k] & 0x0F) : (packed[k - 8] >> 4);
    const int high = (packed[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    return (low | (high << 4)) - 32;
}
DEVICE float dq_q3_k(const u8* b, int i) {
    const int low = (b[32 + (i >> 7) * 32 + (i & 31)] >> (2 * ((i >> 5) & 3))) & 3;
    const int high_clear = ((b[i & 31] >> (i >> 5)) & 1) ^ 1;
    const float dl = load_half(b + 108) * (float)q3_k_scale(b + 96, i >> 4);
    return dl * (float)(low - (high_clear << 2));
}
DEVICE void dq8_q3_k(const u8* b, int i0, float* v) {
    const u8* qs = b + 32 + (i0 >> 7) * 32 + (i0 & 31);
    const u8* hm = b + (i0 & 31);
    const int shift = 2 * ((i0 >> 5) & 3);
    const int bit = i0 >> 5;
    const float dl = load_half(b + 108) * (float)q3_k_scale(b + 96, i0 >> 4);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int high_clear = ((hm[k] >> bit) & 1) ^ 1;
        v[k] = dl * (float)(((qs[k] >> shift) & 3) - (high_clear << 2));
    }
}

// ---- IQ4_NL and IQ4_XS: four-bit indices into one table of 16 non-uniform signed levels
// (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113), held
// as the bytes of two 64-bit constants so that a lookup is a shift, with no memory table.
#define IQ4_LEVELS_LO 0xF6EADDCFBFAD9881ull
#define IQ4_LEVELS_HI 0x7159453526190D01ull
DEVICE int iq4_level(int n) {
    const u64 table = (n < 8) ? IQ4_LEVELS_LO : IQ4_LEVELS_HI;
    return (int)(i8)(u8)(table >> (8 * (n & 7)));
}

// IQ4_NL: d (f16), qs[16] laid out as Q4_0's; w = d * level[q].
DEVICE float dq_iq4_nl(const u8* b, int j) {
    const u8 byte = b[2 + (j & 15)];
    const int n = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    return load_half(b) * (float)iq4_level(n);
}
DEVICE void dq8_iq4_nl(const u8* b, int j0, float* v) {
    const float d = load_half(b);
    const u8* qs = b + 2 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * (float)iq4_level((qs[i] >> shift) & 0x0F);
}

// IQ4_XS: d (f16), scales_h (u16), scales_l[4], qs[128]. Sub-block s of 32 values has the
// 6-bit scale ls = (nibble s of scales_l) | (bits 2s, 2s+1 of scales_h) << 4, its 16 bytes
// qs[16 s ..] laid out as IQ4_NL's; w = (d * (ls - 32)) * level[q].
DEVICE float iq4_xs_scale(const u8* b, int s) {
    const int low = (b[4 + (s >> 1)] >> (4 * (s & 1))) & 0x0F;
    const int high = (load_u16(b + 2) >> (2 * s)) & 3;
    return load_half(b) * (float)((low | (high << 4)) - 32);
}
DEVICE float dq_iq4_xs(const u8* b, int i) {
    const int j = i & 31;
    const u8 byte = b[8 + (i >> 5) * 16 + (j & 15)];
    const int n = (j < 16) ? (byte & 0x0F) : (byte >> 4);
    return iq4_xs_scale(b, i >> 5) * (float)iq4_level(n);
}
DEVICE void dq8_iq4_xs(const u8* b, int i0, float* v) {
    const float dl = iq4_xs_scale(b, i0 >> 5);
    const int j0 = i0 & 31;
    const u8* qs = b + 8 + (i0 >> 5) * 16 + (j0 & 15);
    const int shift = (j0 < 16) ? 0 : 4;
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = dl * (float)iq4_level((qs[k] >> shift) & 0x0F);
}

// ---- Dispatch on the format at compile time.

// Column c of a row that starts at `row`.
template <int FMT> DEVICE float dequant_one(const u8* row, u32 c) {
    if (FMT == FMT_F32) return ((const float*)row)[c];
    if (FMT == FMT_F16) return f16_to_f32(((const u16*)row)[c]);
    if (FMT == FMT_BF16) return bf16_to_f32(((const u16*)row)[c]);
    const u8* b = row + (u64)(c / FormatInfo<FMT>::elems) * FormatInfo<FMT>::bytes;
    const int j = (int)(c % FormatInfo<FMT>::elems);
    switch (FMT) {
        case FMT_Q4_0: return dq_q4_0(b, j);
        case FMT_Q4_1: return dq_q4_1(b, j);
        case FMT_Q5_0: return dq_q5_0(b, j);
        case FMT_Q5_1: return dq_q5_1(b, j);
        case FMT_Q8_0: return dq_q8_0(b, j);
        case FMT_Q4_K: return dq_q4_k(b, j);
        case FMT_Q5_K: return dq_q5_k(b, j);
        case FMT_Q6_K: return dq_q6_k(b, j);
        case FMT_Q2_K: return dq_q2_k(b, j);
        case FMT_Q3_K: return dq_q3_k(b, j);
        case FMT_IQ4_NL: return dq_iq4_nl(b, j);
        case FMT_IQ4_XS: return dq_iq4_xs(b, j);
        default: return 0.0f;
    }
}

// Columns 8u .. 8u+7 of a row into v[0..8]. For dense formats the caller guarantees that all
// eight columns exist.
template <int FMT> DEVICE void dequant_run8(const u8* row, u32 u, float* v) {
    if (FormatInfo<FMT>::dense) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = dequant_one<FMT>(row, u * 8 + k);
        return;
    }
    const u32 c0 = u * 8;
    const u8* b = row + (u64)(c0 / FormatInfo<FMT>::elems) * FormatInfo<FMT>::bytes;
    const int j0 = (int)(c0 % FormatInfo<FMT>::elems);
    switch (FMT) {
        case FMT_Q4_0: dq8_q4_0(b, j0, v); break;
        case FMT_Q4_1: dq8_q4_1(b, j0, v); break;
        case FMT_Q5_0: dq8_q5_0(b, j0, v); break;
        case FMT_Q5_1: dq8_q5_1(b, j0, v); break;
        case FMT_Q8_0: dq8_q8_0(b, j0, v); break;
        case FMT_Q4_K: dq8_q4_k(b, j0, v); break;
        case FMT_Q5_K: dq8_q5_k(b, j0, v); break;
        case FMT_Q6_K: dq8_q6_k(b, j0, v); break;
        case FMT_Q2_K: dq8_q2_k(b, j0, v); break;
        case FMT_Q3_K: dq8_q3_k(b, j0, v); break;
        case FMT_IQ4_NL: dq8_iq4_nl(b, j0, v); break;
        case FMT_IQ4_XS: dq8_iq4_xs(b, j0, v); break;
        default: break;
    }
}

// ---- The warp-level row dot product that matvec and the MoE expert matvec share.
//
// One warp computes acc[t] = sum_c row[c] * x[t * x_stride + c] for t < n_tokens (at most
// MAXT). Quantized rows: each lane takes runs of eight columns, lane-strided, so neighbouring
// lanes read neighbouring weight bytes and activations. Dense rows: lane-strided columns.
// Every lane of the warp must call it (it ends in warp_sum); every lane gets the sums.
// The strided form: this lane starts at column (or run) `first` and steps by `step`, so
// several warps can share one row (matvec); the sum covers this warp's share only.
template <int FMT, int MAXT>
DEVICE void warp_row_dot_strided(const u8* row, const float* x, u64 x_stride, int n_tokens,
                                 u32 cols, float* acc, u32 first, u32 step) {
#pragma unroll
    for (int t = 0; t < MAXT; ++t) acc[t] = 0.0f;
    if (FormatInfo<FMT>::dense) {
        // Unrolled so that several columns' loads are in flight at once: a row of an MoE
        // router (2048 f32) is only eight columns per lane, which one at a time is a chain of
        // memory latencies.
#pragma unroll 4
        for (u32 c = first; c < cols; c += step) {
            const float w = dequant_one<FMT>(row, c);
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                if (t < n_tokens) acc[t] += w * x[(u64)t * x_stride + c];
            }
        }
    } else {
        const u32 runs = cols / 8;
        for (u32 u = first; u < runs; u += step) {
            float v[8];
            dequant_run8<FMT>(row, u, v);
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                if (t < n_tokens) {
                    const float* xt = x + (u64)t * x_stride + (u64)u * 8;
                    float s = 0.0f;
#pragma unroll
                    for (int k = 0; k < 8; ++k) s += v[k] * xt[k];
                    acc[t] += s;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) acc[t] = warp_sum(acc[t]);
}

template <int FMT, int MAXT>
DEVICE void warp_row_dot(const u8* row, const float* x, u64 x_stride, int n_tokens, u32 cols,
                         float* acc) {
    warp_row_dot_strided<FMT, MAXT>(row, x, x_stride, n_tokens, cols, acc,
                                    threadIdx.x % WARP_SIZE, WARP_SIZE);
}

// Instantiates `MACRO(suffix, FMT)` once per supported format: the entry point names of the
// modules are `<op>_<suffix>`, the suffix being ggml's type name in lower case.
#define FOR_EACH_WEIGHT_FORMAT(MACRO) \
    MACRO(f32, FMT_F32)               \
    MACRO(f16, FMT_F16)               \
    MACRO(bf16, FMT_BF16)             \
    MACRO(q4_0, FMT_Q4_0)             \
    MACRO(q4_1, FMT_Q4_1)             \
    MACRO(q5_0, FMT_Q5_0)             \
    MACRO(q5_1, FMT_Q5_1)             \
    MACRO(q8_0, FMT_Q8_0)             \
    MACRO(q4_k, FMT_Q4_K)             \
    MACRO(q5_k, FMT_Q5_K)             \
    MACRO(q6_k, FMT_Q6_K)             \
    MACRO(q2_k, FMT_Q2_K)             \
    MACRO(q3_k, FMT_Q3_K)             \
    MACRO(iq4_nl, FMT_IQ4_NL)         \
    MACRO(iq4_xs, FMT_IQ4_XS)

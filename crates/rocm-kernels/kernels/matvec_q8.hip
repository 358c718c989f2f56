// Matrix-vector products with 8-bit activations, for decode: the fast path.
//
// Activations are quantized once per launch group by quantize_q8: for every 32 values of a
// token's row, one f32 scale d = max|x| / 127 and 32 signed bytes q = round(x / d). The product
// then runs on packed integers: four weight values against four activation bytes per dot4_i8
// (dp4a / sdot4), with the weight block's scales and the activation scale applied once per
// group. Weights stay in their GGUF blocks; nothing is dequantized to memory.
//
// Work split: a row's blocks are cut into PARTS pieces each (a piece is 16 or 32 weight values,
// read with the widest loads the format's alignment allows); the lanes of `warps_per_row`
// warps take pieces lane-strided, so neighbouring lanes read neighbouring bytes. A block of
// threads holds (blockDim.x / WARP_SIZE) / warps_per_row rows. Several warps per row keep
// enough loads in flight when a matrix has few rows; their sums meet in shared memory.
//
// Layout of the quantized activations: xq is [n_tokens][cols] bytes, xd [n_tokens][cols / 32]
// f32; cols is a multiple of 32 for every quantized format (of 256 for the k-quants).
// Entry points: quantize_q8; per format of Q8_FORMATS (ops::matvec_q8), in its order,
// matvec_q8_<fmt> (up to MATVEC_Q8_MAX_TOKENS tokens) and matvec_q8_one_<fmt> (one token),
// then matvec_id_q8_<fmt> and moe_down_q8_<fmt> (below).
#include "portability.h"
#include "quant.h"

#define MATVEC_Q8_MAX_TOKENS 8

// ---- Activation quantization: one thread per value; the 32 threads of a group (32
// consecutive lanes of one warp) find its max with shuffles. A thread per value keeps the
// loads coalesced and spreads a decode row (128 groups for a 4096-wide one) over many
// multiprocessors. Grid: (ceil(32 * n_groups / blockDim.x), 1, 1), blockDim.x a multiple of 32.
KERNEL void LAUNCH_BOUNDS(256) quantize_q8(const float* __restrict__ x, i8* __restrict__ xq, float* __restrict__ xd,
                        u32 n_groups) {
    KERNEL_PROLOGUE();
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // Whole groups (whole warps on wave32) leave together: see gated_q8.
    if (k >= (u64)n_groups * 32) return;
    q8_quantize_lane(x[k], k, xq, xd);
}

// Sum of the four activation bytes of each word: the offset terms (q - 8, the minimums) need it.
#define ONES 0x01010101

// Bits b0..b3 of `bits` to bit 4 of bytes 0..3 (the fifth bit of Q5 values).
DEVICE int bits_to_bit4(u32 bits) {
    return (int)(((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) |
                 ((bits & 8u) << 25));
}

// Every format's piece: Q8Piece<FMT>::PARTS pieces per block; dot<MAXT> adds the piece's
// contribution for each token t < nt to acc[t]. `xq` and `xd` point at token 0's activations
// of this block's first value; token t is at xq + t * xq_stride, xd + t * xd_stride.
template <int FMT> struct Q8Piece;

// Q4_0: piece p (of 2) covers values 8p..8p+7 (low nibbles of qs[8p..8p+7]) and 16+8p..16+8p+7
// (their high nibbles); w = d * (q - 8).
template <> struct Q8Piece<FMT_Q4_0> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        const u32 v0 = load_u32_from_u16(b + 2 + 8 * p);
        const u32 v1 = load_u32_from_u16(b + 6 + 8 * p);
        const int w0 = (int)(v0 & 0x0F0F0F0Fu), w1 = (int)(v1 & 0x0F0F0F0Fu);
        const int w2 = (int)((v0 >> 4) & 0x0F0F0F0Fu), w3 = (int)((v1 >> 4) & 0x0F0F0F0Fu);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride);
            const int x0 = x[2 * p], x1 = x[2 * p + 1], x2 = x[4 + 2 * p], x3 = x[5 + 2 * p];
            const int s = dot4_i8(w3, x3, dot4_i8(w2, x2, dot4_i8(w1, x1, dot4_i8(w0, x0, 0))));
            const int sx =
                dot4_i8(ONES, x3, dot4_i8(ONES, x2, dot4_i8(ONES, x1, dot4_i8(ONES, x0, 0))));
            acc[t] += d * xd[(u64)t * xd_stride] * (float)(s - 8 * sx);
        }
    }
};

// Q4_1: as Q4_0 with w = d * q + m.
template <> struct Q8Piece<FMT_Q4_1> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        const float m = load_half(b + 2);
        const u32 v0 = load_u32_aligned(b + 4 + 8 * p);
        const u32 v1 = load_u32_aligned(b + 8 + 8 * p);
        const int w0 = (int)(v0 & 0x0F0F0F0Fu), w1 = (int)(v1 & 0x0F0F0F0Fu);
        const int w2 = (int)((v0 >> 4) & 0x0F0F0F0Fu), w3 = (int)((v1 >> 4) & 0x0F0F0F0Fu);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride);
            const int x0 = x[2 * p], x1 = x[2 * p + 1], x2 = x[4 + 2 * p], x3 = x[5 + 2 * p];
            const int s = dot4_i8(w3, x3, dot4_i8(w2, x2, dot4_i8(w1, x1, dot4_i8(w0, x0, 0))));
            const int sx =
                dot4_i8(ONES, x3, dot4_i8(ONES, x2, dot4_i8(ONES, x1, dot4_i8(ONES, x0, 0))));
            acc[t] += xd[(u64)t * xd_stride] * (d * (float)s + m * (float)sx);
        }
    }
};

// Q5_0: as Q4_0 plus bit 4 of value j from bit j of qh; w = d * (q - 16).
template <> struct Q8Piece<FMT_Q5_0> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        const u32 qh = load_u32_from_u16(b + 2);
        const u32 v0 = load_u32_from_u16(b + 6 + 8 * p);
        const u32 v1 = load_u32_from_u16(b + 10 + 8 * p);
        const int w0 = (int)(v0 & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (8 * p));
        const int w1 = (int)(v1 & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (8 * p + 4));
        const int w2 = (int)((v0 >> 4) & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (16 + 8 * p));
        const int w3 = (int)((v1 >> 4) & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (20 + 8 * p));
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride);
            const int x0 = x[2 * p], x1 = x[2 * p + 1], x2 = x[4 + 2 * p], x3 = x[5 + 2 * p];
            const int s = dot4_i8(w3, x3, dot4_i8(w2, x2, dot4_i8(w1, x1, dot4_i8(w0, x0, 0))));
            const int sx =
                dot4_i8(ONES, x3, dot4_i8(ONES, x2, dot4_i8(ONES, x1, dot4_i8(ONES, x0, 0))));
            acc[t] += d * xd[(u64)t * xd_stride] * (float)(s - 16 * sx);
        }
    }
};

// Q5_1: as Q5_0 with w = d * q + m.
template <> struct Q8Piece<FMT_Q5_1> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        const float m = load_half(b + 2);
        const u32 qh = load_u32_aligned(b + 4);
        const u32 v0 = load_u32_aligned(b + 8 + 8 * p);
        const u32 v1 = load_u32_aligned(b + 12 + 8 * p);
        const int w0 = (int)(v0 & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (8 * p));
        const int w1 = (int)(v1 & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (8 * p + 4));
        const int w2 = (int)((v0 >> 4) & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (16 + 8 * p));
        const int w3 = (int)((v1 >> 4) & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (20 + 8 * p));
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride);
            const int x0 = x[2 * p], x1 = x[2 * p + 1], x2 = x[4 + 2 * p], x3 = x[5 + 2 * p];
            const int s = dot4_i8(w3, x3, dot4_i8(w2, x2, dot4_i8(w1, x1, dot4_i8(w0, x0, 0))));
            const int sx =
                dot4_i8(ONES, x3, dot4_i8(ONES, x2, dot4_i8(ONES, x1, dot4_i8(ONES, x0, 0))));
            acc[t] += xd[(u64)t * xd_stride] * (d * (float)s + m * (float)sx);
        }
    }
};

// Q8_0: piece p (of 2) covers values 16p..16p+15; w = d * q.
template <> struct Q8Piece<FMT_Q8_0> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        int w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = (int)load_u32_from_u16(b + 2 + 16 * p + 4 * i);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride) + 4 * p;
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) s = dot4_i8(w[i], x[i], s);
            acc[t] += d * xd[(u64)t * xd_stride] * (float)s;
        }
    }
};

// Pieces in two phases. A format with a `Raw` type loads a piece's weight bytes into registers
// (`load`) and multiplies them later (`dot_raw`), so the main loop issues the loads of two
// pieces before it computes either: twice the bytes in flight per lane. The formats without
// one (the 32-value blocks, read by small kernels) call `dot` directly.

// The 6-bit scales and minimums of groups 2j and 2j + 1 (j < 4) from a k4 block's header in
// registers, without a branch or an indexed register array: neighbouring lanes hold different
// j, so a branch on it would run both sides, and an indexed array would go through memory.
// Bytes 0-3 (head.y) are the scales of groups 0-3 and the top two bits of those of 4-7, bytes
// 4-7 (head.z) the same for the minimums, bytes 8-11 (head.w) the low nibbles of groups 4-7's
// scales and (high nibbles) minimums. Each result pair is two bytes: group 2j, then 2j + 1.
DEVICE void k4_scale_min_pair(uint4 head, int j, int* sc0, int* m0, int* sc1, int* m1) {
    const u32 shift = 16u * (u32)(j & 1);
    const u32 a = head.y >> shift, b = head.z >> shift, c = head.w >> shift;
    const bool upper = j >= 2;
    const u32 sc = upper ? ((c & 0x0F0Fu) | ((a >> 2) & 0x3030u)) : (a & 0x3F3Fu);
    const u32 mn = upper ? (((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u)) : (b & 0x3F3Fu);
    *sc0 = (int)(sc & 0xFFu);
    *sc1 = (int)((sc >> 8) & 0xFFu);
    *m0 = (int)(mn & 0xFFu);
    *m1 = (int)((mn >> 8) & 0xFFu);
}

// Q4_K / Q5_K: piece p (of 8) is j = p / 2, h = p % 2: the 16 quant bytes at 32j + 16h hold
// values 64j + 16h + [0, 16) of group 2j (low nibbles) and 64j + 32 + 16h + [0, 16) of group
// 2j + 1 (high nibbles); Q5_K's fifth bits come from qh[16h + k], bit g.
// w = (d * sc) * q - (dmin * m), so the piece's sum is d*sc*sum(q x) - dmin*m*sum(x) per group.
// The 16-byte header (d, dmin, 12 scale bytes) and the quant bytes are 128-bit loads.
struct K4Raw {
    uint4 head;
    uint4 qs;
    uint4 qh;
};

template <int FMT>
DEVICE void k4_load(const u8* b, int p, K4Raw& r) {
    const int j = p >> 1, h = p & 1;
    r.head = *(const uint4*)b;
    r.qs = *(const uint4*)(b + (FMT == FMT_Q5_K ? 48 : 16) + 32 * j + 16 * h);
    if (FMT == FMT_Q5_K) r.qh = *(const uint4*)(b + 16 + 16 * h);
}

template <int FMT, int MAXT>
DEVICE void k4_dot(const K4Raw& r, int p, const i8* xq, const float* xd, u32 xq_stride,
                   u32 xd_stride, int nt, float* acc) {
    const int j = p >> 1, h = p & 1;
    const int g0 = 2 * j, g1 = 2 * j + 1;
    const float d = f16_to_f32((u16)(r.head.x & 0xFFFFu));
    const float dmin = f16_to_f32((u16)(r.head.x >> 16));
    int sc0, m0, sc1, m1;
    k4_scale_min_pair(r.head, j, &sc0, &m0, &sc1, &m1);
    const u32 vw[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
    int lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo[i] = (int)(vw[i] & 0x0F0F0F0Fu);
        hi[i] = (int)((vw[i] >> 4) & 0x0F0F0F0Fu);
    }
    if (FMT == FMT_Q5_K) {
        const u32 hw[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] |= (int)(((hw[i] >> g0) & 0x01010101u) << 4);
            hi[i] |= (int)(((hw[i] >> g1) & 0x01010101u) << 4);
        }
    }
    const float dl0 = d * (float)sc0, ml0 = dmin * (float)m0;
    const float dl1 = d * (float)sc1, ml1 = dmin * (float)m1;
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        if (t >= nt) break;
        const i8* xt = xq + (u64)t * xq_stride;
        const int4 xa = *(const int4*)(xt + 64 * j + 16 * h);
        const int4 xb = *(const int4*)(xt + 64 * j + 32 + 16 * h);
        const int s0 = dot4_i8(lo[3], xa.w, dot4_i8(lo[2], xa.z, dot4_i8(lo[1], xa.y,
                       dot4_i8(lo[0], xa.x, 0))));
        const int s1 = dot4_i8(hi[3], xb.w, dot4_i8(hi[2], xb.z, dot4_i8(hi[1], xb.y,
                       dot4_i8(hi[0], xb.x, 0))));
        const int sx0 = dot4_i8(ONES, xa.w, dot4_i8(ONES, xa.z, dot4_i8(ONES, xa.y,
                        dot4_i8(ONES, xa.x, 0))));
        const int sx1 = dot4_i8(ONES, xb.w, dot4_i8(ONES, xb.z, dot4_i8(ONES, xb.y,
                        dot4_i8(ONES, xb.x, 0))));
        const float* dt = xd + (u64)t * xd_stride;
        acc[t] += dt[g0] * (dl0 * (float)s0 - ml0 * (float)sx0) +
                  dt[g1] * (dl1 * (float)s1 - ml1 * (float)sx1);
    }
}

template <> struct Q8Piece<FMT_Q4_K> {
    enum { PARTS = 8, SPLIT = 1 };
    typedef K4Raw Raw;
    static DEVICE void load(const u8* b, int p, Raw& r) { k4_load<FMT_Q4_K>(b, p, r); }
    template <int MAXT>
    static DEVICE void dot_raw(const Raw& r, int p, const i8* xq, const float* xd, u32 xq_stride,
                               u32 xd_stride, int nt, float* acc) {
        k4_dot<FMT_Q4_K, MAXT>(r, p, xq, xd, xq_stride, xd_stride, nt, acc);
    }
};

template <> struct Q8Piece<FMT_Q5_K> {
    enum { PARTS = 8, SPLIT = 1 };
    typedef K4Raw Raw;
    static DEVICE void load(const u8* b, int p, Raw& r) { k4_load<FMT_Q5_K>(b, p, r); }
    template <int MAXT>
    static DEVICE void dot_raw(const Raw& r, int p, const i8* xq, const float* xd, u32 xq_stride,
                               u32 xd_stride, int nt, float* acc) {
        k4_dot<FMT_Q5_K, MAXT>(r, p, xq, xd, xq_stride, xd_stride, nt, acc);
    }
};

// Q6_K: piece p (of 8) is half h = p / 4 and s = p % 4; it covers values
// h*128 + 32k + 8s + [0, 8) for k < 4: low nibbles of ql[h*64 + 8s ..] (k = 0) and
// ql[h*64 + 32 + 8s ..] (k = 1), high nibbles of the same (k = 2, 3), two high bits from
// qh[h*32 + 8s ..] >> 2k; scale index h*8 + 2k + s/2; w = d * sc * (q - 32). The 210-byte
// blocks are only 2-byte aligned: 16-bit loads.
struct Q6Raw {
    u32 a[2], c[2], e[2];
    u32 sc;  // the four scale bytes this piece uses, one per byte
    u16 d;
};

template <> struct Q8Piece<FMT_Q6_K> {
    enum { PARTS = 8, SPLIT = 1 };
    typedef Q6Raw Raw;
    static DEVICE void load(const u8* b, int p, Raw& r) {
        const int h = p >> 2, s = p & 3;
        const u8* ql = b + h * 64 + 8 * s;
        const u8* qh = b + 128 + h * 32 + 8 * s;
        load8_from_even(ql, r.a);
        load8_from_even(ql + 32, r.c);
        load8_from_even(qh, r.e);
        // Scales h*8 + (s >> 1) + 2k for k < 4: bytes at an even offset (s >> 1 is 0 or 1
        // beside an even base), read as words and picked apart in dot_raw.
        u32 sw[2];
        load8_from_even(b + 192 + h * 8, sw);
        const u32 lo = sw[0], hi = sw[1];
        const int o = s >> 1;
        r.sc = ((lo >> (8 * o)) & 0xFFu) | (((lo >> (16 + 8 * o)) & 0xFFu) << 8) |
               (((hi >> (8 * o)) & 0xFFu) << 16) | (((hi >> (16 + 8 * o)) & 0xFFu) << 24);
        r.d = *(const u16*)(b + 208);
    }
    template <int MAXT>
    static DEVICE void dot_raw(const Raw& r, int p, const i8* xq, const float* xd, u32 xq_stride,
                               u32 xd_stride, int nt, float* acc) {
        const int h = p >> 2, s = p & 3;
        const float d = f16_to_f32(r.d);
        int w[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 low[4] = {r.a[i] & 0x0F0F0F0Fu, r.c[i] & 0x0F0F0F0Fu,
                                (r.a[i] >> 4) & 0x0F0F0F0Fu, (r.c[i] >> 4) & 0x0F0F0F0Fu};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u32 q = low[k] | (((r.e[i] >> (2 * k)) & 0x03030303u) << 4);
                // q - 32 in every byte without borrows between bytes (q < 64).
                w[k][i] = (int)(((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
            }
        }
        float sc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) sc[k] = d * (float)(i8)((r.sc >> (8 * k)) & 0xFFu);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const i8* xt = xq + (u64)t * xq_stride + h * 128 + 8 * s;
            const float* dt = xd + (u64)t * xd_stride + h * 4;
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int* x = (const int*)(xt + 32 * k);
                const int si = dot4_i8(w[k][1], x[1], dot4_i8(w[k][0], x[0], 0));
                sum += sc[k] * dt[k] * (float)si;
            }
            acc[t] += sum;
        }
    }
};

// Four packed weight words against four activation words, and the sum of the sixteen
// activation bytes (for the offsets): the helpers of the formats below.
DEVICE int dot4_words(const int* w, const int* x) {
    return dot4_i8(w[3], x[3], dot4_i8(w[2], x[2], dot4_i8(w[1], x[1], dot4_i8(w[0], x[0], 0))));
}
DEVICE int sum4_words(const int* x) {
    return dot4_i8(ONES, x[3], dot4_i8(ONES, x[2], dot4_i8(ONES, x[1], dot4_i8(ONES, x[0], 0))));
}

// Q2_K: piece p (of 8) is activation group p, values 32p .. 32p+31: chunk n = p / 4, bit pair
// p % 4 of qs[32 n .. 32 n + 31]. Its first 16 values take scale byte 2p, the rest 2p + 1;
// w = (d * sc) * q - (dmin * m).
template <> struct Q8Piece<FMT_Q2_K> {
    enum { PARTS = 8, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const u8* qs = b + 16 + 32 * (p >> 2);
        const int shift = 2 * (p & 3);
        int w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            w[i] = (int)((load_u32_from_u16(qs + 4 * i) >> shift) & 0x03030303u);
        }
        const float d = load_half(b + 80), dmin = load_half(b + 82);
        const int sc0 = b[2 * p], sc1 = b[2 * p + 1];
        const float dl0 = d * (float)(sc0 & 0x0F), ml0 = dmin * (float)(sc0 >> 4);
        const float dl1 = d * (float)(sc1 & 0x0F), ml1 = dmin * (float)(sc1 >> 4);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride) + 8 * p;
            const int s0 = dot4_words(w, x), s1 = dot4_words(w + 4, x + 4);
            const int sx0 = sum4_words(x), sx1 = sum4_words(x + 4);
            acc[t] += xd[(u64)t * xd_stride + p] *
                      (dl0 * (float)s0 - ml0 * (float)sx0 + dl1 * (float)s1 - ml1 * (float)sx1);
        }
    }
};

// Q3_K: piece p as Q2_K's (low bits from qs at byte 32), plus the third bit from bit p of
// hmask[0 .. 31]. The bits make q + 4 in 0..7, so a group's sum is d * s * (sum - 4 sum(x)).
template <> struct Q8Piece<FMT_Q3_K> {
    enum { PARTS = 8, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const u8* qs = b + 32 + 32 * (p >> 2);
        const int shift = 2 * (p & 3);
        int w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 low = (load_u32_from_u16(qs + 4 * i) >> shift) & 0x03030303u;
            const u32 high = (load_u32_from_u16(b + 4 * i) >> p) & 0x01010101u;
            w[i] = (int)(low | (high << 2));
        }
        const float d = load_half(b + 108);
        const float dl0 = d * (float)q3_k_scale(b + 96, 2 * p);
        const float dl1 = d * (float)q3_k_scale(b + 96, 2 * p + 1);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride) + 8 * p;
            const int s0 = dot4_words(w, x) - 4 * sum4_words(x);
            const int s1 = dot4_words(w + 4, x + 4) - 4 * sum4_words(x + 4);
            acc[t] += xd[(u64)t * xd_stride + p] * (dl0 * (float)s0 + dl1 * (float)s1);
        }
    }
};

// The IQ4 levels of the four indices in the low nibbles of `nibbles`' bytes, as four signed
// bytes.
DEVICE int iq4_levels4(u32 nibbles) {
    u32 out = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        out |= (u32)(u8)iq4_level((int)((nibbles >> (8 * k)) & 0x0Fu)) << (8 * k);
    }
    return (int)out;
}

// IQ4_NL: pieces as Q4_0's (values 8p..8p+7 and 16+8p..16+8p+7); w = d * level[q].
template <> struct Q8Piece<FMT_IQ4_NL> {
    enum { PARTS = 2, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const float d = load_half(b);
        const u32 v0 = load_u32_from_u16(b + 2 + 8 * p);
        const u32 v1 = load_u32_from_u16(b + 6 + 8 * p);
        const int w[4] = {iq4_levels4(v0), iq4_levels4(v1), iq4_levels4(v0 >> 4),
                          iq4_levels4(v1 >> 4)};
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride);
            const int xs[4] = {x[2 * p], x[2 * p + 1], x[4 + 2 * p], x[5 + 2 * p]};
            acc[t] += d * xd[(u64)t * xd_stride] * (float)dot4_words(w, xs);
        }
    }
};

// IQ4_XS: piece p (of 8) is sub-block p, values 32p .. 32p+31: low nibbles of qs[16p ..
// 16p+15] then their high nibbles; w = (d * (ls - 32)) * level[q].
template <> struct Q8Piece<FMT_IQ4_XS> {
    enum { PARTS = 8, SPLIT = 0 };
    template <int MAXT>
    static DEVICE void dot(const u8* b, int p, const i8* xq, const float* xd, u32 xq_stride,
                           u32 xd_stride, int nt, float* acc) {
        const u8* qs = b + 8 + 16 * p;
        int w[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 v = load_u32_from_u16(qs + 4 * i);
            w[i] = iq4_levels4(v);
            w[4 + i] = iq4_levels4(v >> 4);
        }
        const float dl = iq4_xs_scale(b, p);
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            const int* x = (const int*)(xq + (u64)t * xq_stride) + 8 * p;
            const int s = dot4_words(w, x) + dot4_words(w + 4, x + 4);
            acc[t] += dl * xd[(u64)t * xd_stride + p] * (float)s;
        }
    }
};

// The main loop over a row's pieces, by kind of piece.
template <int FMT, int MAXT, int SPLIT>
struct Q8RowLoop;

template <int FMT, int MAXT>
struct Q8RowLoop<FMT, MAXT, 0> {
    static DEVICE void run(const u8* row, const i8* xq, const float* xd, u32 cols, int nt,
                           u32 first, u32 step, u32 pieces, float* acc) {
        enum { ELEMS = FormatInfo<FMT>::elems, BYTES = FormatInfo<FMT>::bytes };
        enum { PARTS = Q8Piece<FMT>::PARTS };
#pragma unroll 2
        for (u32 i = first; i < pieces; i += step) {
            const u32 blk = i / PARTS;
            const int part = (int)(i % PARTS);
            Q8Piece<FMT>::template dot<MAXT>(row + (u64)blk * BYTES, part, xq + (u64)blk * ELEMS,
                                             xd + (u64)blk * (ELEMS / 32), cols, cols / 32, nt,
                                             acc);
        }
    }
};

// Pieces a lane loads before it uses any (k-quants): enough bytes in flight per
// multiprocessor to cover the memory latency. Set by the host (-DMATVEC_Q8_DEPTH) from
// HIPDECODE_MATVEC_DEPTH; the summation order is the same for every depth.
#ifndef MATVEC_Q8_DEPTH
#define MATVEC_Q8_DEPTH 2
#endif

template <int FMT, int MAXT>
struct Q8RowLoop<FMT, MAXT, 1> {
    static DEVICE void run(const u8* row, const i8* xq, const float* xd, u32 cols, int nt,
                           u32 first, u32 step, u32 pieces, float* acc) {
        enum { ELEMS = FormatInfo<FMT>::elems, BYTES = FormatInfo<FMT>::bytes };
        enum { PARTS = Q8Piece<FMT>::PARTS, DEPTH = MATVEC_Q8_DEPTH };
        typedef typename Q8Piece<FMT>::Raw Raw;
        for (u32 i = first; i < pieces; i += DEPTH * step) {
            Raw r[DEPTH];
#pragma unroll
            for (int k = 0; k < DEPTH; ++k) {
                const u32 id = i + k * step;
                if (id < pieces) Q8Piece<FMT>::load(row + (u64)(id / PARTS) * BYTES, (int)(id % PARTS), r[k]);
            }
#pragma unroll
            for (int k = 0; k < DEPTH; ++k) {
                const u32 id = i + k * step;
                if (id < pieces) {
                    Q8Piece<FMT>::template dot_raw<MAXT>(
                        r[k], (int)(id % PARTS), xq + (u64)(id / PARTS) * ELEMS,
                        xd + (u64)(id / PARTS) * (ELEMS / 32), cols, cols / 32, nt, acc);
                }
            }
        }
    }
};

template <int FMT, int MAXT>
DEVICE void matvec_q8_impl(const u8* __restrict__ w, const i8* __restrict__ xq,
                           const float* __restrict__ xd, float* __restrict__ out, u32 rows,
                           u32 cols, u32 n_tokens, u32 warps_per_row, const u8* w2,
                           float* out2, u32 rows2) {
    __shared__ float partial[32][MAXT];
    // grid.y = 2: a second matrix of the same format and width over the same activations
    // (gate and up, Q and K) in the same launch.
    if (blockIdx.y == 1) {
        w = w2;
        out = out2;
        rows = rows2;
    }
    const u32 lane = threadIdx.x % WARP_SIZE;
    const u32 warp = threadIdx.x / WARP_SIZE;
    const u32 rows_per_block = (blockDim.x / WARP_SIZE) / warps_per_row;
    const u32 r = blockIdx.x * rows_per_block + warp / warps_per_row;
    const u32 sub = warp % warps_per_row;
    const int nt = (int)n_tokens;
    enum { ELEMS = FormatInfo<FMT>::elems, PARTS = Q8Piece<FMT>::PARTS };
    const u32 pieces = (cols / ELEMS) * PARTS;
    if (warps_per_row == 1) {
        // A warp per row, striding over the rows when the host capped the grid (fewer, longer-
        // lived blocks: see HIPDECODE_MATVEC_BLOCKS_PER_SM); no shared memory, no barrier.
        for (u32 rr = r; rr < rows; rr += gridDim.x * rows_per_block) {
            float acc[MAXT];
#pragma unroll
            for (int t = 0; t < MAXT; ++t) acc[t] = 0.0f;
            const u8* row = w + (u64)rr * row_bytes<FMT>(cols);
            Q8RowLoop<FMT, MAXT, Q8Piece<FMT>::SPLIT>::run(row, xq, xd, cols, nt, lane, WARP_SIZE,
                                                           pieces, acc);
#pragma unroll
            for (int t = 0; t < MAXT; ++t) acc[t] = warp_sum(acc[t]);
            if (lane == 0) {
#pragma unroll
                for (int t = 0; t < MAXT; ++t) {
                    if (t < nt) out[(u64)t * rows + rr] = acc[t];
                }
            }
        }
        return;  // warps_per_row is the same for the whole block: no thread waits below
    }
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) acc[t] = 0.0f;
    if (r < rows) {
        const u8* row = w + (u64)r * row_bytes<FMT>(cols);
        Q8RowLoop<FMT, MAXT, Q8Piece<FMT>::SPLIT>::run(row, xq, xd, cols, nt,
                                                       sub * WARP_SIZE + lane,
                                                       warps_per_row * WARP_SIZE, pieces, acc);
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < MAXT; ++t) partial[warp][t] = acc[t];
    }
    __syncthreads();
    if (sub == 0 && lane == 0 && r < rows) {
#pragma unroll
        for (int t = 0; t < MAXT; ++t) {
            if (t >= nt) break;
            float s = 0.0f;
            for (u32 k = 0; k < warps_per_row; ++k) s += partial[warp + k][t];
            out[(u64)t * rows + r] = s;
        }
    }
}

#define MATVEC_Q8_ENTRY(suffix, FMT)                                                            \
    KERNEL void LAUNCH_BOUNDS(128) matvec_q8_##suffix(const u8* w, const i8* xq, const float* xd, float* out,      \
                                   u32 rows, u32 cols, u32 n_tokens, u32 warps_per_row,         \
                                   const u8* w2, float* out2, u32 rows2) {                      \
        KERNEL_PROLOGUE();                                                                      \
        matvec_q8_impl<FMT, MATVEC_Q8_MAX_TOKENS>(w, xq, xd, out, rows, cols, n_tokens,         \
                                                  warps_per_row, w2, out2, rows2);              \
    }                                                                                           \
    KERNEL void LAUNCH_BOUNDS(128) matvec_q8_one_##suffix(const u8* w, const i8* xq, const float* xd, float* out,  \
                                       u32 rows, u32 cols, u32 n_tokens, u32 warps_per_row,     \
                                       const u8* w2, float* out2, u32 rows2) {                  \
        KERNEL_PROLOGUE();                                                                      \
        matvec_q8_impl<FMT, 1>(w, xq, xd, out, rows, cols, 1, warps_per_row, w2, out2, rows2);  \
    }

// The same product for routed experts (moe.hip's matvec_id, on 8-bit activations): for pair
// p = t * k + s (grid.x), out[p * rows + r] = W[ids[p]][r] . x[xrow], xrow = p when each slot
// has its own input (x_per_slot) and t otherwise; one warp per row (grid.y * warps + warp);
// an id outside [0, n_expert) reads no weights and gives zeros. The ids stay on the device.
// grid.z = 2: a second stack of the same format and shape (an MoE's up beside its gate) into
// out2, in the same launch.
template <int FMT>
DEVICE void matvec_id_q8_impl(const u8* __restrict__ w, const i32* __restrict__ ids,
                              const i8* __restrict__ xq, const float* __restrict__ xd,
                              float* __restrict__ out, u32 n_expert, u32 rows, u32 cols, u32 k,
                              u32 x_per_slot, const u8* w2, float* out2) {
    if (blockIdx.z == 1) {
        w = w2;
        out = out2;
    }
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
    enum { ELEMS = FormatInfo<FMT>::elems, PARTS = Q8Piece<FMT>::PARTS };
    const u8* row = w + ((u64)e * rows + r) * row_bytes<FMT>(cols);
    const u32 xrow = x_per_slot ? pair : pair / k;
    float acc[1] = {0.0f};
    Q8RowLoop<FMT, 1, Q8Piece<FMT>::SPLIT>::run(row, xq + (u64)xrow * cols,
                                                xd + (u64)xrow * (cols / 32), cols, 1, lane,
                                                WARP_SIZE, (cols / ELEMS) * PARTS, acc);
    acc[0] = warp_sum(acc[0]);
    if (lane == 0) *dst = acc[0];
}

#define MATVEC_ID_Q8_ENTRY(suffix, FMT)                                                        \
    KERNEL void LAUNCH_BOUNDS(128) matvec_id_q8_##suffix(const u8* w, const i32* ids, const i8* xq, const float* xd, \
                                      float* out, u32 n_expert, u32 rows, u32 cols, u32 k,     \
                                      u32 x_per_slot, const u8* w2, float* out2) {             \
        KERNEL_PROLOGUE();                                                                     \
        matvec_id_q8_impl<FMT>(w, ids, xq, xd, out, n_expert, rows, cols, k, x_per_slot, w2,   \
                               out2);                                                          \
    }

// The down projection of decode's MoE with the routing weights applied, in one launch instead
// of a product and a weighted sum: for token t (grid.x) and output row r (grid.y),
// out[t * rows + r] = sum_s weights[p] * (W[ids[p]][r] . x[p]), p = t * k + s, with x
// quantized per slot. A block is k warps, warp s taking slot s of row r as matvec_id_q8 would
// (so as many warps read weights as before); the k products meet in shared memory and are added
// in slot order, as moe_weighted_sum adds them. An id outside [0, n_expert) adds nothing.
// blockDim.x = k * WARP_SIZE <= 1024.
template <int FMT>
DEVICE void moe_down_q8_impl(const u8* __restrict__ w, const i32* __restrict__ ids,
                             const float* __restrict__ weights, const i8* __restrict__ xq,
                             const float* __restrict__ xd, float* __restrict__ out, u32 n_expert,
                             u32 rows, u32 cols, u32 k) {
    __shared__ float slot_sum[32];
    const u32 t = blockIdx.x;
    const u32 r = blockIdx.y;
    const u32 s = threadIdx.x / WARP_SIZE;
    const u32 lane = threadIdx.x % WARP_SIZE;
    const u32 p = t * k + s;
    const i32 e = ids[p];
    float acc[1] = {0.0f};
    if (e >= 0 && (u32)e < n_expert) {
        enum { ELEMS = FormatInfo<FMT>::elems, PARTS = Q8Piece<FMT>::PARTS };
        const u8* row = w + ((u64)e * rows + r) * row_bytes<FMT>(cols);
        Q8RowLoop<FMT, 1, Q8Piece<FMT>::SPLIT>::run(row, xq + (u64)p * cols,
                                                    xd + (u64)p * (cols / 32), cols, 1, lane,
                                                    WARP_SIZE, (cols / ELEMS) * PARTS, acc);
    }
    acc[0] = warp_sum(acc[0]);
    if (lane == 0) slot_sum[s] = acc[0];
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (u32 j = 0; j < k; ++j) total += weights[t * k + j] * slot_sum[j];
        out[(u64)t * rows + r] = total;
    }
}

#define MOE_DOWN_Q8_ENTRY(suffix, FMT)                                                         \
    KERNEL void LAUNCH_BOUNDS(16 * WARP_SIZE) moe_down_q8_##suffix(const u8* w, const i32* ids, const float* weights,        \
                                     const i8* xq, const float* xd, float* out, u32 n_expert,  \
                                     u32 rows, u32 cols, u32 k) {                              \
        KERNEL_PROLOGUE();                                                                     \
        moe_down_q8_impl<FMT>(w, ids, weights, xq, xd, out, n_expert, rows, cols, k);          \
    }

// moe_down_q8_<fmt> and matvec_id_q8_<fmt> for every format of Q8_FORMATS (ops::matvec_q8),
// in its order.
MOE_DOWN_Q8_ENTRY(q4_0, FMT_Q4_0)
MOE_DOWN_Q8_ENTRY(q4_1, FMT_Q4_1)
MOE_DOWN_Q8_ENTRY(q5_0, FMT_Q5_0)
MOE_DOWN_Q8_ENTRY(q5_1, FMT_Q5_1)
MOE_DOWN_Q8_ENTRY(q8_0, FMT_Q8_0)
MOE_DOWN_Q8_ENTRY(q4_k, FMT_Q4_K)
MOE_DOWN_Q8_ENTRY(q5_k, FMT_Q5_K)
MOE_DOWN_Q8_ENTRY(q6_k, FMT_Q6_K)
MOE_DOWN_Q8_ENTRY(q2_k, FMT_Q2_K)
MOE_DOWN_Q8_ENTRY(q3_k, FMT_Q3_K)
MOE_DOWN_Q8_ENTRY(iq4_nl, FMT_IQ4_NL)
MOE_DOWN_Q8_ENTRY(iq4_xs, FMT_IQ4_XS)

MATVEC_ID_Q8_ENTRY(q4_0, FMT_Q4_0)
MATVEC_ID_Q8_ENTRY(q4_1, FMT_Q4_1)
MATVEC_ID_Q8_ENTRY(q5_0, FMT_Q5_0)
MATVEC_ID_Q8_ENTRY(q5_1, FMT_Q5_1)
MATVEC_ID_Q8_ENTRY(q8_0, FMT_Q8_0)
MATVEC_ID_Q8_ENTRY(q4_k, FMT_Q4_K)
MATVEC_ID_Q8_ENTRY(q5_k, FMT_Q5_K)
MATVEC_ID_Q8_ENTRY(q6_k, FMT_Q6_K)
MATVEC_ID_Q8_ENTRY(q2_k, FMT_Q2_K)
MATVEC_ID_Q8_ENTRY(q3_k, FMT_Q3_K)
MATVEC_ID_Q8_ENTRY(iq4_nl, FMT_IQ4_NL)
MATVEC_ID_Q8_ENTRY(iq4_xs, FMT_IQ4_XS)

MATVEC_Q8_ENTRY(q4_0, FMT_Q4_0)
MATVEC_Q8_ENTRY(q4_1, FMT_Q4_1)
MATVEC_Q8_ENTRY(q5_0, FMT_Q5_0)
MATVEC_Q8_ENTRY(q5_1, FMT_Q5_1)
MATVEC_Q8_ENTRY(q8_0, FMT_Q8_0)
MATVEC_Q8_ENTRY(q4_k, FMT_Q4_K)
MATVEC_Q8_ENTRY(q5_k, FMT_Q5_K)
MATVEC_Q8_ENTRY(q6_k, FMT_Q6_K)
MATVEC_Q8_ENTRY(q2_k, FMT_Q2_K)
MATVEC_Q8_ENTRY(q3_k, FMT_Q3_K)
MATVEC_Q8_ENTRY(iq4_nl, FMT_IQ4_NL)
MATVEC_Q8_ENTRY(iq4_xs, FMT_IQ4_XS)

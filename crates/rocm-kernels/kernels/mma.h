// The matrix-core layer: one 16 x 16 x 16 product of f16 tiles into f32, per warp, with one
// implementation per ISA family behind the same names, so kernel bodies are written once.
//
//   MmaAcc c;            this lane's share of a 16 x 16 f32 tile C (MMA_ACC values)
//   mma_zero(c);
//   mma_16x16x16(c, a, lda, b, ldb);
//                        c += A . B^T, A and B 16 x 16 f16 tiles in shared memory, both stored
//                        with k contiguous: A[m][k] at a[m * lda + k], B[n][k] at b[n * ldb + k]
//                        (lda, ldb in halves, multiples of 4; a, b 8-byte aligned)
//   mma_m(i), mma_n(i)   the row m and column n of C that this lane's value c.v[i] holds
//
// Every lane of the warp calls these together (they are warp-wide operations). The host picks
// the variant (rocm_kernels::mma) and passes -DMMA_VARIANT=<id>; each variant checks here that
// the target has its instructions, so a wrong choice is a compile error, not wrong numbers:
//   MMA_SIMT (0)         any target: each lane sums its MMA_ACC values from shared memory;
//   MMA_NV_SYNC (1)      NVIDIA sm_80 and later: two mma.sync.m16n8k16 per tile;
//   MMA_AMD_MFMA (2)     AMD CDNA (gfx908, gfx90a, gfx94x, gfx950; wave64):
//                        v_mfma_f32_16x16x16f16;
//   MMA_AMD_WMMA11 (3)   AMD RDNA 3 (gfx11; wave32): v_wmma_f32_16x16x16_f16;
//   MMA_AMD_WMMA12 (4)   AMD RDNA 4 (gfx12; wave32): the gfx12 form of the same instruction.
// Debian's hiprtc compiles neither WMMA variant (it crashes on gfx1100 and knows no gfx12), and
// no AMD variant has run on an AMD GPU yet, so all three are off unless asked for
// (HIPDECODE_MMA=native).
//
// Products are exact in f32 for f16 inputs; only the order of the additions differs between
// variants (about 1e-7 of the magnitude of a 16-term sum).
#pragma once

#define MMA_SIMT 0
#define MMA_NV_SYNC 1
#define MMA_AMD_MFMA 2
#define MMA_AMD_WMMA11 3
#define MMA_AMD_WMMA12 4

#ifndef MMA_VARIANT
#error "MMA_VARIANT must be defined by the host (rocm_kernels::mma picks it from the device)"
#endif

#if MMA_VARIANT == MMA_NV_SYNC
#if !(defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#error "MMA_NV_SYNC needs NVIDIA compute capability 8.0 or later"
#endif
#elif MMA_VARIANT == MMA_AMD_MFMA
#if !(defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
      defined(__gfx942__) || defined(__gfx950__)) ||                                             \
    WARP_SIZE != 64
#error "MMA_AMD_MFMA needs an AMD CDNA target (gfx908, gfx90a, gfx94x, gfx950) in wave64"
#endif
#elif MMA_VARIANT == MMA_AMD_WMMA11
#if !(defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) ||                 \
      defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) ||                 \
      defined(__gfx1152__)) ||                                                                \
    WARP_SIZE != 32
#error "MMA_AMD_WMMA11 needs an AMD RDNA 3 target (gfx11) in wave32"
#endif
#elif MMA_VARIANT == MMA_AMD_WMMA12
#if !(defined(__gfx1200__) || defined(__gfx1201__)) || WARP_SIZE != 32
#error "MMA_AMD_WMMA12 needs an AMD RDNA 4 target (gfx12) in wave32"
#endif
#elif MMA_VARIANT != MMA_SIMT
#error "unknown MMA_VARIANT"
#endif

// Values of the 16 x 16 accumulator tile per lane: 8 in a wave of 32, 4 in a wave of 64.
#define MMA_ACC (256 / WARP_SIZE)

struct MmaAcc {
    float v[MMA_ACC];
};

DEVICE void mma_zero(MmaAcc& c) {
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) c.v[i] = 0.0f;
}

DEVICE u32 mma_lane() { return threadIdx.x % WARP_SIZE; }

// Two halves of a k-contiguous tile as one 32-bit word (the lower k in the low half).
DEVICE u32 mma_load2(const u16* p) { return *(const u32*)p; }

#if MMA_VARIANT == MMA_NV_SYNC
// m16n8k16, A row-major and B column-major (k contiguous in both, as stored here). Lane l is in
// group g = l / 4 at position t = l % 4; see PTX's "Matrix fragments for mma.m16n8k16".
//   A: {(g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)} pairs of k;
//   B: {(k 2t, n g), (k 2t + 8, n g)} pairs of k;
//   C: (g, 2t + j) and (g + 8, 2t + j) for j < 2.
// The 16 columns of n are two such products, v[0..3] for n < 8 and v[4..7] for n >= 8.
DEVICE void mma_16x16x16(MmaAcc& c, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 g = mma_lane() / 4, t = mma_lane() % 4;
    const u32 a0 = mma_load2(a + g * lda + 2 * t);
    const u32 a1 = mma_load2(a + (g + 8) * lda + 2 * t);
    const u32 a2 = mma_load2(a + g * lda + 2 * t + 8);
    const u32 a3 = mma_load2(a + (g + 8) * lda + 2 * t + 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u16* bn = b + (g + 8 * h) * ldb;
        const u32 b0 = mma_load2(bn + 2 * t);
        const u32 b1 = mma_load2(bn + 2 * t + 8);
        float* d = c.v + 4 * h;
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
DEVICE u32 mma_m(int i) { return mma_lane() / 4 + 8 * ((i >> 1) & 1); }
DEVICE u32 mma_n(int i) { return 8 * (i >> 2) + 2 * (mma_lane() % 4) + (i & 1); }

#elif MMA_VARIANT == MMA_AMD_MFMA
typedef _Float16 mma_half4 __attribute__((ext_vector_type(4)));
typedef float mma_float4 __attribute__((ext_vector_type(4)));
// v_mfma_f32_16x16x16f16 in wave64: lane l holds A[l % 16][4 (l / 16) + j] and
// B[4 (l / 16) + j][l % 16] for j < 4 (so four consecutive k of row m, and of row n of the
// stored B), and C[4 (l / 16) + i][l % 16].
DEVICE mma_half4 mma_load4(const u16* p) {
    mma_half4 v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
}
// c += A . B^T from this lane's operand registers.
DEVICE void mma_product(MmaAcc& c, const mma_half4& av, const mma_half4& bv) {
    mma_float4 d = {c.v[0], c.v[1], c.v[2], c.v[3]};
    d = __builtin_amdgcn_mfma_f32_16x16x16f16(av, bv, d, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.v[i] = d[i];
}
DEVICE void mma_16x16x16(MmaAcc& c, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 r = mma_lane() % 16, k = 4 * (mma_lane() / 16);
    mma_product(c, mma_load4(a + r * lda + k), mma_load4(b + r * ldb + k));
}
DEVICE u32 mma_m(int i) { return 4 * (mma_lane() / 16) + (u32)i; }
DEVICE u32 mma_n(int i) { return mma_lane() % 16; }

#elif MMA_VARIANT == MMA_AMD_WMMA11 || MMA_VARIANT == MMA_AMD_WMMA12
typedef float mma_float8 __attribute__((ext_vector_type(8)));
#if MMA_VARIANT == MMA_AMD_WMMA11
// gfx11 wave32: lanes l and l + 16 both hold all 16 k of A's row l % 16 and of B's column
// l % 16; C[2 i + l / 16][l % 16].
typedef _Float16 mma_halfk __attribute__((ext_vector_type(16)));
#define MMA_K_PER_LANE 16
#define MMA_K_OFFSET 0
#else
// gfx12 wave32: lane l holds k 8 (l / 16) .. + 7 of A's row l % 16 and of B's column l % 16;
// C[8 (l / 16) + i][l % 16].
typedef _Float16 mma_halfk __attribute__((ext_vector_type(8)));
#define MMA_K_PER_LANE 8
#define MMA_K_OFFSET (8 * (mma_lane() / 16))
#endif
DEVICE mma_halfk mma_loadk(const u16* p) {
    mma_halfk v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
}
// c += A . B^T from this lane's operand registers.
DEVICE void mma_product(MmaAcc& c, const mma_halfk& av, const mma_halfk& bv) {
    mma_float8 d;
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = c.v[i];
#if MMA_VARIANT == MMA_AMD_WMMA11
    d = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(av, bv, d);
#else
    d = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(av, bv, d);
#endif
#pragma unroll
    for (int i = 0; i < 8; ++i) c.v[i] = d[i];
}
DEVICE void mma_16x16x16(MmaAcc& c, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u32 r = mma_lane() % 16;
    mma_product(c, mma_loadk(a + r * lda + MMA_K_OFFSET),
                mma_loadk(b + r * ldb + MMA_K_OFFSET));
}
#if MMA_VARIANT == MMA_AMD_WMMA11
DEVICE u32 mma_m(int i) { return 2 * (u32)i + mma_lane() / 16; }
#else
DEVICE u32 mma_m(int i) { return 8 * (mma_lane() / 16) + (u32)i; }
#endif
DEVICE u32 mma_n(int i) { return mma_lane() % 16; }

#else  // MMA_SIMT
// Lane l holds C[l / 16 + i (WARP_SIZE / 16)][l % 16]: a column of C per lane, a different
// column for each of the 16 lanes that share a row, so B's reads are spread over the banks.
DEVICE u32 mma_m(int i) { return mma_lane() / 16 + (u32)i * (WARP_SIZE / 16); }
DEVICE u32 mma_n(int i) { return mma_lane() % 16; }
DEVICE void mma_16x16x16(MmaAcc& c, const u16* a, u32 lda, const u16* b, u32 ldb) {
    const u16* bn = b + mma_n(0) * ldb;
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) {
        const u16* am = a + mma_m(i) * lda;
        float s = c.v[i];
#pragma unroll
        for (int k = 0; k < 16; ++k) s += f16_to_f32(am[k]) * f16_to_f32(bn[k]);
        c.v[i] = s;
    }
}
#endif

// ---- Operands held for several products, and rows reduced in registers (attention_mma.hip):
//
//   MmaA a;              a 16 x 16 f16 A operand ready for products (registers where the
//                        variant can, else a place in shared memory)
//   mma_load_a(a, p, lda);
//                        A[m][k] from p[m * lda + k] in shared memory (lda in halves, a multiple
//                        of 8; p 16-byte aligned); it must stay there while `a` is used where
//                        the variant keeps only its place (MMA_SIMT)
//   mma_a_from_acc(a, c, scratch, ld);
//                        C rounded to f16 as an A operand (C's columns become A's k). scratch is
//                        this warp's 16 x ld halves of shared memory (ld a multiple of 8,
//                        16-byte aligned), written where registers do not suffice; it must stay
//                        unchanged while `a` is used
//   mma_16x16x16_a(c, a, b, ldb);     c += A . B^T, B[n][k] at b[n * ldb + k] (k contiguous)
//   mma_16x16x16_a_kn(c, a, b, ldb);  c += A . B, B[k][n] at b[k * ldb + n] (n contiguous)
//                        (ldb a multiple of 8, b 16-byte aligned, both in shared memory)
//
//   MMA_A_IN_REGS        1 where MmaA holds the operand itself, 0 where only its place
//   MMA_A_FROM_ACC_SCRATCH
//                        1 where mma_a_from_acc writes its scratch, 0 where it needs none
//   MMA_ROWS             how many rows of C this lane holds values of
//   mma_row_of(i)        which of them (0 .. MMA_ROWS - 1) value c.v[i] lies in
//   mma_row(r)           the tile row of the lane's r-th
//   mma_row_max(x), mma_row_sum(x)
//                        over the lanes holding values of the same rows (x one per row of the
//                        lane's, the same r on every lane): the row's max or sum on each of them

// Makes shared-memory stores of this warp visible to its other lanes: the operand exchange
// through scratch.
#if defined(__CUDACC__)
DEVICE void mma_warp_sync() { __syncwarp(); }
#else
// A wave runs in lockstep and its LDS operations complete in order; the barrier keeps the
// compiler from moving loads above the stores.
DEVICE void mma_warp_sync() { __builtin_amdgcn_wave_barrier(); }
#endif

#if MMA_VARIANT == MMA_NV_SYNC
// The 32-bit shared-memory address ldmatrix takes.
DEVICE u32 mma_smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// Four 8 x 8 matrices of halves: lane l gives the address of row l % 8 of matrix l / 8 and gets
// matrix i's (row g, columns 2t, 2t + 1) in r[i], or with `trans` (rows 2t, 2t + 1, column g).
DEVICE void mma_ldmatrix4(u32 (&r)[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(row)));
}
DEVICE void mma_ldmatrix4_trans(u32 (&r)[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(row)));
}
#define MMA_A_IN_REGS 1
#define MMA_A_FROM_ACC_SCRATCH 0
struct MmaA {
    u32 r[4];  // a0..a3 of m16n8k16 (see mma_16x16x16)
};
DEVICE void mma_load_a(MmaA& a, const u16* p, u32 lda) {
    // Matrices: rows 0-7 / 8-15 by (l / 8) % 2, k 0-7 / 8-15 by l / 16: a0, a1, a2, a3.
    const u32 l = mma_lane(), i = l / 8;
    mma_ldmatrix4(a.r, p + (l % 8 + 8 * (i & 1)) * lda + 8 * (i >> 1));
}
// The accumulator's (g, 2t + j) and (g + 8, 2t + j) for columns n < 8 and n >= 8 are exactly
// the A fragment's pairs of k, so no lane exchange is needed.
DEVICE void mma_a_from_acc(MmaA& a, const MmaAcc& c, u16*, u32) {
    a.r[0] = pack_f16x2(c.v[0], c.v[1]);
    a.r[1] = pack_f16x2(c.v[2], c.v[3]);
    a.r[2] = pack_f16x2(c.v[4], c.v[5]);
    a.r[3] = pack_f16x2(c.v[6], c.v[7]);
}
DEVICE void mma_nv_16x8x16(float* d, const MmaA& a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b0), "r"(b1));
}
DEVICE void mma_16x16x16_a(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    // Matrices: n 0-7 / 8-15 by l / 16, k 0-7 / 8-15 by (l / 8) % 2: b0, b1 of each half of n.
    const u32 l = mma_lane(), i = l / 8;
    u32 r[4];
    mma_ldmatrix4(r, b + (l % 8 + 8 * (i >> 1)) * ldb + 8 * (i & 1));
    mma_nv_16x8x16(c.v, a, r[0], r[1]);
    mma_nv_16x8x16(c.v + 4, a, r[2], r[3]);
}
DEVICE void mma_16x16x16_a_kn(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    // Transposed matrices: k 0-7 / 8-15 by (l / 8) % 2, n 0-7 / 8-15 by l / 16.
    const u32 l = mma_lane(), i = l / 8;
    u32 r[4];
    mma_ldmatrix4_trans(r, b + (l % 8 + 8 * (i & 1)) * ldb + 8 * (i >> 1));
    mma_nv_16x8x16(c.v, a, r[0], r[1]);
    mma_nv_16x8x16(c.v + 4, a, r[2], r[3]);
}
// Lane (g, t) holds rows g and g + 8; the four lanes of group g share them.
#define MMA_ROWS 2
DEVICE int mma_row_of(int i) { return (i >> 1) & 1; }
DEVICE u32 mma_row(int r) { return mma_lane() / 4 + 8 * (u32)r; }
#define MMA_ROW_LANES 4

#else
// The other variants hold one value per row of C (MMA_ACC rows), and the 16 lanes of a
// quarter (or half) of the wave share them: mma_m(i) depends on the lane only through l / 16.
#define MMA_ROWS MMA_ACC
DEVICE int mma_row_of(int i) { return i; }
DEVICE u32 mma_row(int r) { return mma_m(r); }
#define MMA_ROW_LANES 16
#define MMA_A_FROM_ACC_SCRATCH 1

#if MMA_VARIANT == MMA_SIMT
#define MMA_A_IN_REGS 0
struct MmaA {
    const u16* p;
    u32 ld;
};
DEVICE void mma_load_a(MmaA& a, const u16* p, u32 lda) {
    a.p = p;
    a.ld = lda;
}
DEVICE void mma_16x16x16_a(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    mma_16x16x16(c, a.p, a.ld, b, ldb);
}
DEVICE void mma_16x16x16_a_kn(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    const u16* bn = b + mma_n(0);
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) {
        const u16* am = a.p + mma_m(i) * a.ld;
        float s = c.v[i];
#pragma unroll
        for (int k = 0; k < 16; ++k) s += f16_to_f32(am[k]) * f16_to_f32(bn[k * ldb]);
        c.v[i] = s;
    }
}
#else
// MFMA and WMMA: the A operand's registers as mma_16x16x16 loads them, and B's gathered from
// an n-contiguous tile one half at a time (k differs between a lane's halves).
#if MMA_VARIANT == MMA_AMD_MFMA
#define MMA_A_HALVES 4
#define MMA_A_K0 (4 * (mma_lane() / 16))
typedef mma_half4 mma_a_vec;
#else
#define MMA_A_HALVES MMA_K_PER_LANE
#define MMA_A_K0 MMA_K_OFFSET
typedef mma_halfk mma_a_vec;
#endif
#define MMA_A_IN_REGS 1
struct MmaA {
    mma_a_vec v;
};
DEVICE void mma_load_a(MmaA& a, const u16* p, u32 lda) {
    __builtin_memcpy(&a.v, p + (mma_lane() % 16) * lda + MMA_A_K0, sizeof(a.v));
}
DEVICE mma_a_vec mma_b_col(const u16* b, u32 ldb) {
    u16 h[MMA_A_HALVES];
#pragma unroll
    for (int j = 0; j < MMA_A_HALVES; ++j) h[j] = b[(MMA_A_K0 + j) * ldb + mma_lane() % 16];
    mma_a_vec v;
    __builtin_memcpy(&v, h, sizeof(v));
    return v;
}
// B stored [n][k] is laid out in the lanes as A is ([m][k]).
DEVICE void mma_16x16x16_a(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    MmaA bt;
    mma_load_a(bt, b, ldb);
    mma_product(c, a.v, bt.v);
}
DEVICE void mma_16x16x16_a_kn(MmaAcc& c, const MmaA& a, const u16* b, u32 ldb) {
    mma_product(c, a.v, mma_b_col(b, ldb));
}
#endif

// Through this warp's scratch: each lane stores its values of C, then the operand is loaded
// as from any tile.
DEVICE void mma_a_from_acc(MmaA& a, const MmaAcc& c, u16* scratch, u32 ld) {
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) scratch[mma_m(i) * ld + mma_n(i)] = f32_to_f16_rn(c.v[i]);
    mma_warp_sync();
    mma_load_a(a, scratch, ld);
}
#endif

DEVICE float mma_row_max(float x) {
#pragma unroll
    for (int m = 1; m < MMA_ROW_LANES; m <<= 1) x = fmaxf(x, warp_shfl_xor(x, m));
    return x;
}
DEVICE float mma_row_sum(float x) {
#pragma unroll
    for (int m = 1; m < MMA_ROW_LANES; m <<= 1) x += warp_shfl_xor(x, m);
    return x;
}

// ---- 8-bit integer products, for the products of quantized weights by 8-bit activations
// (matmul_q8_mma.hip):
//
//   MmaAccI c;           this lane's share of a 16 x 16 i32 tile C (MMA_ACC values), at the
//                        same (mma_m(i), mma_n(i)) places as MmaAcc's
//   mma_zero_i(c);
//   mma_i8_16x16x16(c, a, lda, b, ldb);
//                        c += A . B^T, A and B 16 x 16 tiles of signed bytes in shared memory,
//                        k contiguous: A[m][k] at a[m * lda + k], B[n][k] at b[n * ldb + k]
//                        (lda, ldb in bytes, multiples of 16; a, b 16-byte aligned)
//
//   mma_i8_16x16x32(c, a, lda, b, ldb);
//                        the same over 32 values of k (a, b as above): one instruction where
//                        the ISA has a 32-deep integer form (NVIDIA m16n8k32, CDNA 3), two
//                        16-deep ones elsewhere
//
// Sums are exact in i32 whatever the variant (at most 32 products of 128 * 128 each).
struct MmaAccI {
    int v[MMA_ACC];
};

DEVICE void mma_zero_i(MmaAccI& c) {
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) c.v[i] = 0;
}

#if MMA_VARIANT == MMA_NV_SYNC
// m16n8k16 with s8 operands: lane (g, t) holds A's bytes (g, 4t..4t+3) and (g + 8, 4t..4t+3),
// B's (k 4t..4t+3, n g), and C as in the f16 product (PTX's "Matrix fragments for mma.m16n8k16"
// with .s8).
DEVICE void mma_i8_16x16x16(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 g = mma_lane() / 4, t = mma_lane() % 4;
    const u32 a0 = *(const u32*)(a + g * lda + 4 * t);
    const u32 a1 = *(const u32*)(a + (g + 8) * lda + 4 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 b0 = *(const u32*)(b + (g + 8 * h) * ldb + 4 * t);
        int* d = c.v + 4 * h;
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
            "{%0, %1, %2, %3};"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a0), "r"(a1), "r"(b0));
    }
}

// m16n8k32 with s8 operands: lane (g, t) holds A's bytes (g, 4t..4t+3), (g + 8, 4t..4t+3),
// (g, 16+4t..) and (g + 8, 16+4t..), and B's (k 4t..4t+3, n g) and (k 16+4t.., n g); C as above.
DEVICE void mma_i8_16x16x32(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 g = mma_lane() / 4, t = mma_lane() % 4;
    const u32 a0 = *(const u32*)(a + g * lda + 4 * t);
    const u32 a1 = *(const u32*)(a + (g + 8) * lda + 4 * t);
    const u32 a2 = *(const u32*)(a + g * lda + 16 + 4 * t);
    const u32 a3 = *(const u32*)(a + (g + 8) * lda + 16 + 4 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const i8* bn = b + (g + 8 * h) * ldb;
        const u32 b0 = *(const u32*)(bn + 4 * t);
        const u32 b1 = *(const u32*)(bn + 16 + 4 * t);
        int* d = c.v + 4 * h;
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
#define MMA_HAS_I8_K32 1

#elif MMA_VARIANT == MMA_AMD_MFMA
typedef int mma_int4 __attribute__((ext_vector_type(4)));
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__)
// CDNA 3 has no 16 x 16 x 16 integer form; v_mfma_i32_16x16x32_i8 takes lane l's eight bytes
// A[l % 16][8 (l / 16) + j] (and B's likewise), so the lanes of k 16..31 give zeros.
DEVICE void mma_i8_16x16x16(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 r = mma_lane() % 16, q = mma_lane() / 16;
    long av = 0, bv = 0;
    if (q < 2) {
        av = *(const long*)(a + r * lda + 8 * q);
        bv = *(const long*)(b + r * ldb + 8 * q);
    }
    mma_int4 d = {c.v[0], c.v[1], c.v[2], c.v[3]};
    d = __builtin_amdgcn_mfma_i32_16x16x32_i8(av, bv, d, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.v[i] = d[i];
}
// The same instruction with every lane's eight bytes in use.
DEVICE void mma_i8_16x16x32(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 r = mma_lane() % 16, q = mma_lane() / 16;
    const long av = *(const long*)(a + r * lda + 8 * q);
    const long bv = *(const long*)(b + r * ldb + 8 * q);
    mma_int4 d = {c.v[0], c.v[1], c.v[2], c.v[3]};
    d = __builtin_amdgcn_mfma_i32_16x16x32_i8(av, bv, d, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.v[i] = d[i];
}
#define MMA_HAS_I8_K32 1
#else
// v_mfma_i32_16x16x16i8 (gfx908, gfx90a): lane l holds four bytes A[l % 16][4 (l / 16) + j]
// (and B's likewise); C as in the f16 product.
DEVICE void mma_i8_16x16x16(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 r = mma_lane() % 16, k = 4 * (mma_lane() / 16);
    const int av = *(const int*)(a + r * lda + k);
    const int bv = *(const int*)(b + r * ldb + k);
    mma_int4 d = {c.v[0], c.v[1], c.v[2], c.v[3]};
    d = __builtin_amdgcn_mfma_i32_16x16x16i8(av, bv, d, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.v[i] = d[i];
}
#endif

#elif MMA_VARIANT == MMA_AMD_WMMA11 || MMA_VARIANT == MMA_AMD_WMMA12
typedef int mma_int8 __attribute__((ext_vector_type(8)));
#if MMA_VARIANT == MMA_AMD_WMMA11
// gfx11: lanes l and l + 16 hold all 16 bytes of A's row l % 16 (and B's); C as the f16 one.
typedef int mma_intk __attribute__((ext_vector_type(4)));
#define MMA_I8_K_OFFSET 0
#else
// gfx12: lane l holds the eight bytes 8 (l / 16) .. + 7 of A's row l % 16 (and B's).
typedef int mma_intk __attribute__((ext_vector_type(2)));
#define MMA_I8_K_OFFSET (8 * (mma_lane() / 16))
#endif
DEVICE void mma_i8_16x16x16(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const u32 r = mma_lane() % 16;
    mma_intk av, bv;
    __builtin_memcpy(&av, a + r * lda + MMA_I8_K_OFFSET, sizeof(av));
    __builtin_memcpy(&bv, b + r * ldb + MMA_I8_K_OFFSET, sizeof(bv));
    mma_int8 d;
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = c.v[i];
    // Both operands signed, no clamping.
#if MMA_VARIANT == MMA_AMD_WMMA11
    d = __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(true, av, true, bv, d, false);
#else
    d = __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32_gfx12(true, av, true, bv, d, false);
#endif
#pragma unroll
    for (int i = 0; i < 8; ++i) c.v[i] = d[i];
}

#else  // MMA_SIMT
DEVICE void mma_i8_16x16x16(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    const int* bn = (const int*)(b + mma_n(0) * ldb);
#pragma unroll
    for (int i = 0; i < MMA_ACC; ++i) {
        const int* am = (const int*)(a + mma_m(i) * lda);
        int s = c.v[i];
#pragma unroll
        for (int k = 0; k < 4; ++k) s = dot4_i8(am[k], bn[k], s);
        c.v[i] = s;
    }
}
#endif

#ifndef MMA_HAS_I8_K32
// Two 16-deep products where the ISA has no 32-deep integer form (or it is not used here).
DEVICE void mma_i8_16x16x32(MmaAccI& c, const i8* a, u32 lda, const i8* b, u32 ldb) {
    mma_i8_16x16x16(c, a, lda, b, ldb);
    mma_i8_16x16x16(c, a + 16, lda, b + 16, ldb);
}
#endif

//! Matrix products that read quantized weights directly: the CPU backend's hot loops.
//!
//! `out[t][r] = dot(W[r], x[t])` for a weight matrix stored as ggml blocks. Two flavours share
//! one block walk:
//! - [`Precision::Exact`] dequantizes one block into a stack array and multiplies by the f32
//!   activations. It is the reference the GPU kernels are compared against.
//! - [`Precision::Fast`] quantizes every activation row once to 8 bits ([`Q16Row`]) and takes
//!   integer dot products against the unpacked weight integers, applying the block scales once
//!   per group of 16; Q8_0 weights skip unpacking altogether.
//!
//! Rows are split across the rayon pool. Several activation rows (a prefill batch) are walked
//! together so a weight block is unpacked once per tile of tokens, which is why prefill costs
//! less per token than decode. The loops are written over fixed-size arrays so LLVM vectorizes
//! them; on x86-64 the same code is also compiled for AVX2 and chosen at run time.

use crate::quant::{self, Q16Row, Unpacked, ACT_BLOCK, GROUP, MAX_BLOCK};
use gguf_loader::GgmlType;
use rayon::prelude::*;

/// How activations enter the weight products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// 16-bit integer activations, integer dot products: the fast path.
    #[default]
    Fast,
    /// f32 activations against exactly dequantized weights: the reference path.
    Exact,
}

/// Tokens walked together per weight block.
const TILE: usize = 4;

/// A weight matrix as the kernels see it: `rows` rows of `cols` elements in `format`, one of
/// [`quant::SUPPORTED`] (backends check it when loading the weight).
#[derive(Clone, Copy)]
pub struct MatrixRef<'a> {
    pub format: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl MatrixRef<'_> {
    fn row_bytes(&self) -> usize {
        self.cols / self.format.block_size() * self.format.type_size()
    }
}

/// `out[t * rows + r] = W[r] · x[t * cols ..]` for `n_tok` activation rows.
///
/// `act_q` is scratch for the quantized activations; it is filled here when needed.
pub fn matmul(
    w: MatrixRef<'_>,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    precision: Precision,
    act_q: &mut Vec<Q16Row>,
) {
    debug_assert_eq!(x.len(), n_tok * w.cols);
    debug_assert_eq!(out.len(), n_tok * w.rows);
    debug_assert_eq!(w.data.len(), w.rows * w.row_bytes());
    let use_int = precision == Precision::Fast && !quant::is_float(w.format);
    if use_int {
        act_q.resize_with(n_tok, Q16Row::default);
        for (row, xr) in act_q.iter_mut().zip(x.chunks_exact(w.cols)) {
            row.quantize_from(xr);
        }
    }
    let acts = Acts {
        x,
        act_q: if use_int { &act_q[..n_tok] } else { &[] },
        cols: w.cols,
    };
    // Enough chunks to balance two to a few cores, few enough that scheduling is cheap.
    let threads = rayon::current_num_threads().max(1);
    let chunk_rows = w.rows.div_ceil(threads * 4).max(16);
    if n_tok == 1 {
        out.par_chunks_mut(chunk_rows)
            .enumerate()
            .for_each(|(c, dst)| {
                let r0 = c * chunk_rows;
                rows_dispatch(w, &acts, r0, dst.len(), 0, 1, dst);
            });
        return;
    }
    // Several tokens: each chunk fills a [n_tok][chunk] tile, scattered afterwards.
    let n_chunks = w.rows.div_ceil(chunk_rows);
    let tiles: Vec<Vec<f32>> = (0..n_chunks)
        .into_par_iter()
        .map(|c| {
            let r0 = c * chunk_rows;
            let nr = chunk_rows.min(w.rows - r0);
            let mut tile = vec![0f32; n_tok * nr];
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = TILE.min(n_tok - t0);
                rows_dispatch(w, &acts, r0, nr, t0, nt, &mut tile[t0 * nr..(t0 + nt) * nr]);
                t0 += nt;
            }
            tile
        })
        .collect();
    for (c, tile) in tiles.iter().enumerate() {
        let r0 = c * chunk_rows;
        let nr = tile.len() / n_tok;
        for t in 0..n_tok {
            out[t * w.rows + r0..t * w.rows + r0 + nr].copy_from_slice(&tile[t * nr..(t + 1) * nr]);
        }
    }
}

struct Acts<'a> {
    x: &'a [f32],
    act_q: &'a [Q16Row],
    cols: usize,
}

/// Rows `r0..r0+nr` for tokens `t0..t0+nt`; `dst` is `[nt][nr]`.
fn rows_dispatch(
    w: MatrixRef<'_>,
    acts: &Acts<'_>,
    r0: usize,
    nr: usize,
    t0: usize,
    nt: usize,
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were detected on this CPU just above, which is the only
            // requirement `rows_avx2` has.
            unsafe { rows_avx2(w, acts, r0, nr, t0, nt, dst) };
            return;
        }
    }
    rows_generic::<Portable>(w, acts, r0, nr, t0, nt, dst);
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(
    w: MatrixRef<'_>,
    acts: &Acts<'_>,
    r0: usize,
    nr: usize,
    t0: usize,
    nt: usize,
    dst: &mut [f32],
) {
    rows_generic::<avx2::Avx2>(w, acts, r0, nr, t0, nt, dst);
}

/// The integer multiply-accumulate step, portable or with explicit SIMD.
trait IntDot {
    /// Running sum of scaled group dot products.
    type Acc: Copy;
    fn zero() -> Self::Acc;
    /// `acc + scale * (w · a)` over 16 elements.
    fn group16(acc: Self::Acc, w: &[i8; 16], a: &[i16; 16], scale: f32) -> Self::Acc;
    /// `acc + scale * (w · a)` over 32 elements.
    fn group32(acc: Self::Acc, w: &[i8; 32], a: &[i16; 32], scale: f32) -> Self::Acc;
    /// [`IntDot::group32`] with the weights given as the bytes of `i8` values (Q8_0 blocks).
    fn group32_bytes(acc: Self::Acc, w: &[u8; 32], a: &[i16; 32], scale: f32) -> Self::Acc;
    fn sum(acc: Self::Acc) -> f32;
}

/// Plain Rust; LLVM vectorizes what it can.
struct Portable;

impl IntDot for Portable {
    type Acc = f32;
    #[inline(always)]
    fn zero() -> f32 {
        0.0
    }
    #[inline(always)]
    fn group16(acc: f32, w: &[i8; 16], a: &[i16; 16], scale: f32) -> f32 {
        acc + scale * idot(w, a) as f32
    }
    #[inline(always)]
    fn group32(acc: f32, w: &[i8; 32], a: &[i16; 32], scale: f32) -> f32 {
        acc + scale * idot(w, a) as f32
    }
    #[inline(always)]
    fn group32_bytes(acc: f32, w: &[u8; 32], a: &[i16; 32], scale: f32) -> f32 {
        let mut s = 0i32;
        for i in 0..32 {
            s += w[i] as i8 as i32 * a[i] as i32;
        }
        acc + scale * s as f32
    }
    #[inline(always)]
    fn sum(acc: f32) -> f32 {
        acc
    }
}

#[inline(always)]
fn rows_generic<D: IntDot>(
    w: MatrixRef<'_>,
    acts: &Acts<'_>,
    r0: usize,
    nr: usize,
    t0: usize,
    nt: usize,
    dst: &mut [f32],
) {
    let rb = w.row_bytes();
    let mut scratch = Unpacked::default();
    let mut fbuf = [0f32; MAX_BLOCK];
    for i in 0..nr {
        let row = &w.data[(r0 + i) * rb..(r0 + i + 1) * rb];
        let mut acc = [0f32; TILE];
        if !acts.act_q.is_empty() {
            let a = &acts.act_q[t0..t0 + nt];
            if w.format == GgmlType::Q8_0 {
                dot_q8_0::<D>(row, a, &mut acc);
            } else {
                dot_unpacked::<D>(w.format, row, a, &mut acc, &mut scratch);
            }
        } else {
            dot_f32(
                w.format,
                row,
                acts,
                t0,
                nt,
                &mut acc,
                &mut scratch,
                &mut fbuf,
            );
        }
        for t in 0..nt {
            dst[t * nr + i] = acc[t];
        }
    }
}

/// Integer dot product of weight integers with 16-bit activations. No overflow: |w| <= 128 and
/// |a| <= 32767, so each pair of products (what `vpmaddwd` adds) stays below 2^23.
#[inline(always)]
fn idot<const N: usize>(w: &[i8; N], a: &[i16; N]) -> i32 {
    let mut s = 0i32;
    for i in 0..N {
        s += w[i] as i32 * a[i] as i32;
    }
    s
}

#[inline(always)]
fn dot_q8_0<D: IntDot>(row: &[u8], acts: &[Q16Row], acc: &mut [f32; TILE]) {
    let mut vacc = [D::zero(); TILE];
    for (b, blk) in row.chunks_exact(34).enumerate() {
        let dw = quant::f16_bits_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        let wq: &[u8; 32] = blk[2..34].try_into().expect("block of 32");
        for (t, a) in acts.iter().enumerate() {
            let aq: &[i16; 32] = a.q[b * ACT_BLOCK..(b + 1) * ACT_BLOCK]
                .try_into()
                .expect("block of 32");
            vacc[t] = D::group32_bytes(vacc[t], wq, aq, dw * a.d[b]);
        }
    }
    for t in 0..acts.len() {
        acc[t] += D::sum(vacc[t]);
    }
}

#[inline(always)]
fn dot_unpacked<D: IntDot>(
    format: GgmlType,
    row: &[u8],
    acts: &[Q16Row],
    acc: &mut [f32; TILE],
    u: &mut Unpacked,
) {
    let bl = format.block_size();
    let groups = bl / GROUP;
    // Q6_K, Q2_K and Q3_K change scale every 16 elements; the others take 32 at a time.
    let by32 = !quant::scale_per_16(format);
    let has_offset = quant::has_offset(format);
    let mut vacc = [D::zero(); TILE];
    let mut offsets = [0f32; TILE];
    for (b, blk) in row.chunks_exact(format.type_size()).enumerate() {
        quant::unpack_block(format, blk, u);
        let base = b * bl;
        for (t, a) in acts.iter().enumerate() {
            let mut v = vacc[t];
            if by32 {
                for g in 0..groups / 2 {
                    let e = base + g * ACT_BLOCK;
                    let wq: &[i8; 32] = u.q[g * 32..(g + 1) * 32].try_into().expect("group");
                    let aq: &[i16; 32] = a.q[e..e + 32].try_into().expect("group");
                    v = D::group32(v, wq, aq, u.scale[2 * g] * a.d[e / ACT_BLOCK]);
                }
            } else {
                for g in 0..groups {
                    let e = base + g * GROUP;
                    let wq: &[i8; GROUP] =
                        u.q[g * GROUP..(g + 1) * GROUP].try_into().expect("group");
                    let aq: &[i16; GROUP] = a.q[e..e + GROUP].try_into().expect("group");
                    v = D::group16(v, wq, aq, u.scale[g] * a.d[e / ACT_BLOCK]);
                }
            }
            vacc[t] = v;
            if has_offset {
                for g in 0..groups {
                    offsets[t] += u.offset[g] * a.group_sum[base / GROUP + g];
                }
            }
        }
    }
    for t in 0..acts.len() {
        acc[t] += D::sum(vacc[t]) + offsets[t];
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The integer steps written with AVX2 intrinsics: LLVM left alone widens to 32 bits and
    //! multiplies with `vpmulld`; `vpmaddwd` does 16 products and the pairwise adds in one go.

    use super::IntDot;
    use std::arch::x86_64::*;

    pub struct Avx2;

    impl IntDot for Avx2 {
        type Acc = __m256;

        #[inline(always)]
        fn zero() -> __m256 {
            // SAFETY: only reached from `rows_avx2`, which requires AVX2 and FMA.
            unsafe { _mm256_setzero_ps() }
        }

        #[inline(always)]
        fn group16(acc: __m256, w: &[i8; 16], a: &[i16; 16], scale: f32) -> __m256 {
            // SAFETY: only reached from `rows_avx2`, which requires AVX2 and FMA; the loads read
            // exactly the 16 bytes of `w` and the 32 bytes of `a` (unaligned loads).
            unsafe {
                let wv = _mm_loadu_si128(w.as_ptr().cast());
                let av = _mm256_loadu_si256(a.as_ptr().cast());
                let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(wv), av);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(scale), acc)
            }
        }

        #[inline(always)]
        fn group32(acc: __m256, w: &[i8; 32], a: &[i16; 32], scale: f32) -> __m256 {
            // SAFETY: only reached from `rows_avx2`, which requires AVX2 and FMA; the loads read
            // exactly the 32 bytes of `w` and the 64 bytes of `a` (unaligned loads).
            unsafe {
                let w0 = _mm_loadu_si128(w.as_ptr().cast());
                let w1 = _mm_loadu_si128(w.as_ptr().add(16).cast());
                let a0 = _mm256_loadu_si256(a.as_ptr().cast());
                let a1 = _mm256_loadu_si256(a.as_ptr().add(16).cast());
                let p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), a0);
                let p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), a1);
                let s = _mm256_add_epi32(p0, p1);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(scale), acc)
            }
        }

        #[inline(always)]
        fn group32_bytes(acc: __m256, w: &[u8; 32], a: &[i16; 32], scale: f32) -> __m256 {
            // SAFETY: only reached from `rows_avx2`, which requires AVX2 and FMA; the loads read
            // exactly the 32 bytes of `w` and the 64 bytes of `a` (unaligned loads). The bytes
            // are the two's-complement i8 values, which `cvtepi8` sign-extends.
            unsafe {
                let w0 = _mm_loadu_si128(w.as_ptr().cast());
                let w1 = _mm_loadu_si128(w.as_ptr().add(16).cast());
                let a0 = _mm256_loadu_si256(a.as_ptr().cast());
                let a1 = _mm256_loadu_si256(a.as_ptr().add(16).cast());
                let p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), a0);
                let p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), a1);
                let s = _mm256_add_epi32(p0, p1);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(scale), acc)
            }
        }

        #[inline(always)]
        fn sum(acc: __m256) -> f32 {
            // SAFETY: only reached from `rows_avx2`, which requires AVX2 and FMA.
            unsafe {
                let lo = _mm256_castps256_ps128(acc);
                let hi = _mm256_extractf128_ps(acc, 1);
                let s = _mm_add_ps(lo, hi);
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
                _mm_cvtss_f32(s)
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn dot_f32(
    format: GgmlType,
    row: &[u8],
    acts: &Acts<'_>,
    t0: usize,
    nt: usize,
    acc: &mut [f32; TILE],
    u: &mut Unpacked,
    fbuf: &mut [f32; MAX_BLOCK],
) {
    // Steps of whole blocks; a dense row of any length ends in a shorter step.
    let step = quant::step_len(format);
    let step_bytes = step / format.block_size() * format.type_size();
    for (b, blk) in row.chunks(step_bytes).enumerate() {
        let n = blk.len() / format.type_size() * format.block_size();
        quant::block_to_f32(format, blk, &mut fbuf[..n], u);
        for (t, a) in acc.iter_mut().enumerate().take(nt) {
            let x0 = (t0 + t) * acts.cols + b * step;
            *a += dot_f32_slice(&fbuf[..n], &acts.x[x0..x0 + n]);
        }
    }
}

/// f32 dot product with eight independent accumulators so it vectorizes.
#[inline(always)]
pub fn dot_f32_slice(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = lanes.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use half::{bf16, f16};
    use rand::Rng;
    use test_support::rng::StdRng;

    /// A random but valid row: random dense values in [-1, 1), or blocks with random integer
    /// fields and small finite scales (`fill_random_blocks`, as the synthetic models' weights).
    pub(crate) fn random_row(format: GgmlType, cols: usize, rng: &mut StdRng) -> Vec<u8> {
        match format {
            GgmlType::F32 => {
                return (0..cols)
                    .flat_map(|_| rng.random_range(-1.0f32..1.0).to_le_bytes())
                    .collect()
            }
            GgmlType::F16 => {
                return (0..cols)
                    .flat_map(|_| f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
                    .collect()
            }
            GgmlType::Bf16 => {
                return (0..cols)
                    .flat_map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
                    .collect()
            }
            _ => {}
        }
        let mut out = vec![0u8; quant::row_bytes(format, cols).expect("whole blocks")];
        gguf_loader::synth::fill_random_blocks(format, &mut out, rng);
        out
    }

    /// The portable kernels over all rows, one token at a time (the AVX2 ones are what
    /// `matmul` picks on this machine, so this is how the portable path gets checked).
    fn matmul_portable(
        w: MatrixRef<'_>,
        x: &[f32],
        n_tok: usize,
        precision: Precision,
    ) -> Vec<f32> {
        let mut rows = vec![Q16Row::default(); n_tok];
        for (r, xr) in rows.iter_mut().zip(x.chunks_exact(w.cols)) {
            r.quantize_from(xr);
        }
        let use_int = precision == Precision::Fast && !quant::is_float(w.format);
        let acts = Acts {
            x,
            act_q: if use_int { &rows } else { &[] },
            cols: w.cols,
        };
        let mut out = vec![0f32; n_tok * w.rows];
        for t in 0..n_tok {
            rows_generic::<Portable>(
                w,
                &acts,
                0,
                w.rows,
                t,
                1,
                &mut out[t * w.rows..(t + 1) * w.rows],
            );
        }
        out
    }

    /// Both precisions, single-token and batched, AVX2 and portable, against dequantizing
    /// the rows then an f64 dot product.
    fn check_against_dequantized(format: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) {
        let n_tok = 6;
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(format, cols, rng))
            .collect();
        let x: Vec<f32> = (0..n_tok * cols)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let w = MatrixRef {
            format,
            data: &data,
            rows,
            cols,
        };
        let rb = quant::row_bytes(format, cols).unwrap();
        assert_eq!(data.len(), rows * rb, "{format} x {cols}");
        let mut deq = vec![0f32; cols];
        let mut want = vec![0f64; n_tok * rows];
        for r in 0..rows {
            quant::row_to_f32(format, &data[r * rb..(r + 1) * rb], &mut deq);
            for t in 0..n_tok {
                want[t * rows + r] = deq
                    .iter()
                    .zip(&x[t * cols..(t + 1) * cols])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
            }
        }
        let scale = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
        for (precision, tol) in [(Precision::Exact, 1e-5), (Precision::Fast, 1e-4)] {
            // Single token and batched paths.
            let portable = matmul_portable(w, &x, n_tok, precision);
            for nt in [1, n_tok, usize::MAX] {
                let out = if nt == usize::MAX {
                    portable.clone()
                } else {
                    let mut out = vec![0f32; nt * rows];
                    matmul(w, &x[..nt * cols], nt, &mut out, precision, &mut Vec::new());
                    out
                };
                for (i, (&got, &exp)) in out.iter().zip(&want).enumerate() {
                    let err = (got as f64 - exp).abs() / scale;
                    assert!(
                        err < tol,
                        "{format} x {cols} {precision:?} n_tok {nt} element {i}: {got} vs {exp}"
                    );
                }
            }
        }
    }

    #[test]
    fn both_precisions_match_dequantize_then_dot_for_every_format() {
        let mut rng = test_support::rng::seeded(0x9E37_79B9_7F4A_7C15);
        for format in quant::SUPPORTED {
            check_against_dequantized(format, 37, 512, &mut rng);
        }
    }

    #[test]
    fn dense_rows_of_any_length_multiply() {
        let mut rng = test_support::rng::seeded(0x2545_F491_4F6C_DD1D);
        for format in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
            // Shorter than a step, and a step and a bit (MAX_BLOCK is 256).
            for cols in [1, 7, 301] {
                check_against_dequantized(format, 5, cols, &mut rng);
            }
        }
    }
}

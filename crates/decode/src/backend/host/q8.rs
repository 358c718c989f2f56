//! Matrix-vector products against 8-bit activations on the host's cores: the CPU half of the
//! hybrid offload (`super::gpu` splits an offloaded product's rows between a kernel reading
//! mapped host memory and these functions reading the same memory).
//!
//! The activations are the GPU's own ([`rocm_kernels::ops::matvec_q8`]): 32 signed bytes and
//! one f32 scale per group, copied back from the device, so both halves of a product multiply
//! the same numbers and differ only in the order in which f32 group sums meet. Q4_K and Q6_K,
//! the bulk of a Q4_K_M model, have AVX2 paths (`vpmaddubsw` takes 32 weight-activation pairs
//! per instruction); the other integer formats go through a portable path with exact integer
//! sums per 16 values. Float weights are refused: the device never runs them against 8-bit
//! activations, so no split product has them.

use super::pool::{self as host_pool, HostPool, PoolKind};
use crate::error::{DecodeError, Result};
use crate::quant;
use gguf_loader::GgmlType;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// Values per activation scale (the GPU's group).
pub const GROUP: usize = rocm_kernels::ops::matvec_q8::GROUP;

const Q4K_BYTES: usize = 144;
const Q6K_BYTES: usize = 210;

/// One token's activations in the GPU's 8-bit form, with the per-group sums the formats with
/// an offset (Q4_K's minimum, Q6_K's −32) need.
#[derive(Clone, Debug, Default)]
pub struct HostActivations {
    values: Vec<i8>,
    scales: Vec<f32>,
    /// Sum of the integers of each group of 32.
    sum32: Vec<i32>,
    /// Sum of the integers of each half group (16 values): Q6_K changes scale every 16.
    sum16: Vec<i32>,
}

impl HostActivations {
    /// Takes quantized activations as the device wrote them: `values` (a multiple of 32) and
    /// one scale per 32.
    pub fn set(&mut self, values: &[i8], scales: &[f32]) -> Result<()> {
        if !values.len().is_multiple_of(GROUP) || scales.len() != values.len() / GROUP {
            return Err(DecodeError::InvalidArgument(format!(
                "host activations: {} values with {} scales; expected whole groups of {GROUP} \
                 and one scale per group",
                values.len(),
                scales.len()
            )));
        }
        self.values.clear();
        self.values.extend_from_slice(values);
        self.scales.clear();
        self.scales.extend_from_slice(scales);
        self.sum16.clear();
        self.sum16.extend(
            values
                .chunks_exact(GROUP / 2)
                .map(|h| h.iter().map(|&v| i32::from(v)).sum::<i32>()),
        );
        self.sum32.clear();
        self.sum32
            .extend(self.sum16.chunks_exact(2).map(|p| p[0] + p[1]));
        Ok(())
    }

    /// Quantizes `x` as the device's `quantize_q8` does (`d = max|x| / 127`, values
    /// `round_half_even(x * (1 / d))`), then [`HostActivations::set`].
    pub fn quantize(&mut self, x: &[f32]) -> Result<()> {
        let q = rocm_kernels::reference::matvec_q8::quantize(x)
            .map_err(|e| DecodeError::InvalidArgument(format!("host activations: {e}")))?;
        self.set(&q.values, &q.scales)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Whether [`matvec_rows`] multiplies `format` with an integer kernel written for it (the rest
/// take the slower portable path).
pub fn has_fast_path(format: GgmlType) -> bool {
    matches!(format, GgmlType::Q4K | GgmlType::Q6K)
}

/// `out[i] = W[rows.start + i] · x` for the rows in `rows` of a matrix of `cols` columns stored
/// in `format` (`matrix` holds all its rows), spread over rayon's pool.
pub fn matvec_rows(
    format: GgmlType,
    matrix: &[u8],
    cols: usize,
    rows: Range<usize>,
    x: &HostActivations,
    out: &mut [f32],
) -> Result<()> {
    let row_bytes = checked_row_bytes(format, cols)?;
    let n = rows.len();
    if x.len() != cols || out.len() < n || matrix.len() < rows.end * row_bytes {
        return Err(DecodeError::InvalidArgument(format!(
            "host product: rows {rows:?} of {cols} columns ({row_bytes} bytes each) from a \
             matrix of {} bytes, {} activations, into {} outputs",
            matrix.len(),
            x.len(),
            out.len()
        )));
    }
    let base = rows.start;
    let chunk = chunk_rows(n);
    let pieces = out[..n]
        .chunks_mut(chunk)
        .enumerate()
        .map(|(c, dst)| (format, matrix, row_bytes, base + c * chunk, x, dst))
        .collect();
    run_pieces(pieces)
}

/// One piece of work: rows `r0..r0 + dst.len()` of a matrix into `dst`.
type Piece<'a> = (
    GgmlType,
    &'a [u8],
    usize,
    usize,
    &'a HostActivations,
    &'a mut [f32],
);

/// Runs the pieces on the host pool [`PoolKind::from_env`] names.
fn run_pieces(pieces: Vec<Piece<'_>>) -> Result<()> {
    match PoolKind::from_env()? {
        PoolKind::Rayon => {
            pieces
                .into_par_iter()
                .for_each(|(format, matrix, row_bytes, r0, x, dst)| {
                    rows_serial(format, matrix, row_bytes, r0, x, dst)
                })
        }
        PoolKind::Spin => {
            // Each piece is claimed by exactly one participant; the lock is never contended.
            let pieces: Vec<Mutex<Piece<'_>>> = pieces.into_iter().map(Mutex::new).collect();
            host_pool::for_each_chunk(HostPool::global(), pieces.len(), 1, &|a, b| {
                for p in &pieces[a..b] {
                    let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                    let (format, matrix, row_bytes, r0, x, ref mut dst) = *p;
                    rows_serial(format, matrix, row_bytes, r0, x, dst);
                }
            });
        }
    }
    Ok(())
}

/// Rows per parallel task for `n` rows: a few tasks per thread balance the pool, and each is
/// big enough that scheduling is cheap.
fn chunk_rows(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads().max(1) * 4).max(8)
}

/// One product of a batch for [`matvec_batch`]: rows `first..first + out.len()` of a matrix of
/// `cols` columns in `format`, against `x`.
pub struct RowTask<'a> {
    pub format: GgmlType,
    pub matrix: &'a [u8],
    pub cols: usize,
    pub first: usize,
    pub x: &'a HostActivations,
    pub out: &'a mut [f32],
}

/// Several products in one parallel region (an MoE's experts: one wake-up of the pool instead
/// of one per product), each split into row chunks.
pub fn matvec_batch(tasks: Vec<RowTask<'_>>) -> Result<()> {
    let mut pieces = Vec::new();
    for t in tasks {
        let row_bytes = checked_row_bytes(t.format, t.cols)?;
        let n = t.out.len();
        if t.x.len() != t.cols || t.matrix.len() < (t.first + n) * row_bytes {
            return Err(DecodeError::InvalidArgument(format!(
                "host product: rows {}..{} of {} columns from a matrix of {} bytes, {} activations",
                t.first,
                t.first + n,
                t.cols,
                t.matrix.len(),
                t.x.len()
            )));
        }
        let chunk = chunk_rows(n);
        for (c, dst) in t.out.chunks_mut(chunk).enumerate() {
            pieces.push((t.format, t.matrix, row_bytes, t.first + c * chunk, t.x, dst));
        }
    }
    run_pieces(pieces)
}

/// Bytes of one row of `cols` values of `format`, or the error naming the problem. The formats
/// are the device's 8-bit-activation ones (`matvec_q8::Q8_FORMATS`): the host half only ever
/// shares a product the device runs that way.
fn checked_row_bytes(format: GgmlType, cols: usize) -> Result<usize> {
    if !rocm_kernels::ops::matvec_q8::supports(format) {
        return Err(DecodeError::InvalidArgument(format!(
            "host product: {} has no 8-bit-activation product (these formats have one: {})",
            format.name(),
            rocm_kernels::ops::matvec_q8::Q8_FORMATS
                .map(GgmlType::name)
                .join(", ")
        )));
    }
    quant::row_bytes(format, cols)
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            DecodeError::InvalidArgument(format!(
                "host product: {cols} columns of {} are not whole blocks",
                format.name()
            ))
        })
}

/// Rows `r0..r0 + dst.len()` on the calling thread; shapes checked by the caller.
fn rows_serial(
    format: GgmlType,
    matrix: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &HostActivations,
    dst: &mut [f32],
) {
    for (i, o) in dst.iter_mut().enumerate() {
        let r = r0 + i;
        *o = row_dot(format, &matrix[r * row_bytes..(r + 1) * row_bytes], x);
    }
}

/// What [`measure_rate`] saw for one format.
#[derive(Clone, Debug)]
pub struct HostRate {
    pub format: GgmlType,
    /// Bytes of the matrix.
    pub bytes: usize,
    /// Median seconds per product.
    pub seconds: f64,
    pub threads: usize,
}

impl HostRate {
    /// Weight bytes per second, in GB/s.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

/// Measures the host cores' rate on [`matvec_rows`]: one product over a matrix of about
/// `bytes` in `format` (pseudo-random blocks with small finite scales, so the timing does not
/// depend on the values), 4096 columns, repeated `runs` times after one warm-up; the median.
/// The matrix is far larger than any cache, so this is the rate at which the cores stream
/// weights from host memory, as the hybrid offload's host half does.
pub fn measure_rate(format: GgmlType, bytes: usize, runs: usize) -> Result<HostRate> {
    const COLS: usize = 4096;
    let row_bytes = checked_row_bytes(format, COLS)?;
    let rows = (bytes / row_bytes).max(ROW_QUANTUM_FOR_PROBE);
    let mut matrix = vec![0u8; rows * row_bytes];
    // The synthetic models' random blocks: small finite scales keep every product finite.
    gguf_loader::synth::fill_random_blocks_seeded(format, &mut matrix, 0x9e37_79b9_7f4a_7c15);
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
        .collect();
    let mut acts = HostActivations::default();
    acts.quantize(&x)?;
    let mut out = vec![0f32; rows];
    matvec_rows(format, &matrix, COLS, 0..rows, &acts, &mut out)?;
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            matvec_rows(format, &matrix, COLS, 0..rows, &acts, &mut out).map(|()| t.elapsed())
        })
        .map(|r| r.map(|d| d.as_secs_f64()))
        .collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    if out.iter().any(|v| !v.is_finite()) {
        return Err(DecodeError::InvalidArgument(
            "the host rate probe produced a non-finite product".into(),
        ));
    }
    Ok(HostRate {
        format,
        bytes: matrix.len(),
        seconds: times[times.len() / 2],
        threads: rayon::current_num_threads(),
    })
}

/// The fewest rows the probe multiplies.
const ROW_QUANTUM_FOR_PROBE: usize = 64;

/// One row's product with `x`.
fn row_dot(format: GgmlType, row: &[u8], x: &HostActivations) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_fast_path(format)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were detected just above, the only requirement of the
            // `avx2` functions; the row holds whole blocks of `format` (checked by the caller)
            // and `x` holds `256 * blocks` values with their scales and sums.
            return unsafe {
                if format == GgmlType::Q4K {
                    avx2::dot_q4k(row, x)
                } else {
                    avx2::dot_q6k(row, x)
                }
            };
        }
    }
    match format {
        GgmlType::Q4K => dot_q4k(row, x),
        GgmlType::Q6K => dot_q6k(row, x),
        _ => dot_unpacked(format, row, x),
    }
}

/// Any other integer format, as the device computes it: per 16 values an exact integer dot
/// product of the weight integers with the activation bytes, then `scale * dot + offset * sum`
/// in f32 (the weights' value is `scale * q + offset`), times the activations' group scale.
/// Exact integer sums keep the host's rows within f32 rounding of the device's, which greedy
/// decoding needs to stay on the same tokens.
fn dot_unpacked(format: GgmlType, row: &[u8], x: &HostActivations) -> f32 {
    let mut u = quant::Unpacked::default();
    let block = format.block_size();
    let mut sum = 0.0f32;
    for (b, blk) in row.chunks_exact(format.type_size()).enumerate() {
        quant::unpack_block(format, blk, &mut u);
        for h in 0..block / 16 {
            let e = b * block + h * 16;
            let dot: i32 = u.q[h * 16..h * 16 + 16]
                .iter()
                .zip(&x.values[e..e + 16])
                .map(|(&q, &a)| i32::from(q) * i32::from(a))
                .sum();
            let group = u.scale[h] * dot as f32 + u.offset[h] * x.sum16[e / 16] as f32;
            sum += x.scales[e / GROUP] * group;
        }
    }
    sum
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    quant::f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K super-block (ggml's packing).
#[inline(always)]
fn q4k_scale_min(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// Q4_K: value = `d * sc * q - dmin * m` per sub-block of 32, so a group's product is
/// `scale_x * (d * sc * Σ q a - dmin * m * Σ a)`.
fn dot_q4k(row: &[u8], x: &HostActivations) -> f32 {
    let mut sum = 0.0f32;
    for (b, blk) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        let (scales, qs) = (&blk[4..16], &blk[16..144]);
        for sub in 0..8 {
            let g = b * 8 + sub;
            let (sc, m) = q4k_scale_min(sub, scales);
            let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
            let a = &x.values[g * GROUP..(g + 1) * GROUP];
            let shift = 4 * (sub % 2);
            let s: i32 = bytes
                .iter()
                .zip(a)
                .map(|(&q, &a)| i32::from((q >> shift) & 0x0F) * i32::from(a))
                .sum();
            sum += x.scales[g] * (d * sc * s as f32 - dmin * m * x.sum32[g] as f32);
        }
    }
    sum
}

/// Q6_K: value = `d * sc * (q - 32)` with a signed scale per 16 values.
fn dot_q6k(row: &[u8], x: &HostActivations) -> f32 {
    let mut sum = 0.0f32;
    for (b, blk) in row.chunks_exact(Q6K_BYTES).enumerate() {
        let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
        let d = f16_at(blk, 208);
        for half in 0..2 {
            let (ql, qh) = (
                &ql[64 * half..64 * half + 64],
                &qh[32 * half..32 * half + 32],
            );
            for part in 0..4 {
                let g = b * 8 + half * 4 + part;
                let a = &x.values[g * GROUP..(g + 1) * GROUP];
                let mut s = [0i32; 2];
                for l in 0..32 {
                    let low = if part % 2 == 0 { ql[l] } else { ql[l + 32] };
                    let low = if part < 2 { low & 0x0F } else { low >> 4 };
                    let q = low | (((qh[l] >> (2 * part)) & 3) << 4);
                    s[l / 16] += i32::from(q) * i32::from(a[l]);
                }
                let scale = |i: usize| f32::from(sc[8 * half + 2 * part + i] as i8);
                let centred = |i: usize| (s[i] - 32 * x.sum16[2 * g + i]) as f32;
                sum += d * x.scales[g] * (scale(0) * centred(0) + scale(1) * centred(1));
            }
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The two k-quant dots with AVX2: `vpmaddubsw` multiplies 32 unsigned weight integers by
    //! 32 signed activation bytes and adds pairs, `vpmaddwd` widens (and for Q6_K applies the
    //! per-16 scales), and one FMA per group applies the f32 scales.

    use super::{f16_at, q4k_scale_min, HostActivations, GROUP, Q4K_BYTES, Q6K_BYTES};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA must be available; `row` holds whole Q4_K blocks and `x` their values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q4k(row: &[u8], x: &HostActivations) -> f32 {
        let low4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        let mut offset = 0.0f32;
        let blocks = row.len() / Q4K_BYTES;
        assert!(x.values.len() >= blocks * 256 && x.scales.len() >= blocks * 8);
        for b in 0..blocks {
            let blk = &row[b * Q4K_BYTES..(b + 1) * Q4K_BYTES];
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let scales = &blk[4..16];
            for pair in 0..4 {
                // SAFETY: 32 bytes at 16 + 32 * pair lie inside the 144-byte block; the two
                // activation loads read groups 2 * pair and 2 * pair + 1 of block b, inside
                // `x.values` (asserted above). Unaligned loads.
                let (q, a0, a1) = unsafe {
                    let g = b * 8 + 2 * pair;
                    (
                        _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * pair).cast()),
                        _mm256_loadu_si256(x.values.as_ptr().add(g * GROUP).cast()),
                        _mm256_loadu_si256(x.values.as_ptr().add((g + 1) * GROUP).cast()),
                    )
                };
                let lo = _mm256_and_si256(q, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                let s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), ones);
                let s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), ones);
                for (i, s) in [(0, s0), (1, s1)] {
                    let sub = 2 * pair + i;
                    let g = b * 8 + sub;
                    let (sc, m) = q4k_scale_min(sub, scales);
                    let xs = x.scales[g];
                    let f = _mm256_set1_ps(d * sc * xs);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), f, acc);
                    offset += dmin * m * xs * x.sum32[g] as f32;
                }
            }
        }
        hsum(acc) - offset
    }

    /// # Safety
    /// AVX2 and FMA must be available; `row` holds whole Q6_K blocks and `x` their values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q6k(row: &[u8], x: &HostActivations) -> f32 {
        let low4 = _mm256_set1_epi8(0x0F);
        let two = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        let mut offset = 0.0f32;
        let blocks = row.len() / Q6K_BYTES;
        assert!(x.values.len() >= blocks * 256 && x.sum16.len() >= blocks * 16);
        for b in 0..blocks {
            let blk = &row[b * Q6K_BYTES..(b + 1) * Q6K_BYTES];
            let d = f16_at(blk, 208);
            let sc = &blk[192..208];
            for half in 0..2 {
                // SAFETY: ql (128 bytes at 0) and qh (64 at 128) lie inside the 210-byte block.
                let (ql0, ql1, qh) = unsafe {
                    let p = blk.as_ptr();
                    (
                        _mm256_loadu_si256(p.add(64 * half).cast()),
                        _mm256_loadu_si256(p.add(64 * half + 32).cast()),
                        _mm256_loadu_si256(p.add(128 + 32 * half).cast()),
                    )
                };
                let high = |shift: i32| -> __m256i {
                    let h = match shift {
                        0 => qh,
                        2 => _mm256_srli_epi16(qh, 2),
                        4 => _mm256_srli_epi16(qh, 4),
                        _ => _mm256_srli_epi16(qh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(h, two), 4)
                };
                let parts = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low4), high(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), high(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), high(6)),
                ];
                for (part, q) in parts.into_iter().enumerate() {
                    let g = b * 8 + half * 4 + part;
                    // SAFETY: group g of `x.values` (asserted above); unaligned load.
                    let a = unsafe { _mm256_loadu_si256(x.values.as_ptr().add(g * GROUP).cast()) };
                    let (s0, s1) = (
                        sc[8 * half + 2 * part] as i8 as i16,
                        sc[8 * half + 2 * part + 1] as i8 as i16,
                    );
                    let scale = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                    let s = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), scale);
                    let f = d * x.scales[g];
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(f), acc);
                    let centre = f32::from(s0) * x.sum16[2 * g] as f32
                        + f32::from(s1) * x.sum16[2 * g + 1] as f32;
                    offset += 32.0 * f * centre;
                }
            }
        }
        hsum(acc) - offset
    }

    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let two = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
        _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::tests::random_row;
    use rand::Rng;
    use rocm_kernels::reference::matvec::HostMatrix;
    use rocm_kernels::reference::matvec_q8 as reference;

    /// Every supported quantized format, fast path or not, against the kernels' CPU reference
    /// (exact product of the dequantized weights with the same 8-bit activations).
    #[test]
    fn rows_match_the_reference_for_every_quantized_format() {
        let mut rng = test_support::rng::seeded(0x5eed);
        for format in rocm_kernels::ops::matvec_q8::Q8_FORMATS {
            let (rows, cols) = (37, 512);
            let matrix: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(format, cols, &mut rng))
                .collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-4.5..1.5)).collect();
            let q = reference::quantize(&x).unwrap();
            let w = HostMatrix::new(&matrix, format, rows, cols).unwrap();
            let want = reference::matvec(&w, &q, 1).unwrap();
            let mut acts = HostActivations::default();
            acts.set(&q.values, &q.scales).unwrap();
            // A row range that does not start at 0, as the hybrid split hands out.
            let range = 5..rows;
            let mut got = vec![f32::NAN; range.len()];
            matvec_rows(format, &matrix, cols, range.clone(), &acts, &mut got).unwrap();
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want[range]).enumerate() {
                let err = (g - w).abs();
                assert!(
                    err <= 1e-4 * scale,
                    "{} row {}: host {g} against reference {w}",
                    format.name(),
                    i + 5
                );
            }
            // The portable path agrees with the SIMD one on the same rows.
            if has_fast_path(format) {
                let rb = matrix.len() / rows;
                for (i, &g) in got.iter().enumerate() {
                    let r = i + 5;
                    let row = &matrix[r * rb..(r + 1) * rb];
                    let portable = match format {
                        GgmlType::Q4K => dot_q4k(row, &acts),
                        _ => dot_q6k(row, &acts),
                    };
                    assert!((portable - g).abs() <= 1e-4 * scale, "{portable} vs {g}");
                }
            }
        }
    }

    #[test]
    fn host_quantization_is_the_devices() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
        let mut a = HostActivations::default();
        a.quantize(&x).unwrap();
        let q = reference::quantize(&x).unwrap();
        assert_eq!(a.values, q.values);
        assert_eq!(a.scales, q.scales);
        assert_eq!(
            a.sum32[0],
            q.values[..32].iter().map(|&v| i32::from(v)).sum::<i32>()
        );
    }

    #[test]
    fn the_rate_probe_measures_a_finite_positive_rate() {
        let r = measure_rate(GgmlType::Q4K, 1 << 20, 3).unwrap();
        assert!(r.gbps().is_finite() && r.gbps() > 0.0, "{r:?}");
        assert!(r.bytes >= 1 << 19, "{r:?}");
        assert!(measure_rate(GgmlType::Q4K, 1 << 20, 1).is_ok());
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let mut a = HostActivations::default();
        assert!(a.set(&[0; 33], &[1.0]).is_err());
        a.set(&[1; 256], &[1.0; 8]).unwrap();
        let matrix = vec![0u8; 144];
        let mut out = vec![0.0; 2];
        let err = matvec_rows(GgmlType::Q4K, &matrix, 256, 0..2, &a, &mut out).unwrap_err();
        assert!(err.to_string().contains("144 bytes"), "{err}");
        assert!(matvec_rows(GgmlType::Q4K, &matrix, 100, 0..1, &a, &mut out).is_err());
        let f32_row = vec![0u8; 256 * 4];
        let err = matvec_rows(GgmlType::F32, &f32_row, 256, 0..1, &a, &mut out).unwrap_err();
        assert!(
            err.to_string().contains("no 8-bit-activation product"),
            "{err}"
        );
    }
}

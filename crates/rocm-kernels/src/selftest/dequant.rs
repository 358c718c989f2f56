//! The f16 dequantization and conversion ops (`ops::dequant`) against the CPU reference, for
//! every weight format, at odd shapes, row ranges and unaligned outputs; and that nothing
//! outside an output is written.
//!
//! Exactness. The reference dequantizes in f32 with gguf-loader (bit-exact with gguf-py) and
//! rounds with `half::f16::from_f32`; the GPU computes the same f32 operations in the same order
//! (quant.h) and rounds with the hardware conversion, which is also round-to-nearest-even. So:
//! * dense formats (F32, F16, BF16) and the formats whose value is one product (Q4_0, Q5_0,
//!   Q8_0, Q6_K, Q3_K, IQ4_NL, IQ4_XS, whose `d * sc` is exact in f32) must match bit for bit;
//! * the formats with a multiply-add (Q4_1, Q5_1: `d * q + m`; Q4_K, Q5_K, Q2_K:
//!   `(d * sc) * q - dmin * m`) may differ by 1 f16 ulp: the compilers may fuse the multiply-add
//!   into one FMA (and gfx9's v_fma_mix rounds that straight to f16), which skips the rounding of
//!   the product. The random blocks' scales (`gguf_loader::synth::fill_random_blocks`) keep
//!   every product below 1 in magnitude, so that rounding is at most 2^-25, below one f16 ulp
//!   (>= 2^-24) of any result, and the f16 values can differ by at most one step. An indexing
//!   mistake differs by thousands of ulps.
//!
//! NaN must stay NaN (its payload may change); a NaN where a number was expected fails.

use super::case::Case;
use super::case::{seeded, uniform_vec};
use super::rig::Rig;
use crate::ops::dequant;
use crate::ops::matvec::{self, QuantMatrix, WEIGHT_FORMATS};
use crate::reference;
use crate::reference::matvec::HostMatrix;
use gguf_loader::synth::fill_random_blocks;
use gguf_loader::GgmlType;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use std::ops::Range;

pub const CASES: &[Case] = &[
    Case {
        name: "dequantize_f16_matches_the_reference_for_every_format",
        op: "dequantize_f16",
        run: dequantize_every_format,
    },
    Case {
        name: "dequantize_f16_into_an_unaligned_output_takes_the_narrow_stores",
        op: "dequantize_f16",
        run: dequantize_unaligned,
    },
    Case {
        name: "single_product_formats_are_bit_exact_at_any_scale",
        op: "dequantize_f16",
        run: single_product_formats_bit_exact,
    },
    Case {
        name: "dequantize_f16_row_ranges_tile_the_matrix",
        op: "dequantize_f16",
        run: row_ranges_tile_the_matrix,
    },
    Case {
        name: "f32_to_f16_matches_the_reference_bit_for_bit",
        op: "f32_to_f16",
        run: f32_to_f16_bit_for_bit,
    },
];

/// Halves the cases fill outputs with, to see what a kernel wrote and what it left: a NaN
/// pattern no conversion produces (hardware NaNs are 0x7fff or 0x7e00, and ±0x7e00 here).
const SENTINEL: u16 = 0xFEED;
/// Halves after the end of every output, which no launch may touch.
const GUARD: usize = 24;

/// Values the f32 and BF16 matrices carry besides uniform ones: zeros of both signs, f32 and
/// f16 subnormals, the f16 extremes and their rounding edges, overflow to ±inf, inf and NaN.
const SPECIAL: [f32; 16] = [
    0.0,
    -0.0,
    1e-40,
    -3e-6,
    6.0e-8,
    2.9e-8,
    65504.0,
    65519.0,
    65520.0,
    -1e6,
    3.0e38,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1.0 + 1.0 / 2048.0,
    -6.1e-5,
];

/// Random valid GGUF data for a `rows` x `cols` matrix of `format` (as the products' cases make
/// it, plus special values in the dense formats and every bit pattern in F16).
fn random_weights(
    rig: &Rig<'_>,
    rng: &mut StdRng,
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> crate::Result<Vec<u8>> {
    let n = rows * cols;
    let mut dense = uniform_vec(rng, n, -1.0, 1.0);
    for v in dense.iter_mut() {
        if rng.random_range(0..8) == 0 {
            *v = SPECIAL[rng.random_range(0..SPECIAL.len())];
        }
    }
    Ok(match format {
        GgmlType::F32 => dense.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::Bf16 => dense
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        // Any 16 bits are a half: subnormals, infinities and NaNs included.
        GgmlType::F16 => {
            let mut bytes = vec![0u8; 2 * n];
            rng.fill_bytes(&mut bytes);
            bytes
        }
        _ => {
            let mut bytes = vec![0u8; matrix_bytes(rig, format, rows, cols)?];
            fill_random_blocks(format, &mut bytes, rng);
            bytes
        }
    })
}

/// Bytes of a `rows` x `cols` matrix of `format`; an error of the case when that is not whole
/// blocks.
fn matrix_bytes(rig: &Rig<'_>, format: GgmlType, rows: usize, cols: usize) -> crate::Result<usize> {
    matvec::matrix_bytes(format, rows, cols)
        .ok_or_else(|| rig.failure(format!("{format} {rows} x {cols} is not whole blocks")))
}

/// f16 ulps the GPU may differ by, per format (see the module docs).
fn allowed_ulps(format: GgmlType) -> u32 {
    match format {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q2K => 1,
        _ => 0,
    }
}

/// A half's bits mapped to integers in the order of their values, +0 and -0 both to 0.
fn ordered(h: u16) -> i32 {
    let magnitude = i32::from(h & 0x7fff);
    if h & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Records that every `got[i]` is within `ulps` f16 steps of `want[i]` (an infinity counts as
/// the step after the largest finite half), and NaN exactly where `want` is NaN. The values
/// compared are the halves' places in value order ([`ordered`]), so the largest error is in
/// f16 steps; NaN on both sides counts as equal (its payload may change), NaN on one side only
/// fails.
fn f16_close(rig: &Rig<'_>, what: &str, got: &[u16], want: &[u16], ulps: u32) {
    let place = |h: u16| {
        if f16::from_bits(h).is_nan() {
            f32::NAN
        } else {
            // At most 0x7fff in magnitude: exact in f32.
            ordered(h) as f32
        }
    };
    let mut g: Vec<f32> = got.iter().map(|&h| place(h)).collect();
    let mut w: Vec<f32> = want.iter().map(|&h| place(h)).collect();
    for (a, b) in g.iter_mut().zip(w.iter_mut()) {
        if a.is_nan() && b.is_nan() {
            (*a, *b) = (0.0, 0.0);
        }
    }
    rig.within(&format!("{what} (in f16 steps)"), &g, &w, f64::from(ulps));
}

/// Records that every half of `all` outside `offset..offset + n` is still [`SENTINEL`].
fn untouched(rig: &Rig<'_>, what: &str, all: &[u16], offset: usize, n: usize) {
    let outside = all[..offset].iter().chain(&all[offset + n..]);
    let written = outside.filter(|&&h| h != SENTINEL).count();
    rig.holds(
        &format!("{what}: nothing outside the output written"),
        written == 0,
        format!(
            "{written} of {} halves outside the output written",
            all.len() - n
        ),
    );
}

/// Column counts for a format: one block and several (dense: also counts that are not a
/// multiple of 8, so rows end in a partial run, and one shorter than a run).
fn col_counts(format: GgmlType) -> Vec<usize> {
    match format.block_size() {
        1 => vec![32, 96, 37, 5],
        256 => vec![256, 768, 4096],
        b => vec![b, 3 * b, 11 * b],
    }
}

/// Row ranges of a `rows`-row matrix: all of it, and where possible an odd run starting past
/// row 0.
fn row_ranges(rows: usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::with_capacity(2);
    ranges.push(0..rows);
    if rows >= 7 {
        ranges.push(3..rows - 1);
    } else if rows > 1 {
        ranges.push(1..rows);
    }
    ranges
}

/// Dequantizes `range` of random matrices of `format` on the GPU into an output that starts
/// `offset` halves into its buffer (0: 16-byte aligned, the wide stores; 1: only 2-byte
/// aligned, the 16-bit stores), and checks it against the reference and that nothing outside
/// was written.
fn check_format(rig: &Rig<'_>, format: GgmlType, offset: usize, seed: u64) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(seed);
    for rows in [1, 7, 67] {
        for cols in col_counts(format) {
            let bytes = random_weights(rig, &mut rng, format, rows, cols)?;
            let wb = rig.upload(&bytes)?;
            let m = QuantMatrix::new(rig.view(&wb, bytes.len())?, format, rows, cols)?;
            let host = HostMatrix::new(&bytes, format, rows, cols)?;
            for range in row_ranges(rows) {
                let n = range.len() * cols;
                let total = offset + n + GUARD;
                let ob = rig.upload(&vec![SENTINEL; total])?;
                let mut out = rig
                    .view_mut::<u16>(&ob, total)?
                    .slice_mut(offset, n)
                    .ok_or_else(|| rig.failure(format!("{n} halves at {offset} of {total}")))?;
                dequant::dequantize_f16(k, s, &m, range.clone(), &mut out)?;
                let all: Vec<u16> = rig.download(&ob, total)?;
                let want = reference::dequant::dequantize_f16(&host, range.clone())?;
                let what = format!(
                    "dequantize_f16: {format} {rows} x {cols}, rows {range:?}, offset {offset}"
                );
                f16_close(
                    rig,
                    &what,
                    &all[offset..offset + n],
                    &want,
                    allowed_ulps(format),
                );
                untouched(rig, &what, &all, offset, n);
            }
        }
    }
    Ok(())
}

fn dequantize_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    for (i, format) in WEIGHT_FORMATS.into_iter().enumerate() {
        check_format(rig, format, 0, 100 + i as u64)?;
    }
    Ok(())
}

fn dequantize_unaligned(rig: &Rig<'_>) -> crate::Result<()> {
    let formats = [GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K];
    for (i, format) in formats.into_iter().enumerate() {
        check_format(rig, format, 1, 200 + i as u64)?;
    }
    Ok(())
}

fn single_product_formats_bit_exact(rig: &Rig<'_>) -> crate::Result<()> {
    // Scales of every bit pattern (huge, subnormal, inf, NaN): a single product rounds once on
    // both sides, so even overflow to ±inf and NaN must agree.
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(300);
    for (format, scale_at) in [
        (GgmlType::Q4_0, 0),
        (GgmlType::Q5_0, 0),
        (GgmlType::Q8_0, 0),
        (GgmlType::Q6K, 208),
    ] {
        let (rows, cols) = (9, 2 * format.block_size());
        let mut bytes = vec![0u8; matrix_bytes(rig, format, rows, cols)?];
        rng.fill_bytes(&mut bytes);
        // Every fourth block gets the largest finite scale, so overflow shows up for sure.
        for b in bytes.chunks_exact_mut(format.type_size()).step_by(4) {
            b[scale_at..scale_at + 2].copy_from_slice(&f16::MAX.to_bits().to_le_bytes());
        }
        let wb = rig.upload(&bytes)?;
        let m = QuantMatrix::new(rig.view(&wb, bytes.len())?, format, rows, cols)?;
        let host = HostMatrix::new(&bytes, format, rows, cols)?;
        let n = rows * cols;
        let ob = rig.upload(&vec![SENTINEL; n])?;
        dequant::dequantize_f16(k, s, &m, 0..rows, &mut rig.view_mut(&ob, n)?)?;
        let want = reference::dequant::dequantize_f16(&host, 0..rows)?;
        let what = format!("dequantize_f16 at any scale: {format}");
        let infinities = want
            .iter()
            .filter(|&&h| f16::from_bits(h).is_infinite())
            .count();
        rig.holds(
            &format!("{what}: the reference overflows somewhere"),
            infinities > 0,
            format!("{infinities} infinities in the reference"),
        );
        let got: Vec<u16> = rig.download(&ob, n)?;
        f16_close(rig, &what, &got, &want, 0);
    }
    Ok(())
}

fn row_ranges_tile_the_matrix(rig: &Rig<'_>) -> crate::Result<()> {
    // Prefill converts a matrix in pieces into one workspace: the pieces must put together the
    // whole conversion.
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(400);
    let (format, rows, cols) = (GgmlType::Q4K, 37, 512);
    let bytes = random_weights(rig, &mut rng, format, rows, cols)?;
    let wb = rig.upload(&bytes)?;
    let m = QuantMatrix::new(rig.view(&wb, bytes.len())?, format, rows, cols)?;
    let ob = rig.upload(&vec![SENTINEL; rows * cols])?;
    let mut out = rig.view_mut::<u16>(&ob, rows * cols)?;
    for range in [0..5, 5..6, 6..6, 6..30, 30..37] {
        let mut piece = out
            .slice_mut(range.start * cols, range.len() * cols)
            .ok_or_else(|| rig.failure(format!("rows {range:?} of the output")))?;
        dequant::dequantize_f16(k, s, &m, range, &mut piece)?;
    }
    let host = HostMatrix::new(&bytes, format, rows, cols)?;
    let want = reference::dequant::dequantize_f16(&host, 0..rows)?;
    let got: Vec<u16> = rig.download(&ob, rows * cols)?;
    f16_close(
        rig,
        &format!("dequantize_f16 in row ranges: {format} {rows} x {cols}"),
        &got,
        &want,
        allowed_ulps(format),
    );
    Ok(())
}

/// Inputs of the conversion case: uniform values of several magnitudes and every special case.
fn conversion_inputs(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let extra = [
        f32::from_bits(0x7fc0_0001),  // quiet NaN with a payload
        f32::from_bits(0xff80_0001),  // negative signalling NaN
        f32::from_bits(0x0000_0001),  // smallest f32 subnormal: +0
        f32::from_bits(0x8000_0001),  // -0
        5.960_464_5e-8,               // smallest f16 subnormal, 2^-24
        2.0f32.powi(-25),             // half of it: ties to even, +0
        2.0f32.powi(-25) * 1.000_001, // just above: the smallest subnormal
        3.0 * 2.0f32.powi(-25),       // 1.5 subnormal steps: ties to even, 2 steps
        6.097_555e-5,                 // the largest f16 subnormal
        6.103_515_6e-5,               // the smallest f16 normal
        f32::from_bits(0x477f_efff),  // just below 65520: rounds down to the largest half
        1.0 + 3.0 / 2048.0,           // a tie that rounds up to even
        f32::MAX,
        f32::MIN,
    ];
    (0..n)
        .map(|i| match i % 4 {
            _ if i < SPECIAL.len() => SPECIAL[i],
            _ if i < SPECIAL.len() + extra.len() => extra[i - SPECIAL.len()],
            0 => rng.random_range(-1.0f32..1.0),
            1 => rng.random_range(-1e5f32..1e5),
            2 => rng.random_range(-1e-4f32..1e-4),
            _ => f32::from_bits(rng.next_u32()),
        })
        .collect()
}

fn f32_to_f16_bit_for_bit(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(600);
    for n in [1, 7, 8, 9, 30, 4099] {
        // Offset 0: the 16-byte loads and stores; 1: both views only 4- and 2-byte aligned.
        for offset in [0, 1] {
            let x = conversion_inputs(&mut rng, offset + n);
            let xb = rig.upload(&x)?;
            let total = offset + n + GUARD;
            let ob = rig.upload(&vec![SENTINEL; total])?;
            let placed = || rig.failure(format!("{n} values at {offset}"));
            let xs = rig
                .view::<f32>(&xb, offset + n)?
                .slice(offset, n)
                .ok_or_else(placed)?;
            let mut out = rig
                .view_mut::<u16>(&ob, total)?
                .slice_mut(offset, n)
                .ok_or_else(placed)?;
            dequant::f32_to_f16(k, s, xs, n, &mut out)?;
            let all: Vec<u16> = rig.download(&ob, total)?;
            let want = reference::dequant::f32_to_f16(&x[offset..]);
            let what = format!("f32_to_f16: {n} values at offset {offset}");
            f16_close(rig, &what, &all[offset..offset + n], &want, 0);
            untouched(rig, &what, &all, offset, n);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Here rather than in tests/gpu_dequant.rs, next to the values it checks: it runs without a
    // GPU, and the special values have one copy.
    #[test]
    fn reference_agrees_with_the_half_crate_on_the_special_values() {
        // The truth the GPU cases compare against, checked by hand on the cases that matter.
        let out = reference::dequant::f32_to_f16(&SPECIAL);
        let expect: [u16; 16] = [
            0x0000, 0x8000, 0x0000, 0x8032, 0x0001, 0x0000, 0x7bff, 0x7bff, 0x7c00, 0xfc00, 0x7c00,
            0x7c00, 0xfc00, 0, 0x3c00, 0x83ff,
        ];
        for (i, (&g, &w)) in out.iter().zip(&expect).enumerate() {
            if SPECIAL[i].is_nan() {
                assert!(f16::from_bits(g).is_nan(), "[{i}]");
            } else {
                assert_eq!(g, w, "[{i}] {} -> {:#06x}", SPECIAL[i], g);
            }
        }
    }
}

//! The f16 dequantization and conversion ops (`ops::dequant`) against the CPU reference, for
//! every weight format, and their shape checks.
//!
//! The shape-check tests run without a GPU: they call the checks the launch wrappers make first,
//! on matrix descriptions whose memory is never touched. The GPU tests skip with a printed
//! reason without a GPU (fail under `HIPDECODE_REQUIRE_GPU=1`).
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
//!   every product below 1 in magnitude, so that rounding
//!   is at most 2^-25, below one f16 ulp (>= 2^-24) of any result, and the f16 values can differ
//!   by at most one step. An indexing mistake differs by thousands of ulps.
//!
//! NaN must stay NaN (its payload may change); a NaN where a number was expected fails.

mod common;

use common::{download, setup, upload, view, view_mut};
use gguf_loader::synth::fill_random_blocks;
use gguf_loader::GgmlType;
use half::{bf16, f16};
use hip_ffi::Stream;
use rand::{Rng, RngCore};
use rocm_kernels::ops::dequant::{self, check_dequantize_f16, check_f32_to_f16};
use rocm_kernels::ops::matvec::{self, QuantMatrix, WEIGHT_FORMATS};
use rocm_kernels::reference;
use rocm_kernels::reference::matvec::HostMatrix;
use rocm_kernels::{DeviceSlice, KernelError, Kernels};
use std::ops::Range;
use test_support::rng::{seeded, uniform_vec, StdRng};

/// Halves the tests fill outputs with, to see what a kernel wrote and what it left: a NaN
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

/// Random valid GGUF data for a `rows` x `cols` matrix of `format` (as tests/gpu_quant.rs makes
/// it, plus special values in the dense formats and every bit pattern in F16).
fn random_weights(rng: &mut StdRng, format: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    let mut dense = uniform_vec(rng, n, -1.0, 1.0);
    for v in dense.iter_mut() {
        if rng.random_range(0..8) == 0 {
            *v = SPECIAL[rng.random_range(0..SPECIAL.len())];
        }
    }
    match format {
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
            let mut bytes = vec![0u8; matvec::matrix_bytes(format, rows, cols).unwrap()];
            fill_random_blocks(format, &mut bytes, rng);
            bytes
        }
    }
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

/// Fails unless every `got[i]` is within `ulps` f16 steps of `want[i]` (an infinity counts as
/// the step after the largest finite half), and NaN exactly where `want` is NaN.
fn assert_f16_close(got: &[u16], want: &[u16], ulps: u32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (gf, wf) = (f16::from_bits(g), f16::from_bits(w));
        if wf.is_nan() || gf.is_nan() {
            assert!(
                wf.is_nan() && gf.is_nan(),
                "{what}: [{i}] gpu {gf} ({g:#06x}) vs cpu {wf} ({w:#06x}): NaN on one side only"
            );
            continue;
        }
        let distance = ordered(g).abs_diff(ordered(w));
        assert!(
            distance <= ulps,
            "{what}: [{i}] gpu {gf} ({g:#06x}) vs cpu {wf} ({w:#06x}): {distance} ulps > {ulps}"
        );
    }
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
fn check_format(k: &Kernels, s: &Stream, test: &str, format: GgmlType, offset: usize, seed: u64) {
    let mut rng = seeded(seed);
    for rows in [1, 7, 67] {
        for cols in col_counts(format) {
            let bytes = random_weights(&mut rng, format, rows, cols);
            let wb = upload(k, &bytes);
            let m = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).unwrap();
            let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
            for range in row_ranges(rows) {
                let n = range.len() * cols;
                let ob = upload(k, &vec![SENTINEL; offset + n + GUARD]);
                let mut out = view_mut::<u16>(&ob, offset + n + GUARD)
                    .slice_mut(offset, n)
                    .unwrap();
                dequant::dequantize_f16(k, s, &m, range.clone(), &mut out).unwrap();
                let all: Vec<u16> = download(s, &ob, offset + n + GUARD);
                let want = reference::dequant::dequantize_f16(&host, range.clone()).unwrap();
                let what = format!("{test}: {format} {rows} x {cols}, rows {range:?}");
                assert_f16_close(&all[offset..offset + n], &want, allowed_ulps(format), &what);
                assert!(
                    all[..offset]
                        .iter()
                        .chain(&all[offset + n..])
                        .all(|&h| h == SENTINEL),
                    "{what}: a half outside the output was written"
                );
            }
        }
    }
}

#[test]
fn dequantize_f16_matches_the_reference_for_every_format() {
    let test = "dequantize_f16_matches_the_reference_for_every_format";
    let Some((k, s)) = setup(test) else {
        return;
    };
    for (i, format) in WEIGHT_FORMATS.into_iter().enumerate() {
        check_format(k, &s, test, format, 0, 100 + i as u64);
    }
}

#[test]
fn dequantize_f16_into_an_unaligned_output_takes_the_narrow_stores() {
    let test = "dequantize_f16_into_an_unaligned_output_takes_the_narrow_stores";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let formats = [GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K];
    for (i, format) in formats.into_iter().enumerate() {
        check_format(k, &s, test, format, 1, 200 + i as u64);
    }
}

#[test]
fn single_product_formats_are_bit_exact_at_any_scale() {
    // Scales of every bit pattern (huge, subnormal, inf, NaN): a single product rounds once on
    // both sides, so even overflow to ±inf and NaN must agree.
    let test = "single_product_formats_are_bit_exact_at_any_scale";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(300);
    for (format, scale_at) in [
        (GgmlType::Q4_0, 0),
        (GgmlType::Q5_0, 0),
        (GgmlType::Q8_0, 0),
        (GgmlType::Q6K, 208),
    ] {
        let (rows, cols) = (9, 2 * format.block_size());
        let mut bytes = vec![0u8; matvec::matrix_bytes(format, rows, cols).unwrap()];
        rng.fill_bytes(&mut bytes);
        // Every fourth block gets the largest finite scale, so overflow shows up for sure.
        for b in bytes.chunks_exact_mut(format.type_size()).step_by(4) {
            b[scale_at..scale_at + 2].copy_from_slice(&f16::MAX.to_bits().to_le_bytes());
        }
        let wb = upload(k, &bytes);
        let m = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).unwrap();
        let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
        let n = rows * cols;
        let ob = upload(k, &vec![SENTINEL; n]);
        dequant::dequantize_f16(k, &s, &m, 0..rows, &mut view_mut(&ob, n)).unwrap();
        let want = reference::dequant::dequantize_f16(&host, 0..rows).unwrap();
        assert!(want.iter().any(|&h| f16::from_bits(h).is_infinite()));
        assert_f16_close(
            &download(&s, &ob, n),
            &want,
            0,
            &format!("{test}: {format}"),
        );
    }
}

#[test]
fn dequantize_f16_row_ranges_tile_the_matrix() {
    // Prefill converts a matrix in pieces into one workspace: the pieces must put together the
    // whole conversion.
    let test = "dequantize_f16_row_ranges_tile_the_matrix";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(400);
    let (format, rows, cols) = (GgmlType::Q4K, 37, 512);
    let bytes = random_weights(&mut rng, format, rows, cols);
    let wb = upload(k, &bytes);
    let m = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).unwrap();
    let ob = upload(k, &vec![SENTINEL; rows * cols]);
    let mut out = view_mut::<u16>(&ob, rows * cols);
    for range in [0..5, 5..6, 6..6, 6..30, 30..37] {
        let mut piece = out
            .slice_mut(range.start * cols, range.len() * cols)
            .unwrap();
        dequant::dequantize_f16(k, &s, &m, range, &mut piece).unwrap();
    }
    let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
    let want = reference::dequant::dequantize_f16(&host, 0..rows).unwrap();
    assert_f16_close(&download(&s, &ob, rows * cols), &want, 1, test);
}

#[test]
fn dequantize_f16_refuses_bad_shapes_without_writing() {
    let test = "dequantize_f16_refuses_bad_shapes_without_writing";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(500);
    let (format, rows, cols) = (GgmlType::Q8_0, 5, 64);
    let bytes = random_weights(&mut rng, format, rows, cols);
    let wb = upload(k, &bytes);
    let m = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).unwrap();
    let ob = upload(k, &vec![SENTINEL; rows * cols]);
    let mut out = view_mut::<u16>(&ob, rows * cols);
    for (range, out_len) in [
        (0..5, rows * cols - 1),
        (4..6, 2 * cols),
        (2..7, rows * cols),
    ] {
        let mut short = out.slice_mut(0, out_len).unwrap();
        let err = dequant::dequantize_f16(k, &s, &m, range, &mut short).unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
    }
    dequant::dequantize_f16(k, &s, &m, 3..3, &mut out).unwrap();
    let all: Vec<u16> = download(&s, &ob, rows * cols);
    assert!(all.iter().all(|&h| h == SENTINEL), "{test}: an error wrote");
}

/// Inputs of the conversion test: uniform values of several magnitudes and every special case.
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

#[test]
fn f32_to_f16_matches_the_reference_bit_for_bit() {
    let test = "f32_to_f16_matches_the_reference_bit_for_bit";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(600);
    for n in [1, 7, 8, 9, 30, 4099] {
        // Offset 0: the 16-byte loads and stores; 1: both views only 4- and 2-byte aligned.
        for offset in [0, 1] {
            let x = conversion_inputs(&mut rng, offset + n);
            let xb = upload(k, &x);
            let ob = upload(k, &vec![SENTINEL; offset + n + GUARD]);
            let xs: DeviceSlice<f32> = view::<f32>(&xb, offset + n).slice(offset, n).unwrap();
            let mut out = view_mut::<u16>(&ob, offset + n + GUARD)
                .slice_mut(offset, n)
                .unwrap();
            dequant::f32_to_f16(k, &s, xs, n, &mut out).unwrap();
            let all: Vec<u16> = download(&s, &ob, offset + n + GUARD);
            let want = reference::dequant::f32_to_f16(&x[offset..]);
            let what = format!("{test}: {n} values at offset {offset}");
            assert_f16_close(&all[offset..offset + n], &want, 0, &what);
            assert!(
                all[..offset]
                    .iter()
                    .chain(&all[offset + n..])
                    .all(|&h| h == SENTINEL),
                "{what}: a half outside the output was written"
            );
        }
    }
}

#[test]
fn f32_to_f16_refuses_short_views_without_writing() {
    let test = "f32_to_f16_refuses_short_views_without_writing";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let xb = upload(k, &[1.0f32; 16]);
    let ob = upload(k, &[SENTINEL; 16]);
    for (x_len, out_len) in [(15, 16), (16, 15)] {
        let err = dequant::f32_to_f16(k, &s, view(&xb, x_len), 16, &mut view_mut(&ob, out_len))
            .unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
    }
    dequant::f32_to_f16(k, &s, view(&xb, 0), 0, &mut view_mut(&ob, 0)).unwrap();
    let all: Vec<u16> = download(&s, &ob, 16);
    assert!(all.iter().all(|&h| h == SENTINEL), "{test}: an error wrote");
}

// ---- Shape checks, without a GPU.

/// A matrix description over memory that is never touched.
fn fake_matrix(format: GgmlType, rows: usize, cols: usize) -> QuantMatrix {
    let bytes = matvec::matrix_bytes(format, rows, cols).unwrap();
    // SAFETY: the view is never dereferenced: only the shape checks read the description.
    let data = unsafe { DeviceSlice::<u8>::from_raw(0x10_0000, bytes) };
    QuantMatrix::new(data, format, rows, cols).unwrap()
}

fn shape_message(result: rocm_kernels::Result<u32>) -> String {
    match result {
        Err(e @ KernelError::Shape { .. }) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn dequantize_f16_checks_name_the_problem() {
    let m = fake_matrix(GgmlType::Q4K, 7, 512);
    // Whole matrix, a sub-range, an empty range (0 runs: nothing is queued).
    assert_eq!(check_dequantize_f16(&m, &(0..7), 7 * 512).unwrap(), 7 * 64);
    assert_eq!(check_dequantize_f16(&m, &(2..5), 3 * 512).unwrap(), 3 * 64);
    assert_eq!(check_dequantize_f16(&m, &(7..7), 0).unwrap(), 0);

    let msg = shape_message(check_dequantize_f16(&m, &(5..8), 10_000));
    assert!(
        msg.contains("dequantize_f16") && msg.contains("5..8"),
        "{msg}"
    );
    assert!(msg.contains("7 rows"), "{msg}");
    let msg = shape_message(check_dequantize_f16(&m, &(8..8), 10_000));
    assert!(msg.contains("7 rows"), "{msg}");
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 5..3;
    let msg = shape_message(check_dequantize_f16(&m, &reversed, 10_000));
    assert!(msg.contains("reversed"), "{msg}");
    let msg = shape_message(check_dequantize_f16(&m, &(2..5), 3 * 512 - 1));
    assert!(
        msg.contains("out holds 1535") && msg.contains("1536"),
        "{msg}"
    );

    // A dense row that ends in a partial run still needs exactly rows * cols halves.
    let d = fake_matrix(GgmlType::F16, 3, 37);
    assert_eq!(check_dequantize_f16(&d, &(1..3), 74).unwrap(), 2 * 5);
    assert!(check_dequantize_f16(&d, &(1..3), 73).is_err());

    // More runs than the kernel's 32-bit index: 2^20 rows of 2^16 columns are 2^33 runs.
    let huge = fake_matrix(GgmlType::F32, 1 << 20, 1 << 16);
    let msg = shape_message(check_dequantize_f16(&huge, &(0..1 << 20), usize::MAX));
    assert!(msg.contains("32-bit"), "{msg}");
    // A range of the same matrix that fits is accepted.
    assert_eq!(
        check_dequantize_f16(&huge, &(0..1 << 10), usize::MAX).unwrap(),
        1 << 23
    );
}

#[test]
fn f32_to_f16_checks_name_the_problem() {
    assert_eq!(check_f32_to_f16(9, 9, 9).unwrap(), 9);
    assert_eq!(check_f32_to_f16(0, 0, 0).unwrap(), 0);
    let msg = shape_message(check_f32_to_f16(8, 9, 9));
    assert!(
        msg.contains("f32_to_f16") && msg.contains("x holds 8"),
        "{msg}"
    );
    let msg = shape_message(check_f32_to_f16(9, 9, 8));
    assert!(msg.contains("out holds 8"), "{msg}");
    let n = u32::MAX as usize + 1;
    let msg = shape_message(check_f32_to_f16(usize::MAX, n, usize::MAX));
    assert!(msg.contains("32-bit"), "{msg}");
}

#[test]
fn reference_agrees_with_the_half_crate_on_the_special_values() {
    // The truth the GPU tests compare against, checked by hand on the cases that matter.
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

//! What the f16 dequantization and conversion ops (`ops::dequant`) refuse, and their shape
//! checks.
//!
//! The shape-check tests run without a GPU: they call the checks the launch wrappers make first,
//! on matrix descriptions whose memory is never touched. The GPU tests (refused calls write
//! nothing) skip with a printed reason without a GPU (fail under `HIPDECODE_REQUIRE_GPU=1`).
//!
//! The comparisons of these ops with the CPU reference, for every format, are cases of the
//! self-test table (`rocm_kernels::selftest`, its dequant group), which `tests/gpu_selftest.rs`
//! runs; the check of the reference itself on the special values sits there too, as a unit
//! test next to the values.

mod common;

use common::{download, setup, upload, view, view_mut};
use gguf_loader::synth::fill_random_blocks_seeded;
use gguf_loader::GgmlType;
use rocm_kernels::ops::dequant::{self, check_dequantize_f16, check_f32_to_f16};
use rocm_kernels::ops::matvec::{self, QuantMatrix};
use rocm_kernels::{DeviceSlice, KernelError};

/// Halves the tests fill outputs with, to see that a refused call wrote nothing: a NaN pattern
/// no conversion produces.
const UNWRITTEN: u16 = 0xFEED;

#[test]
fn dequantize_f16_refuses_bad_shapes_without_writing() {
    let test = "dequantize_f16_refuses_bad_shapes_without_writing";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let (format, rows, cols) = (GgmlType::Q8_0, 5, 64);
    let mut bytes = vec![0u8; matvec::matrix_bytes(format, rows, cols).unwrap()];
    fill_random_blocks_seeded(format, &mut bytes, 500);
    let wb = upload(k, &bytes);
    let m = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).unwrap();
    let ob = upload(k, &vec![UNWRITTEN; rows * cols]);
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
    assert!(
        all.iter().all(|&h| h == UNWRITTEN),
        "{test}: an error wrote"
    );
}

#[test]
fn f32_to_f16_refuses_short_views_without_writing() {
    let test = "f32_to_f16_refuses_short_views_without_writing";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let xb = upload(k, &[1.0f32; 16]);
    let ob = upload(k, &[UNWRITTEN; 16]);
    for (x_len, out_len) in [(15, 16), (16, 15)] {
        let err = dequant::f32_to_f16(k, &s, view(&xb, x_len), 16, &mut view_mut(&ob, out_len))
            .unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
    }
    dequant::f32_to_f16(k, &s, view(&xb, 0), 0, &mut view_mut(&ob, 0)).unwrap();
    let all: Vec<u16> = download(&s, &ob, 16);
    assert!(
        all.iter().all(|&h| h == UNWRITTEN),
        "{test}: an error wrote"
    );
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

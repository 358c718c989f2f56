//! What the quantized-weight ops refuse, on the GPU: short views, and formats without an
//! 8-bit-activation kernel. Each skips with a printed reason without a GPU (fails under
//! `HIPDECODE_REQUIRE_GPU=1`).
//!
//! The comparisons of these ops (matvec, matmul, embed, MoE routing, expert products and
//! weighted sum) with the CPU reference are cases of the self-test table
//! (`rocm_kernels::selftest`, its products group), which `tests/gpu_selftest.rs` runs.

mod common;

use common::{setup, upload, view, view_mut};
use gguf_loader::synth::fill_random_blocks_seeded;
use gguf_loader::GgmlType;
use rocm_kernels::ops::matvec::{self, QuantMatrix};
use rocm_kernels::ops::matvec_q8::{self, Q8Activations};
use rocm_kernels::ops::{matmul, matmul_mma};
use rocm_kernels::{KernelError, Kernels};

/// Random valid blocks of `format` for a `rows` x `cols` matrix, uploaded, as a matrix; and the
/// buffer that holds it. The refusals never read it.
fn random_matrix(
    k: &Kernels,
    format: GgmlType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (hip_ffi::DeviceBuffer, QuantMatrix) {
    let mut bytes = vec![0u8; matvec::matrix_bytes(format, rows, cols).unwrap()];
    fill_random_blocks_seeded(format, &mut bytes, seed);
    let wb = upload(k, &bytes);
    let w = QuantMatrix::new(view(&wb, bytes.len()), format, rows, cols).expect("matrix");
    (wb, w)
}

#[test]
fn products_refuse_short_views_without_launching() {
    let test = "products_refuse_short_views_without_launching";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let (_wb, w) = random_matrix(k, GgmlType::Q8_0, 4, 64, 5);
    let xb = upload(k, &[0.0f32; 128]);
    let ob = upload(k, &[0.0f32; 8]);
    for op in [
        matvec::matvec as matvec::MatrixProduct,
        matmul::matmul,
        matmul_mma::matmul_mma,
    ] {
        let err = op(k, &s, &w, view(&xb, 127), &mut view_mut(&ob, 8), 2).unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
        let err = op(k, &s, &w, view(&xb, 128), &mut view_mut(&ob, 7), 2).unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
        op(k, &s, &w, view(&xb, 0), &mut view_mut(&ob, 0), 0).unwrap();
    }
    s.synchronize().unwrap();
}

#[test]
fn matvec_q8_refuses_formats_without_a_kernel() {
    let test = "matvec_q8_refuses_formats_without_a_kernel";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let (_wb, w) = random_matrix(k, GgmlType::F16, 2, 64, 9);
    // Activations of the right shape (one token of 64 values, two scales); the format is
    // refused before they would be read.
    let (vb, sb) = (upload(k, &[0i8; 64]), upload(k, &[1.0f32; 2]));
    let act = Q8Activations {
        values: view(&vb, 64),
        scales: view(&sb, 2),
    };
    let ob = upload(k, &[0.0f32; 2]);
    let err = matvec_q8::matvec(k, &s, &w, act, &mut view_mut(&ob, 2), 1).unwrap_err();
    assert!(
        matches!(err, KernelError::UnsupportedFormat { .. }),
        "{err}"
    );
}

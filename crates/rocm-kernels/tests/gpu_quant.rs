//! GPU tests of the quantized-weight ops (matvec, matmul, embed, MoE routing, expert products
//! and weighted sum) against the CPU reference, for every weight format the kernels read, at
//! odd shapes and partial tiles. Each skips with a printed reason without a GPU (fails under
//! `HIPDECODE_REQUIRE_GPU=1`).
//!
//! Test weights are random valid blocks: random bytes with the f16 scale fields set to small
//! finite values (every other bit pattern of these formats is a valid weight), dense formats
//! uniform in [-1, 1]. The reference dequantizes with gguf-loader (bit-exact with gguf-py) and
//! accumulates in f64.
//!
//! Tolerance of the products: every |gpu - cpu| <= 1e-4 x RMS of the reference output. The
//! GPU sums in f32 in another order (and may fuse the dequantization's multiply-add), which
//! costs about 1e-6 of the RMS at these sizes; an indexing mistake costs about 1. NaN fails.

mod common;

use common::{download, setup, upload, view, view_mut};
use gguf_loader::synth::fill_random_blocks;
use gguf_loader::GgmlType;
use half::{bf16, f16};
use hip_ffi::{DeviceBuffer, Stream};
use rand::Rng;
use rocm_kernels::mma::MmaVariant;
use rocm_kernels::ops::embed;
use rocm_kernels::ops::matvec::{self, QuantMatrix, MAX_TOKENS, WEIGHT_FORMATS};
use rocm_kernels::ops::matvec_q8::{self, Q8Activations, Q8ActivationsMut};
use rocm_kernels::ops::moe::{self, Accumulate, ExpertInput, QuantExperts};
use rocm_kernels::ops::{matmul, matmul_mma};
use rocm_kernels::reference;
use rocm_kernels::reference::matvec::HostMatrix;
use rocm_kernels::reference::matvec_q8::HostQ8;
use rocm_kernels::{DeviceSlice, DeviceSliceMut, KernelError, Kernels};
use test_support::rng::{seeded, uniform_vec, StdRng};
use test_support::tolerance::try_relative_error;

/// Random valid GGUF data for a `rows` x `cols` matrix of `format`.
fn random_weights(rng: &mut StdRng, format: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match format {
        GgmlType::F32 => uniform_vec(rng, n, -1.0, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => uniform_vec(rng, n, -1.0, 1.0)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::Bf16 => uniform_vec(rng, n, -1.0, 1.0)
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let mut bytes = vec![0u8; matvec::matrix_bytes(format, rows, cols).unwrap()];
            fill_random_blocks(format, &mut bytes, rng);
            bytes
        }
    }
}

/// Column counts for a format: one block and several blocks (dense: also a count that is not
/// a multiple of 8 or 32).
fn col_counts(format: GgmlType) -> Vec<usize> {
    match format.block_size() {
        1 => vec![32, 96, 37],
        b => vec![b, 3 * b],
    }
}

const RMS_TOL: f64 = 1e-4;

/// Fails unless every |got - want| <= tol x RMS(want), and on any NaN or infinity.
fn assert_close_rms(got: &[f32], want: &[f32], tol: f64, what: &str) {
    let e = try_relative_error(got, want).unwrap_or_else(|e| panic!("{what}: {e}"));
    let i = e.worst;
    assert!(
        e.max_rel() <= tol,
        "{what}: [{i}] gpu {} vs cpu {}: |err| {:.3e} > {tol} x RMS {:.3e}",
        got[i],
        want[i],
        e.max_abs,
        e.reference_rms
    );
}

/// Uploads a random `rows` x `cols` matrix of `format`; returns the buffer and host bytes.
fn weights_on_device(
    k: &Kernels,
    rng: &mut StdRng,
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> (DeviceBuffer, Vec<u8>) {
    let bytes = random_weights(rng, format, rows, cols);
    (upload(k, &bytes), bytes)
}

fn quant_matrix(
    buf: &DeviceBuffer,
    bytes: &[u8],
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> QuantMatrix {
    QuantMatrix::new(view(buf, bytes.len()), format, rows, cols).expect("matrix")
}

type ProductOp = fn(
    &Kernels,
    &Stream,
    &QuantMatrix,
    DeviceSlice<f32>,
    &mut DeviceSliceMut<f32>,
    usize,
) -> rocm_kernels::Result<()>;

type ReferenceOp = fn(&HostMatrix<'_>, &[f32], usize) -> rocm_kernels::Result<Vec<f32>>;

/// Runs `op` for every format, the given row counts, column counts and token counts, against
/// the f32 reference.
fn check_products(test: &str, op: ProductOp, tokens: &[usize], seed: u64) {
    check_products_against(test, op, reference::matmul::matmul, tokens, seed)
}

/// As [`check_products`], against `reference`.
fn check_products_against(
    test: &str,
    op: ProductOp,
    reference: ReferenceOp,
    tokens: &[usize],
    seed: u64,
) {
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(seed);
    for format in WEIGHT_FORMATS {
        for rows in [1, 7, 67] {
            for cols in col_counts(format) {
                let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
                let w = quant_matrix(&wb, &bytes, format, rows, cols);
                let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
                for &nt in tokens {
                    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                    let want = reference(&host, &x, nt).unwrap();
                    let xb = upload(k, &x);
                    let ob = upload(k, &vec![f32::NAN; nt * rows]);
                    op(
                        k,
                        &s,
                        &w,
                        view(&xb, x.len()),
                        &mut view_mut(&ob, nt * rows),
                        nt,
                    )
                    .unwrap();
                    let what = format!("{test}: {format} {rows} x {cols}, {nt} tokens");
                    assert_close_rms(&download(&s, &ob, nt * rows), &want, RMS_TOL, &what);
                }
            }
        }
    }
}

#[test]
fn matvec_matches_the_reference_for_every_format() {
    // 17 tokens take three launches of at most MAX_TOKENS.
    check_products(
        "matvec_matches_the_reference_for_every_format",
        matvec::matvec,
        &[1, 3, MAX_TOKENS, 17],
        1,
    );
}

#[test]
fn matvec_splits_long_rows_over_several_warps() {
    let test = "matvec_splits_long_rows_over_several_warps";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(11);
    // 4096 columns in few rows: several warps share each row (up to eight).
    for format in [GgmlType::F32, GgmlType::F16, GgmlType::Q4K, GgmlType::Q8_0] {
        for rows in [1, 67] {
            let cols = 4096;
            let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
            let w = quant_matrix(&wb, &bytes, format, rows, cols);
            let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
            for nt in [1, 3] {
                let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                let want = reference::matvec::matvec(&host, &x, nt).unwrap();
                let xb = upload(k, &x);
                let ob = upload(k, &vec![f32::NAN; nt * rows]);
                matvec::matvec(
                    k,
                    &s,
                    &w,
                    view(&xb, x.len()),
                    &mut view_mut(&ob, nt * rows),
                    nt,
                )
                .unwrap();
                let what = format!("{test}: {format} {rows} x {cols}, {nt} tokens");
                assert_close_rms(&download(&s, &ob, nt * rows), &want, RMS_TOL, &what);
            }
        }
    }
}

#[test]
fn matmul_matches_the_reference_for_every_format() {
    // 67 rows and 100 tokens leave partial 64-wide tiles in both directions.
    check_products(
        "matmul_matches_the_reference_for_every_format",
        matmul::matmul,
        &[1, 3, 17, 100],
        2,
    );
}

#[test]
fn linear_matches_the_reference_on_both_sides_of_the_switch() {
    check_products(
        "linear_matches_the_reference_on_both_sides_of_the_switch",
        matmul::linear,
        &[MAX_TOKENS, MAX_TOKENS + 1],
        3,
    );
}

#[test]
fn matmul_covers_several_tiles_of_a_real_shape() {
    let test = "matmul_covers_several_tiles_of_a_real_shape";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(4);
    // A Q4_K projection of 2 x 1024 into 200 rows for 130 tokens: 4 x 3 tiles, 32 K steps.
    let (format, rows, cols, nt) = (GgmlType::Q4K, 200, 1024, 130);
    let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
    let w = quant_matrix(&wb, &bytes, format, rows, cols);
    let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
    let want = reference::matmul::matmul(&host, &x, nt).unwrap();
    let xb = upload(k, &x);
    let ob = upload(k, &vec![f32::NAN; nt * rows]);
    matmul::matmul(
        k,
        &s,
        &w,
        view(&xb, x.len()),
        &mut view_mut(&ob, nt * rows),
        nt,
    )
    .unwrap();
    assert_close_rms(&download(&s, &ob, nt * rows), &want, RMS_TOL, test);
}

#[test]
fn matmul_mma_matches_the_half_rounded_reference_for_every_format() {
    // 67 rows leave a partial tile of 64 rows, 100 tokens a partial second tile of 64 and a
    // token tile of 16 only partly filled; 96 columns of a 32-block format a partial step of
    // 128, and 37 dense columns a partial run of eight.
    check_products_against(
        "matmul_mma_matches_the_half_rounded_reference_for_every_format",
        matmul_mma::matmul_mma,
        reference::matmul_mma::matmul_mma,
        &[1, 9, 16, 33, 64, 100],
        12,
    );
}

#[test]
fn matmul_mma_native_and_simt_builds_agree_at_real_shapes() {
    let test = "matmul_mma_native_and_simt_builds_agree_at_real_shapes";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let simt = common::simt_kernels(test, k.device());
    eprintln!(
        "{test}: the default build's variant is {}",
        k.mma_variant().name()
    );
    let mut rng = seeded(13);
    // The 8B's shapes in fewer rows: 14 and 4 steps of 128 columns, several row tiles, one and
    // three token tiles.
    for (format, rows, cols) in [(GgmlType::Q4K, 320, 1792), (GgmlType::Q6K, 130, 512)] {
        let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
        let w = quant_matrix(&wb, &bytes, format, rows, cols);
        let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
        for nt in [40, 130] {
            let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
            let want = reference::matmul_mma::matmul_mma(&host, &x, nt).unwrap();
            let xb = upload(k, &x);
            let mut got = Vec::new();
            for kernels in [k, simt] {
                let ob = upload(k, &vec![f32::NAN; nt * rows]);
                let (x, mut o) = (view(&xb, x.len()), view_mut(&ob, nt * rows));
                matmul_mma::matmul_mma(kernels, &s, &w, x, &mut o, nt).unwrap();
                got.push(download(&s, &ob, nt * rows));
            }
            let what = format!("{test}: {format} {rows} x {cols}, {nt} tokens");
            for (g, build) in got.iter().zip([k.mma_variant(), MmaVariant::Simt]) {
                assert_close_rms(g, &want, RMS_TOL, &format!("{what}, {}", build.name()));
            }
            assert_close_rms(
                &got[0],
                &got[1],
                RMS_TOL,
                &format!("{what}, native vs simt"),
            );
        }
    }
}

#[test]
fn matmul_mma_split_over_the_columns_matches_the_reference_and_the_unsplit_product() {
    let test = "matmul_mma_split_over_the_columns_matches_the_reference_and_the_unsplit_product";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(14);
    // Decode-step shapes: few row tiles, so the columns split. The Q6_K case's buffer holds
    // four splits of its 18 steps, which leaves a shorter last split (5, 5, 5, 3). The
    // partials are poisoned with NaN: any value a split did not write would show.
    for (format, rows, cols, nt, buffer_splits) in [
        (GgmlType::Q4K, 256, 4096, 16, matmul_mma::MAX_SPLITS),
        (GgmlType::Q6K, 130, 2304, 33, 4),
        (GgmlType::Q8_0, 64, 2048, 9, matmul_mma::MAX_SPLITS),
    ] {
        let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
        let w = quant_matrix(&wb, &bytes, format, rows, cols);
        let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let want = reference::matmul_mma::matmul_mma(&host, &x, nt).unwrap();
        let xb = upload(k, &x);
        let what = format!("{test}: {format} {rows} x {cols}, {nt} tokens");
        let floats = buffer_splits * rows * nt;
        let pb = upload(k, &vec![f32::NAN; floats]);
        let ob = upload(k, &vec![f32::NAN; nt * rows]);
        let splits = matmul_mma::matmul_mma_split(
            k,
            &s,
            &w,
            view(&xb, x.len()),
            &mut view_mut(&ob, nt * rows),
            nt,
            &mut view_mut(&pb, floats),
        )
        .unwrap();
        assert!(splits > 1, "{what}: the columns were not split");
        let split = download(&s, &ob, nt * rows);
        assert_close_rms(&split, &want, RMS_TOL, &what);
        let ob1 = upload(k, &vec![f32::NAN; nt * rows]);
        matmul_mma::matmul_mma(
            k,
            &s,
            &w,
            view(&xb, x.len()),
            &mut view_mut(&ob1, nt * rows),
            nt,
        )
        .unwrap();
        let whole = download(&s, &ob1, nt * rows);
        assert_close_rms(&split, &whole, RMS_TOL, &format!("{what}, split vs whole"));
        // A buffer too small for two splits is left alone: one pass, straight into out.
        let small = rows * nt + 1;
        let pb = upload(k, &vec![f32::NAN; small]);
        let ob2 = upload(k, &vec![f32::NAN; nt * rows]);
        let one = matmul_mma::matmul_mma_split(
            k,
            &s,
            &w,
            view(&xb, x.len()),
            &mut view_mut(&ob2, nt * rows),
            nt,
            &mut view_mut(&pb, small),
        )
        .unwrap();
        assert_eq!(one, 1, "{what}: split into a buffer that holds one split");
        let unsplit: Vec<f32> = download(&s, &ob2, nt * rows);
        assert!(
            unsplit
                .iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: one split differs from matmul_mma"
        );
        assert!(
            download::<f32>(&s, &pb, small).iter().all(|v| v.is_nan()),
            "{what}"
        );
    }
}

#[test]
fn products_refuse_short_views_without_launching() {
    let test = "products_refuse_short_views_without_launching";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(5);
    let (wb, bytes) = weights_on_device(k, &mut rng, GgmlType::Q8_0, 4, 64);
    let w = quant_matrix(&wb, &bytes, GgmlType::Q8_0, 4, 64);
    let xb = upload(k, &[0.0f32; 128]);
    let ob = upload(k, &[0.0f32; 8]);
    for op in [
        matvec::matvec as ProductOp,
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
fn embed_gathers_every_format_and_zeroes_out_of_range_ids() {
    let test = "embed_gathers_every_format_and_zeroes_out_of_range_ids";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(6);
    let vocab = 5;
    for format in WEIGHT_FORMATS {
        let dim = match format.block_size() {
            1 => 37,
            b => 2 * b,
        };
        let (tb, bytes) = weights_on_device(k, &mut rng, format, vocab, dim);
        let table = quant_matrix(&tb, &bytes, format, vocab, dim);
        let host = HostMatrix::new(&bytes, format, vocab, dim).unwrap();
        for (ids, scale) in [(vec![3, 0, -1, 4, 5, 2], 0.5f32), (vec![4, 4, 1], 25.3)] {
            let (want, bad) = reference::embed::embed(&host, &ids, scale).unwrap();
            let idb = upload(k, &ids);
            let ob = upload(k, &vec![f32::NAN; ids.len() * dim]);
            let fb = upload(k, &[0i32]);
            embed::embed(
                k,
                &s,
                &table,
                view(&idb, ids.len()),
                ids.len(),
                scale,
                &mut view_mut(&ob, ids.len() * dim),
                Some(&mut view_mut(&fb, 1)),
            )
            .unwrap();
            let got = download::<f32>(&s, &ob, ids.len() * dim);
            let what = format!("embed {format} ids {ids:?}");
            // One product per value: only a fused multiply-add in the dequantization differs.
            assert_close_rms(&got, &want, 1e-6, &what);
            for (t, &id) in ids.iter().enumerate() {
                if id < 0 || id >= vocab as i32 {
                    assert!(
                        got[t * dim..(t + 1) * dim].iter().all(|&v| v == 0.0),
                        "{what}"
                    );
                }
            }
            assert_eq!(
                download::<i32>(&s, &fb, 1)[0],
                i32::from(bad),
                "{what}: flag"
            );
        }
    }
    // Without a flag, a bad id still reads nothing and writes zeros.
    let (tb, bytes) = weights_on_device(k, &mut rng, GgmlType::Q6K, vocab, 256);
    let table = quant_matrix(&tb, &bytes, GgmlType::Q6K, vocab, 256);
    let idb = upload(k, &[i32::MAX, i32::MIN]);
    let ob = upload(k, &vec![f32::NAN; 512]);
    embed::embed(
        k,
        &s,
        &table,
        view(&idb, 2),
        2,
        1.0,
        &mut view_mut(&ob, 512),
        None,
    )
    .unwrap();
    assert!(download::<f32>(&s, &ob, 512).iter().all(|&v| v == 0.0));
}

/// Router logits with ties: row 0 all equal, row 1 every third expert tied at the top and
/// -0.0 / +0.0 next to each other, the rest random.
fn router_logits(rng: &mut StdRng, rows: usize, n_expert: usize) -> Vec<f32> {
    let mut logits = uniform_vec(rng, rows * n_expert, -4.0, 4.0);
    logits[..n_expert].fill(1.0);
    if rows > 1 {
        let row = &mut logits[n_expert..2 * n_expert];
        for v in row.iter_mut().step_by(3) {
            *v = 2.5;
        }
        row[1] = -0.0;
        row[2] = 0.0;
    }
    if rows > 2 {
        // Quantized-looking logits: many exact ties at every level.
        for v in &mut logits[2 * n_expert..3 * n_expert] {
            *v = (*v * 2.0).round() / 2.0;
        }
    }
    logits
}

#[test]
fn routing_matches_the_cpu_rule_with_ties() {
    let test = "routing_matches_the_cpu_rule_with_ties";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(7);
    for (rows, n_expert, top) in [(5, 8, 2), (3, 128, 8), (4, 200, 7), (3, 64, 64), (1, 1, 1)] {
        let logits = router_logits(&mut rng, rows, n_expert);
        let (want_ids, want_w) = reference::moe::route_top_k(&logits, rows, n_expert, top).unwrap();
        let lb = upload(k, &logits);
        let ib = upload(k, &vec![-7i32; rows * top]);
        let wb = upload(k, &vec![f32::NAN; rows * top]);
        moe::route_top_k(
            k,
            &s,
            view(&lb, logits.len()),
            rows,
            n_expert,
            top,
            &mut view_mut(&ib, rows * top),
            &mut view_mut(&wb, rows * top),
        )
        .unwrap();
        let what = format!("route {rows} x {n_expert}, top {top}");
        assert_eq!(
            download::<i32>(&s, &ib, rows * top),
            want_ids,
            "{what}: ids"
        );
        let got_w = download::<f32>(&s, &wb, rows * top);
        for (i, (&g, &w)) in got_w.iter().zip(&want_w).enumerate() {
            // Weights are in [0, 1]; the device's expf may differ from the CPU's by an ulp or two.
            assert!(
                (g - w).abs() <= 1e-6,
                "{what}: weight [{i}] gpu {g} vs cpu {w}"
            );
        }
    }
    // More experts than one warp's lanes hold, and k out of range, are errors.
    let too_many = 64 * k.wave_size() as usize + 1;
    let lb = upload(k, &vec![0.0f32; too_many]);
    let ib = upload(k, &[0i32; 2]);
    let wb = upload(k, &[0.0f32; 2]);
    for (n_expert, top) in [(too_many, 2), (4, 5), (4, 0)] {
        let err = moe::route_top_k(
            k,
            &s,
            view(&lb, too_many),
            1,
            n_expert,
            top,
            &mut view_mut(&ib, 2),
            &mut view_mut(&wb, 2),
        )
        .unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
    }
}

#[test]
fn expert_products_match_the_reference_for_every_format() {
    let test = "expert_products_match_the_reference_for_every_format";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(8);
    let (n_expert, rows, nt, top) = (5, 9, 3, 2);
    // Pair 4 names expert 9 of 5: a zero row, and no read outside the stack.
    let ids = [4i32, 0, 2, 2, 9, 1];
    for format in WEIGHT_FORMATS {
        let cols = match format.block_size() {
            1 => 40,
            b => 2 * b,
        };
        let (eb, bytes) = weights_on_device(k, &mut rng, format, n_expert * rows, cols);
        let experts =
            QuantExperts::new(view(&eb, bytes.len()), format, n_expert, rows, cols).unwrap();
        let host = HostMatrix::new(&bytes, format, n_expert * rows, cols).unwrap();
        let idb = upload(k, &ids);
        for input in [ExpertInput::PerToken, ExpertInput::PerSlot] {
            let x_rows = if input == ExpertInput::PerSlot {
                nt * top
            } else {
                nt
            };
            let x = uniform_vec(&mut rng, x_rows * cols, -1.0, 1.0);
            let want =
                reference::moe::matvec_id(&host, n_expert, &ids, nt, top, &x, input).unwrap();
            let xb = upload(k, &x);
            let ob = upload(k, &vec![f32::NAN; nt * top * rows]);
            moe::matvec_id(
                k,
                &s,
                &experts,
                view(&idb, ids.len()),
                nt,
                top,
                view(&xb, x.len()),
                input,
                &mut view_mut(&ob, nt * top * rows),
            )
            .unwrap();
            let what = format!("matvec_id {format} {input:?}");
            assert_close_rms(&download(&s, &ob, nt * top * rows), &want, RMS_TOL, &what);
        }
    }
}

#[test]
fn weighted_sum_stores_and_adds() {
    let test = "weighted_sum_stores_and_adds";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(9);
    for (nt, top, dim) in [(1, 1, 1), (3, 4, 300), (17, 8, 640)] {
        let y = uniform_vec(&mut rng, nt * top * dim, -2.0, 2.0);
        let w = uniform_vec(&mut rng, nt * top, 0.0, 1.0);
        let base = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
        for mode in [Accumulate::Store, Accumulate::Add] {
            let mut want = base.clone();
            reference::moe::weighted_sum(&y, &w, nt, top, dim, &mut want, mode).unwrap();
            let (yb, wb, ob) = (upload(k, &y), upload(k, &w), upload(k, &base));
            moe::weighted_sum(
                k,
                &s,
                view(&yb, y.len()),
                view(&wb, w.len()),
                nt,
                top,
                dim,
                &mut view_mut(&ob, base.len()),
                mode,
            )
            .unwrap();
            // At most 9 f32 terms, same order; only fused multiply-adds differ.
            let what = format!("weighted_sum {nt} x {top} x {dim} {mode:?}");
            assert_close_rms(&download(&s, &ob, base.len()), &want, 1e-6, &what);
        }
    }
}

/// Routing, expert products and the weighted sum queued back to back with no host read in
/// between, as a decode step runs them; the result matches the reference chain.
#[test]
fn moe_chain_runs_without_host_sync() {
    let test = "moe_chain_runs_without_host_sync";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(10);
    let (nt, n_expert, top, dim, ff) = (3, 8, 2, 256, 256);
    let format = GgmlType::Q4K;
    let logits = uniform_vec(&mut rng, nt * n_expert, -3.0, 3.0);
    let x = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
    let residual = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
    let (up_b, up_bytes) = weights_on_device(k, &mut rng, format, n_expert * ff, dim);
    let (down_b, down_bytes) = weights_on_device(k, &mut rng, format, n_expert * dim, ff);
    let up = QuantExperts::new(view(&up_b, up_bytes.len()), format, n_expert, ff, dim).unwrap();
    let down =
        QuantExperts::new(view(&down_b, down_bytes.len()), format, n_expert, dim, ff).unwrap();

    // Reference chain.
    let (ids, w) = reference::moe::route_top_k(&logits, nt, n_expert, top).unwrap();
    let up_h = HostMatrix::new(&up_bytes, format, n_expert * ff, dim).unwrap();
    let down_h = HostMatrix::new(&down_bytes, format, n_expert * dim, ff).unwrap();
    let hidden =
        reference::moe::matvec_id(&up_h, n_expert, &ids, nt, top, &x, ExpertInput::PerToken)
            .unwrap();
    let y = reference::moe::matvec_id(
        &down_h,
        n_expert,
        &ids,
        nt,
        top,
        &hidden,
        ExpertInput::PerSlot,
    )
    .unwrap();
    let mut want = residual.clone();
    reference::moe::weighted_sum(&y, &w, nt, top, dim, &mut want, Accumulate::Add).unwrap();

    // Device chain.
    let lb = upload(k, &logits);
    let xb = upload(k, &x);
    let ib = upload(k, &vec![0i32; nt * top]);
    let wb = upload(k, &vec![0.0f32; nt * top]);
    let hb = upload(k, &vec![f32::NAN; nt * top * ff]);
    let yb = upload(k, &vec![f32::NAN; nt * top * dim]);
    let ob = upload(k, &residual);
    let (mut ids_v, mut w_v) = (
        view_mut::<i32>(&ib, nt * top),
        view_mut::<f32>(&wb, nt * top),
    );
    moe::route_top_k(
        k,
        &s,
        view(&lb, logits.len()),
        nt,
        n_expert,
        top,
        &mut ids_v,
        &mut w_v,
    )
    .unwrap();
    let mut hidden_v = view_mut::<f32>(&hb, nt * top * ff);
    moe::matvec_id(
        k,
        &s,
        &up,
        ids_v.as_const(),
        nt,
        top,
        view(&xb, x.len()),
        ExpertInput::PerToken,
        &mut hidden_v,
    )
    .unwrap();
    let mut y_v = view_mut::<f32>(&yb, nt * top * dim);
    moe::matvec_id(
        k,
        &s,
        &down,
        ids_v.as_const(),
        nt,
        top,
        hidden_v.as_const(),
        ExpertInput::PerSlot,
        &mut y_v,
    )
    .unwrap();
    moe::weighted_sum(
        k,
        &s,
        y_v.as_const(),
        w_v.as_const(),
        nt,
        top,
        dim,
        &mut view_mut(&ob, nt * dim),
        Accumulate::Add,
    )
    .unwrap();
    assert_eq!(download::<i32>(&s, &ib, nt * top), ids, "{test}: ids");
    // Two chained products: the intermediate's f32 error carries into the second, so 2e-4.
    assert_close_rms(&download(&s, &ob, nt * dim), &want, 2e-4, test);
}

/// Quantizes `x` (`nt` rows of `cols`) on the device; returns the device buffers and their
/// contents.
fn quantize_on_device(
    k: &Kernels,
    s: &Stream,
    x: &[f32],
    nt: usize,
    cols: usize,
) -> (DeviceBuffer, DeviceBuffer, HostQ8) {
    let n = nt * cols;
    let xb = upload(k, x);
    let vb = upload(k, &vec![0x7fi8; n]);
    let sb = upload(k, &vec![f32::NAN; n / matvec_q8::GROUP]);
    let mut q = Q8ActivationsMut {
        values: view_mut(&vb, n),
        scales: view_mut(&sb, n / matvec_q8::GROUP),
    };
    matvec_q8::quantize(k, s, view(&xb, n), nt, cols, &mut q).unwrap();
    let host = HostQ8 {
        values: download(s, &vb, n),
        scales: download(s, &sb, n / matvec_q8::GROUP),
    };
    (vb, sb, host)
}

#[test]
fn activation_quantization_matches_the_reference() {
    let test = "activation_quantization_matches_the_reference";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(7);
    for (nt, cols) in [(1, 32), (3, 640), (8, 4096)] {
        let mut x = uniform_vec(&mut rng, nt * cols, -3.0, 3.0);
        // An all-zero group and a group with one large value.
        x[..32].fill(0.0);
        if x.len() >= 64 {
            x[40] = 1e4;
        }
        let (_vb, _sb, got) = quantize_on_device(k, &s, &x, nt, cols);
        let want = reference::matvec_q8::quantize(&x).unwrap();
        for (i, (g, w)) in got.scales.iter().zip(&want.scales).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{nt} x {cols}: scale {i}: gpu {g} vs cpu {w}"
            );
        }
        for (i, (&g, &w)) in got.values.iter().zip(&want.values).enumerate() {
            assert!(
                (i32::from(g) - i32::from(w)).abs() <= 1,
                "{nt} x {cols}: value {i}: gpu {g} vs cpu {w}"
            );
        }
        let exact = got.values.iter().zip(&want.values).filter(|(a, b)| a == b);
        assert!(exact.count() * 1000 >= got.values.len() * 999);
    }
}

#[test]
fn matvec_q8_matches_the_reference_for_every_format() {
    let test = "matvec_q8_matches_the_reference_for_every_format";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(8);
    for format in matvec_q8::Q8_FORMATS {
        // 4096 columns make several warps share a row (two for the k-quants, four for the
        // 32-value blocks), the smaller counts one warp with idle lanes.
        for cols in [format.block_size(), 3 * format.block_size(), 4096] {
            for rows in [1, 7, 67] {
                let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
                let w = quant_matrix(&wb, &bytes, format, rows, cols);
                let host = HostMatrix::new(&bytes, format, rows, cols).unwrap();
                for nt in [1, 3, MAX_TOKENS, 11] {
                    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                    let (vb, sb, q) = quantize_on_device(k, &s, &x, nt, cols);
                    let want = reference::matvec_q8::matvec(&host, &q, nt).unwrap();
                    let ob = upload(k, &vec![f32::NAN; nt * rows]);
                    let act = Q8Activations {
                        values: view(&vb, nt * cols),
                        scales: view(&sb, nt * cols / matvec_q8::GROUP),
                    };
                    matvec_q8::matvec(k, &s, &w, act, &mut view_mut(&ob, nt * rows), nt).unwrap();
                    let what = format!("{test}: {format} {rows} x {cols}, {nt} tokens");
                    assert_close_rms(&download(&s, &ob, nt * rows), &want, RMS_TOL, &what);
                }
            }
        }
    }
}

#[test]
fn matvec_q8_refuses_formats_without_a_kernel() {
    let test = "matvec_q8_refuses_formats_without_a_kernel";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(9);
    let (wb, bytes) = weights_on_device(k, &mut rng, GgmlType::F16, 2, 64);
    let w = quant_matrix(&wb, &bytes, GgmlType::F16, 2, 64);
    let (vb, sb, _) = quantize_on_device(k, &s, &uniform_vec(&mut rng, 64, -1.0, 1.0), 1, 64);
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

#[test]
fn int8_expert_products_match_the_reference_of_the_same_activations() {
    let test = "int8_expert_products_match_the_reference_of_the_same_activations";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(10);
    let (n_expert, rows, nt, top) = (5, 9, 3, 2);
    // Pair 4 names expert 9 of 5: a zero row, and no read outside the stack.
    let ids = [4i32, 0, 2, 2, 9, 1];
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let (eb, bytes) = weights_on_device(k, &mut rng, format, n_expert * rows, cols);
        let experts =
            QuantExperts::new(view(&eb, bytes.len()), format, n_expert, rows, cols).unwrap();
        let host = HostMatrix::new(&bytes, format, n_expert * rows, cols).unwrap();
        let idb = upload(k, &ids);
        for input in [ExpertInput::PerToken, ExpertInput::PerSlot] {
            let x_rows = if input == ExpertInput::PerSlot {
                nt * top
            } else {
                nt
            };
            let x = uniform_vec(&mut rng, x_rows * cols, -1.0, 1.0);
            let (vb, sb, q) = quantize_on_device(k, &s, &x, x_rows, cols);
            let want =
                reference::moe::matvec_id(&host, n_expert, &ids, nt, top, &q.dequantized(), input)
                    .unwrap();
            let ob = upload(k, &vec![f32::NAN; nt * top * rows]);
            let act = Q8Activations {
                values: view(&vb, x.len()),
                scales: view(&sb, x.len() / matvec_q8::GROUP),
            };
            matvec_q8::matvec_id(
                k,
                &s,
                &experts,
                view(&idb, ids.len()),
                nt,
                top,
                act,
                input,
                &mut view_mut(&ob, nt * top * rows),
            )
            .unwrap();
            let what = format!("matvec_id_q8 {format} {input:?}");
            assert_close_rms(&download(&s, &ob, nt * top * rows), &want, RMS_TOL, &what);
        }
    }
}

#[test]
fn int8_expert_pairs_match_two_single_products() {
    let test = "int8_expert_pairs_match_two_single_products";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(13);
    let (n_expert, rows, nt, top) = (4, 11, 2, 2);
    let ids = [3i32, 0, 1, 7];
    let idb = upload(k, &ids);
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let stack = |rng: &mut StdRng| {
            let (b, bytes) = weights_on_device(k, rng, format, n_expert * rows, cols);
            (b, bytes.len())
        };
        let ((gb, gn), (ub, un)) = (stack(&mut rng), stack(&mut rng));
        let gate = QuantExperts::new(view(&gb, gn), format, n_expert, rows, cols).unwrap();
        let up = QuantExperts::new(view(&ub, un), format, n_expert, rows, cols).unwrap();
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(k, &s, &x, nt, cols);
        let act = || Q8Activations {
            values: view(&vb, x.len()),
            scales: view(&sb, x.len() / matvec_q8::GROUP),
        };
        let n_out = nt * top * rows;
        let single = |experts: &QuantExperts| {
            let ob = upload(k, &vec![f32::NAN; n_out]);
            let input = ExpertInput::PerToken;
            let ids = view(&idb, ids.len());
            let out = &mut view_mut(&ob, n_out);
            matvec_q8::matvec_id(k, &s, experts, ids, nt, top, act(), input, out).unwrap();
            download::<f32>(&s, &ob, n_out)
        };
        let (want_g, want_u) = (single(&gate), single(&up));
        let (og, ou) = (
            upload(k, &vec![f32::NAN; n_out]),
            upload(k, &vec![f32::NAN; n_out]),
        );
        matvec_q8::matvec_id_pair(
            k,
            &s,
            (&gate, &mut view_mut(&og, n_out)),
            (&up, &mut view_mut(&ou, n_out)),
            view(&idb, ids.len()),
            nt,
            top,
            act(),
            ExpertInput::PerToken,
        )
        .unwrap();
        // The same kernel body on the same inputs: bit for bit (NaN never equals).
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            want_g.iter().chain(&want_u).all(|v| v.is_finite()),
            "{format}"
        );
        assert_eq!(
            bits(&download(&s, &og, n_out)),
            bits(&want_g),
            "{test}: {format} gate"
        );
        assert_eq!(
            bits(&download(&s, &ou, n_out)),
            bits(&want_u),
            "{test}: {format} up"
        );
        // Overlapping outputs are refused before anything is queued.
        let err = matvec_q8::matvec_id_pair(
            k,
            &s,
            (&gate, &mut view_mut(&og, n_out)),
            (&up, &mut view_mut(&og, n_out)),
            view(&idb, ids.len()),
            nt,
            top,
            act(),
            ExpertInput::PerToken,
        )
        .unwrap_err();
        assert!(err.to_string().contains("overlap"), "{err}");
    }
}

#[test]
fn moe_down_matches_the_product_and_weighted_sum_it_replaces() {
    let test = "moe_down_matches_the_product_and_weighted_sum_it_replaces";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(14);
    let (n_expert, rows, nt, top) = (5, 13, 3, 4);
    // Token 1's last slot names expert 8 of 5: it adds nothing and reads no weights.
    let ids = [4i32, 0, 2, 1, 3, 3, 0, 8, 1, 2, 4, 0];
    let routing: Vec<f32> = (0..nt * top).map(|_| rng.random_range(0.05..0.6)).collect();
    let (idb, wtb) = (upload(k, &ids), upload(k, &routing));
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let (eb, bytes) = weights_on_device(k, &mut rng, format, n_expert * rows, cols);
        let experts =
            QuantExperts::new(view(&eb, bytes.len()), format, n_expert, rows, cols).unwrap();
        let x = uniform_vec(&mut rng, nt * top * cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(k, &s, &x, nt * top, cols);
        let act = || Q8Activations {
            values: view(&vb, x.len()),
            scales: view(&sb, x.len() / matvec_q8::GROUP),
        };
        // What it replaces: the per-slot products, then their weighted sum.
        let yb = upload(k, &vec![f32::NAN; nt * top * rows]);
        let ids_v = view(&idb, ids.len());
        let y = &mut view_mut(&yb, nt * top * rows);
        let input = ExpertInput::PerSlot;
        matvec_q8::matvec_id(k, &s, &experts, ids_v, nt, top, act(), input, y).unwrap();
        let wantb = upload(k, &vec![f32::NAN; nt * rows]);
        moe::weighted_sum(
            k,
            &s,
            view(&yb, nt * top * rows),
            view(&wtb, routing.len()),
            nt,
            top,
            rows,
            &mut view_mut(&wantb, nt * rows),
            moe::Accumulate::Store,
        )
        .unwrap();
        let want = download::<f32>(&s, &wantb, nt * rows);
        let gotb = upload(k, &vec![f32::NAN; nt * rows]);
        let wt = view(&wtb, routing.len());
        let out = &mut view_mut(&gotb, nt * rows);
        matvec_q8::moe_down(k, &s, &experts, ids_v, wt, nt, top, act(), out).unwrap();
        let got = download::<f32>(&s, &gotb, nt * rows);
        // The same products added in the same slot order; only the compiler's contraction of
        // multiply-adds may differ between the two kernels.
        assert_close_rms(&got, &want, 1e-6, &format!("{test}: {format}"));
    }
    // A k the kernel's block cannot hold is refused before anything is queued.
    let format = GgmlType::Q4K;
    let (eb, bytes) = weights_on_device(k, &mut rng, format, 2, 256);
    let experts = QuantExperts::new(view(&eb, bytes.len()), format, 1, 2, 256).unwrap();
    let big = matvec_q8::MOE_DOWN_MAX_K + 1;
    let (vb, sb, _) = quantize_on_device(k, &s, &vec![0.5; big * 256], big, 256);
    let act = Q8Activations {
        values: view(&vb, big * 256),
        scales: view(&sb, big * 256 / matvec_q8::GROUP),
    };
    let ib = upload(k, &vec![0i32; big]);
    let wb = upload(k, &vec![1.0f32; big]);
    let ob = upload(k, &[0.0f32; 2]);
    let err = matvec_q8::moe_down(
        k,
        &s,
        &experts,
        view(&ib, big),
        view(&wb, big),
        1,
        big,
        act,
        &mut view_mut(&ob, 2),
    )
    .unwrap_err();
    assert!(err.to_string().contains("experts per token"), "{err}");
}

#[test]
fn matvec_q8_pairs_match_two_single_products() {
    let test = "matvec_q8_pairs_match_two_single_products";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(12);
    for format in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5_0] {
        let cols = 4 * format.block_size();
        // Two row counts, either larger: the grid covers the taller matrix.
        for (rows, rows2) in [(67, 7), (7, 67)] {
            let (wb, bytes) = weights_on_device(k, &mut rng, format, rows, cols);
            let (wb2, bytes2) = weights_on_device(k, &mut rng, format, rows2, cols);
            let w = quant_matrix(&wb, &bytes, format, rows, cols);
            let w2 = quant_matrix(&wb2, &bytes2, format, rows2, cols);
            for nt in [1, 3] {
                let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                let (vb, sb, q) = quantize_on_device(k, &s, &x, nt, cols);
                let act = Q8Activations {
                    values: view(&vb, nt * cols),
                    scales: view(&sb, nt * cols / matvec_q8::GROUP),
                };
                let ob = upload(k, &vec![f32::NAN; nt * rows]);
                let ob2 = upload(k, &vec![f32::NAN; nt * rows2]);
                matvec_q8::matvec_pair(
                    k,
                    &s,
                    &w,
                    &mut view_mut(&ob, nt * rows),
                    &w2,
                    &mut view_mut(&ob2, nt * rows2),
                    act,
                    nt,
                )
                .unwrap();
                for (bytes_h, r, buf) in [(&bytes, rows, &ob), (&bytes2, rows2, &ob2)] {
                    let host = HostMatrix::new(bytes_h, format, r, cols).unwrap();
                    let want = reference::matvec_q8::matvec(&host, &q, nt).unwrap();
                    let what =
                        format!("{test}: {format} {r} of ({rows}, {rows2}) rows, {nt} tokens");
                    assert_close_rms(&download(&s, buf, nt * r), &want, RMS_TOL, &what);
                }
            }
        }
        let (wb, bytes) = weights_on_device(k, &mut rng, format, 2, cols);
        let (wb2, bytes2) = weights_on_device(k, &mut rng, GgmlType::Q8_0, 2, cols);
        let w = quant_matrix(&wb, &bytes, format, 2, cols);
        let w2 = quant_matrix(&wb2, &bytes2, GgmlType::Q8_0, 2, cols);
        let (vb, sb, _) =
            quantize_on_device(k, &s, &uniform_vec(&mut rng, cols, -1.0, 1.0), 1, cols);
        let act = Q8Activations {
            values: view(&vb, cols),
            scales: view(&sb, cols / matvec_q8::GROUP),
        };
        let (ob, ob2) = (upload(k, &[0.0f32; 2]), upload(k, &[0.0f32; 2]));
        let mixed = matvec_q8::matvec_pair(
            k,
            &s,
            &w,
            &mut view_mut(&ob, 2),
            &w2,
            &mut view_mut(&ob2, 2),
            act,
            1,
        );
        assert!(
            format == GgmlType::Q8_0 || mixed.is_err(),
            "{format} with Q8_0 is not a pair"
        );
    }
}

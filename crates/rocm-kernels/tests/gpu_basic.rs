//! GPU tests of the basic ops (norm, elementwise, sampling) against the CPU reference, at odd and
//! real shapes. Each skips with a printed reason without a GPU (fails under
//! `HIPDECODE_REQUIRE_GPU=1`). Tolerances are stated per op; a NaN never passes a comparison.

mod common;

use common::{download, setup, upload, view, view_mut};
use rand::Rng;
use rocm_kernels::ops::elementwise::{self, GateActivation};
use rocm_kernels::ops::norm;
use rocm_kernels::ops::sampling::{self, SamplingParams, ARGMAX_WORKSPACE};
use rocm_kernels::reference;
use rocm_kernels::KernelError;
use test_support::rng::{seeded, uniform_vec, StdRng};

/// Fails unless every |got - want| <= abs + rel * |want| (false for NaN, so NaN fails).
fn assert_close(got: &[f32], want: &[f32], rel: f32, abs: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= abs + rel * w.abs();
        assert!(
            ok,
            "{what}: [{i}] gpu {g} vs cpu {w} (rel {rel}, abs {abs})"
        );
    }
}

fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: [{i}] gpu {g} vs cpu {w} (exact)"
        );
    }
}

const DIMS: [usize; 10] = [1, 7, 64, 128, 256, 257, 640, 1152, 2051, 4096];
const ROWS: [usize; 3] = [1, 3, 17];

// Norm: the GPU sums squares in another order than the CPU, so 2e-5 relative (f32 sums of up
// to 4096 squares) plus 1e-6 absolute.
const NORM_REL: f32 = 2e-5;
const NORM_ABS: f32 = 1e-6;

#[test]
fn rms_norm_matches_the_reference_out_of_place_and_in_place() {
    let Some((k, s)) = setup("rms_norm_matches_the_reference_out_of_place_and_in_place") else {
        return;
    };
    let mut rng = seeded(1);
    for dim in DIMS {
        for rows in ROWS {
            let x = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
            let w = uniform_vec(&mut rng, dim, 0.5, 14.0);
            let eps = 1e-6;
            let mut want = vec![0.0; rows * dim];
            reference::norm::rms_norm(&x, &w, &mut want, rows, dim, eps).unwrap();
            let (xb, wb) = (upload(k, &x), upload(k, &w));
            let ob = upload(k, &vec![f32::NAN; rows * dim]);
            norm::rms_norm(
                k,
                &s,
                view(&xb, x.len()),
                view(&wb, dim),
                &mut view_mut(&ob, x.len()),
                rows,
                dim,
                eps,
            )
            .unwrap();
            let what = format!("rms_norm rows {rows} dim {dim}");
            assert_close(
                &download(&s, &ob, x.len()),
                &want,
                NORM_REL,
                NORM_ABS,
                &what,
            );
            norm::rms_norm_inplace(
                k,
                &s,
                &mut view_mut(&xb, x.len()),
                view(&wb, dim),
                rows,
                dim,
                eps,
            )
            .unwrap();
            let what = format!("rms_norm_inplace rows {rows} dim {dim}");
            assert_close(
                &download(&s, &xb, x.len()),
                &want,
                NORM_REL,
                NORM_ABS,
                &what,
            );
        }
    }
}

#[test]
fn per_head_norm_matches_the_reference() {
    let Some((k, s)) = setup("per_head_norm_matches_the_reference") else {
        return;
    };
    let mut rng = seeded(2);
    // (tokens, heads, head_dim): Qwen3 and Gemma 3 shapes, odd ones, and one past the warp path.
    for (tokens, heads, head_dim) in [
        (1, 16, 128),
        (3, 8, 256),
        (17, 4, 64),
        (5, 3, 7),
        (2, 1, 1),
        (1, 2, 300),
    ] {
        let n = tokens * heads;
        let x = uniform_vec(&mut rng, n * head_dim, -4.0, 4.0);
        let w = uniform_vec(&mut rng, head_dim, 0.1, 2.0);
        let mut want = x.clone();
        reference::norm::rms_norm_inplace(&mut want, &w, n, head_dim, 1e-6).unwrap();
        let (xb, wb) = (upload(k, &x), upload(k, &w));
        norm::rms_norm_inplace(
            k,
            &s,
            &mut view_mut(&xb, x.len()),
            view(&wb, head_dim),
            n,
            head_dim,
            1e-6,
        )
        .unwrap();
        let what = format!("per-head norm {tokens}x{heads}x{head_dim}");
        assert_close(
            &download(&s, &xb, x.len()),
            &want,
            NORM_REL,
            NORM_ABS,
            &what,
        );
    }
}

#[test]
fn query_and_key_norms_in_one_launch_match_two_launches() {
    let test = "query_and_key_norms_in_one_launch_match_two_launches";
    let Some((k, s)) = setup(test) else {
        return;
    };
    let mut rng = seeded(3);
    // (query vectors, key vectors, head_dim): Qwen3's and Gemma 3's, no keys, and one past the
    // one-warp path (two launches).
    for (qn, kn, dim) in [(32, 4, 128), (4, 1, 256), (5, 0, 64), (3, 2, 300)] {
        let (q, kx) = (
            uniform_vec(&mut rng, qn * dim, -4.0, 4.0),
            uniform_vec(&mut rng, kn * dim, -4.0, 4.0),
        );
        let (qw, kw) = (
            uniform_vec(&mut rng, dim, 0.1, 2.0),
            uniform_vec(&mut rng, dim, 0.1, 2.0),
        );
        let (qwb, kwb) = (upload(k, &qw), upload(k, &kw));
        let single = |x: &[f32], wb, rows| {
            let xb = upload(k, x);
            let len = x.len();
            norm::rms_norm_inplace(
                k,
                &s,
                &mut view_mut(&xb, len),
                view(wb, dim),
                rows,
                dim,
                1e-6,
            )
            .unwrap();
            download::<f32>(&s, &xb, len)
        };
        let (want_q, want_k) = (single(&q, &qwb, qn), single(&kx, &kwb, kn));
        // One allocation for both, as a layer's activations sit side by side.
        let mut both = q.clone();
        both.extend_from_slice(&kx);
        let b = upload(k, &both);
        let mut qv = view_mut::<f32>(&b, q.len());
        // SAFETY: the keys' values follow the queries' in the same buffer, which outlives the
        // view; the test reads it only after the stream is synchronized.
        let mut kv = unsafe {
            rocm_kernels::DeviceSliceMut::<f32>::from_raw(
                b.ptr().0 + (q.len() * 4) as u64,
                kn * dim,
            )
        };
        norm::rms_norm_inplace_pair(
            k,
            &s,
            (&mut qv, view(&qwb, dim), qn),
            (&mut kv, view(&kwb, dim), kn),
            dim,
            1e-6,
        )
        .unwrap();
        let got = download::<f32>(&s, &b, both.len());
        let what = format!("{test}: {qn} + {kn} vectors of {dim}");
        assert_bits_eq(&got[..q.len()], &want_q, &format!("{what}: q"));
        assert_bits_eq(&got[q.len()..], &want_k, &format!("{what}: k"));
    }
}

const LENS: [usize; 7] = [1, 7, 640, 1152, 2051, 6144 * 3, 100_003];

#[test]
fn gated_activations_match_the_reference() {
    let Some((k, s)) = setup("gated_activations_match_the_reference") else {
        return;
    };
    let mut rng = seeded(3);
    for act in [GateActivation::Silu, GateActivation::GeluTanh] {
        for len in LENS {
            let g = uniform_vec(&mut rng, len, -12.0, 12.0);
            let u = uniform_vec(&mut rng, len, -3.0, 3.0);
            let mut want = g.clone();
            reference::elementwise::gated(&mut want, &u, len, act).unwrap();
            let (gb, ub) = (upload(k, &g), upload(k, &u));
            elementwise::gated(k, &s, &mut view_mut(&gb, len), view(&ub, len), len, act).unwrap();
            let got = download::<f32>(&s, &gb, len);
            // expf / tanhf differ by a few ulp between libraries; 1 + tanh(x) near -1 cancels,
            // so the absolute part scales with |gate * up|.
            for i in 0..len {
                let tol = 1e-5 * want[i].abs() + 1e-6 * (1.0 + (g[i] * u[i]).abs());
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{act:?} len {len} [{i}]: gate {} up {}: gpu {} cpu {}",
                    g[i],
                    u[i],
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn softcap_matches_the_reference_and_stays_inside_the_cap() {
    let Some((k, s)) = setup("softcap_matches_the_reference") else {
        return;
    };
    let mut rng = seeded(4);
    for cap in [30.0f32, 0.5] {
        for len in LENS {
            let x = uniform_vec(&mut rng, len, -100.0, 100.0);
            let mut want = x.clone();
            reference::elementwise::softcap(&mut want, len, cap).unwrap();
            let xb = upload(k, &x);
            elementwise::softcap(k, &s, &mut view_mut(&xb, len), len, cap).unwrap();
            let got = download::<f32>(&s, &xb, len);
            // tanhf differs by a few ulp between libraries.
            assert_close(
                &got,
                &want,
                1e-5,
                1e-6 * cap,
                &format!("cap {cap} len {len}"),
            );
            assert!(
                got.iter().all(|v| v.abs() <= cap),
                "cap {cap}: a value past the cap"
            );
        }
    }
    let xb = upload(k, &[1.0f32]);
    for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = elementwise::softcap(k, &s, &mut view_mut(&xb, 1), 1, cap).unwrap_err();
        assert!(e.to_string().contains("cap"), "{e}");
    }
}

#[test]
fn add_bias_scale_copy_and_zero_match_the_reference_exactly() {
    let Some((k, s)) = setup("add_bias_scale_copy_and_zero_match_the_reference_exactly") else {
        return;
    };
    let mut rng = seeded(4);
    for len in LENS {
        let x = uniform_vec(&mut rng, len, -5.0, 5.0);
        let y = uniform_vec(&mut rng, len, -5.0, 5.0);
        let (xb, yb) = (upload(k, &x), upload(k, &y));
        // One add, one scale: single roundings, the same on both sides.
        let mut want = x.clone();
        reference::elementwise::add(&mut want, &y, len).unwrap();
        elementwise::add(k, &s, &mut view_mut(&xb, len), view(&yb, len), len).unwrap();
        assert_bits_eq(&download(&s, &xb, len), &want, &format!("add len {len}"));
        reference::elementwise::scale(&mut want, len, -0.37).unwrap();
        elementwise::scale(k, &s, &mut view_mut(&xb, len), len, -0.37).unwrap();
        assert_bits_eq(&download(&s, &xb, len), &want, &format!("scale len {len}"));
        // Zero only a prefix: the rest stays.
        let n0 = len / 2 + 1;
        reference::elementwise::zero(&mut want, n0).unwrap();
        elementwise::zero(k, &s, &mut view_mut(&xb, len), n0).unwrap();
        assert_bits_eq(
            &download(&s, &xb, len),
            &want,
            &format!("zero {n0} of {len}"),
        );
    }
    for dim in DIMS {
        for rows in ROWS {
            let x = uniform_vec(&mut rng, rows * dim, -5.0, 5.0);
            let b = uniform_vec(&mut rng, dim, -1.0, 1.0);
            let mut want = x.clone();
            reference::elementwise::add_bias(&mut want, &b, rows, dim).unwrap();
            let (xb, bb) = (upload(k, &x), upload(k, &b));
            elementwise::add_bias(
                k,
                &s,
                &mut view_mut(&xb, x.len()),
                view(&bb, dim),
                rows,
                dim,
            )
            .unwrap();
            let what = format!("add_bias rows {rows} dim {dim}");
            assert_bits_eq(&download(&s, &xb, x.len()), &want, &what);

            // copy_rows: rows 1.. of a (rows + 2)-row source into a (rows + 3)-row destination at
            // row 2; the other destination rows keep their values.
            let src = uniform_vec(&mut rng, (rows + 2) * dim, -5.0, 5.0);
            let dst = uniform_vec(&mut rng, (rows + 3) * dim, -5.0, 5.0);
            let mut want = dst.clone();
            reference::elementwise::copy_rows(&src, 1, &mut want, 2, rows, dim).unwrap();
            let (sb, db) = (upload(k, &src), upload(k, &dst));
            elementwise::copy_rows(
                k,
                &s,
                view(&sb, src.len()),
                1,
                &mut view_mut(&db, dst.len()),
                2,
                rows,
                dim,
            )
            .unwrap();
            let what = format!("copy_rows rows {rows} dim {dim}");
            assert_bits_eq(&download(&s, &db, dst.len()), &want, &what);
        }
    }
}

#[test]
fn add_scaled_row_reads_alpha_from_the_device_and_touches_one_row() {
    let Some((k, s)) = setup("add_scaled_row_reads_alpha_from_the_device_and_touches_one_row")
    else {
        return;
    };
    let mut rng = seeded(5);
    for dim in DIMS {
        let rows = 3;
        let x = uniform_vec(&mut rng, rows * dim, -5.0, 5.0);
        let y = uniform_vec(&mut rng, dim, -5.0, 5.0);
        let xb = upload(k, &x);
        let yb = upload(k, &y);
        let mut want = x.clone();
        // Two steps with different alphas through the same launch arguments: the kernel must
        // read the value at run time.
        let mut ab = upload(k, &[0.0f32]);
        for (row, alpha) in [(2usize, 0.3f32), (0, -1.75)] {
            ab.copy_from_host(&[alpha]).unwrap();
            reference::elementwise::add_scaled_row(&mut want, row, &y, alpha, dim).unwrap();
            elementwise::add_scaled_row(
                k,
                &s,
                &mut view_mut(&xb, x.len()),
                row,
                view(&yb, dim),
                view(&ab, 1),
                dim,
            )
            .unwrap();
            // x + alpha * y may be fused into one rounding on the GPU: 1 ulp of the terms.
            let what = format!("add_scaled_row dim {dim} row {row}");
            assert_close(&download(&s, &xb, x.len()), &want, 2e-7, 1e-6, &what);
        }
    }
}

/// Rows for argmax and sampling: random logits of several vocabulary sizes (Gemma's 262144
/// among them) and hand-made edge cases.
fn logit_rows(rng: &mut StdRng) -> Vec<(String, Vec<f32>)> {
    let mut rows = Vec::new();
    for n in [1usize, 7, 1000, 32_000, 151_936, 262_144 + 3] {
        rows.push((format!("random {n}"), uniform_vec(rng, n, -12.0, 18.0)));
    }
    let mut tie = uniform_vec(rng, 5000, -1.0, 1.0);
    tie[1234] = 7.0;
    tie[4321] = 7.0;
    tie[4999] = 7.0;
    rows.push(("tie at 1234/4321/4999".into(), tie));
    let mut nan = uniform_vec(rng, 3000, -1.0, 1.0);
    nan[0] = f32::NAN;
    nan[17] = f32::NAN;
    nan[2999] = 5.0;
    rows.push(("NaN around a max at the end".into(), nan));
    rows.push(("all NaN".into(), vec![f32::NAN; 300]));
    rows.push((
        "-inf and NaN only".into(),
        vec![f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY],
    ));
    rows.push(("-0 before +0".into(), vec![-1.0, -0.0, 0.0, -3.0]));
    rows.push((
        "max at index 0".into(),
        (0..4097).map(|i| -(i as f32)).collect(),
    ));
    rows
}

#[test]
fn argmax_matches_the_reference_on_every_row() {
    let Some((k, s)) = setup("argmax_matches_the_reference_on_every_row") else {
        return;
    };
    let mut rng = seeded(6);
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[-1i32]);
    for (name, row) in logit_rows(&mut rng) {
        let lb = upload(k, &row);
        sampling::argmax(
            k,
            &s,
            view(&lb, row.len()),
            row.len(),
            &mut view_mut(&ws, ARGMAX_WORKSPACE),
            &mut view_mut(&out, 1),
        )
        .unwrap();
        let got = download::<i32>(&s, &out, 1)[0];
        assert_eq!(
            got,
            reference::sampling::argmax(&row) as i32,
            "argmax of {name}"
        );
    }
    // n = 0 writes 0.
    let lb = upload(k, &[1.0f32]);
    sampling::argmax(
        k,
        &s,
        view(&lb, 1),
        0,
        &mut view_mut(&ws, ARGMAX_WORKSPACE),
        &mut view_mut(&out, 1),
    )
    .unwrap();
    assert_eq!(download::<i32>(&s, &out, 1)[0], 0, "argmax of nothing");
}

#[test]
fn sampling_picks_the_cpu_samplers_token_for_the_same_draw() {
    let Some((k, s)) = setup("sampling_picks_the_cpu_samplers_token_for_the_same_draw") else {
        return;
    };
    let mut rng = seeded(7);
    let settings = [
        SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 0.9,
        },
        SamplingParams {
            temperature: 0.3,
            top_k: 1,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 2.0,
            top_k: 5000,
            top_p: 0.5,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 0.999,
        },
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
        },
    ];
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[-1i32]);
    let mut drawb = upload(k, &[0.0f32]);
    let (mut compared, mut ties) = (0usize, 0usize);
    for (name, row) in logit_rows(&mut rng) {
        let lb = upload(k, &row);
        for p in &settings {
            for d in 0..12 {
                // Draws spread over [0, 1), both ends included.
                let u: f32 = match d {
                    0 => 0.0,
                    1 => 1.0 - f32::EPSILON / 2.0,
                    _ => rng.random_range(0.0..1.0),
                };
                drawb.copy_from_host(&[u]).unwrap();
                sampling::sample(
                    k,
                    &s,
                    view(&lb, row.len()),
                    row.len(),
                    p,
                    view(&drawb, 1),
                    &mut view_mut(&ws, ARGMAX_WORKSPACE),
                    &mut view_mut(&out, 1),
                )
                .unwrap();
                let got = download::<i32>(&s, &out, 1)[0];
                let want = reference::sampling::sample(&row, p, u as f64).unwrap();
                // Closer to a boundary than 1e-6 of the mass is a float tie: another order of
                // additions (or a 1-ulp exp) may pick the neighbour. So are NaN weights (the
                // -inf row) and a top-k cut inside equal logits. Counted, not compared.
                if want.margin < 1e-6 {
                    ties += 1;
                    continue;
                }
                compared += 1;
                assert_eq!(
                    got, want.token as i32,
                    "{name}, {p:?}, u = {u}: gpu {got}, cpu {} (margin {:e})",
                    want.token, want.margin
                );
            }
        }
    }
    eprintln!("sampling: {compared} draws compared, {ties} float ties skipped");
    // The rows include deliberate ties (equal logits, a -inf row, draws at 0): what matters is
    // that enough draws were compared, and every compared one agreed (asserted above).
    assert!(
        compared >= 500,
        "only {compared} draws compared ({ties} ties skipped): too few to mean anything"
    );
}

#[test]
fn sampling_time_on_a_gemma_sized_vocabulary() {
    let Some((k, s)) = setup("sampling_time_on_a_gemma_sized_vocabulary") else {
        return;
    };
    let mut rng = seeded(8);
    let n = 262_144;
    let row = uniform_vec(&mut rng, n, -12.0, 18.0);
    let lb = upload(k, &row);
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[-1i32]);
    let drawb = upload(k, &[0.5f32]);
    for p in [
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        },
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.95,
        },
    ] {
        let run = || {
            sampling::sample(
                k,
                &s,
                view(&lb, n),
                n,
                &p,
                view(&drawb, 1),
                &mut view_mut(&ws, ARGMAX_WORKSPACE),
                &mut view_mut(&out, 1),
            )
            .unwrap()
        };
        run();
        s.synchronize().unwrap();
        let reps = 20;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            run();
        }
        s.synchronize().unwrap();
        // Informational (includes launch overhead); the lead records it.
        eprintln!(
            "sample {n} logits {p:?}: {:.1?} per call",
            t.elapsed() / reps
        );
        let got = download::<i32>(&s, &out, 1)[0];
        let want = reference::sampling::sample(&row, &p, 0.5).unwrap();
        assert!(
            want.margin < 1e-6 || got == want.token as i32,
            "{p:?}: gpu {got} cpu {want:?}"
        );
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let Some((k, s)) = setup("bad_shapes_are_errors_not_panics") else {
        return;
    };
    let b = upload(k, &[0.0f32; 16]);
    let ws = upload(k, &vec![0u64; ARGMAX_WORKSPACE]);
    let out = upload(k, &[0i32]);
    let is_shape = |r: rocm_kernels::Result<()>, what: &str| match r {
        Err(KernelError::Shape { .. }) => {}
        other => panic!("{what}: expected a shape error, got {other:?}"),
    };
    is_shape(
        norm::rms_norm(
            k,
            &s,
            view(&b, 16),
            view(&b, 4),
            &mut view_mut(&b, 16),
            5,
            4,
            1e-6,
        ),
        "norm rows past the end",
    );
    is_shape(
        norm::rms_norm_inplace(k, &s, &mut view_mut(&b, 16), view(&b, 4), 4, 0, 1e-6),
        "norm dim 0",
    );
    is_shape(
        norm::rms_norm_inplace(k, &s, &mut view_mut(&b, 16), view(&b, 4), 4, 4, f32::NAN),
        "norm eps NaN",
    );
    let (lo, hi) = (view_mut::<f32>(&b, 8), view::<f32>(&b, 16));
    let mut lo = lo;
    is_shape(
        elementwise::add(k, &s, &mut lo, hi.slice(4, 8).unwrap(), 8),
        "add over overlapping views",
    );
    is_shape(
        elementwise::gated(
            k,
            &s,
            &mut view_mut(&b, 16),
            view(&b, 4),
            8,
            GateActivation::Silu,
        ),
        "gated with short up",
    );
    is_shape(
        elementwise::add_scaled_row(k, &s, &mut view_mut(&b, 8), 2, view(&b, 4), view(&b, 1), 4),
        "add_scaled_row row past the end",
    );
    is_shape(
        elementwise::copy_rows(k, &s, view(&b, 8), 1, &mut view_mut(&b, 16), 3, 2, 4),
        "copy_rows source past the end",
    );
    is_shape(
        sampling::argmax(
            k,
            &s,
            view(&b, 16),
            17,
            &mut view_mut(&ws, 256),
            &mut view_mut(&out, 1),
        ),
        "argmax past the end",
    );
    is_shape(
        sampling::argmax(
            k,
            &s,
            view(&b, 16),
            16,
            &mut view_mut(&ws, 10),
            &mut view_mut(&out, 1),
        ),
        "argmax short workspace",
    );
    let bad = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.0,
    };
    is_shape(
        sampling::sample(
            k,
            &s,
            view(&b, 16),
            16,
            &bad,
            view(&b, 1),
            &mut view_mut(&ws, 256),
            &mut view_mut(&out, 1),
        ),
        "top_p 0",
    );
    s.synchronize().unwrap();
}

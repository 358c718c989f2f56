//! Norms, elementwise ops and sampling against the reference, at odd and real shapes.

use super::case::{seeded, uniform_vec, Case};
use super::rig::Rig;
use crate::ops::elementwise::{self, GateActivation};
use crate::ops::matvec_q8::Q8ActivationsMut;
use crate::ops::norm::{self, Residual};
use crate::ops::sampling::{self, SamplingParams, ARGMAX_WORKSPACE};
use crate::reference;
use crate::DeviceSliceMut;
use rand::rngs::StdRng;
use rand::Rng;

pub const CASES: &[Case] = &[
    Case {
        name: "rms_norm_matches_the_reference_out_of_place_and_in_place",
        op: "rms_norm",
        run: rms_norm_out_of_place_and_in_place,
    },
    Case {
        name: "per_head_norm_matches_the_reference",
        op: "rms_norm",
        run: per_head_norm,
    },
    Case {
        name: "query_and_key_norms_in_one_launch_match_two_launches",
        op: "rms_norm",
        run: query_and_key_norms_in_one_launch,
    },
    Case {
        name: "residual_add_norm_and_quantization_in_one_launch_match_the_reference",
        op: "add_rms_norm",
        run: add_rms_norm_with_residuals_and_quantization,
    },
    Case {
        name: "gated_activations_match_the_reference",
        op: "gated",
        run: gated_activations,
    },
    Case {
        name: "gated_activations_quantized_match_the_activation_then_the_quantizer",
        op: "gated",
        run: gated_activations_quantized,
    },
    Case {
        name: "softcap_matches_the_reference_and_stays_inside_the_cap",
        op: "softcap",
        run: softcap_inside_the_cap,
    },
    Case {
        name: "add_bias_scale_copy_and_zero_match_the_reference_exactly",
        op: "elementwise",
        run: add_bias_scale_copy_and_zero,
    },
    Case {
        name: "add_scaled_row_reads_alpha_from_the_device_and_touches_one_row",
        op: "elementwise",
        run: add_scaled_row_reads_alpha_from_the_device,
    },
    Case {
        name: "the_spin_kernel_runs_and_returns",
        op: "elementwise",
        run: spin_runs_and_returns,
    },
    Case {
        name: "argmax_matches_the_reference_on_every_row",
        op: "argmax",
        run: argmax_on_every_row,
    },
    Case {
        name: "argmax_rows_matches_the_reference_on_every_row_of_one_launch",
        op: "argmax",
        run: argmax_rows_on_every_row,
    },
    Case {
        name: "sampling_picks_the_cpu_samplers_token_for_the_same_draw",
        op: "sample",
        run: sampling_picks_the_cpu_samplers_token,
    },
];

const DIMS: [usize; 10] = [1, 7, 64, 128, 256, 257, 640, 1152, 2051, 4096];
const ROWS: [usize; 3] = [1, 3, 17];

// Norm: the GPU sums squares in another order than the CPU, so 2e-5 relative (f32 sums of up
// to 4096 squares) plus 1e-6 absolute.
const NORM_REL: f32 = 2e-5;
const NORM_ABS: f32 = 1e-6;

fn rms_norm_out_of_place_and_in_place(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(1);
    for dim in DIMS {
        for rows in ROWS {
            let x = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
            let w = uniform_vec(&mut rng, dim, 0.5, 14.0);
            let eps = 1e-6;
            let mut want = vec![0.0; rows * dim];
            reference::norm::rms_norm(&x, &w, &mut want, rows, dim, eps)?;
            let (xb, wb) = (rig.upload(&x)?, rig.upload(&w)?);
            let ob = rig.upload(&vec![f32::NAN; rows * dim])?;
            norm::rms_norm(
                k,
                s,
                rig.view(&xb, x.len())?,
                rig.view(&wb, dim)?,
                &mut rig.view_mut(&ob, x.len())?,
                rows,
                dim,
                eps,
            )?;
            let got = rig.download(&ob, x.len())?;
            rig.close(
                &format!("rms_norm rows {rows} dim {dim}"),
                &got,
                &want,
                NORM_REL,
                NORM_ABS,
            );
            norm::rms_norm_inplace(
                k,
                rig.stream(),
                &mut rig.view_mut(&xb, x.len())?,
                rig.view(&wb, dim)?,
                rows,
                dim,
                eps,
            )?;
            let got = rig.download(&xb, x.len())?;
            rig.close(
                &format!("rms_norm_inplace rows {rows} dim {dim}"),
                &got,
                &want,
                NORM_REL,
                NORM_ABS,
            );
        }
    }
    Ok(())
}

fn per_head_norm(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
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
        reference::norm::rms_norm_inplace(&mut want, &w, n, head_dim, 1e-6)?;
        let (xb, wb) = (rig.upload(&x)?, rig.upload(&w)?);
        norm::rms_norm_inplace(
            k,
            s,
            &mut rig.view_mut(&xb, x.len())?,
            rig.view(&wb, head_dim)?,
            n,
            head_dim,
            1e-6,
        )?;
        let got = rig.download(&xb, x.len())?;
        let what = format!("per-head norm {tokens}x{heads}x{head_dim}");
        rig.close(&what, &got, &want, NORM_REL, NORM_ABS);
    }
    Ok(())
}

/// The bits of each value, so an exact comparison tells -0 from +0 and names the values.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn query_and_key_norms_in_one_launch(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
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
        let (qwb, kwb) = (rig.upload(&qw)?, rig.upload(&kw)?);
        let single = |x: &[f32], wb, rows| -> crate::Result<Vec<f32>> {
            let xb = rig.upload(x)?;
            let len = x.len();
            norm::rms_norm_inplace(
                k,
                s,
                &mut rig.view_mut(&xb, len)?,
                rig.view(wb, dim)?,
                rows,
                dim,
                1e-6,
            )?;
            rig.download::<f32>(&xb, len)
        };
        let (want_q, want_k) = (single(&q, &qwb, qn)?, single(&kx, &kwb, kn)?);
        // One allocation for both, as a layer's activations sit side by side.
        let mut both = q.clone();
        both.extend_from_slice(&kx);
        let b = rig.upload(&both)?;
        let mut qv = rig.view_mut::<f32>(&b, q.len())?;
        // SAFETY: the keys' values follow the queries' in the same buffer, which holds both and
        // outlives the view; the case reads it only after the stream is synchronized.
        let mut kv =
            unsafe { DeviceSliceMut::<f32>::from_raw(b.ptr().0 + (q.len() * 4) as u64, kn * dim) };
        norm::rms_norm_inplace_pair(
            k,
            s,
            (&mut qv, rig.view(&qwb, dim)?, qn),
            (&mut kv, rig.view(&kwb, dim)?, kn),
            dim,
            1e-6,
        )?;
        let got = rig.download::<f32>(&b, both.len())?;
        let what = format!("{qn} + {kn} vectors of {dim}");
        rig.equal(
            &format!("{what}: q"),
            &bits(&got[..q.len()]),
            &bits(&want_q),
        );
        rig.equal(
            &format!("{what}: k"),
            &bits(&got[q.len()..]),
            &bits(&want_k),
        );
    }
    Ok(())
}

/// Quantized values may differ by one step where `x / d` lands within an ulp of a half (the
/// kernel's `x * (1 / d)` against the reference's on values that differ in their last bit).
const Q8_VALUE_STEPS: f64 = 1.0;

/// Checks quantized activations against the reference quantizer applied to `values` (what the
/// kernel wrote as floats next to them).
fn check_quantized(
    rig: &Rig<'_>,
    what: &str,
    values: &[f32],
    q8: (&[i8], &[f32]),
) -> crate::Result<()> {
    let want = reference::matvec_q8::quantize(values)?;
    let as_f32 = |q: &[i8]| q.iter().map(|&v| f32::from(v)).collect::<Vec<f32>>();
    rig.within(
        &format!("{what}: quantized values"),
        &as_f32(q8.0),
        &as_f32(&want.values),
        Q8_VALUE_STEPS,
    );
    rig.close(
        &format!("{what}: group scales"),
        q8.1,
        &want.scales,
        1e-6,
        0.0,
    );
    Ok(())
}

fn add_rms_norm_with_residuals_and_quantization(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(9);
    let eps = 1e-6;
    // (rows, dim): one decode row of real widths, several rows, and widths of one group of 32
    // and of an odd number of groups.
    for (rows, dim) in [(1, 2048), (1, 640), (3, 4096), (2, 32), (5, 96)] {
        let n = rows * dim;
        for residual in ["none", "add", "norm-add"] {
            for quantized in [false, true] {
                let x = uniform_vec(&mut rng, n, -3.0, 3.0);
                let y = uniform_vec(&mut rng, n, -3.0, 3.0);
                let w = uniform_vec(&mut rng, dim, 0.5, 2.0);
                let yw = uniform_vec(&mut rng, dim, 0.5, 2.0);
                // The reference: y normalized (norm-add), x += y, then the norm of x.
                let mut want_y = y.clone();
                let mut want_x = x.clone();
                match residual {
                    "add" => reference::elementwise::add(&mut want_x, &y, n)?,
                    "norm-add" => {
                        reference::norm::rms_norm_inplace(&mut want_y, &yw, rows, dim, eps)?;
                        reference::elementwise::add(&mut want_x, &want_y, n)?;
                    }
                    _ => {}
                }
                let mut want_out = vec![0.0; n];
                reference::norm::rms_norm(&want_x, &w, &mut want_out, rows, dim, eps)?;

                let (xb, yb, wb, ywb) = (
                    rig.upload(&x)?,
                    rig.upload(&y)?,
                    rig.upload(&w)?,
                    rig.upload(&yw)?,
                );
                let ob = rig.upload(&vec![f32::NAN; n])?;
                let (qb, db) = (rig.filled::<i8>(n, 0x7f)?, rig.filled::<f32>(n / 32, 0xff)?);
                let mut yv = rig.view_mut(&yb, n)?;
                let res = match residual {
                    "add" => Some(Residual::Add(rig.view(&yb, n)?)),
                    "norm-add" => Some(Residual::NormAdd {
                        y: &mut yv,
                        weight: rig.view(&ywb, dim)?,
                    }),
                    _ => None,
                };
                let mut q8 = Q8ActivationsMut {
                    values: rig.view_mut(&qb, n)?,
                    scales: rig.view_mut(&db, n / 32)?,
                };
                norm::add_rms_norm(
                    k,
                    s,
                    &mut rig.view_mut(&xb, n)?,
                    res,
                    rig.view(&wb, dim)?,
                    &mut rig.view_mut(&ob, n)?,
                    quantized.then_some(&mut q8),
                    rows,
                    dim,
                    eps,
                )?;
                let what = format!("{residual} rows {rows} dim {dim} quantized {quantized}");
                let got_x = rig.download::<f32>(&xb, n)?;
                let got_out = rig.download::<f32>(&ob, n)?;
                // x + y is one rounding on both sides; the normalized y and the norm sum squares
                // in another order.
                let (rel, abs) = if residual == "norm-add" {
                    (NORM_REL, NORM_ABS * 4.0)
                } else {
                    (0.0, 0.0)
                };
                rig.close(&format!("{what}: x"), &got_x, &want_x, rel, abs);
                rig.close(
                    &format!("{what}: out"),
                    &got_out,
                    &want_out,
                    NORM_REL,
                    NORM_ABS * 4.0,
                );
                if residual == "norm-add" {
                    let got_y = rig.download::<f32>(&yb, n)?;
                    rig.close(&format!("{what}: y"), &got_y, &want_y, NORM_REL, NORM_ABS);
                }
                if quantized {
                    let q = rig.download::<i8>(&qb, n)?;
                    let d = rig.download::<f32>(&db, n / 32)?;
                    check_quantized(rig, &what, &got_out, (&q, &d))?;
                }
            }
        }
    }
    Ok(())
}

const LENS: [usize; 7] = [1, 7, 640, 1152, 2051, 6144 * 3, 100_003];

/// The gated activations' tolerance at one value: expf / tanhf differ by a few ulp between
/// libraries; 1 + tanh(x) near -1 cancels, so the absolute part scales with |gate * up|.
fn gated_bound(want: f32, gate: f32, up: f32) -> f32 {
    1e-5 * want.abs() + 1e-6 * (1.0 + (gate * up).abs())
}

fn gated_activations(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(3);
    for act in [GateActivation::Silu, GateActivation::GeluTanh] {
        for len in LENS {
            let g = uniform_vec(&mut rng, len, -12.0, 12.0);
            let u = uniform_vec(&mut rng, len, -3.0, 3.0);
            let mut want = g.clone();
            reference::elementwise::gated(&mut want, &u, len, act)?;
            let (gb, ub) = (rig.upload(&g)?, rig.upload(&u)?);
            elementwise::gated(
                k,
                s,
                &mut rig.view_mut(&gb, len)?,
                rig.view(&ub, len)?,
                len,
                act,
            )?;
            let got = rig.download::<f32>(&gb, len)?;
            rig.within_each(&format!("{act:?} len {len}"), &got, &want, |i| {
                f64::from(gated_bound(want[i], g[i], u[i]))
            });
        }
    }
    Ok(())
}

fn gated_activations_quantized(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(10);
    for act in [GateActivation::Silu, GateActivation::GeluTanh] {
        // Whole groups of 32 only: one group, a real FFN width, and an odd number of groups.
        for len in [32, 6144, 32 * 333] {
            let g = uniform_vec(&mut rng, len, -12.0, 12.0);
            let u = uniform_vec(&mut rng, len, -3.0, 3.0);
            let mut want = g.clone();
            reference::elementwise::gated(&mut want, &u, len, act)?;
            let (gb, ub) = (rig.upload(&g)?, rig.upload(&u)?);
            let (qb, db) = (
                rig.filled::<i8>(len, 0x7f)?,
                rig.filled::<f32>(len / 32, 0xff)?,
            );
            let mut q8 = Q8ActivationsMut {
                values: rig.view_mut(&qb, len)?,
                scales: rig.view_mut(&db, len / 32)?,
            };
            elementwise::gated_q8(
                k,
                s,
                &mut rig.view_mut(&gb, len)?,
                rig.view(&ub, len)?,
                len,
                act,
                &mut q8,
            )?;
            let got = rig.download::<f32>(&gb, len)?;
            let what = format!("{act:?} len {len}");
            rig.within_each(&what, &got, &want, |i| {
                f64::from(gated_bound(want[i], g[i], u[i]))
            });
            let q = rig.download::<i8>(&qb, len)?;
            let d = rig.download::<f32>(&db, len / 32)?;
            check_quantized(rig, &what, &got, (&q, &d))?;
        }
    }
    Ok(())
}

fn softcap_inside_the_cap(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(4);
    for cap in [30.0f32, 0.5] {
        for len in LENS {
            let x = uniform_vec(&mut rng, len, -100.0, 100.0);
            let mut want = x.clone();
            reference::elementwise::softcap(&mut want, len, cap)?;
            let xb = rig.upload(&x)?;
            elementwise::softcap(k, s, &mut rig.view_mut(&xb, len)?, len, cap)?;
            let got = rig.download::<f32>(&xb, len)?;
            // tanhf differs by a few ulp between libraries.
            let what = format!("cap {cap} len {len}");
            rig.close(&what, &got, &want, 1e-5, 1e-6 * cap);
            let past = got.iter().filter(|v| v.abs() > cap).count();
            rig.holds(
                &format!("{what}: inside the cap"),
                past == 0,
                format!("{past} values past the cap"),
            );
        }
    }
    let xb = rig.upload(&[1.0f32])?;
    for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let result = elementwise::softcap(k, s, &mut rig.view_mut(&xb, 1)?, 1, cap);
        rig.refused(&format!("cap {cap}"), result, &["cap"]);
    }
    Ok(())
}

fn add_bias_scale_copy_and_zero(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(4);
    for len in LENS {
        let x = uniform_vec(&mut rng, len, -5.0, 5.0);
        let y = uniform_vec(&mut rng, len, -5.0, 5.0);
        let (xb, yb) = (rig.upload(&x)?, rig.upload(&y)?);
        // One add, one scale: single roundings, the same on both sides.
        let mut want = x.clone();
        reference::elementwise::add(&mut want, &y, len)?;
        elementwise::add(k, s, &mut rig.view_mut(&xb, len)?, rig.view(&yb, len)?, len)?;
        let got = rig.download::<f32>(&xb, len)?;
        rig.equal(&format!("add len {len}"), &bits(&got), &bits(&want));
        reference::elementwise::scale(&mut want, len, -0.37)?;
        elementwise::scale(k, s, &mut rig.view_mut(&xb, len)?, len, -0.37)?;
        let got = rig.download::<f32>(&xb, len)?;
        rig.equal(&format!("scale len {len}"), &bits(&got), &bits(&want));
        // Zero only a prefix: the rest stays.
        let n0 = len / 2 + 1;
        reference::elementwise::zero(&mut want, n0)?;
        elementwise::zero(k, s, &mut rig.view_mut(&xb, len)?, n0)?;
        let got = rig.download::<f32>(&xb, len)?;
        rig.equal(&format!("zero {n0} of {len}"), &bits(&got), &bits(&want));
    }
    for dim in DIMS {
        for rows in ROWS {
            let x = uniform_vec(&mut rng, rows * dim, -5.0, 5.0);
            let b = uniform_vec(&mut rng, dim, -1.0, 1.0);
            let mut want = x.clone();
            reference::elementwise::add_bias(&mut want, &b, rows, dim)?;
            let (xb, bb) = (rig.upload(&x)?, rig.upload(&b)?);
            elementwise::add_bias(
                k,
                s,
                &mut rig.view_mut(&xb, x.len())?,
                rig.view(&bb, dim)?,
                rows,
                dim,
            )?;
            let got = rig.download::<f32>(&xb, x.len())?;
            rig.equal(
                &format!("add_bias rows {rows} dim {dim}"),
                &bits(&got),
                &bits(&want),
            );

            // copy_rows: rows 1.. of a (rows + 2)-row source into a (rows + 3)-row destination at
            // row 2; the other destination rows keep their values.
            let src = uniform_vec(&mut rng, (rows + 2) * dim, -5.0, 5.0);
            let dst = uniform_vec(&mut rng, (rows + 3) * dim, -5.0, 5.0);
            let mut want = dst.clone();
            reference::elementwise::copy_rows(&src, 1, &mut want, 2, rows, dim)?;
            let (sb, db) = (rig.upload(&src)?, rig.upload(&dst)?);
            elementwise::copy_rows(
                k,
                s,
                rig.view(&sb, src.len())?,
                1,
                &mut rig.view_mut(&db, dst.len())?,
                2,
                rows,
                dim,
            )?;
            let got = rig.download::<f32>(&db, dst.len())?;
            rig.equal(
                &format!("copy_rows rows {rows} dim {dim}"),
                &bits(&got),
                &bits(&want),
            );
        }
    }
    Ok(())
}

fn add_scaled_row_reads_alpha_from_the_device(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(5);
    for dim in DIMS {
        let rows = 3;
        let x = uniform_vec(&mut rng, rows * dim, -5.0, 5.0);
        let y = uniform_vec(&mut rng, dim, -5.0, 5.0);
        let xb = rig.upload(&x)?;
        let yb = rig.upload(&y)?;
        let mut want = x.clone();
        // Two steps with different alphas through the same launch arguments: the kernel must
        // read the value at run time.
        let mut ab = rig.upload(&[0.0f32])?;
        for (row, alpha) in [(2usize, 0.3f32), (0, -1.75)] {
            s.synchronize()?;
            ab.copy_from_host(&[alpha])?;
            reference::elementwise::add_scaled_row(&mut want, row, &y, alpha, dim)?;
            elementwise::add_scaled_row(
                k,
                s,
                &mut rig.view_mut(&xb, x.len())?,
                row,
                rig.view(&yb, dim)?,
                rig.view(&ab, 1)?,
                dim,
            )?;
            // x + alpha * y may be fused into one rounding on the GPU: 1 ulp of the terms.
            let got = rig.download::<f32>(&xb, x.len())?;
            rig.close(
                &format!("add_scaled_row dim {dim} row {row}"),
                &got,
                &want,
                2e-7,
                1e-6,
            );
        }
    }
    Ok(())
}

fn spin_runs_and_returns(rig: &Rig<'_>) -> crate::Result<()> {
    // The profiling kernel only waits; what can be checked is that it launches and ends, with
    // the stream still usable after it.
    elementwise::spin(rig.kernels(), rig.stream(), 1000)?;
    let b = rig.upload(&[1.0f32, 2.0])?;
    elementwise::scale(
        rig.kernels(),
        rig.stream(),
        &mut rig.view_mut(&b, 2)?,
        2,
        2.0,
    )?;
    let got = rig.download::<f32>(&b, 2)?;
    rig.equal(
        "a scale queued after the spin",
        &bits(&got),
        &bits(&[2.0, 4.0]),
    );
    Ok(())
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

fn argmax_on_every_row(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(6);
    let ws = rig.upload(&vec![0u64; ARGMAX_WORKSPACE])?;
    let out = rig.upload(&[-1i32])?;
    let mut got = Vec::new();
    let mut want = Vec::new();
    let mut names = Vec::new();
    for (name, row) in logit_rows(&mut rng) {
        let lb = rig.upload(&row)?;
        sampling::argmax(
            k,
            s,
            rig.view(&lb, row.len())?,
            row.len(),
            &mut rig.view_mut(&ws, ARGMAX_WORKSPACE)?,
            &mut rig.view_mut(&out, 1)?,
        )?;
        got.push(rig.download::<i32>(&out, 1)?[0]);
        want.push(reference::sampling::argmax(&row) as i32);
        names.push(name);
    }
    // n = 0 writes 0.
    let lb = rig.upload(&[1.0f32])?;
    sampling::argmax(
        k,
        s,
        rig.view(&lb, 1)?,
        0,
        &mut rig.view_mut(&ws, ARGMAX_WORKSPACE)?,
        &mut rig.view_mut(&out, 1)?,
    )?;
    got.push(rig.download::<i32>(&out, 1)?[0]);
    want.push(0);
    names.push("nothing".into());
    rig.equal(
        &format!("argmax of the rows ({})", names.join(", ")),
        &got,
        &want,
    );
    Ok(())
}

/// Rows of `n` values for one `argmax_rows` launch: random, ties, NaN, -inf, signed zeros,
/// the largest first and last.
fn argmax_row_block(rng: &mut StdRng, n: usize) -> Vec<Vec<f32>> {
    let last = n - 1;
    let mut rows = vec![uniform_vec(rng, n, -12.0, 18.0)];
    let mut tie = uniform_vec(rng, n, -1.0, 1.0);
    for i in [last / 3, last / 2, last] {
        tie[i] = 7.0;
    }
    rows.push(tie);
    let mut nan = uniform_vec(rng, n, -1.0, 1.0);
    nan[0] = f32::NAN;
    nan[last] = 5.0;
    nan[last / 2] = f32::NAN;
    rows.push(nan);
    rows.push(vec![f32::NAN; n]);
    rows.push(vec![f32::NEG_INFINITY; n]);
    let mut zeros = vec![-1.0f32; n];
    zeros[last / 2] = -0.0;
    zeros[last] = 0.0;
    rows.push(zeros);
    rows.push((0..n).map(|i| -(i as f32)).collect());
    rows.push((0..n).map(|i| i as f32).collect());
    rows
}

fn argmax_rows_on_every_row(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(8);
    // Lengths below a block, odd, past the unrolled loop's reach, and a real vocabulary.
    for n in [1usize, 7, 1001, 8 * 1024 + 3, 151_936] {
        let rows = argmax_row_block(&mut rng, n);
        let flat: Vec<f32> = rows.concat();
        let want: Vec<i32> = rows
            .iter()
            .map(|r| reference::sampling::argmax(r) as i32)
            .collect();
        let lb = rig.upload(&flat)?;
        // One slot past the rows, which must stay untouched.
        let out = rig.upload(&vec![-1i32; rows.len() + 1])?;
        sampling::argmax_rows(
            k,
            s,
            rig.view(&lb, flat.len())?,
            n,
            rows.len(),
            &mut rig.view_mut(&out, rows.len() + 1)?,
        )?;
        let mut want_out = want;
        want_out.push(-1);
        rig.equal(
            &format!("argmax_rows of {} rows of {n}", rows.len()),
            &rig.download::<i32>(&out, rows.len() + 1)?,
            &want_out,
        );
    }
    // n = 0 gives 0 on every row.
    let lb = rig.upload(&[1.0f32])?;
    let out = rig.upload(&[-1i32; 3])?;
    sampling::argmax_rows(k, s, rig.view(&lb, 1)?, 0, 3, &mut rig.view_mut(&out, 3)?)?;
    rig.equal(
        "argmax_rows of rows of nothing",
        &rig.download::<i32>(&out, 3)?,
        &[0, 0, 0],
    );
    Ok(())
}

fn sampling_picks_the_cpu_samplers_token(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(7);
    let params = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
    };
    let settings = [
        params(0.7, 40, 0.95),
        params(1.0, 0, 1.0),
        params(1.5, 0, 0.9),
        params(0.3, 1, 1.0),
        params(2.0, 5000, 0.5),
        params(1.0, 3, 0.999),
        params(0.0, 40, 0.95),
    ];
    let ws = rig.upload(&vec![0u64; ARGMAX_WORKSPACE])?;
    let out = rig.upload(&[-1i32])?;
    let mut drawb = rig.upload(&[0.0f32])?;
    let (mut compared, mut ties) = (0usize, 0usize);
    let mut disagreements = Vec::new();
    for (name, row) in logit_rows(&mut rng) {
        let lb = rig.upload(&row)?;
        for p in &settings {
            // Draws spread over [0, 1), both ends included.
            for d in 0..12 {
                let u: f32 = match d {
                    0 => 0.0,
                    1 => 1.0 - f32::EPSILON / 2.0,
                    _ => rng.random_range(0.0..1.0),
                };
                s.synchronize()?;
                drawb.copy_from_host(&[u])?;
                sampling::sample(
                    k,
                    s,
                    rig.view(&lb, row.len())?,
                    row.len(),
                    p,
                    rig.view(&drawb, 1)?,
                    &mut rig.view_mut(&ws, ARGMAX_WORKSPACE)?,
                    &mut rig.view_mut(&out, 1)?,
                )?;
                let got = rig.download::<i32>(&out, 1)?[0];
                let want = reference::sampling::sample(&row, p, u as f64)?;
                // Closer to a boundary than 1e-6 of the mass is a float tie: another order of
                // additions (or a 1-ulp exp) may pick the neighbour. So are NaN weights (the
                // -inf row) and a top-k cut inside equal logits. Counted, not compared.
                if want.margin < 1e-6 {
                    ties += 1;
                    continue;
                }
                compared += 1;
                if got != want.token as i32 {
                    disagreements.push(format!(
                        "{name}, {p:?}, u = {u}: gpu {got}, cpu {} (margin {:e})",
                        want.token, want.margin
                    ));
                }
            }
        }
    }
    rig.holds(
        "every compared draw picks the reference's token",
        disagreements.is_empty(),
        format!(
            "{} of {compared} differ (ties skipped: {ties}): {}",
            disagreements.len(),
            disagreements
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ),
    );
    // The rows include deliberate ties (equal logits, a -inf row, draws at 0): what matters is
    // that enough draws were compared.
    rig.holds(
        "enough draws compared to mean something",
        compared >= 500,
        format!("{compared} draws compared, {ties} float ties skipped"),
    );
    Ok(())
}

//! The quantized-weight ops against the reference, for every weight format the kernels read, at
//! odd shapes and partial tiles: matvec (f32 activations and 8-bit ones, single and paired),
//! the activation quantization, the tiled matmul and `linear`'s switch between the two, the
//! matrix-core matmul (native and SIMT builds, unsplit and split over the columns), embedding
//! lookups, and the MoE ops (routing, expert products on f32 and 8-bit activations, the
//! weighted sum, the fused down projection, and the whole chain).
//!
//! Weights are random valid blocks ([`fill_random_blocks`]: random bytes with the f16 scale
//! fields set to small finite values; every other bit pattern of these formats is a valid
//! weight), dense formats uniform in [-1, 1]. The reference dequantizes with gguf-loader
//! (bit-exact with gguf-py) and accumulates in f64.
//!
//! Tolerance of the products: every |gpu - cpu| <= 1e-4 x RMS of the reference output. The
//! GPU sums in f32 in another order (and may fuse the dequantization's multiply-add), which
//! costs about 1e-6 of the RMS at these sizes; an indexing mistake costs about 1. NaN fails.
//! The bound is relative to the output's own RMS however small it is (the random blocks'
//! scales keep products far below 1), not to `max(1, RMS)` as [`Rig::close_to_rms`] takes it.

use super::case::Case;
use super::case::{seeded, uniform_vec};
use super::rig::rms;
use super::rig::Rig;
use crate::mma::MmaVariant;
use crate::ops::embed;
use crate::ops::matvec::{self, QuantMatrix, MAX_TOKENS, WEIGHT_FORMATS};
use crate::ops::matvec_q8::{self, Q8Activations, Q8ActivationsMut, GROUP};
use crate::ops::moe::{self, Accumulate, ExpertInput, QuantExperts};
use crate::ops::{matmul, matmul_mma, matmul_q8_mma};
use crate::reference;
use crate::reference::matvec::HostMatrix;
use crate::reference::matvec_q8::HostQ8;

use gguf_loader::synth::fill_random_blocks;
use gguf_loader::GgmlType;
use half::{bf16, f16};
use hip_ffi::DeviceBuffer;
use rand::rngs::StdRng;
use rand::Rng;

pub const CASES: &[Case] = &[
    Case {
        name: "matvec_matches_the_reference_for_every_format",
        op: "matvec",
        run: matvec_every_format,
    },
    Case {
        name: "matvec_splits_long_rows_over_several_warps",
        op: "matvec",
        run: matvec_long_rows,
    },
    Case {
        name: "activation_quantization_matches_the_reference",
        op: "quantize_q8",
        run: activation_quantization,
    },
    Case {
        name: "matvec_q8_matches_the_reference_for_every_format",
        op: "matvec_q8",
        run: matvec_q8_every_format,
    },
    Case {
        name: "matvec_q8_pairs_match_two_single_products",
        op: "matvec_q8_pair",
        run: matvec_q8_pairs,
    },
    Case {
        name: "matmul_matches_the_reference_for_every_format",
        op: "matmul",
        run: matmul_every_format,
    },
    Case {
        name: "matmul_covers_several_tiles_of_a_real_shape",
        op: "matmul",
        run: matmul_real_shape,
    },
    Case {
        name: "linear_matches_the_reference_on_both_sides_of_the_switch",
        op: "linear",
        run: linear_both_sides,
    },
    Case {
        name: "matmul_mma_matches_the_half_rounded_reference_for_every_format",
        op: "matmul_mma",
        run: matmul_mma_every_format,
    },
    Case {
        name: "matmul_mma_native_and_simt_builds_agree_at_a_real_shape",
        op: "matmul_mma",
        run: matmul_mma_native_and_simt,
    },
    Case {
        name: "matmul_mma_split_over_the_columns_matches_the_reference_and_the_unsplit_product",
        op: "matmul_mma_split",
        run: matmul_mma_split,
    },
    Case {
        name: "matmul_q8_mma_matches_the_int8_reference_for_every_format",
        op: "matmul_q8_mma",
        run: matmul_q8_mma_every_format,
    },
    Case {
        name: "matmul_q8_mma_native_and_simt_builds_agree_split_and_whole",
        op: "matmul_q8_mma",
        run: matmul_q8_mma_native_simt_split,
    },
    Case {
        name: "matmul_q8_mma_grouped_multiplies_each_experts_rows_by_its_matrix",
        op: "matmul_q8_mma_grouped",
        run: matmul_q8_mma_grouped,
    },
    Case {
        name: "embed_gathers_every_format_and_zeroes_out_of_range_ids",
        op: "embed",
        run: embed_every_format,
    },
    Case {
        name: "routing_matches_the_cpu_rule_with_ties",
        op: "route_top_k",
        run: routing_with_ties,
    },
    Case {
        name: "expert_products_match_the_reference_for_every_format",
        op: "matvec_id",
        run: expert_products_every_format,
    },
    Case {
        name: "weighted_sum_stores_and_adds",
        op: "weighted_sum",
        run: weighted_sum_stores_and_adds,
    },
    Case {
        name: "moe_chain_runs_without_host_sync",
        op: "moe_chain",
        run: moe_chain,
    },
    Case {
        name: "int8_expert_products_match_the_reference_of_the_same_activations",
        op: "matvec_id_q8",
        run: int8_expert_products,
    },
    Case {
        name: "int8_expert_pairs_match_two_single_products",
        op: "matvec_id_q8_pair",
        run: int8_expert_pairs,
    },
    Case {
        name: "moe_down_matches_the_product_and_weighted_sum_it_replaces",
        op: "moe_down",
        run: moe_down,
    },
];

const RMS_TOL: f64 = 1e-4;

/// Records that every |got - want| <= `tol` x RMS(want); NaN, or a length mismatch, fails.
fn close_rms(rig: &Rig<'_>, what: &str, got: &[f32], want: &[f32], tol: f64) {
    rig.within(what, got, want, tol * rms(want));
}

/// The bits of `values`, for comparisons that must hold bit for bit.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Random valid GGUF data for a `rows` x `cols` matrix of `format`.
fn random_weights(
    rig: &Rig<'_>,
    rng: &mut StdRng,
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> crate::Result<Vec<u8>> {
    let n = rows * cols;
    Ok(match format {
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
            let len = matvec::matrix_bytes(format, rows, cols).ok_or_else(|| {
                rig.failure(format!("{format} {rows} x {cols} is not whole blocks"))
            })?;
            let mut bytes = vec![0u8; len];
            fill_random_blocks(format, &mut bytes, rng);
            bytes
        }
    })
}

/// Uploads a random `rows` x `cols` matrix of `format`; returns the buffer and host bytes.
fn weights_on_device(
    rig: &Rig<'_>,
    rng: &mut StdRng,
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> crate::Result<(DeviceBuffer, Vec<u8>)> {
    let bytes = random_weights(rig, rng, format, rows, cols)?;
    Ok((rig.upload(&bytes)?, bytes))
}

fn quant_matrix(
    rig: &Rig<'_>,
    buf: &DeviceBuffer,
    bytes: &[u8],
    format: GgmlType,
    rows: usize,
    cols: usize,
) -> crate::Result<QuantMatrix> {
    QuantMatrix::new(rig.view(buf, bytes.len())?, format, rows, cols)
}

/// Column counts for a format: one block and several blocks (dense: also a count that is not
/// a multiple of 8 or 32).
fn col_counts(format: GgmlType) -> Vec<usize> {
    match format.block_size() {
        1 => vec![32, 96, 37],
        b => vec![b, 3 * b],
    }
}

type ProductOp = crate::ops::matvec::MatrixProduct;

type ReferenceOp = fn(&HostMatrix<'_>, &[f32], usize) -> crate::Result<Vec<f32>>;

/// Runs `op` for every format, row counts 1, 7 and 67, [`col_counts`] and `tokens`, against
/// `reference`.
fn check_products(
    rig: &Rig<'_>,
    name: &str,
    op: ProductOp,
    reference: ReferenceOp,
    tokens: &[usize],
    seed: u64,
) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(seed);
    for format in WEIGHT_FORMATS {
        for rows in [1, 7, 67] {
            for cols in col_counts(format) {
                let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
                let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
                let host = HostMatrix::new(&bytes, format, rows, cols)?;
                for &nt in tokens {
                    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                    let want = reference(&host, &x, nt)?;
                    let xb = rig.upload(&x)?;
                    let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
                    op(
                        k,
                        s,
                        &w,
                        rig.view(&xb, x.len())?,
                        &mut rig.view_mut(&ob, nt * rows)?,
                        nt,
                    )?;
                    let what = format!("{name}: {format} {rows} x {cols}, {nt} tokens");
                    close_rms(rig, &what, &rig.download(&ob, nt * rows)?, &want, RMS_TOL);
                }
            }
        }
    }
    Ok(())
}

fn matvec_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    // 17 tokens take three launches of at most MAX_TOKENS.
    check_products(
        rig,
        "matvec",
        matvec::matvec,
        reference::matmul::matmul,
        &[1, 3, MAX_TOKENS, 17],
        1,
    )
}

fn matvec_long_rows(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(11);
    // 4096 columns in few rows: several warps share each row (up to eight).
    for format in [GgmlType::F32, GgmlType::F16, GgmlType::Q4K, GgmlType::Q8_0] {
        for rows in [1, 67] {
            let cols = 4096;
            let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
            let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
            let host = HostMatrix::new(&bytes, format, rows, cols)?;
            for nt in [1, 3] {
                let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                let want = reference::matvec::matvec(&host, &x, nt)?;
                let xb = rig.upload(&x)?;
                let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
                matvec::matvec(
                    k,
                    s,
                    &w,
                    rig.view(&xb, x.len())?,
                    &mut rig.view_mut(&ob, nt * rows)?,
                    nt,
                )?;
                let what = format!("matvec: {format} {rows} x {cols}, {nt} tokens");
                close_rms(rig, &what, &rig.download(&ob, nt * rows)?, &want, RMS_TOL);
            }
        }
    }
    Ok(())
}

fn matmul_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    // 67 rows and 100 tokens leave partial 64-wide tiles in both directions.
    check_products(
        rig,
        "matmul",
        matmul::matmul,
        reference::matmul::matmul,
        &[1, 3, 17, 100],
        2,
    )
}

fn linear_both_sides(rig: &Rig<'_>) -> crate::Result<()> {
    check_products(
        rig,
        "linear",
        matmul::linear,
        reference::matmul::matmul,
        &[MAX_TOKENS, MAX_TOKENS + 1],
        3,
    )
}

fn matmul_real_shape(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(4);
    // A Q4_K projection of 2 x 1024 into 200 rows for 130 tokens: 4 x 3 tiles, 32 K steps.
    let (format, rows, cols, nt) = (GgmlType::Q4K, 200, 1024, 130);
    let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
    let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
    let host = HostMatrix::new(&bytes, format, rows, cols)?;
    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
    let want = reference::matmul::matmul(&host, &x, nt)?;
    let xb = rig.upload(&x)?;
    let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
    matmul::matmul(
        k,
        s,
        &w,
        rig.view(&xb, x.len())?,
        &mut rig.view_mut(&ob, nt * rows)?,
        nt,
    )?;
    let what = format!("matmul: {format} {rows} x {cols}, {nt} tokens");
    close_rms(rig, &what, &rig.download(&ob, nt * rows)?, &want, RMS_TOL);
    Ok(())
}

fn matmul_mma_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    // 67 rows leave a partial tile of 64 rows, 100 tokens a partial second tile of 64 and a
    // token tile of 16 only partly filled; 96 columns of a 32-block format a partial step of
    // 128, and 37 dense columns a partial run of eight.
    check_products(
        rig,
        "matmul_mma",
        matmul_mma::matmul_mma,
        reference::matmul_mma::matmul_mma,
        &[1, 9, 16, 33, 64, 100],
        12,
    )
}

fn matmul_mma_native_and_simt(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let simt = rig.simt_kernels()?;
    let mut rng = seeded(13);
    // The 8B's shape in fewer rows: 14 steps of 128 columns, five row tiles, one and three
    // token tiles (the last partial). One real shape is enough here: every format's kernel is
    // checked at odd shapes by the case before.
    let (format, rows, cols) = (GgmlType::Q4K, 320, 1792);
    let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
    let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
    let host = HostMatrix::new(&bytes, format, rows, cols)?;
    for nt in [40, 130] {
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let want = reference::matmul_mma::matmul_mma(&host, &x, nt)?;
        let xb = rig.upload(&x)?;
        let mut got = Vec::new();
        for kernels in [k, simt] {
            let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
            let (xv, mut o) = (rig.view(&xb, x.len())?, rig.view_mut(&ob, nt * rows)?);
            matmul_mma::matmul_mma(kernels, s, &w, xv, &mut o, nt)?;
            got.push(rig.download(&ob, nt * rows)?);
        }
        let what = format!("matmul_mma: {format} {rows} x {cols}, {nt} tokens");
        for (g, build) in got.iter().zip([k.mma_variant(), MmaVariant::Simt]) {
            close_rms(rig, &format!("{what}, {}", build.name()), g, &want, RMS_TOL);
        }
        let native = k.mma_variant().name();
        close_rms(
            rig,
            &format!("{what}, {native} vs simt"),
            &got[0],
            &got[1],
            RMS_TOL,
        );
    }
    Ok(())
}

fn matmul_mma_split(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(14);
    // Decode-step shapes: few row tiles, so the columns split. The Q6_K case's buffer holds
    // four splits of its 18 steps, which leaves a shorter last split (5, 5, 5, 3). The
    // partials are poisoned with NaN: any value a split did not write would show.
    for (format, rows, cols, nt, buffer_splits) in [
        (GgmlType::Q4K, 256, 4096, 16, matmul_mma::MAX_SPLITS),
        (GgmlType::Q6K, 130, 2304, 33, 4),
        (GgmlType::Q8_0, 64, 2048, 9, matmul_mma::MAX_SPLITS),
    ] {
        let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
        let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
        let host = HostMatrix::new(&bytes, format, rows, cols)?;
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let want = reference::matmul_mma::matmul_mma(&host, &x, nt)?;
        let xb = rig.upload(&x)?;
        let what = format!("matmul_mma_split: {format} {rows} x {cols}, {nt} tokens");
        let floats = buffer_splits * rows * nt;
        let pb = rig.upload(&vec![f32::NAN; floats])?;
        let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
        let splits = matmul_mma::matmul_mma_split(
            k,
            s,
            &w,
            rig.view(&xb, x.len())?,
            &mut rig.view_mut(&ob, nt * rows)?,
            nt,
            &mut rig.view_mut(&pb, floats)?,
        )?;
        rig.holds(
            &format!("{what}: the columns are split"),
            splits > 1,
            format!("{splits} splits"),
        );
        let split = rig.download(&ob, nt * rows)?;
        close_rms(rig, &what, &split, &want, RMS_TOL);
        let ob1 = rig.upload(&vec![f32::NAN; nt * rows])?;
        matmul_mma::matmul_mma(
            k,
            s,
            &w,
            rig.view(&xb, x.len())?,
            &mut rig.view_mut(&ob1, nt * rows)?,
            nt,
        )?;
        let whole = rig.download(&ob1, nt * rows)?;
        close_rms(
            rig,
            &format!("{what}, split vs whole"),
            &split,
            &whole,
            RMS_TOL,
        );
        // A buffer too small for two splits is left alone: one pass, straight into out.
        let small = rows * nt + 1;
        let pb_small = rig.upload(&vec![f32::NAN; small])?;
        let ob2 = rig.upload(&vec![f32::NAN; nt * rows])?;
        let one = matmul_mma::matmul_mma_split(
            k,
            s,
            &w,
            rig.view(&xb, x.len())?,
            &mut rig.view_mut(&ob2, nt * rows)?,
            nt,
            &mut rig.view_mut(&pb_small, small)?,
        )?;
        rig.holds(
            &format!("{what}: a buffer that holds one split is not split"),
            one == 1,
            format!("{one} splits"),
        );
        let unsplit: Vec<f32> = rig.download(&ob2, nt * rows)?;
        rig.equal(
            &format!("{what}: one split against matmul_mma, bit for bit"),
            &bits(&unsplit),
            &bits(&whole),
        );
        let partials: Vec<f32> = rig.download(&pb_small, small)?;
        let written = partials.iter().filter(|v| !v.is_nan()).count();
        rig.holds(
            &format!("{what}: one split leaves the partials alone"),
            written == 0,
            format!("{written} of {small} partials written"),
        );
    }
    Ok(())
}

fn embed_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(6);
    let vocab = 5;
    for format in WEIGHT_FORMATS {
        let dim = match format.block_size() {
            1 => 37,
            b => 2 * b,
        };
        let (tb, bytes) = weights_on_device(rig, &mut rng, format, vocab, dim)?;
        let table = quant_matrix(rig, &tb, &bytes, format, vocab, dim)?;
        let host = HostMatrix::new(&bytes, format, vocab, dim)?;
        for (ids, scale) in [(vec![3, 0, -1, 4, 5, 2], 0.5f32), (vec![4, 4, 1], 25.3)] {
            let (want, bad) = reference::embed::embed(&host, &ids, scale)?;
            let n = ids.len() * dim;
            let idb = rig.upload(&ids)?;
            let ob = rig.upload(&vec![f32::NAN; n])?;
            let fb = rig.upload(&[0i32])?;
            embed::embed(
                k,
                s,
                &table,
                rig.view(&idb, ids.len())?,
                ids.len(),
                scale,
                &mut rig.view_mut(&ob, n)?,
                Some(&mut rig.view_mut(&fb, 1)?),
            )?;
            let got: Vec<f32> = rig.download(&ob, n)?;
            let what = format!("embed {format} ids {ids:?}");
            // One product per value: only a fused multiply-add in the dequantization differs.
            close_rms(rig, &what, &got, &want, 1e-6);
            let out_of_range = |id: i32| id < 0 || id >= vocab as i32;
            let nonzero = ids
                .iter()
                .enumerate()
                .filter(|&(_, &id)| out_of_range(id))
                .flat_map(|(t, _)| &got[t * dim..(t + 1) * dim])
                .filter(|&&v| v != 0.0)
                .count();
            rig.holds(
                &format!("{what}: rows of out-of-range ids are zero"),
                nonzero == 0,
                format!("{nonzero} values are not"),
            );
            let flag: Vec<i32> = rig.download(&fb, 1)?;
            rig.equal(&format!("{what}: flag"), &flag, &[i32::from(bad)]);
        }
    }
    // Without a flag, a bad id still reads nothing and writes zeros.
    let (tb, bytes) = weights_on_device(rig, &mut rng, GgmlType::Q6K, vocab, 256)?;
    let table = quant_matrix(rig, &tb, &bytes, GgmlType::Q6K, vocab, 256)?;
    let idb = rig.upload(&[i32::MAX, i32::MIN])?;
    let ob = rig.upload(&vec![f32::NAN; 512])?;
    embed::embed(
        k,
        s,
        &table,
        rig.view(&idb, 2)?,
        2,
        1.0,
        &mut rig.view_mut(&ob, 512)?,
        None,
    )?;
    let got: Vec<f32> = rig.download(&ob, 512)?;
    let nonzero = got.iter().filter(|&&v| v != 0.0).count();
    rig.holds(
        "embed Q6_K ids [i32::MAX, i32::MIN] without a flag: zeros",
        nonzero == 0,
        format!("{nonzero} of 512 values are not zero"),
    );
    Ok(())
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

fn routing_with_ties(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(7);
    for (rows, n_expert, top) in [(5, 8, 2), (3, 128, 8), (4, 200, 7), (3, 64, 64), (1, 1, 1)] {
        let logits = router_logits(&mut rng, rows, n_expert);
        let (want_ids, want_w) = reference::moe::route_top_k(&logits, rows, n_expert, top)?;
        let lb = rig.upload(&logits)?;
        let ib = rig.upload(&vec![-7i32; rows * top])?;
        let wb = rig.upload(&vec![f32::NAN; rows * top])?;
        moe::route_top_k(
            k,
            s,
            rig.view(&lb, logits.len())?,
            rows,
            n_expert,
            top,
            &mut rig.view_mut(&ib, rows * top)?,
            &mut rig.view_mut(&wb, rows * top)?,
        )?;
        let what = format!("route {rows} x {n_expert}, top {top}");
        let got_ids: Vec<i32> = rig.download(&ib, rows * top)?;
        rig.equal(&format!("{what}: ids"), &got_ids, &want_ids);
        // Weights are in [0, 1]; the device's expf may differ from the CPU's by an ulp or two.
        let got_w: Vec<f32> = rig.download(&wb, rows * top)?;
        rig.within(&format!("{what}: weights"), &got_w, &want_w, 1e-6);
    }
    // More experts than one warp's lanes hold, and k out of range, are refused.
    let too_many = 64 * k.wave_size() as usize + 1;
    let lb = rig.upload(&vec![0.0f32; too_many])?;
    let ib = rig.upload(&[0i32; 2])?;
    let wb = rig.upload(&[0.0f32; 2])?;
    for (n_expert, top) in [(too_many, 2), (4, 5), (4, 0)] {
        let result = moe::route_top_k(
            k,
            s,
            rig.view(&lb, too_many)?,
            1,
            n_expert,
            top,
            &mut rig.view_mut(&ib, 2)?,
            &mut rig.view_mut(&wb, 2)?,
        );
        rig.refused(
            &format!("route 1 x {n_expert}, top {top}"),
            result,
            &["route_top_k"],
        );
    }
    Ok(())
}

fn expert_products_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(8);
    let (n_expert, rows, nt, top) = (5, 9, 3, 2);
    // Pair 4 names expert 9 of 5: a zero row, and no read outside the stack.
    let ids = [4i32, 0, 2, 2, 9, 1];
    for format in WEIGHT_FORMATS {
        let cols = match format.block_size() {
            1 => 40,
            b => 2 * b,
        };
        let (eb, bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let experts = QuantExperts::new(rig.view(&eb, bytes.len())?, format, n_expert, rows, cols)?;
        let host = HostMatrix::new(&bytes, format, n_expert * rows, cols)?;
        let idb = rig.upload(&ids)?;
        for input in [ExpertInput::PerToken, ExpertInput::PerSlot] {
            let x_rows = if input == ExpertInput::PerSlot {
                nt * top
            } else {
                nt
            };
            let x = uniform_vec(&mut rng, x_rows * cols, -1.0, 1.0);
            let want = reference::moe::matvec_id(&host, n_expert, &ids, nt, top, &x, input)?;
            let xb = rig.upload(&x)?;
            let ob = rig.upload(&vec![f32::NAN; nt * top * rows])?;
            moe::matvec_id(
                k,
                s,
                &experts,
                rig.view(&idb, ids.len())?,
                nt,
                top,
                rig.view(&xb, x.len())?,
                input,
                &mut rig.view_mut(&ob, nt * top * rows)?,
            )?;
            let what = format!("matvec_id {format} {input:?}");
            let got = rig.download(&ob, nt * top * rows)?;
            close_rms(rig, &what, &got, &want, RMS_TOL);
        }
    }
    Ok(())
}

fn weighted_sum_stores_and_adds(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(9);
    for (nt, top, dim) in [(1, 1, 1), (3, 4, 300), (17, 8, 640)] {
        let y = uniform_vec(&mut rng, nt * top * dim, -2.0, 2.0);
        let w = uniform_vec(&mut rng, nt * top, 0.0, 1.0);
        let base = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
        for mode in [Accumulate::Store, Accumulate::Add] {
            let mut want = base.clone();
            reference::moe::weighted_sum(&y, &w, nt, top, dim, &mut want, mode)?;
            let (yb, wb, ob) = (rig.upload(&y)?, rig.upload(&w)?, rig.upload(&base)?);
            moe::weighted_sum(
                k,
                s,
                rig.view(&yb, y.len())?,
                rig.view(&wb, w.len())?,
                nt,
                top,
                dim,
                &mut rig.view_mut(&ob, base.len())?,
                mode,
            )?;
            // At most 9 f32 terms, same order; only fused multiply-adds differ.
            let what = format!("weighted_sum {nt} x {top} x {dim} {mode:?}");
            close_rms(rig, &what, &rig.download(&ob, base.len())?, &want, 1e-6);
        }
    }
    Ok(())
}

/// Routing, expert products and the weighted sum queued back to back with no host read in
/// between, as a decode step runs them; the result matches the reference chain.
fn moe_chain(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(10);
    let (nt, n_expert, top, dim, ff) = (3, 8, 2, 256, 256);
    let format = GgmlType::Q4K;
    let logits = uniform_vec(&mut rng, nt * n_expert, -3.0, 3.0);
    let x = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
    let residual = uniform_vec(&mut rng, nt * dim, -1.0, 1.0);
    let (up_b, up_bytes) = weights_on_device(rig, &mut rng, format, n_expert * ff, dim)?;
    let (down_b, down_bytes) = weights_on_device(rig, &mut rng, format, n_expert * dim, ff)?;
    let up = QuantExperts::new(rig.view(&up_b, up_bytes.len())?, format, n_expert, ff, dim)?;
    let down = QuantExperts::new(
        rig.view(&down_b, down_bytes.len())?,
        format,
        n_expert,
        dim,
        ff,
    )?;

    // Reference chain.
    let (ids, w) = reference::moe::route_top_k(&logits, nt, n_expert, top)?;
    let up_h = HostMatrix::new(&up_bytes, format, n_expert * ff, dim)?;
    let down_h = HostMatrix::new(&down_bytes, format, n_expert * dim, ff)?;
    let hidden =
        reference::moe::matvec_id(&up_h, n_expert, &ids, nt, top, &x, ExpertInput::PerToken)?;
    let y = reference::moe::matvec_id(
        &down_h,
        n_expert,
        &ids,
        nt,
        top,
        &hidden,
        ExpertInput::PerSlot,
    )?;
    let mut want = residual.clone();
    reference::moe::weighted_sum(&y, &w, nt, top, dim, &mut want, Accumulate::Add)?;

    // Device chain.
    let lb = rig.upload(&logits)?;
    let xb = rig.upload(&x)?;
    let ib = rig.upload(&vec![0i32; nt * top])?;
    let wb = rig.upload(&vec![0.0f32; nt * top])?;
    let hb = rig.upload(&vec![f32::NAN; nt * top * ff])?;
    let yb = rig.upload(&vec![f32::NAN; nt * top * dim])?;
    let ob = rig.upload(&residual)?;
    let (mut ids_v, mut w_v) = (
        rig.view_mut::<i32>(&ib, nt * top)?,
        rig.view_mut::<f32>(&wb, nt * top)?,
    );
    moe::route_top_k(
        k,
        s,
        rig.view(&lb, logits.len())?,
        nt,
        n_expert,
        top,
        &mut ids_v,
        &mut w_v,
    )?;
    let mut hidden_v = rig.view_mut::<f32>(&hb, nt * top * ff)?;
    moe::matvec_id(
        k,
        s,
        &up,
        ids_v.as_const(),
        nt,
        top,
        rig.view(&xb, x.len())?,
        ExpertInput::PerToken,
        &mut hidden_v,
    )?;
    let mut y_v = rig.view_mut::<f32>(&yb, nt * top * dim)?;
    moe::matvec_id(
        k,
        s,
        &down,
        ids_v.as_const(),
        nt,
        top,
        hidden_v.as_const(),
        ExpertInput::PerSlot,
        &mut y_v,
    )?;
    moe::weighted_sum(
        k,
        s,
        y_v.as_const(),
        w_v.as_const(),
        nt,
        top,
        dim,
        &mut rig.view_mut(&ob, nt * dim)?,
        Accumulate::Add,
    )?;
    let got_ids: Vec<i32> = rig.download(&ib, nt * top)?;
    rig.equal("moe chain: ids", &got_ids, &ids);
    // Two chained products: the intermediate's f32 error carries into the second, so 2e-4.
    let got = rig.download(&ob, nt * dim)?;
    close_rms(rig, "moe chain: output", &got, &want, 2e-4);
    Ok(())
}

/// Quantizes `x` (`nt` rows of `cols`) on the device; returns the device buffers (values,
/// scales) and their contents.
fn quantize_on_device(
    rig: &Rig<'_>,
    x: &[f32],
    nt: usize,
    cols: usize,
) -> crate::Result<(DeviceBuffer, DeviceBuffer, HostQ8)> {
    let n = nt * cols;
    let xb = rig.upload(x)?;
    let vb = rig.upload(&vec![0x7fi8; n])?;
    let sb = rig.upload(&vec![f32::NAN; n / GROUP])?;
    let mut q = Q8ActivationsMut {
        values: rig.view_mut(&vb, n)?,
        scales: rig.view_mut(&sb, n / GROUP)?,
    };
    matvec_q8::quantize(
        rig.kernels(),
        rig.stream(),
        rig.view(&xb, n)?,
        nt,
        cols,
        &mut q,
    )?;
    let host = HostQ8 {
        values: rig.download(&vb, n)?,
        scales: rig.download(&sb, n / GROUP)?,
    };
    Ok((vb, sb, host))
}

/// Views of `n` quantized values and their scales, as [`quantize_on_device`] left them.
fn q8_view(
    rig: &Rig<'_>,
    values: &DeviceBuffer,
    scales: &DeviceBuffer,
    n: usize,
) -> crate::Result<Q8Activations> {
    Ok(Q8Activations {
        values: rig.view(values, n)?,
        scales: rig.view(scales, n / GROUP)?,
    })
}

fn activation_quantization(rig: &Rig<'_>) -> crate::Result<()> {
    let mut rng = seeded(7);
    for (nt, cols) in [(1, 32), (3, 640), (8, 4096)] {
        let mut x = uniform_vec(&mut rng, nt * cols, -3.0, 3.0);
        // An all-zero group and a group with one large value.
        x[..32].fill(0.0);
        if x.len() >= 64 {
            x[40] = 1e4;
        }
        let (_vb, _sb, got) = quantize_on_device(rig, &x, nt, cols)?;
        let want = reference::matvec_q8::quantize(&x)?;
        let what = format!("quantize_q8 {nt} x {cols}");
        // Both sides take d = max|x| / 127 and round x * (1 / d); the device's division may
        // round differently (1e-6 of the scale), which can move a value near a rounding tie by
        // one step: at most one, and rarely (at least 99.9 % of the values equal).
        rig.close(
            &format!("{what}: scales"),
            &got.scales,
            &want.scales,
            1e-6,
            0.0,
        );
        let steps = |v: &[i8]| v.iter().map(|&q| f32::from(q)).collect::<Vec<f32>>();
        rig.within(
            &format!("{what}: values"),
            &steps(&got.values),
            &steps(&want.values),
            1.0,
        );
        let exact = got
            .values
            .iter()
            .zip(&want.values)
            .filter(|(a, b)| a == b)
            .count();
        rig.holds(
            &format!("{what}: values equal to the reference"),
            exact * 1000 >= got.values.len() * 999,
            format!("{exact} of {} equal", got.values.len()),
        );
    }
    Ok(())
}

fn matvec_q8_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(8);
    for format in matvec_q8::Q8_FORMATS {
        // 4096 columns make several warps share a row (two for the k-quants, four for the
        // 32-value blocks), the smaller counts one warp with idle lanes. One token takes the
        // single-token entry, more the one for up to eight (11: two launches, of 8 and 3).
        for cols in [format.block_size(), 3 * format.block_size(), 4096] {
            for rows in [1, 7, 67] {
                let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
                let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
                let host = HostMatrix::new(&bytes, format, rows, cols)?;
                for nt in [1, 3, MAX_TOKENS, 11] {
                    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                    let (vb, sb, q) = quantize_on_device(rig, &x, nt, cols)?;
                    let want = reference::matvec_q8::matvec(&host, &q, nt)?;
                    let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
                    let act = q8_view(rig, &vb, &sb, nt * cols)?;
                    matvec_q8::matvec(k, s, &w, act, &mut rig.view_mut(&ob, nt * rows)?, nt)?;
                    let what = format!("matvec_q8: {format} {rows} x {cols}, {nt} tokens");
                    close_rms(rig, &what, &rig.download(&ob, nt * rows)?, &want, RMS_TOL);
                }
            }
        }
    }
    Ok(())
}

fn matmul_q8_mma_every_format(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(15);
    for format in matmul_q8_mma::FORMATS {
        // Nine 32-value blocks end a step of 256 columns part-way; 67 rows leave a partial row
        // tile; 9 tokens a partial small token tile, 32 a whole one, 70 a second large one.
        let widths = if format.block_size() == 32 {
            [288, 1024]
        } else {
            [256, 1024]
        };
        for cols in widths {
            for rows in [16, 67] {
                let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
                let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
                let host = HostMatrix::new(&bytes, format, rows, cols)?;
                for nt in [9, 32, 70] {
                    let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                    let (vb, sb, q) = quantize_on_device(rig, &x, nt, cols)?;
                    let want = reference::matvec_q8::matvec(&host, &q, nt)?;
                    let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
                    let act = q8_view(rig, &vb, &sb, nt * cols)?;
                    let mut o = rig.view_mut(&ob, nt * rows)?;
                    matmul_q8_mma::matmul(k, s, &w, act, &mut o, nt, None)?;
                    let what = format!("matmul_q8_mma: {format} {rows} x {cols}, {nt} tokens");
                    close_rms(rig, &what, &rig.download(&ob, nt * rows)?, &want, RMS_TOL);
                }
            }
        }
    }
    // A format without a kernel is refused before anything is queued.
    let (wb, bytes) = weights_on_device(rig, &mut rng, GgmlType::Q3K, 16, 256)?;
    let w = quant_matrix(rig, &wb, &bytes, GgmlType::Q3K, 16, 256)?;
    let x = uniform_vec(&mut rng, 9 * 256, -1.0, 1.0);
    let (vb, sb, _) = quantize_on_device(rig, &x, 9, 256)?;
    let ob = rig.upload(&vec![0.0f32; 9 * 16])?;
    let act = q8_view(rig, &vb, &sb, 9 * 256)?;
    let refused = matmul_q8_mma::matmul(k, s, &w, act, &mut rig.view_mut(&ob, 9 * 16)?, 9, None);
    rig.refused("matmul_q8_mma: Q3_K", refused, &["Q3_K"]);
    Ok(())
}

fn matmul_q8_mma_native_simt_split(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let simt = rig.simt_kernels()?;
    let mut rng = seeded(16);
    // Decode-step shapes with few row tiles, so the columns split; Q6_K's buffer holds three
    // splits of its nine steps. Partials and outputs start as NaN: a value no split wrote
    // would show.
    for (format, rows, cols, nt, buffer_splits) in [
        (GgmlType::Q4K, 256, 4096, 33, matmul_mma::MAX_SPLITS),
        (GgmlType::Q6K, 130, 2304, 16, 3),
    ] {
        let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
        let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
        let host = HostMatrix::new(&bytes, format, rows, cols)?;
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let (vb, sb, q) = quantize_on_device(rig, &x, nt, cols)?;
        let want = reference::matvec_q8::matvec(&host, &q, nt)?;
        let what = format!("matmul_q8_mma: {format} {rows} x {cols}, {nt} tokens");
        let floats = buffer_splits * rows * nt;
        let mut got = Vec::new();
        for kernels in [k, simt] {
            let pb = rig.upload(&vec![f32::NAN; floats])?;
            let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
            let act = q8_view(rig, &vb, &sb, nt * cols)?;
            let splits = matmul_q8_mma::matmul(
                kernels,
                s,
                &w,
                act,
                &mut rig.view_mut(&ob, nt * rows)?,
                nt,
                Some(&mut rig.view_mut(&pb, floats)?),
            )?;
            let build = kernels.mma_variant().name();
            rig.holds(
                &format!("{what}, {build}: the columns are split"),
                splits > 1,
                format!("{splits} splits"),
            );
            let split = rig.download(&ob, nt * rows)?;
            close_rms(
                rig,
                &format!("{what}, {build}, split"),
                &split,
                &want,
                RMS_TOL,
            );
            got.push(split);
        }
        let native = k.mma_variant().name();
        close_rms(
            rig,
            &format!("{what}, {native} vs simt"),
            &got[0],
            &got[1],
            RMS_TOL,
        );
    }
    Ok(())
}

fn matmul_q8_mma_grouped(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(17);
    // Three experts of 67 rows (a partial row tile). Expert 0 has 5 rows from slot 0, expert 1
    // none, expert 2 70 rows from slot 8 (a full tile and a partial one); slots 5..8 are
    // padding no tile names, and must keep their NaN. Two more tiles are out of bounds (an
    // expert past the last, rows past the slots) and must be skipped.
    let (n_expert, rows) = (3, 67);
    let (starts, counts) = ([0usize, 5, 8], [5usize, 0, 70]);
    let slots = 78;
    for format in matmul_q8_mma::FORMATS {
        let cols = if format.block_size() == 32 { 288 } else { 512 };
        let (wb, bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let w = quant_matrix(rig, &wb, &bytes, format, n_expert * rows, cols)?;
        let x = uniform_vec(&mut rng, slots * cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(rig, &x, slots, cols)?;
        let mut tiles = matmul_q8_mma::group_tiles(&starts, &counts).ok_or_else(|| {
            crate::KernelError::Shape {
                op: "matmul_q8_mma grouped",
                message: "the tile table's rows do not fit an i32".into(),
            }
        })?;
        let n_good = tiles.len() / 3;
        tiles.extend_from_slice(&[3, 0, 5, 0, 70, 64]);
        let tb = rig.upload(&tiles)?;
        let ob = rig.upload(&vec![f32::NAN; slots * rows])?;
        let act = q8_view(rig, &vb, &sb, slots * cols)?;
        let mut o = rig.view_mut(&ob, slots * rows)?;
        let table = rig.view(&tb, tiles.len())?;
        let n_tiles = tiles.len() / 3;
        matmul_q8_mma::matmul_grouped(k, s, &w, rows, table, n_tiles, act, &mut o, slots)?;
        let got = rig.download(&ob, slots * rows)?;
        let what = format!("matmul_q8_mma grouped: {format} {n_expert} x {rows} x {cols}");
        rig.holds(
            &format!("{what}: the table has a tile per 64 rows of each expert"),
            n_good == 3,
            format!("{n_good} tiles"),
        );
        let row_bytes = bytes.len() / (n_expert * rows);
        for e in 0..n_expert {
            let (first, count) = (starts[e], counts[e]);
            if count == 0 {
                continue;
            }
            let w_e = &bytes[e * rows * row_bytes..(e + 1) * rows * row_bytes];
            let host = HostMatrix::new(w_e, format, rows, cols)?;
            let x_e = &x[first * cols..(first + count) * cols];
            let (_, _, q) = quantize_on_device(rig, x_e, count, cols)?;
            let want = reference::matvec_q8::matvec(&host, &q, count)?;
            let got_e = &got[first * rows..(first + count) * rows];
            close_rms(rig, &format!("{what}, expert {e}"), got_e, &want, RMS_TOL);
        }
        let padding = &got[5 * rows..8 * rows];
        rig.holds(
            &format!("{what}: rows no tile names are left as they were"),
            padding.iter().all(|v| v.is_nan()),
            format!(
                "{} of {} padding values written",
                padding.iter().filter(|v| !v.is_nan()).count(),
                padding.len()
            ),
        );
    }
    // A table too short for its tile count is refused before anything is queued.
    let format = GgmlType::Q4K;
    let (wb, bytes) = weights_on_device(rig, &mut rng, format, 2 * 64, 256)?;
    let w = quant_matrix(rig, &wb, &bytes, format, 2 * 64, 256)?;
    let (vb, sb, _) =
        quantize_on_device(rig, &uniform_vec(&mut rng, 64 * 256, -1.0, 1.0), 64, 256)?;
    let tb = rig.upload(&[0i32, 0, 64])?;
    let ob = rig.upload(&vec![0.0f32; 64 * 64])?;
    let refused = matmul_q8_mma::matmul_grouped(
        k,
        s,
        &w,
        64,
        rig.view(&tb, 3)?,
        2,
        q8_view(rig, &vb, &sb, 64 * 256)?,
        &mut rig.view_mut(&ob, 64 * 64)?,
        64,
    );
    rig.refused(
        "matmul_q8_mma grouped: a short table",
        refused,
        &["tile table"],
    );
    Ok(())
}

fn matvec_q8_pairs(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(12);
    for format in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5_0] {
        let cols = 4 * format.block_size();
        // Two row counts, either larger: the grid covers the taller matrix.
        for (rows, rows2) in [(67, 7), (7, 67)] {
            let (wb, bytes) = weights_on_device(rig, &mut rng, format, rows, cols)?;
            let (wb2, bytes2) = weights_on_device(rig, &mut rng, format, rows2, cols)?;
            let w = quant_matrix(rig, &wb, &bytes, format, rows, cols)?;
            let w2 = quant_matrix(rig, &wb2, &bytes2, format, rows2, cols)?;
            for nt in [1, 3] {
                let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
                let (vb, sb, q) = quantize_on_device(rig, &x, nt, cols)?;
                let act = q8_view(rig, &vb, &sb, nt * cols)?;
                let ob = rig.upload(&vec![f32::NAN; nt * rows])?;
                let ob2 = rig.upload(&vec![f32::NAN; nt * rows2])?;
                matvec_q8::matvec_pair(
                    k,
                    s,
                    &w,
                    &mut rig.view_mut(&ob, nt * rows)?,
                    &w2,
                    &mut rig.view_mut(&ob2, nt * rows2)?,
                    act,
                    nt,
                )?;
                for (bytes_h, r, buf) in [(&bytes, rows, &ob), (&bytes2, rows2, &ob2)] {
                    let host = HostMatrix::new(bytes_h, format, r, cols)?;
                    let want = reference::matvec_q8::matvec(&host, &q, nt)?;
                    let what = format!(
                        "matvec_q8_pair: {format} {r} of ({rows}, {rows2}) rows, {nt} tokens"
                    );
                    close_rms(rig, &what, &rig.download(buf, nt * r)?, &want, RMS_TOL);
                }
            }
        }
        // Two formats are not a pair: refused before anything is queued.
        let (wb, bytes) = weights_on_device(rig, &mut rng, format, 2, cols)?;
        let (wb2, bytes2) = weights_on_device(rig, &mut rng, GgmlType::Q8_0, 2, cols)?;
        let w = quant_matrix(rig, &wb, &bytes, format, 2, cols)?;
        let w2 = quant_matrix(rig, &wb2, &bytes2, GgmlType::Q8_0, 2, cols)?;
        let x = uniform_vec(&mut rng, cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(rig, &x, 1, cols)?;
        let act = q8_view(rig, &vb, &sb, cols)?;
        let (ob, ob2) = (rig.upload(&[0.0f32; 2])?, rig.upload(&[0.0f32; 2])?);
        let mixed = matvec_q8::matvec_pair(
            k,
            s,
            &w,
            &mut rig.view_mut(&ob, 2)?,
            &w2,
            &mut rig.view_mut(&ob2, 2)?,
            act,
            1,
        );
        rig.refused(
            &format!("matvec_q8_pair: {format} with Q8_0"),
            mixed,
            &["one format"],
        );
    }
    Ok(())
}

fn int8_expert_products(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(10);
    let (n_expert, rows, nt, top) = (5, 9, 3, 2);
    // Pair 4 names expert 9 of 5: a zero row, and no read outside the stack.
    let ids = [4i32, 0, 2, 2, 9, 1];
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let (eb, bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let experts = QuantExperts::new(rig.view(&eb, bytes.len())?, format, n_expert, rows, cols)?;
        let host = HostMatrix::new(&bytes, format, n_expert * rows, cols)?;
        let idb = rig.upload(&ids)?;
        for input in [ExpertInput::PerToken, ExpertInput::PerSlot] {
            let x_rows = if input == ExpertInput::PerSlot {
                nt * top
            } else {
                nt
            };
            let x = uniform_vec(&mut rng, x_rows * cols, -1.0, 1.0);
            let (vb, sb, q) = quantize_on_device(rig, &x, x_rows, cols)?;
            let want =
                reference::moe::matvec_id(&host, n_expert, &ids, nt, top, &q.dequantized(), input)?;
            let ob = rig.upload(&vec![f32::NAN; nt * top * rows])?;
            matvec_q8::matvec_id(
                k,
                s,
                &experts,
                rig.view(&idb, ids.len())?,
                nt,
                top,
                q8_view(rig, &vb, &sb, x.len())?,
                input,
                &mut rig.view_mut(&ob, nt * top * rows)?,
            )?;
            let what = format!("matvec_id_q8 {format} {input:?}");
            let got = rig.download(&ob, nt * top * rows)?;
            close_rms(rig, &what, &got, &want, RMS_TOL);
        }
    }
    Ok(())
}

fn int8_expert_pairs(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(13);
    let (n_expert, rows, nt, top) = (4, 11, 2, 2);
    let ids = [3i32, 0, 1, 7];
    let idb = rig.upload(&ids)?;
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let (gb, gate_bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let (ub, up_bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let gate = QuantExperts::new(
            rig.view(&gb, gate_bytes.len())?,
            format,
            n_expert,
            rows,
            cols,
        )?;
        let up = QuantExperts::new(rig.view(&ub, up_bytes.len())?, format, n_expert, rows, cols)?;
        let x = uniform_vec(&mut rng, nt * cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(rig, &x, nt, cols)?;
        let act = q8_view(rig, &vb, &sb, x.len())?;
        let n_out = nt * top * rows;
        let single = |experts: &QuantExperts| -> crate::Result<Vec<f32>> {
            let ob = rig.upload(&vec![f32::NAN; n_out])?;
            matvec_q8::matvec_id(
                k,
                s,
                experts,
                rig.view(&idb, ids.len())?,
                nt,
                top,
                act,
                ExpertInput::PerToken,
                &mut rig.view_mut(&ob, n_out)?,
            )?;
            rig.download(&ob, n_out)
        };
        let (want_g, want_u) = (single(&gate)?, single(&up)?);
        let (og, ou) = (
            rig.upload(&vec![f32::NAN; n_out])?,
            rig.upload(&vec![f32::NAN; n_out])?,
        );
        matvec_q8::matvec_id_pair(
            k,
            s,
            (&gate, &mut rig.view_mut(&og, n_out)?),
            (&up, &mut rig.view_mut(&ou, n_out)?),
            rig.view(&idb, ids.len())?,
            nt,
            top,
            act,
            ExpertInput::PerToken,
        )?;
        let what = format!("matvec_id_q8_pair {format}");
        // The same kernel body on the same inputs: bit for bit (so the singles must be numbers:
        // two NaNs of the same bits would compare equal).
        let not_finite = want_g.iter().chain(&want_u).filter(|v| !v.is_finite());
        let not_finite = not_finite.count();
        rig.holds(
            &format!("{what}: the single products are finite"),
            not_finite == 0,
            format!("{not_finite} of {} values not finite", 2 * n_out),
        );
        let got_g: Vec<f32> = rig.download(&og, n_out)?;
        let got_u: Vec<f32> = rig.download(&ou, n_out)?;
        rig.equal(&format!("{what}: gate"), &bits(&got_g), &bits(&want_g));
        rig.equal(&format!("{what}: up"), &bits(&got_u), &bits(&want_u));
        // Overlapping outputs are refused before anything is queued.
        let overlapping = matvec_q8::matvec_id_pair(
            k,
            s,
            (&gate, &mut rig.view_mut(&og, n_out)?),
            (&up, &mut rig.view_mut(&og, n_out)?),
            rig.view(&idb, ids.len())?,
            nt,
            top,
            act,
            ExpertInput::PerToken,
        );
        rig.refused(
            &format!("{what}: overlapping outputs"),
            overlapping,
            &["overlap"],
        );
    }
    Ok(())
}

fn moe_down(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(14);
    let (n_expert, rows, nt, top) = (5, 13, 3, 4);
    // Token 1's last slot names expert 8 of 5: it adds nothing and reads no weights.
    let ids = [4i32, 0, 2, 1, 3, 3, 0, 8, 1, 2, 4, 0];
    let routing: Vec<f32> = (0..nt * top).map(|_| rng.random_range(0.05..0.6)).collect();
    let (idb, wtb) = (rig.upload(&ids)?, rig.upload(&routing)?);
    for format in matvec_q8::Q8_FORMATS {
        let cols = 2 * format.block_size();
        let (eb, bytes) = weights_on_device(rig, &mut rng, format, n_expert * rows, cols)?;
        let experts = QuantExperts::new(rig.view(&eb, bytes.len())?, format, n_expert, rows, cols)?;
        let x = uniform_vec(&mut rng, nt * top * cols, -1.0, 1.0);
        let (vb, sb, _) = quantize_on_device(rig, &x, nt * top, cols)?;
        let act = q8_view(rig, &vb, &sb, x.len())?;
        let ids_v = rig.view(&idb, ids.len())?;
        let wt = rig.view(&wtb, routing.len())?;
        // What it replaces: the per-slot products, then their weighted sum.
        let yb = rig.upload(&vec![f32::NAN; nt * top * rows])?;
        matvec_q8::matvec_id(
            k,
            s,
            &experts,
            ids_v,
            nt,
            top,
            act,
            ExpertInput::PerSlot,
            &mut rig.view_mut(&yb, nt * top * rows)?,
        )?;
        let wantb = rig.upload(&vec![f32::NAN; nt * rows])?;
        moe::weighted_sum(
            k,
            s,
            rig.view(&yb, nt * top * rows)?,
            wt,
            nt,
            top,
            rows,
            &mut rig.view_mut(&wantb, nt * rows)?,
            Accumulate::Store,
        )?;
        let want: Vec<f32> = rig.download(&wantb, nt * rows)?;
        let gotb = rig.upload(&vec![f32::NAN; nt * rows])?;
        let out = &mut rig.view_mut(&gotb, nt * rows)?;
        matvec_q8::moe_down(k, s, &experts, ids_v, wt, nt, top, act, out)?;
        let got: Vec<f32> = rig.download(&gotb, nt * rows)?;
        // The same products added in the same slot order; only the compiler's contraction of
        // multiply-adds may differ between the two kernels.
        close_rms(rig, &format!("moe_down {format}"), &got, &want, 1e-6);
    }
    // A k the kernel's block cannot hold is refused before anything is queued.
    let format = GgmlType::Q4K;
    let (eb, bytes) = weights_on_device(rig, &mut rng, format, 2, 256)?;
    let experts = QuantExperts::new(rig.view(&eb, bytes.len())?, format, 1, 2, 256)?;
    let big = matvec_q8::MOE_DOWN_MAX_K + 1;
    let (vb, sb, _) = quantize_on_device(rig, &vec![0.5; big * 256], big, 256)?;
    let ib = rig.upload(&vec![0i32; big])?;
    let wb = rig.upload(&vec![1.0f32; big])?;
    let ob = rig.upload(&[0.0f32; 2])?;
    let too_many = matvec_q8::moe_down(
        k,
        s,
        &experts,
        rig.view(&ib, big)?,
        rig.view(&wb, big)?,
        1,
        big,
        q8_view(rig, &vb, &sb, big * 256)?,
        &mut rig.view_mut(&ob, 2)?,
    );
    rig.refused(
        &format!("moe_down {format} with {big} experts per token"),
        too_many,
        &["experts per token"],
    );
    Ok(())
}

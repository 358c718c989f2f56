//! CPU reference of [`crate::ops::moe`]: routing with the decode crate's CPU rule (a stable
//! sort by `f32::total_cmp`, descending, then a softmax over the k selected logits), expert
//! products in f64, and the weighted sum in slot order.

use super::matvec::{dot, HostMatrix};
use crate::error::{check_shape, Result};
use crate::ops::moe::{check_matvec_id, check_route, check_weighted_sum, Accumulate, ExpertInput};

/// Expert ids and weights, both `[rows][k]`, for `rows` rows of `n_expert` logits.
pub fn route_top_k(
    logits: &[f32],
    rows: usize,
    n_expert: usize,
    k: usize,
) -> Result<(Vec<i32>, Vec<f32>)> {
    check_route(rows, n_expert, k, usize::MAX)?;
    check_shape(logits.len() >= rows * n_expert, "route_top_k", || {
        format!("logits hold {}, need {}", logits.len(), rows * n_expert)
    })?;
    let mut ids = Vec::with_capacity(rows * k);
    let mut weights = Vec::with_capacity(rows * k);
    for row in logits.chunks_exact(n_expert).take(rows) {
        let mut idx: Vec<usize> = (0..n_expert).collect();
        // Stable: equal logits keep the lower index first.
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let mut top: Vec<f32> = idx[..k].iter().map(|&i| row[i]).collect();
        let max = top.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in &mut top {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in &mut top {
            *v /= sum;
        }
        ids.extend(idx[..k].iter().map(|&i| i as i32));
        weights.extend(top);
    }
    Ok((ids, weights))
}

/// `out[p][r] = sum_c experts[ids[p]][r][c] * x[xrow][c]` for pairs `p = t * k + s`, with
/// `experts` the whole `[n_expert * rows][cols]` stack; zeros where an id is out of range.
pub fn matvec_id(
    experts: &HostMatrix<'_>,
    n_expert: usize,
    ids: &[i32],
    n_tokens: usize,
    k: usize,
    x: &[f32],
    input: ExpertInput,
) -> Result<Vec<f32>> {
    check_shape(
        n_expert > 0 && experts.rows().is_multiple_of(n_expert),
        "matvec_id",
        || format!("{} rows are not {n_expert} equal experts", experts.rows()),
    )?;
    let rows = experts.rows() / n_expert;
    let cols = experts.cols();
    let pairs = n_tokens * k;
    check_matvec_id(
        rows,
        cols,
        ids.len(),
        n_tokens,
        k,
        x.len(),
        input,
        pairs * rows,
    )?;
    let mut out = vec![0.0f32; pairs * rows];
    for (p, dst) in out.chunks_exact_mut(rows.max(1)).enumerate().take(pairs) {
        let Some(e) = usize::try_from(ids[p]).ok().filter(|&e| e < n_expert) else {
            continue;
        };
        let xrow = match input {
            ExpertInput::PerToken => p / k,
            ExpertInput::PerSlot => p,
        };
        let xv = &x[xrow * cols..(xrow + 1) * cols];
        for (r, o) in dst.iter_mut().enumerate() {
            *o = dot(&experts.row(e * rows + r)?, xv);
        }
    }
    Ok(out)
}

/// `out[t][c] (+)= sum_s weights[t * k + s] * y[(t * k + s) * dim + c]`, summed in f32 from
/// zero in slot order, then stored or added.
pub fn weighted_sum(
    y: &[f32],
    weights: &[f32],
    n_tokens: usize,
    k: usize,
    dim: usize,
    out: &mut [f32],
    mode: Accumulate,
) -> Result<()> {
    check_weighted_sum(y.len(), weights.len(), n_tokens, k, dim, out.len())?;
    for t in 0..n_tokens {
        for c in 0..dim {
            let mut acc = 0.0f32;
            for s in 0..k {
                let p = t * k + s;
                acc += weights[p] * y[p * dim + c];
            }
            let o = &mut out[t * dim + c];
            *o = match mode {
                Accumulate::Store => acc,
                Accumulate::Add => *o + acc,
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_loader::GgmlType;

    #[test]
    fn routing_orders_ties_by_index_and_normalises_over_the_top_k() {
        // Row 0: experts 1 and 3 tie at 2.0 above 0 and 2; row 1: -0.0 ranks below +0.0.
        let logits = [0.0, 2.0, -1.0, 2.0, -0.0, 0.0, -5.0, 0.0];
        let (ids, w) = route_top_k(&logits, 2, 4, 3).unwrap();
        assert_eq!(ids, vec![1, 3, 0, 1, 3, 0]);
        let e = (-2.0f32).exp();
        let z = 2.0 + e;
        for (got, want) in w[..3].iter().zip([1.0 / z, 1.0 / z, e / z]) {
            assert!((got - want).abs() < 1e-7, "{got} vs {want}");
        }
        // Row 1: +0.0 at 1 and 3 (index order), then -0.0 at 0; all equal weights.
        for v in &w[3..] {
            assert!((v - 1.0 / 3.0).abs() < 1e-7, "{v}");
        }
        assert!(route_top_k(&logits, 2, 4, 5).is_err());
        assert!(route_top_k(&logits, 2, 4, 0).is_err());
        assert!(route_top_k(&logits[..7], 2, 4, 1).is_err());
    }

    #[test]
    fn expert_products_pick_the_expert_and_the_input_row() {
        // Two experts of 1 x 2: expert 0 = [1, 0], expert 1 = [0, 1].
        let bytes: Vec<u8> = [1.0f32, 0.0, 0.0, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = HostMatrix::new(&bytes, GgmlType::F32, 2, 2).unwrap();
        let x = [3.0, 4.0, 5.0, 6.0];
        // One token, k = 2: ids [1, 0]; per token both read x[0..2].
        let out = matvec_id(&w, 2, &[1, 0], 1, 2, &x, ExpertInput::PerToken).unwrap();
        assert_eq!(out, vec![4.0, 3.0]);
        // Per slot: pair 0 reads [3, 4], pair 1 reads [5, 6]; a bad id gives 0.
        let out = matvec_id(&w, 2, &[1, 0], 1, 2, &x, ExpertInput::PerSlot).unwrap();
        assert_eq!(out, vec![4.0, 5.0]);
        let out = matvec_id(&w, 2, &[2, -1], 1, 2, &x, ExpertInput::PerSlot).unwrap();
        assert_eq!(out, vec![0.0, 0.0]);
        assert!(matvec_id(&w, 2, &[1], 1, 2, &x, ExpertInput::PerToken).is_err());
    }

    #[test]
    fn weighted_sum_stores_or_adds() {
        let y = [1.0, 2.0, 10.0, 20.0];
        let w = [0.25, 0.75];
        let mut out = [100.0, 100.0];
        weighted_sum(&y, &w, 1, 2, 2, &mut out, Accumulate::Store).unwrap();
        assert_eq!(out, [7.75, 15.5]);
        weighted_sum(&y, &w, 1, 2, 2, &mut out, Accumulate::Add).unwrap();
        assert_eq!(out, [15.5, 31.0]);
        assert!(weighted_sum(&y[..3], &w, 1, 2, 2, &mut out, Accumulate::Add).is_err());
    }
}

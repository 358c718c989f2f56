//! CPU reference of RMSNorm: the decode crate's `rms_norm`, row by row, in f32 with the same
//! operations in the same order (`ss = sum(x^2) / dim`, `inv = 1 / sqrt(ss + eps)`,
//! `out = x * inv * w`).

use crate::error::Result;
use crate::ops::norm::check;

/// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight` for `rows` rows of `dim`; see
/// [`crate::ops::norm::rms_norm`]. Errors on the shapes the GPU op refuses.
pub fn rms_norm(
    x: &[f32],
    weight: &[f32],
    out: &mut [f32],
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), out.len(), rows, dim, eps)?;
    for (xr, or) in x
        .chunks_exact(dim)
        .zip(out.chunks_exact_mut(dim))
        .take(rows)
    {
        norm_row(xr, weight, or, eps);
    }
    Ok(())
}

/// [`rms_norm`] in place over `rows` vectors of `dim` (per-head Q/K norm: rows = tokens x
/// heads, dim = head_dim); see [`crate::ops::norm::rms_norm_inplace`].
pub fn rms_norm_inplace(
    x: &mut [f32],
    weight: &[f32],
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), weight.len(), x.len(), rows, dim, eps)?;
    let mut row = vec![0.0f32; dim];
    for xr in x.chunks_exact_mut(dim).take(rows) {
        row.copy_from_slice(xr);
        norm_row(&row, weight, xr, eps);
    }
    Ok(())
}

fn norm_row(x: &[f32], w: &[f32], out: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_hand_computed_row() {
        // x = [3, 4]: mean of squares 12.5, eps 0.5 -> 1 / sqrt(13) ~ 0.277350.
        let x = [3.0f32, 4.0, 1.0, -1.0];
        let w = [1.0f32, 2.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &w, &mut out, 2, 2, 0.5).unwrap();
        let inv0 = 1.0 / 13f32.sqrt();
        let inv1 = 1.0 / 1.5f32.sqrt();
        assert!((out[0] - 3.0 * inv0).abs() < 1e-6, "{out:?}");
        assert!((out[1] - 8.0 * inv0).abs() < 1e-6, "{out:?}");
        assert!((out[2] - inv1).abs() < 1e-6, "{out:?}");
        assert!((out[3] + 2.0 * inv1).abs() < 1e-6, "{out:?}");
        let mut y = x;
        rms_norm_inplace(&mut y, &w, 2, 2, 0.5).unwrap();
        assert_eq!(y, out);
    }

    #[test]
    fn refuses_short_buffers() {
        let mut out = [0.0f32; 3];
        let e = rms_norm(&[1.0; 4], &[1.0; 2], &mut out, 2, 2, 1e-6).unwrap_err();
        assert!(e.to_string().contains("out"), "{e}");
        assert!(rms_norm(&[1.0; 4], &[1.0; 1], &mut [0.0; 4], 2, 2, 1e-6).is_err());
        assert!(rms_norm_inplace(&mut [1.0; 4], &[1.0; 2], 2, 0, 1e-6).is_err());
    }
}

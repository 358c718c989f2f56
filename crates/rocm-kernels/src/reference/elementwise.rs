//! CPU reference of the elementwise ops: the decode crate's `gated` and the CPU backend's `add`,
//! `add_bias`, `add_scaled_row`, `copy_row` and `zero`, in f32 with the same formulas.

use crate::error::{check_shape, Result};
use crate::ops::elementwise::GateActivation;

/// `gate = act(gate) * up` over `len` values; see [`crate::ops::elementwise::gated`].
pub fn gated(gate: &mut [f32], up: &[f32], len: usize, act: GateActivation) -> Result<()> {
    check_len("gated", "gate", gate.len(), len)?;
    check_len("gated", "up", up.len(), len)?;
    for (g, &u) in gate[..len].iter_mut().zip(&up[..len]) {
        *g = act.apply(*g) * u;
    }
    Ok(())
}

/// `x += y` over `len` values.
pub fn add(x: &mut [f32], y: &[f32], len: usize) -> Result<()> {
    check_len("add", "x", x.len(), len)?;
    check_len("add", "y", y.len(), len)?;
    for (a, &b) in x[..len].iter_mut().zip(&y[..len]) {
        *a += b;
    }
    Ok(())
}

/// `x[r] += bias` for `rows` rows of `dim = bias.len()`.
pub fn add_bias(x: &mut [f32], bias: &[f32], rows: usize, dim: usize) -> Result<()> {
    check_len("add_bias", "bias", bias.len(), dim)?;
    check_len("add_bias", "x", x.len(), rows.saturating_mul(dim))?;
    for xr in x.chunks_exact_mut(dim.max(1)).take(rows) {
        for (v, &b) in xr.iter_mut().zip(bias) {
            *v += b;
        }
    }
    Ok(())
}

/// `x[x_row] += alpha * y[..dim]`.
pub fn add_scaled_row(
    x: &mut [f32],
    x_row: usize,
    y: &[f32],
    alpha: f32,
    dim: usize,
) -> Result<()> {
    let end = x_row.saturating_add(1).saturating_mul(dim);
    check_len("add_scaled_row", "x", x.len(), end)?;
    check_len("add_scaled_row", "y", y.len(), dim)?;
    for (a, &b) in x[end - dim..end].iter_mut().zip(&y[..dim]) {
        *a += alpha * b;
    }
    Ok(())
}

/// `x *= factor` over `len` values.
pub fn scale(x: &mut [f32], len: usize, factor: f32) -> Result<()> {
    check_len("scale", "x", x.len(), len)?;
    for v in &mut x[..len] {
        *v *= factor;
    }
    Ok(())
}

/// `cap * tanh(x / cap)`: a soft-capped logit (Gemma 2's attention scores and final logits);
/// `cap = 0` leaves `x` as it is, as the kernels' `softcap_logit` does.
pub fn softcap_logit(x: f32, cap: f32) -> f32 {
    if cap > 0.0 {
        cap * (x / cap).tanh()
    } else {
        x
    }
}

/// `x = cap * tanh(x / cap)` over `len` values.
pub fn softcap(x: &mut [f32], len: usize, cap: f32) -> Result<()> {
    check_len("softcap", "x", x.len(), len)?;
    for v in &mut x[..len] {
        *v = softcap_logit(*v, cap);
    }
    Ok(())
}

/// Copies `rows` rows of `dim` from row `src_row` of `src` to row `dst_row` of `dst`.
pub fn copy_rows(
    src: &[f32],
    src_row: usize,
    dst: &mut [f32],
    dst_row: usize,
    rows: usize,
    dim: usize,
) -> Result<()> {
    let n = rows.saturating_mul(dim);
    let s0 = src_row.saturating_mul(dim);
    let d0 = dst_row.saturating_mul(dim);
    check_len("copy_rows", "src", src.len(), s0.saturating_add(n))?;
    check_len("copy_rows", "dst", dst.len(), d0.saturating_add(n))?;
    dst[d0..d0 + n].copy_from_slice(&src[s0..s0 + n]);
    Ok(())
}

/// Zeroes the first `len` values.
pub fn zero(x: &mut [f32], len: usize) -> Result<()> {
    check_len("zero", "x", x.len(), len)?;
    x[..len].fill(0.0);
    Ok(())
}

fn check_len(op: &'static str, what: &str, have: usize, need: usize) -> Result<()> {
    check_shape(have >= need, op, || {
        format!("{what} holds {have} values, the shape needs {need}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_match_hand_computed_values() {
        // silu(1) = 1 / (1 + e^-1) = 0.7310586; silu(-1) = -0.2689414.
        let mut g = [1.0f32, -1.0];
        gated(&mut g, &[2.0, 1.0], 2, GateActivation::Silu).unwrap();
        assert!((g[0] - 2.0 * 0.731_058_6).abs() < 1e-6, "{g:?}");
        assert!((g[1] + 0.268_941_43).abs() < 1e-6, "{g:?}");
        // gelu_tanh(1) = 0.5 (1 + tanh(0.7978846 * 1.044715)) = 0.8411920.
        let mut g = [1.0f32, 0.0];
        gated(&mut g, &[3.0, 5.0], 2, GateActivation::GeluTanh).unwrap();
        assert!((g[0] - 3.0 * 0.841_192).abs() < 1e-5, "{g:?}");
        assert_eq!(g[1], 0.0);
    }

    #[test]
    fn row_ops_touch_exactly_their_rows() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_bias(&mut x, &[10.0, 20.0], 2, 2).unwrap();
        assert_eq!(x, [11.0, 22.0, 13.0, 24.0, 5.0, 6.0]);
        add_scaled_row(&mut x, 2, &[1.0, -1.0], 0.5, 2).unwrap();
        assert_eq!(x, [11.0, 22.0, 13.0, 24.0, 5.5, 5.5]);
        let mut d = [0.0f32; 6];
        copy_rows(&x, 1, &mut d, 0, 2, 2).unwrap();
        assert_eq!(d, [13.0, 24.0, 5.5, 5.5, 0.0, 0.0]);
        add(&mut d, &x, 3).unwrap();
        assert_eq!(d, [24.0, 46.0, 18.5, 5.5, 0.0, 0.0]);
        scale(&mut d, 2, -2.0).unwrap();
        assert_eq!(d[..3], [-48.0, -92.0, 18.5]);
        zero(&mut d, 5).unwrap();
        assert_eq!(d, [0.0; 6]);
    }

    #[test]
    fn refuses_rows_past_the_end() {
        let mut x = [0.0f32; 4];
        assert!(add_scaled_row(&mut x, 2, &[1.0, 1.0], 1.0, 2).is_err());
        assert!(copy_rows(&[0.0; 4], 1, &mut x, 0, 2, 2).is_err());
        assert!(add(&mut x, &[0.0; 3], 4).is_err());
    }
}

//! CPU reference of [`crate::ops::matvec_q8`]: the same activation quantization in the same f32
//! operations, then the exact product of the weights with the dequantized activations
//! (`q * d`), accumulated in f64 by [`super::matvec::matvec`]. The GPU kernels differ from it
//! only in the f32 order in which group sums meet.

use super::matvec::HostMatrix;
use crate::error::{KernelError, Result};
use crate::ops::matvec_q8::GROUP;

/// Quantized activations on the host: `values` `[n_tokens][cols]`, `scales`
/// `[n_tokens][cols / 32]`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostQ8 {
    pub values: Vec<i8>,
    pub scales: Vec<f32>,
}

impl HostQ8 {
    /// The activations the quantized values stand for: `q * d`.
    pub fn dequantized(&self) -> Vec<f32> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, &q)| f32::from(q) * self.scales[i / GROUP])
            .collect()
    }
}

/// Quantizes `x` in groups of 32: `d = max|x| / 127`, `q = round_half_even(x / d)` computed as
/// `x * (1 / d)` (zero for an all-zero group), as the kernel does.
pub fn quantize(x: &[f32]) -> Result<HostQ8> {
    if !x.len().is_multiple_of(GROUP) {
        return Err(KernelError::Shape {
            op: "reference quantize_q8",
            message: format!("{} values are not whole groups of {GROUP}", x.len()),
        });
    }
    let mut values = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / GROUP);
    for group in x.chunks_exact(GROUP) {
        let amax = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        values.extend(group.iter().map(|&v| (v * id).round_ties_even() as i8));
        scales.push(d);
    }
    Ok(HostQ8 { values, scales })
}

/// `out[t][r] = sum_c w[r][c] * (q * d)[t][c]` for `t < n_tokens`, accumulated in f64.
pub fn matvec(w: &HostMatrix<'_>, x: &HostQ8, n_tokens: usize) -> Result<Vec<f32>> {
    super::matvec::matvec(w, &x.dequantized(), n_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_by_hand() {
        let mut x = vec![0.0f32; 64];
        x[0] = 1.27;
        x[1] = -0.635; // half of the largest: -63.5 rounds to the even -64
        x[2] = 0.01;
        let q = quantize(&x).unwrap();
        assert_eq!(q.scales, vec![1.27 / 127.0, 0.0]);
        assert_eq!(&q.values[..3], &[127, -64, 1]);
        assert!(q.values[32..].iter().all(|&v| v == 0));
        let back = q.dequantized();
        assert!((back[0] - 1.27).abs() < 1e-6);
    }

    #[test]
    fn partial_groups_are_refused() {
        assert!(quantize(&[1.0; 33]).is_err());
    }
}

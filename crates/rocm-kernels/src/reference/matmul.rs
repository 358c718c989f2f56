//! CPU reference of [`crate::ops::matmul`]: the same product as the matvec reference (only
//! the GPU kernels differ between the two ops), f64 accumulation.

use super::matvec::HostMatrix;
use crate::error::Result;

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens`; see [`super::matvec::matvec`].
pub fn matmul(w: &HostMatrix<'_>, x: &[f32], n_tokens: usize) -> Result<Vec<f32>> {
    super::matvec::matvec(w, x, n_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_loader::GgmlType;
    use half::f16;

    #[test]
    fn f16_product_by_hand() {
        // 2 x 2 matrix [[1, -2], [0.5, 4]] times tokens [1, 1] and [2, -1].
        let bytes: Vec<u8> = [1.0f32, -2.0, 0.5, 4.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let w = HostMatrix::new(&bytes, GgmlType::F16, 2, 2).unwrap();
        let out = matmul(&w, &[1.0, 1.0, 2.0, -1.0], 2).unwrap();
        assert_eq!(out, vec![-1.0, 4.5, 4.0, -3.0]);
    }
}

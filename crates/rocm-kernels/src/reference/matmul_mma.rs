//! CPU reference of [`crate::ops::matmul_mma`]: the product of [`super::matmul`] with both
//! operands first rounded to f16 (round to nearest even), as the matrix-core kernel rounds them,
//! then accumulated in f64. What is left between the two is the kernel's f32 accumulation.

use super::matvec::{dot, HostMatrix};
use crate::error::{KernelError, Result};
use half::f16;

/// `v` rounded to the nearest f16 and back.
fn round_f16(v: &mut [f32]) {
    for v in v {
        *v = f16::from_f32(*v).to_f32();
    }
}

/// `out[t][r] = sum_c half(w[r][c]) * half(x[t][c])` for `t < n_tokens`, in f64.
pub fn matmul_mma(w: &HostMatrix<'_>, x: &[f32], n_tokens: usize) -> Result<Vec<f32>> {
    let (rows, cols) = (w.rows(), w.cols());
    let need = n_tokens.saturating_mul(cols);
    let mut xh = x
        .get(..need)
        .ok_or_else(|| KernelError::Shape {
            op: "matmul_mma",
            message: format!("x holds {}, {n_tokens} tokens need {need}", x.len()),
        })?
        .to_vec();
    round_f16(&mut xh);
    let mut out = vec![0.0f32; n_tokens * rows];
    for r in 0..rows {
        let mut row = w.row(r)?;
        round_f16(&mut row);
        for t in 0..n_tokens {
            out[t * rows + r] = dot(&row, &xh[t * cols..(t + 1) * cols]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_loader::GgmlType;

    #[test]
    fn both_operands_are_rounded_to_half_before_the_product() {
        // 1 + 2^-12 is not a half (its nearest is 1); 3 is.
        let w: Vec<u8> = [1.0f32 + 1.0 / 4096.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = HostMatrix::new(&w, GgmlType::F32, 1, 2).unwrap();
        let out = matmul_mma(&w, &[2.0, 1.0 + 1.0 / 4096.0], 1).unwrap();
        assert_eq!(out, vec![2.0 + 3.0]);
        assert!(matmul_mma(&w, &[2.0], 1).is_err());
    }
}

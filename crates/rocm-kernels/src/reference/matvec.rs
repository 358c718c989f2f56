//! CPU reference of [`crate::ops::matvec`]: rows dequantized with `gguf_loader::dequantize`
//! (bit-exact with gguf-py), products accumulated in f64 and rounded to f32 once, so the
//! reference is closer to the exact result than any f32 accumulation order.

use crate::error::{KernelError, Result};
use crate::ops::matvec::check_matrix;
use gguf_loader::GgmlType;

/// A weight matrix in host memory: `rows` x `cols` values of `format` as raw GGUF bytes.
#[derive(Clone, Copy, Debug)]
pub struct HostMatrix<'a> {
    bytes: &'a [u8],
    format: GgmlType,
    rows: usize,
    cols: usize,
}

impl<'a> HostMatrix<'a> {
    /// Describes `bytes` as a `rows` x `cols` matrix of `format`; errors when `cols` is not a
    /// whole number of blocks, the length is not exactly the matrix's, or the CPU dequantizer
    /// does not read the format.
    pub fn new(bytes: &'a [u8], format: GgmlType, rows: usize, cols: usize) -> Result<Self> {
        const OP: &str = "reference matrix";
        if !format.can_dequantize() {
            return Err(KernelError::UnsupportedFormat {
                op: OP,
                format,
                supported: "every format gguf-loader dequantizes".into(),
            });
        }
        check_matrix(OP, format, rows, cols, bytes.len())?;
        Ok(HostMatrix {
            bytes,
            format,
            rows,
            cols,
        })
    }

    /// The storage format.
    pub fn format(&self) -> GgmlType {
        self.format
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Row `r` dequantized to f32.
    pub fn row(&self, r: usize) -> Result<Vec<f32>> {
        let row_bytes = self.bytes.len() / self.rows;
        let src = self
            .bytes
            .get(r * row_bytes..(r + 1) * row_bytes)
            .ok_or_else(|| KernelError::Shape {
                op: "reference matrix",
                message: format!("row {r} of {}", self.rows),
            })?;
        let mut out = vec![0.0f32; self.cols];
        gguf_loader::dequantize(self.format, src, &mut out).map_err(|e| KernelError::Shape {
            op: "reference matrix",
            message: e.to_string(),
        })?;
        Ok(out)
    }
}

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens` (`x` is `[n_tokens][cols]`, the
/// result `[n_tokens][rows]`), accumulated in f64.
pub fn matvec(w: &HostMatrix<'_>, x: &[f32], n_tokens: usize) -> Result<Vec<f32>> {
    let need = n_tokens.saturating_mul(w.cols);
    if x.len() < need {
        return Err(KernelError::Shape {
            op: "matvec",
            message: format!("x holds {}, {n_tokens} tokens need {need}", x.len()),
        });
    }
    let mut out = vec![0.0f32; n_tokens * w.rows];
    for r in 0..w.rows {
        let row = w.row(r)?;
        for t in 0..n_tokens {
            out[t * w.rows + r] = dot(&row, &x[t * w.cols..(t + 1) * w.cols]);
        }
    }
    Ok(out)
}

/// `sum a[i] * b[i]` in f64, rounded to f32.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum::<f64>() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// One Q8_0 block: scale d, then 32 signed bytes.
    fn q8_0_block(d: f32, q: [i8; 32]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_bits().to_le_bytes().to_vec();
        b.extend(q.iter().map(|&v| v as u8));
        b
    }

    #[test]
    fn q8_0_rows_by_hand() {
        let mut q0 = [0i8; 32];
        q0[0] = 2;
        q0[31] = -4;
        let mut q1 = [1i8; 32];
        q1[5] = -1;
        let mut bytes = q8_0_block(0.5, q0);
        bytes.extend(q8_0_block(0.25, q1));
        let w = HostMatrix::new(&bytes, GgmlType::Q8_0, 2, 32).unwrap();
        // Row 0 is 1.0 at column 0 and -2.0 at column 31; row 1 is 0.25 except -0.25 at 5.
        let mut x = vec![0.0f32; 64];
        x[0] = 3.0;
        x[31] = 1.0;
        x[5] = 4.0;
        for v in &mut x[32..] {
            *v = 1.0;
        }
        let out = matvec(&w, &x, 2).unwrap();
        let row1_x0 = 0.25 * (3.0 + 1.0) - 0.25 * 4.0;
        assert_eq!(out, vec![3.0 - 2.0, row1_x0, 1.0 - 2.0, 0.25 * 31.0 - 0.25]);
    }

    #[test]
    fn f32_matrix_and_shape_errors() {
        let vals = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let w = HostMatrix::new(&bytes, GgmlType::F32, 2, 3).unwrap();
        assert_eq!(matvec(&w, &[1.0, 1.0, 2.0], 1).unwrap(), vec![9.0, -0.5]);
        assert!(matvec(&w, &[1.0, 1.0], 1).is_err());
        assert!(HostMatrix::new(&bytes, GgmlType::F32, 2, 2).is_err());
        assert!(HostMatrix::new(&bytes[..4], GgmlType::Q8K, 1, 256).is_err());
    }
}

//! CPU reference of [`crate::ops::dequant`]: rows dequantized with `gguf_loader::dequantize`
//! (bit-exact with gguf-py), each value rounded to IEEE half with `half::f16::from_f32` (round
//! to nearest even, +-inf beyond the range, NaN kept NaN).

use super::matvec::HostMatrix;
use crate::error::{check_shape, Result};
use std::ops::Range;

/// Rows `rows` of `m` as f16 bits, row-major `[rows.len()][cols]`, densely packed.
///
/// Errors when the range is reversed or ends beyond the matrix.
pub fn dequantize_f16(m: &HostMatrix<'_>, rows: Range<usize>) -> Result<Vec<u16>> {
    check_shape(
        rows.start <= rows.end && rows.end <= m.rows(),
        "reference dequantize_f16",
        || {
            format!(
                "rows {}..{} of a {}-row matrix",
                rows.start,
                rows.end,
                m.rows()
            )
        },
    )?;
    let mut out = Vec::with_capacity(rows.len() * m.cols());
    for r in rows {
        out.extend(m.row(r)?.into_iter().map(f16_bits));
    }
    Ok(out)
}

/// `x` as f16 bits, each rounded to nearest even.
pub fn f32_to_f16(x: &[f32]) -> Vec<u16> {
    x.iter().copied().map(f16_bits).collect()
}

fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_loader::GgmlType;
    use half::f16;

    #[test]
    fn q8_0_rows_by_hand() {
        // Two rows of one Q8_0 block each: d = 0.5 and d = -2.
        let mut bytes = Vec::new();
        for (d, q0) in [(0.5f32, 3i8), (-2.0, -1)] {
            bytes.extend(f16::from_f32(d).to_bits().to_le_bytes());
            bytes.push(q0 as u8);
            bytes.extend([1u8; 31]);
        }
        let m = HostMatrix::new(&bytes, GgmlType::Q8_0, 2, 32).unwrap();
        let out = dequantize_f16(&m, 1..2).unwrap();
        assert_eq!(out.len(), 32);
        assert_eq!(f16::from_bits(out[0]).to_f32(), 2.0);
        assert_eq!(f16::from_bits(out[1]).to_f32(), -2.0);
        let both = dequantize_f16(&m, 0..2).unwrap();
        assert_eq!(f16::from_bits(both[0]).to_f32(), 1.5);
        assert_eq!(&both[32..], &out[..]);
        assert!(dequantize_f16(&m, 0..0).unwrap().is_empty());
        assert!(dequantize_f16(&m, 1..3).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 2..1;
        assert!(dequantize_f16(&m, reversed).is_err());
    }

    #[test]
    fn conversion_rounds_to_nearest_even_and_overflows_to_inf() {
        // 1 + 2^-11 is halfway between 1 and the next half: ties go to the even 1.0.
        let out = f32_to_f16(&[
            1.0 + 2f32.powi(-11),
            65520.0,
            -1e9,
            2f32.powi(-25),
            f32::NAN,
        ]);
        assert_eq!(out[0], f16::ONE.to_bits());
        assert_eq!(out[1], f16::INFINITY.to_bits());
        assert_eq!(out[2], f16::NEG_INFINITY.to_bits());
        assert_eq!(out[3], 0); // exactly half the smallest subnormal: ties to even zero
        assert!(f16::from_bits(out[4]).is_nan());
    }
}

//! CPU reference of [`crate::ops::embed`]: rows dequantized with `gguf_loader::dequantize`,
//! times `scale` in f32; an id outside `[0, vocab)` gives a zero row and raises the flag.

use super::matvec::HostMatrix;
use crate::error::Result;

/// `out[t] = table[tokens[t]] * scale` (`[tokens.len()][dim]`), and whether any id was out of
/// range (its row is zeros).
pub fn embed(table: &HostMatrix<'_>, tokens: &[i32], scale: f32) -> Result<(Vec<f32>, bool)> {
    let dim = table.cols();
    let mut out = vec![0.0f32; tokens.len() * dim];
    let mut out_of_range = false;
    for (dst, &id) in out.chunks_exact_mut(dim).zip(tokens) {
        match usize::try_from(id).ok().filter(|&i| i < table.rows()) {
            Some(i) => {
                for (o, v) in dst.iter_mut().zip(table.row(i)?) {
                    *o = v * scale;
                }
            }
            None => out_of_range = true,
        }
    }
    Ok((out, out_of_range))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf_loader::GgmlType;

    #[test]
    fn gathers_scales_and_zeroes_bad_ids() {
        let bytes: Vec<u8> = [1.0f32, 2.0, -3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let table = HostMatrix::new(&bytes, GgmlType::F32, 2, 2).unwrap();
        let (out, bad) = embed(&table, &[1, 0, 1], 2.0).unwrap();
        assert_eq!(out, vec![-6.0, 8.0, 2.0, 4.0, -6.0, 8.0]);
        assert!(!bad);
        let (out, bad) = embed(&table, &[2, -1, 0], 1.0).unwrap();
        assert_eq!(out, vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert!(bad);
    }
}

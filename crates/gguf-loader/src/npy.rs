//! Writing f32 arrays as NumPy `.npy` files (format version 1.0), for inspecting tensors.

use crate::GgufError;
use std::io::Write;
use std::path::Path;

/// Writes `data` with `shape` (outermost dimension first, as numpy orders it) to `path`.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), GgufError> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| GgufError::overflow("the .npy element count"))?;
    if n != data.len() {
        return Err(GgufError::SizeMismatch {
            what: format!("elements for a .npy array of shape {shape:?}"),
            expected: n as u64,
            actual: data.len() as u64,
        });
    }
    let file = std::fs::File::create(path).map_err(|e| GgufError::io("create", path, e))?;
    let mut out = std::io::BufWriter::new(file);
    let io = |e| GgufError::io("write", path, e);
    out.write_all(&header(shape)).map_err(io)?;
    for chunk in data.chunks(1 << 14) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_all(&bytes).map_err(io)?;
    }
    out.flush().map_err(io)
}

/// Magic, version 1.0, header length, then a Python dict literal padded so the data starts at
/// a multiple of 64 bytes.
fn header(shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_padded_to_64_and_names_the_shape() {
        for shape in [&[3usize][..], &[2, 640], &[1, 2, 3, 4]] {
            let h = header(shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(*h.last().unwrap(), b'\n');
            let text = std::str::from_utf8(&h[10..]).unwrap();
            assert!(text.contains("'descr': '<f4'"));
            let expected = if shape.len() == 1 {
                format!("({},)", shape[0])
            } else {
                format!(
                    "({})",
                    shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            assert!(text.contains(&expected), "{text}");
        }
    }
}

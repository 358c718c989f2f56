//! CPU reference of the K/V store, and host views of a cache in either element type.

use crate::error::{check_shape, Result};
use crate::ops::kv_cache::KvElem;

/// A host copy of a K or V cache.
#[derive(Clone, Copy, Debug)]
pub enum HostKv<'a> {
    /// f16 as `u16` bits.
    F16(&'a [u16]),
    /// f32.
    F32(&'a [f32]),
}

impl HostKv<'_> {
    /// Element `i` as f32.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            HostKv::F16(s) => half::f16::from_bits(s[i]).to_f32(),
            HostKv::F32(s) => s[i],
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostKv::F16(s) => s.len(),
            HostKv::F32(s) => s.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn elem(&self) -> KvElem {
        match self {
            HostKv::F16(_) => KvElem::F16,
            HostKv::F32(_) => KvElem::F32,
        }
    }
}

/// f32 to IEEE half bits, rounding to nearest even (what the GPU store does).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn check(
    src_len: usize,
    cache_len: usize,
    positions: &[i32],
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    const OP: &str = "kv_store reference";
    check_shape(slots > 0 && rows <= slots, OP, || {
        format!("{rows} rows into {slots} slots")
    })?;
    check_shape(positions.len() >= rows, OP, || {
        format!("{rows} rows, {} positions", positions.len())
    })?;
    check_shape(positions[..rows].iter().all(|&p| p >= 0), OP, || {
        "negative position".to_string()
    })?;
    check_shape(
        rows.checked_mul(dim).is_some_and(|n| n <= src_len),
        OP,
        || format!("{rows} rows of {dim} from {src_len} values"),
    )?;
    check_shape(
        slots.checked_mul(dim).is_some_and(|n| n <= cache_len),
        OP,
        || format!("{slots} slots of {dim} in {cache_len} elements"),
    )
}

/// Writes `rows` rows of `dim` from `src` into the f32 `cache`, row r at slot
/// `positions[r] % slots`.
pub fn store_rows_f32(
    cache: &mut [f32],
    src: &[f32],
    positions: &[i32],
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    check(src.len(), cache.len(), positions, rows, dim, slots)?;
    for (r, &p) in positions[..rows].iter().enumerate() {
        let slot = p as usize % slots;
        cache[slot * dim..][..dim].copy_from_slice(&src[r * dim..][..dim]);
    }
    Ok(())
}

/// As [`store_rows_f32`] into an f16 cache (`u16` bits, round to nearest even).
pub fn store_rows_f16(
    cache: &mut [u16],
    src: &[f32],
    positions: &[i32],
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    check(src.len(), cache.len(), positions, rows, dim, slots)?;
    for (r, &p) in positions[..rows].iter().enumerate() {
        let slot = p as usize % slots;
        for (c, &v) in cache[slot * dim..][..dim]
            .iter_mut()
            .zip(&src[r * dim..][..dim])
        {
            *c = f32_to_f16_bits(v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_in_position_mod_slots() {
        let mut cache = vec![0.0f32; 3 * 2];
        let src = [1.0, 2.0, 3.0, 4.0];
        store_rows_f32(&mut cache, &src, &[4, 5], 2, 2, 3).unwrap();
        // Position 4 -> slot 1, position 5 -> slot 2.
        assert_eq!(cache, [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(store_rows_f32(&mut cache, &src, &[0], 2, 2, 3).is_err());
        assert!(store_rows_f32(&mut cache, &src, &[0, 1, 2, 3], 4, 1, 3).is_err());
    }

    #[test]
    fn f16_store_rounds_to_nearest_even_and_reads_back() {
        let mut cache = vec![0u16; 4];
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.0;
        // 1 + 3 * 2^-11 ties to the even 1 + 2^-9.
        let src = [
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            65_520.0,
            -0.0,
        ];
        store_rows_f16(&mut cache, &src, &[0], 1, 4, 1).unwrap();
        assert_eq!(cache, [0x3c00, 0x3c02, 0x7c00, 0x8000]);
        let view = HostKv::F16(&cache);
        assert_eq!(view.get(1), 1.0 + 2f32.powi(-9));
        assert_eq!(view.elem(), KvElem::F16);
    }
}

//! CPU reference of the K/V store, and host views of a cache in any element type.

use crate::error::{check_shape, Result};
use crate::ops::kv_cache::{q8_0_values, KvElem};
use crate::reference::kv_q8::{q8_0_row_bytes, q8_0_value, quantize_q8_0};

/// A host copy of a K or V cache.
#[derive(Clone, Copy, Debug)]
pub enum HostKv<'a> {
    /// f16 as `u16` bits.
    F16(&'a [u16]),
    /// f32.
    F32(&'a [f32]),
    /// q8_0 blocks as bytes (`reference::kv_q8`); values are counted, not bytes.
    Q8_0(&'a [u8]),
}

impl HostKv<'_> {
    /// Element `i` as f32.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            HostKv::F16(s) => half::f16::from_bits(s[i]).to_f32(),
            HostKv::F32(s) => s[i],
            HostKv::Q8_0(s) => q8_0_value(s, i),
        }
    }

    /// Number of values (for q8_0, those of its whole blocks).
    pub fn len(&self) -> usize {
        match self {
            HostKv::F16(s) => s.len(),
            HostKv::F32(s) => s.len(),
            HostKv::Q8_0(s) => q8_0_values(s.len()),
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
            HostKv::Q8_0(_) => KvElem::Q8_0,
        }
    }
}

/// Host copies of a paged cache's block tables: [`crate::ops::kv_cache::KvPages`] on the host.
#[derive(Clone, Copy, Debug)]
pub struct HostPages<'a> {
    /// Per token, its sequence.
    pub seqs: &'a [i32],
    /// `[n_tables][table_len]` block ids.
    pub tables: &'a [i32],
    pub table_len: usize,
    /// Rows per block, a power of two.
    pub block: usize,
}

impl HostPages<'_> {
    /// The cache row of token `t`'s slot `slot`, or `None` where the table (or the token's
    /// sequence id) points outside what it was given or `cache_rows`.
    pub fn row(&self, t: usize, slot: usize, cache_rows: usize) -> Option<usize> {
        let seq = usize::try_from(*self.seqs.get(t)?).ok()?;
        let index = seq.checked_mul(self.table_len)? + slot / self.block;
        (slot / self.block < self.table_len).then_some(())?;
        let block = usize::try_from(*self.tables.get(index)?).ok()?;
        let row = block.checked_mul(self.block)? + slot % self.block;
        (row < cache_rows).then_some(row)
    }
}

/// The cache row of token `t`'s slot, for the reference op `op`: the slot itself unpaged, else
/// through the tables; an error naming the token where they have no block for it.
pub(crate) fn cache_row(
    op: &'static str,
    pages: Option<&HostPages<'_>>,
    t: usize,
    slot: usize,
    cache_rows: usize,
) -> Result<usize> {
    match pages {
        None => Ok(slot),
        Some(p) => p
            .row(t, slot, cache_rows)
            .ok_or_else(|| crate::error::KernelError::Shape {
                op,
                message: format!("token {t}'s slot {slot} has no block in the tables"),
            }),
    }
}

/// f32 to IEEE half bits, rounding to nearest even (what the GPU store does).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

const OP: &str = "kv_store reference";

fn check(
    src_len: usize,
    cache_len: usize,
    positions: &[i32],
    rows: usize,
    dim: usize,
    slots: usize,
    paged: bool,
) -> Result<()> {
    check_shape(slots > 0 && (paged || rows <= slots), OP, || {
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
        paged || slots.checked_mul(dim).is_some_and(|n| n <= cache_len),
        OP,
        || format!("{slots} slots of {dim} in {cache_len} elements"),
    )
}

/// Writes `rows` rows of `dim` from `src` into the f32 `cache`, row r at slot
/// `positions[r] % slots` (through its block table with `pages`).
pub fn store_rows_f32(
    cache: &mut [f32],
    src: &[f32],
    positions: &[i32],
    pages: Option<&HostPages<'_>>,
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    let paged = pages.is_some();
    check(src.len(), cache.len(), positions, rows, dim, slots, paged)?;
    let cache_rows = cache.len() / dim.max(1);
    for (r, &p) in positions[..rows].iter().enumerate() {
        let slot = cache_row(OP, pages, r, p as usize % slots, cache_rows)?;
        cache[slot * dim..][..dim].copy_from_slice(&src[r * dim..][..dim]);
    }
    Ok(())
}

/// As [`store_rows_f32`] into an f16 cache (`u16` bits, round to nearest even).
pub fn store_rows_f16(
    cache: &mut [u16],
    src: &[f32],
    positions: &[i32],
    pages: Option<&HostPages<'_>>,
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    let paged = pages.is_some();
    check(src.len(), cache.len(), positions, rows, dim, slots, paged)?;
    let cache_rows = cache.len() / dim.max(1);
    for (r, &p) in positions[..rows].iter().enumerate() {
        let slot = cache_row(OP, pages, r, p as usize % slots, cache_rows)?;
        for (c, &v) in cache[slot * dim..][..dim]
            .iter_mut()
            .zip(&src[r * dim..][..dim])
        {
            *c = f32_to_f16_bits(v);
        }
    }
    Ok(())
}

/// As [`store_rows_f32`] into a q8_0 cache (bytes, `dim / 32` blocks of 34 per row), each row
/// quantized by [`quantize_q8_0`]: what `kv_store_q8_0` writes. Errors as the others, and
/// where `dim` is not a multiple of 32.
pub fn store_rows_q8_0(
    cache: &mut [u8],
    src: &[f32],
    positions: &[i32],
    pages: Option<&HostPages<'_>>,
    rows: usize,
    dim: usize,
    slots: usize,
) -> Result<()> {
    let row_bytes = q8_0_row_bytes(dim);
    check_shape(row_bytes.is_some(), OP, || {
        format!("dim = {dim} is not a multiple of 32: a q8_0 cache stores whole blocks of 32")
    })?;
    let row_bytes = row_bytes.unwrap_or(0);
    let values = q8_0_values(cache.len());
    let paged = pages.is_some();
    check(src.len(), values, positions, rows, dim, slots, paged)?;
    let cache_rows = values / dim.max(1);
    for (r, &p) in positions[..rows].iter().enumerate() {
        let slot = cache_row(OP, pages, r, p as usize % slots, cache_rows)?;
        quantize_q8_0(
            &src[r * dim..][..dim],
            &mut cache[slot * row_bytes..][..row_bytes],
        );
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
        store_rows_f32(&mut cache, &src, &[4, 5], None, 2, 2, 3).unwrap();
        // Position 4 -> slot 1, position 5 -> slot 2.
        assert_eq!(cache, [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(store_rows_f32(&mut cache, &src, &[0], None, 2, 2, 3).is_err());
        assert!(store_rows_f32(&mut cache, &src, &[0, 1, 2, 3], None, 4, 1, 3).is_err());
    }

    #[test]
    fn paged_rows_land_in_their_sequences_blocks() {
        // Blocks of 2 rows; sequence 0's table is [2, 0], sequence 1's [1, 3].
        let tables = [2, 0, 1, 3];
        let seqs = [0, 1, 0, 1];
        let pages = HostPages {
            seqs: &seqs,
            tables: &tables,
            table_len: 2,
            block: 2,
        };
        let mut cache = vec![0.0f32; 8];
        // Sequence 0 at positions 0 and 3 (slots 0, 3), sequence 1 at 1 and 2 (slots 1, 2).
        let src = [10.0, 11.0, 13.0, 12.0];
        store_rows_f32(&mut cache, &src, &[0, 1, 3, 2], Some(&pages), 4, 1, 4).unwrap();
        // Seq 0 slot 0 -> block 2 row 4; seq 1 slot 1 -> block 1 row 3; seq 0 slot 3 -> block 0
        // row 1; seq 1 slot 2 -> block 3 row 6.
        assert_eq!(cache, [0.0, 13.0, 0.0, 11.0, 10.0, 0.0, 12.0, 0.0]);
        // A block past the cache is refused, not written.
        let bad = [9, 0, 1, 3];
        let pages = HostPages {
            tables: &bad,
            ..pages
        };
        assert!(store_rows_f32(&mut cache, &src, &[0, 1, 3, 2], Some(&pages), 4, 1, 4).is_err());
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
        store_rows_f16(&mut cache, &src, &[0], None, 1, 4, 1).unwrap();
        assert_eq!(cache, [0x3c00, 0x3c02, 0x7c00, 0x8000]);
        let view = HostKv::F16(&cache);
        assert_eq!(view.get(1), 1.0 + 2f32.powi(-9));
        assert_eq!(view.elem(), KvElem::F16);
    }

    #[test]
    fn q8_0_rows_are_quantized_blocks_at_their_slots() {
        // Two slots of 64 values (two blocks each); position 3 goes to slot 1.
        let dim = 64;
        let mut cache = vec![0xaau8; 2 * 68];
        let src: Vec<f32> = (0..dim).map(|i| (i as f32 - 20.0) * 0.1).collect();
        store_rows_q8_0(&mut cache, &src, &[3], None, 1, dim, 2).unwrap();
        let mut want = vec![0u8; 68];
        quantize_q8_0(&src, &mut want);
        assert_eq!(&cache[68..], &want[..]);
        assert!(cache[..68].iter().all(|&b| b == 0xaa), "slot 0 untouched");
        let view = HostKv::Q8_0(&cache);
        assert_eq!((view.len(), view.elem()), (128, KvElem::Q8_0));
        assert_eq!(view.get(64 + 5), q8_0_value(&want, 5));
        // A row that is not whole blocks, and a cache too short for its slots.
        let err = store_rows_q8_0(&mut cache, &src, &[0], None, 1, 48, 2).unwrap_err();
        assert!(err.to_string().contains("multiple of 32"), "{err}");
        assert!(store_rows_q8_0(&mut cache, &src, &[0], None, 1, 32, 5).is_err());
    }
}

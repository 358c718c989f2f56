//! The q8_0 KV cache format and its quantizer, which the GPU store kernel (`kv_store_q8_0`)
//! and the CPU backend match bit for bit.
//!
//! A row of `dim` values (a multiple of [`Q8_0_BLOCK`]) is `dim / 32` blocks of ggml's q8_0
//! layout: the scale `d` as IEEE half bits (little endian), then 32 signed bytes `q`; value
//! `i` of a block reads back as `d * q[i]`. 34 bytes per 32 values: 53.1 % of f16.
//!
//! The arithmetic is ggml's reference quantizer, in the order the GPU kernel does it:
//! `amax = max |x|`, `d = amax / 127`, `q = round_half_away(x * (1 / d))` (`q = 0` where
//! `d = 0`), `d` stored rounded to nearest even. One change: a block with a NaN or an
//! infinity stores a NaN scale, so the values read back as NaN and the step's non-finite
//! check sees them, where ggml's quantizer would store numbers that look valid.

/// Values per block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per block: an f16 scale and 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// The f16 bits of a NaN scale (a quiet NaN, as the GPU kernel writes it).
pub const Q8_0_NAN_SCALE: u16 = 0x7e00;

/// Bytes of a row of `dim` values, or `None` where `dim` is not a whole number of blocks.
pub fn q8_0_row_bytes(dim: usize) -> Option<usize> {
    dim.is_multiple_of(Q8_0_BLOCK)
        .then(|| dim / Q8_0_BLOCK * Q8_0_BLOCK_BYTES)
}

/// One block's scale bits and quants.
pub fn quantize_q8_0_block(x: &[f32; Q8_0_BLOCK]) -> (u16, [i8; Q8_0_BLOCK]) {
    if !x.iter().all(|v| v.is_finite()) {
        return (Q8_0_NAN_SCALE, [0; Q8_0_BLOCK]);
    }
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; Q8_0_BLOCK];
    for (q, &v) in q.iter_mut().zip(x) {
        // |v * id| <= 127 up to a rounding of the last bit, so the cast never saturates.
        *q = (v * id).round() as i8;
    }
    (half::f16::from_f32(d).to_bits(), q)
}

/// Quantizes `values` (a whole number of blocks) into `out` (34 bytes per block).
///
/// # Panics
/// Where `values.len()` is not a multiple of 32 or `out` is not exactly its size.
pub fn quantize_q8_0(values: &[f32], out: &mut [u8]) {
    assert_eq!(values.len() % Q8_0_BLOCK, 0, "q8_0 rows are whole blocks");
    assert_eq!(out.len(), values.len() / Q8_0_BLOCK * Q8_0_BLOCK_BYTES);
    for (x, o) in values
        .chunks_exact(Q8_0_BLOCK)
        .zip(out.chunks_exact_mut(Q8_0_BLOCK_BYTES))
    {
        let (d, q) = quantize_q8_0_block(x.try_into().expect("a chunk of 32"));
        o[..2].copy_from_slice(&d.to_le_bytes());
        for (b, q) in o[2..].iter_mut().zip(q) {
            *b = q as u8;
        }
    }
}

/// Value `i` of q8_0 `blocks`.
pub fn q8_0_value(blocks: &[u8], i: usize) -> f32 {
    let b = i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
    let d = half::f16::from_bits(u16::from_le_bytes([blocks[b], blocks[b + 1]])).to_f32();
    d * f32::from(blocks[b + 2 + i % Q8_0_BLOCK] as i8)
}

/// `values` replaced by what a q8_0 cache gives back for them: the CPU backend's q8_0 KV,
/// which holds these values in f32 rows (the same numbers attention reads on the GPU).
pub fn round_trip_q8_0(values: &mut [f32]) {
    for x in values.chunks_exact_mut(Q8_0_BLOCK) {
        let (d, q) = quantize_q8_0_block((&*x).try_into().expect("a chunk of 32"));
        let d = half::f16::from_bits(d).to_f32();
        for (x, q) in x.iter_mut().zip(q) {
            *x = d * f32::from(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(f: impl Fn(usize) -> f32) -> [f32; 32] {
        std::array::from_fn(f)
    }

    #[test]
    fn a_block_reads_back_within_half_a_step_of_its_scale() {
        let x = block(|i| (i as f32 - 13.3) * 0.37);
        let mut out = [0u8; 34];
        quantize_q8_0(&x, &mut out);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let step = amax / 127.0;
        for (i, &v) in x.iter().enumerate() {
            let back = q8_0_value(&out, i);
            // Half a step, plus the f16 rounding of the scale (2^-11 relative) times 127.
            assert!(
                (back - v).abs() <= 0.5 * step + amax * 2f32.powi(-11),
                "{i}: {v} {back}"
            );
        }
        // The largest value maps to +-127 exactly.
        let (_, q) = quantize_q8_0_block(&x);
        assert_eq!(q.iter().map(|q| q.unsigned_abs()).max(), Some(127));
    }

    #[test]
    fn ties_round_away_from_zero_as_ggml_does() {
        // amax 127 gives d = 1 and id = 1, so x * id is x: 0.5 -> 1, -2.5 -> -3, 1.5 -> 2.
        let x = block(|i| match i {
            0 => 127.0,
            1 => 0.5,
            2 => -2.5,
            3 => 1.5,
            _ => 0.0,
        });
        let (d, q) = quantize_q8_0_block(&x);
        assert_eq!(half::f16::from_bits(d).to_f32(), 1.0);
        assert_eq!(&q[..4], &[127, 1, -3, 2]);
    }

    #[test]
    fn a_zero_block_and_a_non_finite_block() {
        let (d, q) = quantize_q8_0_block(&[0.0; 32]);
        assert_eq!((d, q), (0, [0; 32]));
        let mut x = block(|i| i as f32);
        x[5] = f32::NAN;
        let mut out = [0u8; 34];
        quantize_q8_0(&x, &mut out);
        assert!((0..32).all(|i| q8_0_value(&out, i).is_nan()));
        let mut y = block(|i| i as f32);
        y[31] = f32::INFINITY;
        round_trip_q8_0(&mut y);
        assert!(y.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn the_round_trip_is_the_stored_values() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut out = vec![0u8; 3 * 34];
        quantize_q8_0(&x, &mut out);
        let mut y = x.clone();
        round_trip_q8_0(&mut y);
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v.to_bits(), q8_0_value(&out, i).to_bits());
        }
        assert_eq!(q8_0_row_bytes(96), Some(102));
        assert_eq!(q8_0_row_bytes(100), None);
    }
}

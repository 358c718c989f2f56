//! The q4_0 KV cache format's quantizer: ggml's q4_0 blocks, as the CPU backend holds a q4_0
//! cache (and as a GPU store kernel would have to match, bit for bit).
//!
//! A row of `dim` values (a multiple of [`Q4_0_BLOCK`]) is `dim / 32` blocks: the scale `d` as
//! IEEE half bits, then 16 bytes whose low nibbles are values 0..15 and high nibbles values
//! 16..31, each `q` in 0..15; value `i` reads back as `d * (q[i] - 8)`. 18 bytes per 32 values:
//! 28.1 % of f16.
//!
//! The arithmetic is ggml's reference quantizer: `max` is the value of largest magnitude (with
//! its sign), `d = max / -8`, `q = min(15, trunc(x * (1 / d) + 8.5))` (`q = 8`, a zero, where
//! `d = 0`), `d` stored rounded to nearest even. As for q8_0 (`super::kv_q8`), a block with a
//! NaN or an infinity stores a NaN scale, so it reads back as NaN.

/// Values per block.
pub const Q4_0_BLOCK: usize = 32;
/// Bytes per block: an f16 scale and 16 bytes of two 4-bit values each.
pub const Q4_0_BLOCK_BYTES: usize = 18;

/// The f16 bits of a NaN scale.
const NAN_SCALE: u16 = 0x7e00;

/// Bytes of a row of `dim` values, or `None` where `dim` is not a whole number of blocks.
pub fn q4_0_row_bytes(dim: usize) -> Option<usize> {
    dim.is_multiple_of(Q4_0_BLOCK)
        .then(|| dim / Q4_0_BLOCK * Q4_0_BLOCK_BYTES)
}

/// One block's scale bits and its 32 values' 4-bit codes (0..15, 8 the zero).
pub fn quantize_q4_0_block(x: &[f32; Q4_0_BLOCK]) -> (u16, [u8; Q4_0_BLOCK]) {
    if !x.iter().all(|v| v.is_finite()) {
        return (NAN_SCALE, [8; Q4_0_BLOCK]);
    }
    let max = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; Q4_0_BLOCK];
    for (q, &v) in q.iter_mut().zip(x) {
        // x * id lies in [-8, 8] up to rounding, so the sum is in [0.5, 16.5]: the cast
        // truncates a positive number, and the minimum keeps the largest value at 15.
        *q = ((v * id + 8.5) as u8).min(15);
    }
    (half::f16::from_f32(d).to_bits(), q)
}

/// Quantizes `values` (a whole number of blocks) into `out` (18 bytes per block).
///
/// # Panics
/// Where `values.len()` is not a multiple of 32 or `out` is not exactly its size.
pub fn quantize_q4_0(values: &[f32], out: &mut [u8]) {
    assert_eq!(values.len() % Q4_0_BLOCK, 0, "q4_0 rows are whole blocks");
    assert_eq!(out.len(), values.len() / Q4_0_BLOCK * Q4_0_BLOCK_BYTES);
    for (x, o) in values
        .chunks_exact(Q4_0_BLOCK)
        .zip(out.chunks_exact_mut(Q4_0_BLOCK_BYTES))
    {
        let (d, q) = quantize_q4_0_block(x.try_into().expect("a chunk of 32"));
        o[..2].copy_from_slice(&d.to_le_bytes());
        for (j, b) in o[2..].iter_mut().enumerate() {
            *b = q[j] | (q[j + 16] << 4);
        }
    }
}

/// Value `i` of q4_0 `blocks`.
pub fn q4_0_value(blocks: &[u8], i: usize) -> f32 {
    let b = i / Q4_0_BLOCK * Q4_0_BLOCK_BYTES;
    let d = half::f16::from_bits(u16::from_le_bytes([blocks[b], blocks[b + 1]])).to_f32();
    let j = i % Q4_0_BLOCK;
    let byte = blocks[b + 2 + j % 16];
    let q = if j < 16 { byte & 0x0F } else { byte >> 4 };
    d * (f32::from(q) - 8.0)
}

/// `values` replaced by what a q4_0 cache gives back for them: the CPU backend's q4_0 KV,
/// which holds these values in f32 rows.
pub fn round_trip_q4_0(values: &mut [f32]) {
    for x in values.chunks_exact_mut(Q4_0_BLOCK) {
        let (d, q) = quantize_q4_0_block((&*x).try_into().expect("a chunk of 32"));
        let d = half::f16::from_bits(d).to_f32();
        for (x, q) in x.iter_mut().zip(q) {
            *x = d * (f32::from(q) - 8.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_magnitude_maps_to_minus_eight_and_the_rest_round_to_the_grid() {
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 10.0) * 0.25;
        }
        // max |x| is x[31] = 5.25: d = -0.65625, so x[31] is code 0 (-8 * d).
        let (d, q) = quantize_q4_0_block(&x);
        let d = half::f16::from_bits(d).to_f32();
        assert_eq!(d, -0.65625);
        assert_eq!(q[31], 0);
        let mut bytes = [0u8; 18];
        quantize_q4_0(&x, &mut bytes);
        let mut back = x;
        round_trip_q4_0(&mut back);
        for (i, (&orig, &got)) in x.iter().zip(&back).enumerate() {
            assert_eq!(got, q4_0_value(&bytes, i), "value {i}");
            // Within half a step of the grid (the code is clamped to 15 at the top).
            assert!(
                (got - orig).abs() <= 0.5 * d.abs() + 1e-6,
                "{i}: {orig} -> {got}"
            );
        }
    }

    #[test]
    fn zeros_stay_zero_and_non_finite_blocks_read_back_as_nan() {
        let mut z = [0.0f32; 32];
        round_trip_q4_0(&mut z);
        assert!(z.iter().all(|&v| v == 0.0));
        let mut x = [1.0f32; 32];
        x[3] = f32::INFINITY;
        round_trip_q4_0(&mut x);
        assert!(x.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn rows_are_whole_blocks_of_eighteen_bytes() {
        assert_eq!(q4_0_row_bytes(64), Some(36));
        assert_eq!(q4_0_row_bytes(48), None);
        // 28.1 % of f16's bytes.
        assert_eq!(q4_0_row_bytes(1 << 20).unwrap() * 64, (1 << 20) * 2 * 18);
    }
}

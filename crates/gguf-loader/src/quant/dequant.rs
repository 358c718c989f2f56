//! CPU dequantization to f32.
//!
//! Each function follows ggml's reference layout, and performs its float operations in the same
//! order as gguf-py's `gguf.quants` (for example `(d * scale) * q - (dmin * m)`), so results are
//! bit-identical to it; the tests check that against gguf-py itself.

use super::ggml_type::{GgmlType, QK_K};
use crate::GgufError;
use half::{bf16, f16};

/// Dequantizes `dst.len()` elements of type `ty` from `src` into `dst`.
///
/// `dst.len()` must be a whole number of blocks and `src` exactly as long as those blocks.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let n = dst.len() as u64;
    let expected = ty.bytes_for(n).ok_or_else(|| GgufError::Invalid {
        what: format!("dequantizing {n} elements of {ty}"),
        reason: format!(
            "the count is not a multiple of the block size {}",
            ty.block_size()
        ),
    })?;
    if src.len() as u64 != expected {
        return Err(GgufError::SizeMismatch {
            what: format!("{ty} data for {n} elements"),
            expected,
            actual: src.len() as u64,
        });
    }
    let blocks = src
        .chunks_exact(ty.type_size())
        .zip(dst.chunks_exact_mut(ty.block_size()));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(s, d)| d[0] = f32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(s, d)| d[0] = half_at(s, 0)),
        GgmlType::Bf16 => blocks
            .for_each(|(s, d)| d[0] = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32()),
        GgmlType::Q4_0 => blocks.for_each(|(s, d)| q4_0(s, d)),
        GgmlType::Q4_1 => blocks.for_each(|(s, d)| q4_1(s, d)),
        GgmlType::Q5_0 => blocks.for_each(|(s, d)| q5_0(s, d)),
        GgmlType::Q5_1 => blocks.for_each(|(s, d)| q5_1(s, d)),
        GgmlType::Q8_0 => blocks.for_each(|(s, d)| q8_0(s, d)),
        GgmlType::Q2K => blocks.for_each(|(s, d)| q2_k(s, d)),
        GgmlType::Q3K => blocks.for_each(|(s, d)| q3_k(s, d)),
        GgmlType::Q4K => blocks.for_each(|(s, d)| q4_k(s, d)),
        GgmlType::Q5K => blocks.for_each(|(s, d)| q5_k(s, d)),
        GgmlType::Q6K => blocks.for_each(|(s, d)| q6_k(s, d)),
        GgmlType::Iq4Nl => blocks.for_each(|(s, d)| iq4_nl(s, d)),
        GgmlType::Iq4Xs => blocks.for_each(|(s, d)| iq4_xs(s, d)),
        GgmlType::Mxfp4 => blocks.for_each(|(s, d)| mxfp4(s, d)),
        // Q8_K only ever holds activations inside ggml; no file stores weights in it.
        GgmlType::Q8K => return Err(GgufError::DequantUnsupported { ty: ty.name() }),
    }
    Ok(())
}

/// The little-endian f16 at byte `at`, widened to f32 (exact).
fn half_at(s: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([s[at], s[at + 1]])).to_f32()
}

fn q4_0(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let qs = &s[2..18];
    for j in 0..16 {
        y[j] = d * ((qs[j] & 0x0F) as i32 - 8) as f32;
        y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let m = half_at(s, 2);
    let qs = &s[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0x0F) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

fn q5_0(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let qh = u32::from_le_bytes([s[2], s[3], s[4], s[5]]);
    let qs = &s[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        y[j] = d * (((qs[j] & 0x0F) | (h0 << 4)) as i32 - 16) as f32;
        y[j + 16] = d * (((qs[j] >> 4) | (h1 << 4)) as i32 - 16) as f32;
    }
}

fn q5_1(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let m = half_at(s, 2);
    let qh = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let qs = &s[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        y[j] = d * ((qs[j] & 0x0F) | (h0 << 4)) as f32 + m;
        y[j + 16] = d * ((qs[j] >> 4) | (h1 << 4)) as f32 + m;
    }
}

fn q8_0(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    for (out, &q) in y.iter_mut().zip(&s[2..34]) {
        *out = (q as i8) as f32 * d;
    }
}

fn q2_k(s: &[u8], y: &mut [f32]) {
    let scales = &s[0..16];
    let qs = &s[16..80];
    let d = half_at(s, 80);
    let dmin = half_at(s, 82);
    for (i, out) in y.iter_mut().enumerate().take(QK_K) {
        let (chunk, shift, l) = (i / 128, (i % 128) / 32, i % 32);
        let q = (qs[chunk * 32 + l] >> (2 * shift)) & 3;
        let sc = scales[i / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *out = dl * q as f32 - ml;
    }
}

/// The sixteen 6-bit signed scales of a Q3_K block.
fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low = if k < 8 {
            packed[k] & 0x0F
        } else {
            packed[k - 8] >> 4
        };
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn q3_k(s: &[u8], y: &mut [f32]) {
    let hmask = &s[0..32];
    let qs = &s[32..96];
    let scales = q3_k_scales(&s[96..108]);
    let d = half_at(s, 108);
    for (i, out) in y.iter_mut().enumerate().take(QK_K) {
        let (chunk, shift, l) = (i / 128, (i % 128) / 32, i % 32);
        let low = ((qs[chunk * 32 + l] >> (2 * shift)) & 3) as i32;
        // A set hmask bit means "no offset"; a clear one subtracts 4.
        let high_clear = (((hmask[l] >> (i / 32)) & 1) ^ 1) as i32;
        let q = low - (high_clear << 2);
        let dl = d * scales[i / 16] as f32;
        *out = dl * q as f32;
    }
}

/// The eight 6-bit scales and minimums of a Q4_K or Q5_K block.
fn k4_scale_min(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = packed[j] & 0x3F;
        mn[j] = packed[j + 4] & 0x3F;
        sc[j + 4] = (packed[j + 8] & 0x0F) | ((packed[j] >> 2) & 0x30);
        mn[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

fn q4_k(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let dmin = half_at(s, 2);
    let (sc, mn) = k4_scale_min(&s[4..16]);
    let qs = &s[16..144];
    for (i, out) in y.iter_mut().enumerate().take(QK_K) {
        let group = i / 32; // chunk * 2 + nibble
        let (chunk, nibble, l) = (i / 64, group % 2, i % 32);
        let q = (qs[chunk * 32 + l] >> (4 * nibble)) & 0x0F;
        let dl = d * sc[group] as f32;
        let ml = dmin * mn[group] as f32;
        *out = dl * q as f32 - ml;
    }
}

fn q5_k(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let dmin = half_at(s, 2);
    let (sc, mn) = k4_scale_min(&s[4..16]);
    let qh = &s[16..48];
    let qs = &s[48..176];
    for (i, out) in y.iter_mut().enumerate().take(QK_K) {
        let group = i / 32;
        let (chunk, nibble, l) = (i / 64, group % 2, i % 32);
        let low = (qs[chunk * 32 + l] >> (4 * nibble)) & 0x0F;
        let high = (qh[l] >> group) & 1;
        let q = low | (high << 4);
        let dl = d * sc[group] as f32;
        let ml = dmin * mn[group] as f32;
        *out = dl * q as f32 - ml;
    }
}

fn q6_k(s: &[u8], y: &mut [f32]) {
    let ql = &s[0..128];
    let qh = &s[128..192];
    let scales = &s[192..208];
    let d = half_at(s, 208);
    for (i, out) in y.iter_mut().enumerate().take(QK_K) {
        let chunk = i / 128;
        let within = i % 128;
        let low = (ql[chunk * 64 + within % 64] >> (4 * (within / 64))) & 0x0F;
        let high = (qh[chunk * 32 + within % 32] >> (2 * (within / 32))) & 3;
        let q = (low | (high << 4)) as i32 - 32;
        let dl = d * (scales[i / 16] as i8) as f32;
        *out = dl * q as f32;
    }
}

/// The non-linear 4-bit code book shared by IQ4_NL and IQ4_XS.
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn iq4_nl(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let qs = &s[2..18];
    for j in 0..16 {
        y[j] = d * IQ4_NL_VALUES[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = d * IQ4_NL_VALUES[(qs[j] >> 4) as usize] as f32;
    }
}

fn iq4_xs(s: &[u8], y: &mut [f32]) {
    let d = half_at(s, 0);
    let scales_h = u16::from_le_bytes([s[2], s[3]]);
    let scales_l = &s[4..8];
    let qs = &s[8..136];
    for (ib, out) in y.chunks_exact_mut(32).enumerate().take(QK_K / 32) {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
        let q = &qs[ib * 16..ib * 16 + 16];
        for j in 0..16 {
            out[j] = dl * IQ4_NL_VALUES[(q[j] & 0x0F) as usize] as f32;
            out[j + 16] = dl * IQ4_NL_VALUES[(q[j] >> 4) as usize] as f32;
        }
    }
}

/// FP4 (E2M1) values, doubled so they are integers; the block scale is halved to compensate.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of 2^(e - 127), the E8M0 block scale, as ggml computes it (exact for every e).
fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

fn mxfp4(s: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(s[0]);
    let qs = &s[1..17];
    for j in 0..16 {
        y[j] = d * MXFP4_VALUES[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = d * MXFP4_VALUES[(qs[j] >> 4) as usize] as f32;
    }
}

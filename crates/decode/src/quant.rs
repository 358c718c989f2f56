//! Quantized weight formats as the CPU kernels see them, and the 16-bit activation format the
//! fused dot products use.
//!
//! Weight formats are gguf-loader's [`GgmlType`]: its block geometry (`block_size`, `type_size`,
//! `bytes_for`) is the one definition, and this module adds what the CPU kernels need for the
//! subset they read ([`SUPPORTED`]). The dense types (F32, F16, BF16) are blocks of one element,
//! so a dense row or vector may have any length. A quantized block unpacks into small integers
//! `q` plus, for every group of 16 elements, a scale and an offset, so that element `i` is
//! `scale[i / 16] * q[i] + offset[i / 16]`. That one description serves both kernel flavours:
//! the exact one multiplies by f32 activations, the fast one takes an integer dot product
//! against activations quantized once per row to 16 bits ([`Q16Row`]). The weight bytes are
//! never expanded to a whole f32 row; a block at a time is unpacked into registers and stack
//! arrays.
//!
//! The functions here that take a type expect one of [`SUPPORTED`]; [`check_supported`] (called
//! by `WeightSource::check_bytes`, so by every backend's `load_weight`) refuses the others with
//! an error before any kernel sees them.

use crate::error::{DecodeError, Result};
use gguf_loader::quant::IQ4_NL_VALUES;
use gguf_loader::GgmlType;
use half::bf16;

/// Largest block any supported format uses (the k-quant super-block), and the most elements a
/// dense row is converted at a time.
pub const MAX_BLOCK: usize = 256;
/// Granularity of scales and offsets after unpacking.
pub const GROUP: usize = 16;
/// Block length of the 16-bit activation format.
pub const ACT_BLOCK: usize = 32;
const I16_MAX: f32 = 32767.0;

/// Every weight type the backends read: the GPU kernels' list, which the CPU kernels read too
/// (a test of `kernels` multiplies every one of them).
pub const SUPPORTED: [GgmlType; 15] = rocm_kernels::ops::matvec::WEIGHT_FORMATS;

/// Whether the CPU kernels read `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// The supported types' names, for messages: "F32, F16, BF16, Q4_0, …".
pub fn supported_names() -> String {
    rocm_kernels::ops::matvec::weight_format_names()
}

/// Refuses a tensor `name` stored as a type the kernels cannot read, naming the type and the
/// supported ones.
pub fn check_supported(name: &str, ty: GgmlType) -> Result<()> {
    if is_supported(ty) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedTensorType {
        name: name.to_string(),
        ty: ty.name().to_string(),
        supported: supported_names(),
    })
}

/// Whether `ty` stores every element as its own float (F32, F16, BF16) rather than blocks of
/// small integers: such rows have no integer dot product and may have any length.
pub const fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16)
}

/// Whether unpacked blocks of `ty` carry a nonzero offset (a stored minimum).
pub const fn has_offset(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q2K
    )
}

/// Whether unpacked blocks of `ty` change scale every 16 elements ([`GROUP`]) rather than
/// every 32 (the activation block), so a kernel cannot take 32 at a time.
pub const fn scale_per_16(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q6K | GgmlType::Q2K | GgmlType::Q3K)
}

/// Bytes one row of `n` elements of `ty` takes, or `None` when `n` is not a whole number of
/// blocks (never for the dense types) or the size does not fit in memory.
pub fn row_bytes(ty: GgmlType, n: usize) -> Option<usize> {
    ty.bytes_for(n as u64).and_then(|b| usize::try_from(b).ok())
}

/// Elements [`block_to_f32`] converts per call: one block of a quantized type, up to
/// [`MAX_BLOCK`] elements of a dense one (whose one-element blocks would make a call per
/// element). Kernels walk rows in steps of this many elements; a dense row's last step may be
/// shorter.
pub fn step_len(ty: GgmlType) -> usize {
    if is_float(ty) {
        MAX_BLOCK
    } else {
        ty.block_size()
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// IEEE half to single without a table or F16C: exact for every value.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let rest = (h as u32) & 0x7FFF;
    if rest >= 0x7C00 {
        // Inf or NaN: widen the exponent field to all ones.
        return f32::from_bits(sign | 0x7F80_0000 | ((rest & 0x3FF) << 13));
    }
    // Shifting into f32 position and scaling by 2^112 rebiases the exponent; subnormal halves
    // come out right too because the multiply normalizes them.
    let magic = f32::from_bits((254 - 15) << 23);
    f32::from_bits(sign | (f32::from_bits(rest << 13) * magic).to_bits())
}

/// One block unpacked: integers plus per-16 scale and offset.
pub struct Unpacked {
    pub q: [i8; MAX_BLOCK],
    pub scale: [f32; MAX_BLOCK / GROUP],
    pub offset: [f32; MAX_BLOCK / GROUP],
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked {
            q: [0; MAX_BLOCK],
            scale: [0.0; MAX_BLOCK / GROUP],
            offset: [0.0; MAX_BLOCK / GROUP],
        }
    }
}

/// Unpacks one block of a supported integer format. `src` is exactly one block.
/// Float formats are not unpacked this way (see [`block_to_f32`]).
///
/// # Panics
/// On a float or unsupported type: callers pass only types that passed [`check_supported`].
// Indexed loops on purpose: the indices are the ggml block layout, element j pairs with j + 16.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub fn unpack_block(format: GgmlType, src: &[u8], out: &mut Unpacked) {
    match format {
        GgmlType::Q8_0 => {
            let d = f16_at(src, 0);
            for (q, &b) in out.q[..32].iter_mut().zip(&src[2..34]) {
                *q = b as i8;
            }
            out.scale[..2].fill(d);
            out.offset[..2].fill(0.0);
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let d = f16_at(src, 0);
            let (qs, bias, offset) = if format == GgmlType::Q4_0 {
                (&src[2..18], 8i8, 0.0)
            } else {
                (&src[4..20], 0i8, f16_at(src, 2))
            };
            for j in 0..16 {
                out.q[j] = (qs[j] & 0x0F) as i8 - bias;
                out.q[j + 16] = (qs[j] >> 4) as i8 - bias;
            }
            out.scale[..2].fill(d);
            out.offset[..2].fill(offset);
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = f16_at(src, 0);
            let (base, bias, offset) = if format == GgmlType::Q5_0 {
                (2, 16i8, 0.0)
            } else {
                (4, 0i8, f16_at(src, 2))
            };
            let qh = u32::from_le_bytes([src[base], src[base + 1], src[base + 2], src[base + 3]]);
            let qs = &src[base + 4..base + 20];
            for j in 0..16 {
                let lo = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                out.q[j] = lo as i8 - bias;
                out.q[j + 16] = hi as i8 - bias;
            }
            out.scale[..2].fill(d);
            out.offset[..2].fill(offset);
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let d = f16_at(src, 0);
            let dmin = f16_at(src, 2);
            let scales = &src[4..16];
            let (qh, qs): (&[u8], &[u8]) = if format == GgmlType::Q4K {
                (&[], &src[16..144])
            } else {
                (&src[16..48], &src[48..176])
            };
            for chunk in 0..4 {
                let ql = &qs[chunk * 32..chunk * 32 + 32];
                for l in 0..32 {
                    let mut lo = ql[l] & 0x0F;
                    let mut hi = ql[l] >> 4;
                    if !qh.is_empty() {
                        lo |= ((qh[l] >> (2 * chunk)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
                    }
                    out.q[chunk * 64 + l] = lo as i8;
                    out.q[chunk * 64 + 32 + l] = hi as i8;
                }
            }
            for sub in 0..8 {
                let (sc, m) = k_scale_min(sub, scales);
                let s = d * sc as f32;
                let o = -dmin * m as f32;
                out.scale[2 * sub] = s;
                out.scale[2 * sub + 1] = s;
                out.offset[2 * sub] = o;
                out.offset[2 * sub + 1] = o;
            }
        }
        GgmlType::Q6K => {
            let ql_all = &src[0..128];
            let qh_all = &src[128..192];
            let sc_all = &src[192..208];
            let d = f16_at(src, 208);
            for half in 0..2 {
                let ql = &ql_all[half * 64..half * 64 + 64];
                let qh = &qh_all[half * 32..half * 32 + 32];
                let y = &mut out.q[half * 128..half * 128 + 128];
                for l in 0..32 {
                    let q1 = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                    let q2 = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                    let q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    let q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    y[l] = q1 as i8 - 32;
                    y[l + 32] = q2 as i8 - 32;
                    y[l + 64] = q3 as i8 - 32;
                    y[l + 96] = q4 as i8 - 32;
                }
            }
            for g in 0..16 {
                out.scale[g] = d * (sc_all[g] as i8) as f32;
            }
            out.offset = [0.0; 16];
        }
        GgmlType::Q2K => {
            let (scales, qs) = (&src[0..16], &src[16..80]);
            let (d, dmin) = (f16_at(src, 80), f16_at(src, 82));
            for (i, q) in out.q.iter_mut().enumerate() {
                *q = ((qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3) as i8;
            }
            for (g, &sc) in scales.iter().enumerate() {
                out.scale[g] = d * (sc & 0x0F) as f32;
                out.offset[g] = -(dmin * (sc >> 4) as f32);
            }
        }
        GgmlType::Q3K => {
            let (hmask, qs) = (&src[0..32], &src[32..96]);
            let d = f16_at(src, 108);
            for (i, q) in out.q.iter_mut().enumerate() {
                let low = (qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                // A set hmask bit means "no offset"; a clear one subtracts 4.
                let high_clear = ((hmask[i % 32] >> (i / 32)) & 1) ^ 1;
                *q = low as i8 - 4 * high_clear as i8;
            }
            for (g, &sc) in q3k_scales(&src[96..108]).iter().enumerate() {
                out.scale[g] = d * sc as f32;
            }
            out.offset = [0.0; 16];
        }
        GgmlType::Iq4Nl => {
            let d = f16_at(src, 0);
            for (j, &b) in src[2..18].iter().enumerate() {
                out.q[j] = IQ4_NL_VALUES[(b & 0x0F) as usize];
                out.q[j + 16] = IQ4_NL_VALUES[(b >> 4) as usize];
            }
            out.scale[..2].fill(d);
            out.offset[..2].fill(0.0);
        }
        GgmlType::Iq4Xs => {
            let d = f16_at(src, 0);
            let scales_h = u16::from_le_bytes([src[2], src[3]]);
            for sub in 0..8 {
                let low = (src[4 + sub / 2] >> (4 * (sub % 2))) & 0x0F;
                let high = ((scales_h >> (2 * sub)) & 3) as u8;
                let s = d * ((low | (high << 4)) as i32 - 32) as f32;
                out.scale[2 * sub..2 * sub + 2].fill(s);
                let qs = &src[8 + 16 * sub..24 + 16 * sub];
                for (j, &b) in qs.iter().enumerate() {
                    out.q[32 * sub + j] = IQ4_NL_VALUES[(b & 0x0F) as usize];
                    out.q[32 * sub + j + 16] = IQ4_NL_VALUES[(b >> 4) as usize];
                }
            }
            out.offset = [0.0; 16];
        }
        other => unreachable!(
            "{other} blocks are not unpacked (floats are read by block_to_f32; \
             check_supported refuses the rest)"
        ),
    }
}

/// The sixteen signed 6-bit scales of a Q3_K super-block, unpacked from their 12 bytes: the
/// low four bits of scale `k` are a nibble of byte `k % 8` (the high one for `k >= 8`), the
/// high two are bits `2 (k / 4)` of byte `8 + k % 4`.
fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|k| {
        let low = if k < 8 {
            packed[k] & 0x0F
        } else {
            packed[k - 8] >> 4
        };
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K super-block.
#[inline(always)]
fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one step of a supported format into `dst`: one block of a quantized type
/// (`dst.len() == format.block_size()`), or `dst.len()` elements of a dense one (any count).
#[inline(always)]
pub fn block_to_f32(format: GgmlType, src: &[u8], dst: &mut [f32], scratch: &mut Unpacked) {
    match format {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::Bf16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        _ => {
            unpack_block(format, src, scratch);
            for (g, chunk) in dst.chunks_exact_mut(GROUP).enumerate() {
                let (s, o) = (scratch.scale[g], scratch.offset[g]);
                for (d, &q) in chunk.iter_mut().zip(&scratch.q[g * GROUP..]) {
                    *d = s * q as f32 + o;
                }
            }
        }
    }
}

/// Dequantizes a whole row of a supported format into `dst` (`src` is
/// `row_bytes(format, dst.len())` bytes).
pub fn row_to_f32(format: GgmlType, src: &[u8], dst: &mut [f32]) {
    let mut scratch = Unpacked::default();
    if is_float(format) {
        // Any length, in one call: there is no block structure to walk.
        block_to_f32(format, src, dst, &mut scratch);
        return;
    }
    let bl = format.block_size();
    for (blk, out) in src
        .chunks_exact(format.type_size())
        .zip(dst.chunks_exact_mut(bl))
    {
        block_to_f32(format, blk, out, &mut scratch);
    }
}

/// An activation row quantized to 16 bits in blocks of 32, as the integer kernels consume it.
///
/// 16 rather than 8 bits: Gemma's activations carry outliers hundreds of times their typical
/// size, and 8-bit blocks lost up to 12% of the logits' RMS against the f32 reference, enough
/// to change greedy continuations. The products are widened to 16 bits for the multiply-add
/// anyway, so the wider activations cost nothing in the inner loop.
#[derive(Clone, Debug, Default)]
pub struct Q16Row {
    /// Quantized values.
    pub q: Vec<i16>,
    /// Scale per block of 32.
    pub d: Vec<f32>,
    /// `d * sum(q)` per group of 16, for the offsets of formats with a minimum.
    pub group_sum: Vec<f32>,
}

impl Q16Row {
    /// Quantizes `x` (length a multiple of 32) into `self`, reusing its storage.
    pub fn quantize_from(&mut self, x: &[f32]) {
        let n = x.len();
        self.q.resize(n, 0);
        self.d.resize(n / ACT_BLOCK, 0.0);
        self.group_sum.resize(n / GROUP, 0.0);
        for (b, chunk) in x.chunks_exact(ACT_BLOCK).enumerate() {
            let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            // `f32::max` skips NaN and a NaN cast to i16 is 0, so a NaN activation would
            // count as zero and its products, the logits too, would look finite. A NaN scale
            // carries it into every product of the block instead.
            let amax = if chunk.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else {
                amax
            };
            let d = amax / I16_MAX;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let q = &mut self.q[b * ACT_BLOCK..(b + 1) * ACT_BLOCK];
            for (qv, &v) in q.iter_mut().zip(chunk) {
                *qv = (v * inv).round() as i16;
            }
            self.d[b] = d;
            for h in 0..2 {
                let s: i32 = q[h * GROUP..(h + 1) * GROUP]
                    .iter()
                    .map(|&v| v as i32)
                    .sum();
                self.group_sum[b * 2 + h] = d * s as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn q16_row_reconstructs_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173)
            .collect();
        let mut r = Q16Row::default();
        r.quantize_from(&x);
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / 32];
            let back = d * r.q[i] as f32;
            assert!(
                (back - v).abs() <= d * 0.5 + 1e-6,
                "element {i}: {v} vs {back}"
            );
        }
        let s: f32 = (0..16).map(|i| r.d[0] * r.q[i] as f32).sum();
        assert!((s - r.group_sum[0]).abs() < 1e-4);
    }

    #[test]
    fn f16_conversion_matches_half_for_every_value() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            if h.is_nan() {
                assert!(f16_bits_to_f32(bits).is_nan());
            } else {
                assert_eq!(f16_bits_to_f32(bits), h.to_f32(), "bits {bits:#06x}");
            }
        }
    }

    #[test]
    fn row_bytes_rejects_partial_blocks_of_quantized_types_only() {
        assert_eq!(row_bytes(GgmlType::Q4K, 640), None);
        assert_eq!(row_bytes(GgmlType::Q8_0, 640), Some(20 * 34));
        assert_eq!(row_bytes(GgmlType::Q6K, 512), Some(420));
        assert_eq!(row_bytes(GgmlType::Q8_0, 7), None);
        // Dense types are blocks of one element: any length is whole.
        assert_eq!(row_bytes(GgmlType::F32, 7), Some(28));
        assert_eq!(row_bytes(GgmlType::F16, 7), Some(14));
        assert_eq!(row_bytes(GgmlType::Bf16, 301), Some(602));
    }

    #[test]
    fn dense_rows_of_any_length_convert_exactly() {
        // Longer than one step (MAX_BLOCK) and not a multiple of anything.
        let x: Vec<f32> = (0..301).map(|i| (i as f32 - 150.0) * 0.25).collect();
        let encodings: [(GgmlType, Vec<u8>); 3] = [
            (
                GgmlType::F32,
                x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            (
                GgmlType::F16,
                x.iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            (
                GgmlType::Bf16,
                x.iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
        ];
        for (ty, bytes) in encodings {
            for n in [1, 7, 301] {
                let src = &bytes[..row_bytes(ty, n).unwrap()];
                let mut got = vec![f32::NAN; n];
                row_to_f32(ty, src, &mut got);
                // Every value is a multiple of 1/4 below 40: exact in all three types.
                assert_eq!(got, x[..n], "{ty} length {n}");
            }
        }
    }

    #[test]
    fn unsupported_types_are_refused_by_name_with_the_supported_list() {
        for ty in [GgmlType::Q8K, GgmlType::Mxfp4] {
            assert!(!is_supported(ty));
            let e = check_supported("blk.0.attn_q.weight", ty).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, DecodeError::UnsupportedTensorType { .. }),
                "{msg}"
            );
            assert!(
                msg.contains("blk.0.attn_q.weight") && msg.contains(ty.name()),
                "{msg}"
            );
            assert!(msg.contains(&supported_names()), "{msg}");
        }
        for ty in SUPPORTED {
            check_supported("t", ty).unwrap();
        }
        assert_eq!(
            supported_names(),
            "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, \
             IQ4_XS"
        );
    }

    #[test]
    fn q4_0_unpacks_nibbles_in_ggml_order() {
        // d = 1.0, low nibbles hold elements 0..16, high nibbles 16..32.
        let mut blk = vec![0u8; 18];
        blk[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        for j in 0..16 {
            blk[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; 32];
        block_to_f32(GgmlType::Q4_0, &blk, &mut out, &mut Unpacked::default());
        for j in 0..16 {
            assert_eq!(out[j], j as f32 - 8.0);
            assert_eq!(out[j + 16], (15 - j) as f32 - 8.0);
        }
    }
}

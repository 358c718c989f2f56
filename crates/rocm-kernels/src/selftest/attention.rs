//! Rope, the K/V store and attention against the CPU references: rope (normal and NeoX, with
//! frequency factors, position scaling and partial rotation) and its fused K/V store; the store
//! into f16, f32 and q8_0 caches on rings and pages; decode attention on each of its kernels
//! (key streams, one warp per key, one thread per key, and the combine of their splits) on
//! both sides of tile and split boundaries, with its output left quantized; prefill attention on the
//! tiled, one-query-per-block and flash (matrix-core, native and SIMT) kernels; windows on full
//! caches and rings, paged caches, soft-capped scores on every kernel, q8_0 caches, and a
//! captured decode step replayed at new positions.
//!
//! Tolerances, relative to the RMS of the reference output:
//! * rope: `4e-6 + 5e-7 * p / position_scale` per element (see `ops::rope`: a one-ulp
//!   difference in a frequency between the CPU's libm and the device's turns into an angle
//!   difference that grows with the position);
//! * K/V store: bit-exact (f32 copy; f16 rounds to nearest even on both sides);
//! * attention with the same cache contents on both sides (f32 or f16): max error 5e-5, RMS
//!   error 1e-5 (only the f32 summation order differs);
//! * attention through an f16 cache against an f32 reference of the unrounded values: max 5e-3,
//!   RMS 1e-3 (the f16 rounding of K and V; a numpy model of the kernel gave 8e-4 and 3e-4, and
//!   the H200 3.3e-3 and 3.3e-4 on 300 keys of head size 128, 2026-11-30);
//! * q8_0 caches: the store is byte-exact against `reference::kv_q8::quantize_q8_0`, and
//!   attention is compared with the reference reading the same bytes, at the tolerances of the
//!   same-contents case above (the flash kernel at its own, as it rounds the dequantized values
//!   to f16).
//!
//! Every comparison also fails on a NaN or infinity in the GPU output.
//!
//! The CPU references, not the kernels, are most of the group's time: in the decode loops,
//! caches of thousands of slots take one grouping of heads rather than every one, the kernels
//! run on one shape share its inputs and references, and `run_all` computes references on
//! several threads.

use super::case::Case;
use super::case::{seeded, uniform_vec};
use super::rig::rms;
use super::rig::Rig;
use crate::ops::attention::{
    attention_decode, attention_decode_on, attention_decode_q8, attention_prefill_on,
    decode_splits, decode_workspace_floats, AttentionShape, DecodeKernel, PrefillKernel,
};
use crate::ops::kv_cache::{
    store_kv, store_rows, KvElem, KvPages, KvSlice, KvSliceMut, KvStoreShape,
};
use crate::ops::matvec_q8::{self, Q8ActivationsMut};
use crate::ops::rope::{rope, rope_pair, rope_pair_store, KvStore, RopeParams, RopeShape};
use crate::reference;
use crate::reference::kv_cache::{f32_to_f16_bits, HostKv, HostPages};
use crate::reference::kv_q8::{quantize_q8_0, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, Q8_0_NAN_SCALE};
use hip_ffi::DeviceBuffer;

pub const CASES: &[Case] = &[
    Case {
        name: "rope_matches_the_reference_normal_and_neox_with_factors_scale_and_partial_rotation",
        op: "rope",
        run: rope_normal_and_neox,
    },
    Case {
        name: "rope_with_the_kv_store_leaves_what_rope_then_store_leave",
        op: "rope",
        run: rope_with_the_store,
    },
    Case {
        name: "kv_store_matches_the_reference_bit_for_bit_in_f16_and_f32_with_ring_slots",
        op: "kv_store",
        run: kv_store_f16_and_f32,
    },
    Case {
        name:
            "kv_store_q8_0_writes_the_bytes_of_quantize_q8_0_on_rings_pages_and_non_finite_blocks",
        op: "kv_store",
        run: kv_store_q8_0,
    },
    Case {
        name: "decode_attention_matches_the_reference_over_lengths_heads_and_head_dims",
        op: "attention_decode",
        run: decode_over_lengths_heads_and_head_dims,
    },
    Case {
        name: "decode_attention_is_right_on_both_sides_of_tile_and_split_boundaries",
        op: "attention_decode",
        run: decode_at_tile_and_split_boundaries,
    },
    Case {
        name: "windowed_attention_matches_the_reference_on_full_caches_and_rings",
        op: "attention_decode",
        run: windowed_on_full_caches_and_rings,
    },
    Case {
        name: "a_few_decode_tokens_see_causal_prefixes",
        op: "attention_decode",
        run: a_few_decode_tokens,
    },
    Case {
        name: "q8_0_decode_attention_matches_the_reference_over_the_same_bytes",
        op: "attention_decode",
        run: q8_0_decode,
    },
    Case {
        name: "decode_attention_can_leave_its_output_quantized_as_the_quantizer_would",
        op: "attention_decode",
        run: decode_output_quantized,
    },
    Case {
        name: "prefill_attention_matches_the_reference_causal_windowed_and_grouped",
        op: "attention_prefill",
        run: prefill_causal_windowed_and_grouped,
    },
    Case {
        name: "q8_0_prefill_attention_matches_the_reference_over_the_same_bytes",
        op: "attention_prefill",
        run: q8_0_prefill,
    },
    Case {
        name: "flash_prefill_matches_the_reference_causal_windowed_grouped_and_partial",
        op: "attention_flash",
        run: flash_prefill,
    },
    Case {
        name: "soft_capped_scores_match_the_reference_on_every_kernel",
        op: "attention_softcap",
        run: soft_capped_scores,
    },
    Case {
        name: "paged_stores_and_attention_read_each_sequences_own_blocks",
        op: "attention_paged",
        run: paged_stores_and_attention,
    },
    Case {
        name: "a_captured_decode_step_replays_at_new_positions",
        op: "decode_step_graph",
        run: captured_decode_step_replays,
    },
];

// ---------------------------------------------------------------------------------------------
// Caches and comparisons

/// `values` (a whole number of blocks) as q8_0 bytes.
fn q8_0_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() / Q8_0_BLOCK * Q8_0_BLOCK_BYTES];
    quantize_q8_0(values, &mut out);
    out
}

/// A K or V cache on the device in any element type.
struct DevCache {
    buf: DeviceBuffer,
    elem: KvElem,
    /// Values it holds (for q8_0, those of its whole blocks).
    values: usize,
}

impl DevCache {
    fn from_f32(rig: &Rig<'_>, values: &[f32], elem: KvElem) -> crate::Result<DevCache> {
        DevCache::upload(rig, &HostCache::from_f32(values, elem))
    }

    /// A device copy of `host`.
    fn upload(rig: &Rig<'_>, host: &HostCache) -> crate::Result<DevCache> {
        let buf = match host {
            HostCache::F16(bits) => rig.upload(bits)?,
            HostCache::F32(values) => rig.upload(values)?,
            HostCache::Q8_0(bytes) => rig.upload(bytes)?,
        };
        Ok(DevCache {
            buf,
            elem: host.kv().elem(),
            values: host.kv().len(),
        })
    }

    /// Its length in elements of its buffer: values, or bytes for q8_0.
    fn stored(&self) -> usize {
        match self.elem {
            KvElem::F16 | KvElem::F32 => self.values,
            KvElem::Q8_0 => self.values / Q8_0_BLOCK * Q8_0_BLOCK_BYTES,
        }
    }

    fn view(&self, rig: &Rig<'_>) -> crate::Result<KvSlice> {
        let n = self.stored();
        Ok(match self.elem {
            KvElem::F16 => KvSlice::F16(rig.view(&self.buf, n)?),
            KvElem::F32 => KvSlice::F32(rig.view(&self.buf, n)?),
            KvElem::Q8_0 => KvSlice::Q8_0(rig.view(&self.buf, n)?),
        })
    }

    fn view_mut(&self, rig: &Rig<'_>) -> crate::Result<KvSliceMut> {
        let n = self.stored();
        Ok(match self.elem {
            KvElem::F16 => KvSliceMut::F16(rig.view_mut(&self.buf, n)?),
            KvElem::F32 => KvSliceMut::F32(rig.view_mut(&self.buf, n)?),
            KvElem::Q8_0 => KvSliceMut::Q8_0(rig.view_mut(&self.buf, n)?),
        })
    }

    /// The cache's contents as raw bits (f16 widened, f32 as its bits, q8_0 bytes widened), for
    /// exact comparison.
    fn bits(&self, rig: &Rig<'_>) -> crate::Result<Vec<u32>> {
        let n = self.stored();
        Ok(match self.elem {
            KvElem::F16 => rig
                .download::<u16>(&self.buf, n)?
                .into_iter()
                .map(u32::from)
                .collect(),
            KvElem::F32 => rig
                .download::<f32>(&self.buf, n)?
                .into_iter()
                .map(f32::to_bits)
                .collect(),
            KvElem::Q8_0 => rig
                .download::<u8>(&self.buf, n)?
                .into_iter()
                .map(u32::from)
                .collect(),
        })
    }
}

/// Host copy of a cache, in the element type of the device one.
enum HostCache {
    F16(Vec<u16>),
    F32(Vec<f32>),
    Q8_0(Vec<u8>),
}

impl HostCache {
    /// `len` zero values (for q8_0, blocks of zero bytes).
    fn new(len: usize, elem: KvElem) -> HostCache {
        match elem {
            KvElem::F16 => HostCache::F16(vec![0; len]),
            KvElem::F32 => HostCache::F32(vec![0.0; len]),
            KvElem::Q8_0 => HostCache::Q8_0(vec![0; len / Q8_0_BLOCK * Q8_0_BLOCK_BYTES]),
        }
    }

    fn from_f32(values: &[f32], elem: KvElem) -> HostCache {
        match elem {
            KvElem::F16 => HostCache::F16(values.iter().map(|&v| f32_to_f16_bits(v)).collect()),
            KvElem::F32 => HostCache::F32(values.to_vec()),
            KvElem::Q8_0 => HostCache::Q8_0(q8_0_bytes(values)),
        }
    }

    fn kv(&self) -> HostKv<'_> {
        match self {
            HostCache::F16(v) => HostKv::F16(v),
            HostCache::F32(v) => HostKv::F32(v),
            HostCache::Q8_0(v) => HostKv::Q8_0(v),
        }
    }

    fn store(
        &mut self,
        src: &[f32],
        positions: &[i32],
        rows: usize,
        dim: usize,
        slots: usize,
    ) -> crate::Result<()> {
        self.store_paged(src, positions, None, rows, dim, slots)
    }

    /// The reference store, through `pages` when given.
    fn store_paged(
        &mut self,
        src: &[f32],
        positions: &[i32],
        pages: Option<&HostPages<'_>>,
        rows: usize,
        dim: usize,
        slots: usize,
    ) -> crate::Result<()> {
        match self {
            HostCache::F16(c) => {
                reference::kv_cache::store_rows_f16(c, src, positions, pages, rows, dim, slots)
            }
            HostCache::F32(c) => {
                reference::kv_cache::store_rows_f32(c, src, positions, pages, rows, dim, slots)
            }
            HostCache::Q8_0(c) => {
                reference::kv_cache::store_rows_q8_0(c, src, positions, pages, rows, dim, slots)
            }
        }
    }

    /// The contents as raw bits, as [`DevCache::bits`] reads the device's.
    fn bits(&self) -> Vec<u32> {
        match self {
            HostCache::F16(v) => v.iter().map(|&b| u32::from(b)).collect(),
            HostCache::F32(v) => v.iter().map(|b| b.to_bits()).collect(),
            HostCache::Q8_0(v) => v.iter().map(|&b| u32::from(b)).collect(),
        }
    }
}

/// The bits of `values`, for comparisons that must be exact (and hold for NaN too).
fn f32_bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Records that the largest error is within `max_rel`, and the RMS error within `rms_rel`, of
/// the RMS of `want` (the scale attention tolerances are stated in; a bound of at least 1, as
/// [`Rig::close_to_rms`] takes, would hide a wrong key in outputs of RMS 0.1), and that every
/// value is finite.
fn close_rel(rig: &Rig<'_>, what: &str, got: &[f32], want: &[f32], max_rel: f32, rms_rel: f32) {
    // An all-zero reference leaves no room for any error.
    let scale = rms(want).max(f64::MIN_POSITIVE);
    rig.within(what, got, want, f64::from(max_rel) * scale);
    let finite = got.iter().chain(want).all(|v| v.is_finite());
    let rms_error = if got.len() == want.len() {
        let sum: f64 = got
            .iter()
            .zip(want)
            .map(|(&g, &w)| (f64::from(g) - f64::from(w)).powi(2))
            .sum();
        (sum / got.len().max(1) as f64).sqrt()
    } else {
        f64::INFINITY
    };
    let allowed = f64::from(rms_rel) * scale;
    rig.holds(
        &format!("{what}: RMS error"),
        finite && rms_error <= allowed,
        format!(
            "RMS error {rms_error:.3e}, allowed {allowed:.3e} ({rms_rel:.1e} of the reference \
             RMS {scale:.3e}); all values finite: {finite}"
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// Rope

fn rope_normal_and_neox(rig: &Rig<'_>) -> crate::Result<()> {
    let positions = [0i32, 1, 5, 299, 4096, 32_767];
    let rows = positions.len();
    let dpos = rig.upload(&positions)?;
    let mut noise = seeded(1);
    // (head_dim, n_rot, n_heads)
    for (head_dim, n_rot, n_heads) in [
        (64, 64, 8),
        (128, 128, 2),
        (80, 80, 16),
        (256, 256, 4),
        (128, 64, 8),
        (80, 32, 3),
    ] {
        for neox in [false, true] {
            for (position_scale, with_factors) in [(1.0f32, false), (4.0, true)] {
                let params = RopeParams {
                    neox,
                    freq_base: if neox { 1_000_000.0 } else { 10_000.0 },
                    position_scale,
                    n_rot,
                };
                let shape = RopeShape {
                    rows,
                    n_heads,
                    head_dim,
                };
                let x = uniform_vec(&mut noise, rows * n_heads * head_dim, -2.0, 2.0);
                let factors: Vec<f32> =
                    (0..n_rot / 2).map(|i| 1.0 + (i % 7) as f32 * 0.5).collect();
                let ff = with_factors.then_some(factors.as_slice());

                let mut want = x.clone();
                reference::rope::rope(&mut want, &positions, ff, shape, &params)?;

                let (dx, dff) = (rig.upload(&x)?, rig.upload(&factors)?);
                let dff_view = rig.view(&dff, factors.len())?;
                rope(
                    rig.kernels(),
                    rig.stream(),
                    &mut rig.view_mut(&dx, x.len())?,
                    &rig.view(&dpos, rows)?,
                    with_factors.then_some(&dff_view),
                    shape,
                    &params,
                )?;
                let got = rig.download::<f32>(&dx, x.len())?;

                let row_len = n_heads * head_dim;
                let config = format!(
                    "rope head_dim {head_dim} n_rot {n_rot} neox {neox} scale {position_scale} \
                     factors {with_factors}"
                );
                let (mut kept, mut given) = (Vec::new(), Vec::new());
                for (r, &p) in positions.iter().enumerate() {
                    let tol = 4e-6 + 5e-7 * p as f32 / position_scale;
                    let range = r * row_len..(r + 1) * row_len;
                    let what = format!("{config} position {p}");
                    close_rel(rig, &what, &got[range.clone()], &want[range], tol, tol);
                    for h in 0..n_heads {
                        let base = r * row_len + h * head_dim;
                        kept.extend(f32_bits(&got[base + n_rot..base + head_dim]));
                        given.extend(f32_bits(&x[base + n_rot..base + head_dim]));
                    }
                }
                // Dimensions past n_rot are untouched, bit for bit.
                if n_rot < head_dim {
                    rig.equal(
                        &format!("{config}: the dimensions past n_rot"),
                        &kept,
                        &given,
                    );
                }
            }
        }
    }
    Ok(())
}

fn rope_with_the_store(rig: &Rig<'_>) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let mut noise = seeded(9);
    // Two decode rows and a prefill-like three at ring positions; full and partial rotation,
    // both pairings, both cache element types, with and without frequency factors.
    let slots = 7;
    for (positions, head_dim, n_rot, neox, elem, factors) in [
        (vec![5i32], 128, 128, false, KvElem::F16, false),
        (vec![9i32, 10, 11], 64, 64, true, KvElem::F32, true),
        (vec![12i32, 13], 80, 32, true, KvElem::F16, false),
    ] {
        let (rows, n_heads, n_heads_kv) = (positions.len(), 4, 2);
        let (k_dim, dim_v) = (n_heads_kv * head_dim, n_heads_kv * head_dim + 16);
        let shape = RopeShape {
            rows,
            n_heads,
            head_dim,
        };
        let params = RopeParams {
            neox,
            freq_base: 10_000.0,
            position_scale: 1.0,
            n_rot,
        };
        let q = uniform_vec(&mut noise, rows * n_heads * head_dim, -2.0, 2.0);
        let k = uniform_vec(&mut noise, rows * k_dim, -2.0, 2.0);
        let v = uniform_vec(&mut noise, rows * dim_v, -1.0, 1.0);
        let ff: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + (i % 3) as f32).collect();
        let (dpos, dff, dv) = (rig.upload(&positions)?, rig.upload(&ff)?, rig.upload(&v)?);
        let pos_view = rig.view(&dpos, rows)?;
        let v_view = rig.view(&dv, v.len())?;
        let dff_view = rig.view(&dff, ff.len())?;
        let ffv = factors.then_some(&dff_view);
        let zeros = |n: usize| vec![0.0f32; n];
        // Two ops.
        let (q1, k1) = (rig.upload(&q)?, rig.upload(&k)?);
        let kc1 = DevCache::from_f32(rig, &zeros(slots * k_dim), elem)?;
        let vc1 = DevCache::from_f32(rig, &zeros(slots * dim_v), elem)?;
        rope_pair(
            kernels,
            stream,
            &mut rig.view_mut(&q1, q.len())?,
            &mut rig.view_mut(&k1, k.len())?,
            n_heads_kv,
            &pos_view,
            ffv,
            shape,
            &params,
        )?;
        store_kv(
            kernels,
            stream,
            &rig.view(&k1, k.len())?,
            &v_view,
            &mut kc1.view_mut(rig)?,
            &mut vc1.view_mut(rig)?,
            &pos_view,
            None,
            KvStoreShape {
                rows,
                dim_k: k_dim,
                dim_v,
                slots,
            },
        )?;
        // One.
        let (q2, k2) = (rig.upload(&q)?, rig.upload(&k)?);
        let kc2 = DevCache::from_f32(rig, &zeros(slots * k_dim), elem)?;
        let vc2 = DevCache::from_f32(rig, &zeros(slots * dim_v), elem)?;
        rope_pair_store(
            kernels,
            stream,
            &mut rig.view_mut(&q2, q.len())?,
            &mut rig.view_mut(&k2, k.len())?,
            n_heads_kv,
            &pos_view,
            ffv,
            shape,
            &params,
            Some(KvStore {
                v: &v_view,
                dim_v,
                k_cache: &mut kc2.view_mut(rig)?,
                v_cache: &mut vc2.view_mut(rig)?,
                slots,
                pages: None,
            }),
        )?;
        let what = format!("head_dim {head_dim} n_rot {n_rot} neox {neox} {elem:?}");
        let read = |b: &DeviceBuffer, n: usize| rig.download::<f32>(b, n).map(|x| f32_bits(&x));
        rig.equal(
            &format!("{what}: q"),
            &read(&q2, q.len())?,
            &read(&q1, q.len())?,
        );
        rig.equal(
            &format!("{what}: k"),
            &read(&k2, k.len())?,
            &read(&k1, k.len())?,
        );
        let k_cache = kc2.bits(rig)?;
        rig.equal(&format!("{what}: K cache"), &k_cache, &kc1.bits(rig)?);
        rig.equal(
            &format!("{what}: V cache"),
            &vc2.bits(rig)?,
            &vc1.bits(rig)?,
        );
        // The rows' slots were written (not left at zero).
        let written = k_cache.iter().filter(|&&b| b != 0).count();
        rig.holds(
            &format!("{what}: the rows' K slots were written"),
            written >= rows * k_dim / 2,
            format!("{written} K elements written"),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// K/V store

fn kv_store_f16_and_f32(rig: &Rig<'_>) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let mut noise = seeded(2);
    let slots = 16;
    // Rows at positions 13..20 wrap around the 16-slot ring: slots 13, 14, 15, 0, 1, 2, 3.
    let positions: Vec<i32> = (13..20).collect();
    let rows = positions.len();
    let (dim_k, dim_v) = (2 * 80, 2 * 64);
    let mut k_src = uniform_vec(&mut noise, rows * dim_k, -3.0, 3.0);
    let v_src = uniform_vec(&mut noise, rows * dim_v, -3.0, 3.0);
    // Values that exercise f16 rounding: ties to even, subnormals, overflow, signed zero.
    let special = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65_504.0,
        65_520.0,
        1e6,
        -1e6,
        -0.0,
        3e-7,
        2f32.powi(-25),
        2f32.powi(-25) * 1.5,
        6.1e-5,
        -2f32.powi(-24) * 2.5,
    ];
    k_src[..special.len()].copy_from_slice(&special);
    for elem in [KvElem::F16, KvElem::F32] {
        // A recognisable pattern in the cache shows that untouched slots stay untouched.
        let init_k: Vec<f32> = (0..slots * dim_k).map(|i| i as f32 * 0.25).collect();
        let init_v: Vec<f32> = (0..slots * dim_v).map(|i| -(i as f32) * 0.5).collect();
        let mut want_k = HostCache::from_f32(&init_k, elem);
        let mut want_v = HostCache::from_f32(&init_v, elem);
        want_k.store(&k_src, &positions, rows, dim_k, slots)?;
        want_v.store(&v_src, &positions, rows, dim_v, slots)?;

        let dk = DevCache::from_f32(rig, &init_k, elem)?;
        let dv = DevCache::from_f32(rig, &init_v, elem)?;
        let (ks, vs, dpos) = (
            rig.upload(&k_src)?,
            rig.upload(&v_src)?,
            rig.upload(&positions)?,
        );
        let shape = KvStoreShape {
            rows,
            dim_k,
            dim_v,
            slots,
        };
        store_kv(
            kernels,
            stream,
            &rig.view(&ks, k_src.len())?,
            &rig.view(&vs, v_src.len())?,
            &mut dk.view_mut(rig)?,
            &mut dv.view_mut(rig)?,
            &rig.view(&dpos, rows)?,
            None,
            shape,
        )?;
        rig.equal(&format!("{elem:?} K"), &dk.bits(rig)?, &want_k.bits());
        rig.equal(&format!("{elem:?} V"), &dv.bits(rig)?, &want_v.bits());

        // The one-tensor store writes only its cache.
        let one_pos = [35i32]; // slot 3
        let one_row = uniform_vec(&mut noise, dim_k, -1.0, 1.0);
        want_k.store(&one_row, &one_pos, 1, dim_k, slots)?;
        let (src, pos) = (rig.upload(&one_row)?, rig.upload(&one_pos)?);
        store_rows(
            kernels,
            stream,
            &rig.view(&src, dim_k)?,
            &mut dk.view_mut(rig)?,
            &rig.view(&pos, 1)?,
            None,
            1,
            dim_k,
            slots,
        )?;
        let what = format!("{elem:?} K after store_rows");
        rig.equal(&what, &dk.bits(rig)?, &want_k.bits());
        let what = format!("{elem:?} V after store_rows");
        rig.equal(&what, &dv.bits(rig)?, &want_v.bits());
    }
    Ok(())
}

fn kv_store_q8_0(rig: &Rig<'_>) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let mut noise = seeded(3);
    let slots = 16;
    // Rows at positions 13..20 wrap around the 16-slot ring: slots 13, 14, 15, 0, 1, 2, 3.
    let positions: Vec<i32> = (13..20).collect();
    let rows = positions.len();
    // K rows of 5 blocks (160), V rows of 4 (128): the grid covers the wider one.
    let (dim_k, dim_v) = (2 * 80, 2 * 64);
    let mut k_src = uniform_vec(&mut noise, rows * dim_k, -3.0, 3.0);
    let mut v_src = uniform_vec(&mut noise, rows * dim_v, -3.0, 3.0);
    // Blocks of K row 0: ties that round away from zero (amax 127 makes the scale 1), zeros,
    // a NaN, an infinity; block 4 of row 1 is tiny (a subnormal f16 scale) and of row 2 huge.
    for (i, x) in k_src[..32].iter_mut().enumerate() {
        *x = match i {
            0 => 127.0,
            1 => 0.5,
            2 => -2.5,
            3 => 1.5,
            4 => -0.5,
            _ => (i as f32 - 16.0) * 0.5,
        };
    }
    k_src[32..64].fill(0.0);
    k_src[64 + 7] = f32::NAN;
    k_src[96 + 31] = f32::NEG_INFINITY;
    for x in &mut k_src[dim_k + 128..dim_k + 160] {
        *x *= 1e-6;
    }
    for x in &mut k_src[2 * dim_k + 128..2 * dim_k + 160] {
        *x *= 1e30;
    }
    v_src[dim_v * 3 + 40] = f32::INFINITY;
    // A recognisable pattern in the cache shows that untouched slots stay untouched.
    let init_k: Vec<f32> = (0..slots * dim_k).map(|i| (i % 97) as f32 * 0.25).collect();
    let init_v: Vec<f32> = (0..slots * dim_v)
        .map(|i| -((i % 89) as f32) * 0.5)
        .collect();
    let mut want_k = HostCache::from_f32(&init_k, KvElem::Q8_0);
    let mut want_v = HostCache::from_f32(&init_v, KvElem::Q8_0);
    want_k.store(&k_src, &positions, rows, dim_k, slots)?;
    want_v.store(&v_src, &positions, rows, dim_v, slots)?;
    // The reference store is quantize_q8_0 of each row at its slot; check that much directly.
    let row_k = dim_k / 32 * 34;
    let wk = want_k.bits();
    let slot13 = &wk[13 * row_k..14 * row_k];
    let widen = |bytes: &[u8]| bytes.iter().map(|&b| u32::from(b)).collect::<Vec<u32>>();
    rig.equal(
        "the reference's slot 13 is quantize_q8_0 of row 0",
        slot13,
        &widen(&q8_0_bytes(&k_src[..dim_k])),
    );
    rig.equal(
        "the reference rounds ties away from zero",
        &slot13[2..7],
        &widen(&[127u8, 1, (-3i8) as u8, 2, (-1i8) as u8]),
    );
    let nan_scale = widen(&Q8_0_NAN_SCALE.to_le_bytes());
    rig.equal(
        "the reference's scale of a block with a NaN",
        &slot13[2 * 34..2 * 34 + 2],
        &nan_scale,
    );
    rig.equal(
        "the reference's scale of a block with an infinity",
        &slot13[3 * 34..3 * 34 + 2],
        &nan_scale,
    );

    let dk = DevCache::from_f32(rig, &init_k, KvElem::Q8_0)?;
    let dv = DevCache::from_f32(rig, &init_v, KvElem::Q8_0)?;
    let (ks, vs, dpos) = (
        rig.upload(&k_src)?,
        rig.upload(&v_src)?,
        rig.upload(&positions)?,
    );
    store_kv(
        kernels,
        stream,
        &rig.view(&ks, k_src.len())?,
        &rig.view(&vs, v_src.len())?,
        &mut dk.view_mut(rig)?,
        &mut dv.view_mut(rig)?,
        &rig.view(&dpos, rows)?,
        None,
        KvStoreShape {
            rows,
            dim_k,
            dim_v,
            slots,
        },
    )?;
    rig.equal("ring K", &dk.bits(rig)?, &want_k.bits());
    rig.equal("ring V", &dv.bits(rig)?, &want_v.bits());

    // The one-tensor store writes only its cache.
    let one_pos = [35i32]; // slot 3
    let one_row = uniform_vec(&mut noise, dim_k, -1.0, 1.0);
    want_k.store(&one_row, &one_pos, 1, dim_k, slots)?;
    let (src, pos) = (rig.upload(&one_row)?, rig.upload(&one_pos)?);
    store_rows(
        kernels,
        stream,
        &rig.view(&src, dim_k)?,
        &mut dk.view_mut(rig)?,
        &rig.view(&pos, 1)?,
        None,
        1,
        dim_k,
        slots,
    )?;
    rig.equal("K after store_rows", &dk.bits(rig)?, &want_k.bits());
    rig.equal("V after store_rows", &dv.bits(rig)?, &want_v.bits());

    // Paged: two sequences' rows interleaved, through scrambled tables of blocks of 4 rows.
    let pool = Pool::new(2, 4, 4, 2);
    let dim = 96;
    let positions = [0i32, 0, 1, 5, 2, 15, 9, 6];
    let seqs = [0i32, 1, 0, 1, 0, 1, 0, 1];
    let n = positions.len();
    let src = uniform_vec(&mut noise, n * dim, -2.0, 2.0);
    let init = uniform_vec(&mut noise, pool.rows() * dim, -9.0, 9.0);
    let mut want = HostCache::from_f32(&init, KvElem::Q8_0);
    let host = pool.host(&seqs);
    want.store_paged(&src, &positions, Some(&host), n, dim, 16)?;
    let cache = DevCache::from_f32(rig, &init, KvElem::Q8_0)?;
    let (dsrc, dpos, dseqs, dtables) = (
        rig.upload(&src)?,
        rig.upload(&positions)?,
        rig.upload(&seqs)?,
        rig.upload(&pool.tables)?,
    );
    let pages = KvPages {
        seqs: rig.view(&dseqs, n)?,
        tables: rig.view(&dtables, pool.tables.len())?,
        table_len: pool.table_len,
        block: pool.block,
    };
    store_rows(
        kernels,
        stream,
        &rig.view(&dsrc, src.len())?,
        &mut cache.view_mut(rig)?,
        &rig.view(&dpos, n)?,
        Some(&pages),
        n,
        dim,
        16,
    )?;
    rig.equal("paged", &cache.bits(rig)?, &want.bits());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Attention

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Decode on the kernel `DecodeKernel::Auto` picks.
    Decode,
    /// Decode on the one-warp-per-key kernel, whatever the cache.
    DecodeWarpPerKey,
    /// Decode on the key-stream kernel (f16 and q8_0 caches).
    DecodeKeyStreams,
    Prefill,
    /// Prefill on the one-query-per-block kernel.
    PrefillPerQuery,
    /// Prefill on the matrix cores (flash attention), whatever the device's variant.
    PrefillFlash,
    /// [`Kind::PrefillFlash`] of the kernels built with the SIMT matrix-core layer, whatever
    /// the device has (the build the native variants are checked against).
    PrefillFlashSimt,
    /// The second flash kernel, with the scores in registers (`PrefillKernel::FlashRegs`).
    PrefillFlashRegs,
    /// [`Kind::PrefillFlashRegs`] built with the SIMT matrix-core layer.
    PrefillFlashRegsSimt,
}

impl Kind {
    /// Whether this path is one of the flash kernels (f16 queries and probabilities).
    fn is_flash(self) -> bool {
        matches!(
            self,
            Kind::PrefillFlash
                | Kind::PrefillFlashSimt
                | Kind::PrefillFlashRegs
                | Kind::PrefillFlashRegsSimt
        )
    }
}

impl Run {
    /// With both flash kernels added (the one in registers beside the one through shared
    /// memory), on the same inputs and reference.
    fn and_flash(self) -> Run {
        self.and(Kind::PrefillFlash).and(Kind::PrefillFlashRegs)
    }
}

/// Tolerances (max, RMS, relative to the reference's RMS) of the flash kernel, which rounds
/// queries and probabilities to f16: about 5e-4 of each, so about 1e-3 of the output, where a
/// wrong key or row costs about 1.
const FLASH_TOLERANCE: (f32, f32) = (1e-2, 2e-3);

/// One attention call's shape, cache and kernel.
#[derive(Clone, Copy, Debug)]
struct Spec {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    slots: usize,
    window: Option<usize>,
    /// Position of the first query token; tokens are consecutive.
    pos0: usize,
    n_tokens: usize,
    elem: KvElem,
    path: Kind,
    /// Soft-capping of the scores (Gemma 2).
    softcap: Option<f32>,
}

/// A spec's shape and random inputs: queries twice as large as keys so the softmax is not
/// flat, every slot of both caches filled, consecutive positions from `pos0`.
struct Inputs {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    positions: Vec<i32>,
}

fn case_inputs(spec: &Spec, seed: u64) -> Inputs {
    let mut noise = seeded(seed);
    let d = spec.head_dim;
    let shape = AttentionShape {
        n_tokens: spec.n_tokens,
        n_head: spec.n_head,
        n_head_kv: spec.n_head_kv,
        head_dim_k: d,
        head_dim_v: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: spec.softcap,
        window: spec.window,
        slots: spec.slots,
    };
    let q = uniform_vec(
        &mut noise,
        spec.n_tokens * spec.n_head * d,
        -(2.0 * 3f32.sqrt()),
        2.0 * 3f32.sqrt(),
    );
    let k = uniform_vec(
        &mut noise,
        spec.slots * spec.n_head_kv * d,
        -3f32.sqrt(),
        3f32.sqrt(),
    );
    let v = uniform_vec(&mut noise, spec.slots * spec.n_head_kv * d, -1.0, 1.0);
    let positions = (0..spec.n_tokens).map(|t| (spec.pos0 + t) as i32).collect();
    Inputs {
        shape,
        q,
        k,
        v,
        positions,
    }
}

/// A spec's inputs as the device takes them, and its references: the output over the same
/// (rounded) cache contents the device reads, and for an f16 cache also over the unrounded f32
/// values.
struct References {
    shape: AttentionShape,
    q: Vec<f32>,
    positions: Vec<i32>,
    /// The caches in the spec's element type, as uploaded.
    k: HostCache,
    v: HostCache,
    want: Vec<f32>,
    exact: Option<Vec<f32>>,
}

fn references(spec: &Spec, seed: u64) -> crate::Result<References> {
    let Inputs {
        shape,
        q,
        k,
        v,
        positions,
    } = case_inputs(spec, seed);
    let (hk, hv) = (
        HostCache::from_f32(&k, spec.elem),
        HostCache::from_f32(&v, spec.elem),
    );
    let mut want = vec![0.0; spec.n_tokens * spec.n_head * spec.head_dim];
    reference::attention::attention(&q, hk.kv(), hv.kv(), &positions, None, &mut want, &shape)?;
    let exact = if spec.elem == KvElem::F16 {
        let mut exact = vec![0.0; want.len()];
        let (k, v) = (HostKv::F32(&k), HostKv::F32(&v));
        reference::attention::attention(&q, k, v, &positions, None, &mut exact, &shape)?;
        Some(exact)
    } else {
        None
    };
    Ok(References {
        shape,
        q,
        positions,
        k: hk,
        v: hv,
        want,
        exact,
    })
}

/// One spec run on one or more kernels with the same inputs (its seed's).
struct Run {
    spec: Spec,
    seed: u64,
    paths: Vec<Kind>,
}

impl Run {
    fn new(spec: Spec, seed: u64) -> Run {
        Run {
            spec,
            seed,
            paths: vec![spec.path],
        }
    }

    /// The same inputs on `path` too, against the same references.
    fn and(mut self, path: Kind) -> Run {
        self.paths.push(path);
        self
    }
}

/// Most threads [`run_all`] computes references on: enough to hide the references behind the
/// device work, few enough that the inputs of a chunk (up to about 80 MB a run, for caches of
/// 20 000 slots) stay a small part of a host's memory.
const MAX_REFERENCE_THREADS: usize = 8;

/// Runs `runs` in order. The CPU references are most of the time a run takes (the kernels take
/// milliseconds), so they are computed on several threads, a chunk of runs at a time, while the
/// device work and the comparisons stay in order on the rig.
fn run_all(rig: &Rig<'_>, runs: &[Run]) -> crate::Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_REFERENCE_THREADS);
    for chunk in runs.chunks(threads) {
        let references: Vec<crate::Result<References>> = std::thread::scope(|scope| {
            let computing: Vec<_> = chunk
                .iter()
                .map(|run| scope.spawn(move || references(&run.spec, run.seed)))
                .collect();
            computing
                .into_iter()
                // A panic in a reference is the case's: the runner reports it.
                .map(|c| c.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for (run, references) in chunk.iter().zip(references) {
            run_paths(rig, run, references?)?;
        }
    }
    Ok(())
}

/// Runs a spec with random cache contents in every slot on each of its paths, against the
/// reference reading the same (rounded) cache, and for f16 also against an f32 reference of
/// the unrounded values.
fn run_paths(rig: &Rig<'_>, run: &Run, references: References) -> crate::Result<()> {
    let References {
        shape,
        q,
        positions,
        k,
        v,
        want,
        exact,
    } = references;
    let (dq, dpos) = (rig.upload(&q)?, rig.upload(&positions)?);
    let (dk, dv) = (DevCache::upload(rig, &k)?, DevCache::upload(rig, &v)?);
    // The host copies are no longer needed; a chunk's next runs may need the memory.
    drop((k, v));
    let (q_view, pos_view) = (rig.view(&dq, q.len())?, rig.view(&dpos, positions.len())?);
    let (k_view, v_view) = (dk.view(rig)?, dv.view(rig)?);
    let splits = decode_splits(&shape).unwrap_or(0);
    for &path in &run.paths {
        let spec = Spec { path, ..run.spec };
        // NaN-filled output (every byte 0xff): a value the kernel forgets to write fails the
        // comparison.
        let dout = rig.filled::<f32>(want.len(), 0xff)?;
        let mut out = rig.view_mut(&dout, want.len())?;
        let kernels = match path {
            Kind::PrefillFlashSimt | Kind::PrefillFlashRegsSimt => rig.simt_kernels()?,
            _ => rig.kernels(),
        };
        match path {
            Kind::Decode | Kind::DecodeWarpPerKey | Kind::DecodeKeyStreams => {
                let need = decode_workspace_floats(&shape)?;
                let ws = rig.filled::<f32>(need, 0xff)?;
                let kernel = match path {
                    Kind::DecodeWarpPerKey => DecodeKernel::WarpPerKey,
                    Kind::DecodeKeyStreams => DecodeKernel::KeyStreams,
                    _ => DecodeKernel::Auto,
                };
                attention_decode_on(
                    kernels,
                    rig.stream(),
                    kernel,
                    &q_view,
                    &k_view,
                    &v_view,
                    &pos_view,
                    None,
                    &mut out,
                    &mut rig.view_mut(&ws, need)?,
                    &shape,
                    None,
                )?;
                // The workspace goes at the end of this arm: its work must be done first.
                rig.stream().synchronize()?;
            }
            Kind::Prefill
            | Kind::PrefillPerQuery
            | Kind::PrefillFlash
            | Kind::PrefillFlashSimt
            | Kind::PrefillFlashRegs
            | Kind::PrefillFlashRegsSimt => {
                let kernel = match path {
                    Kind::Prefill => PrefillKernel::Tiled,
                    Kind::PrefillFlash | Kind::PrefillFlashSimt => PrefillKernel::Flash,
                    Kind::PrefillFlashRegs | Kind::PrefillFlashRegsSimt => PrefillKernel::FlashRegs,
                    _ => PrefillKernel::PerQuery,
                };
                attention_prefill_on(
                    kernels,
                    rig.stream(),
                    kernel,
                    &q_view,
                    &k_view,
                    &v_view,
                    &pos_view,
                    None,
                    &mut out,
                    &shape,
                )?;
            }
        }
        let got = rig.download::<f32>(&dout, want.len())?;
        let what = format!("{spec:?} (decode splits {splits})");
        let flash = path.is_flash();
        let (max_rel, rms_rel) = if flash { FLASH_TOLERANCE } else { (5e-5, 1e-5) };
        close_rel(rig, &what, &got, &want, max_rel, rms_rel);
        if let Some(exact) = &exact {
            let (max_rel, rms_rel) = if flash { FLASH_TOLERANCE } else { (5e-3, 1e-3) };
            let what = format!("{what} against unrounded f32");
            close_rel(rig, &what, &got, exact, max_rel, rms_rel);
        }
    }
    Ok(())
}

fn case(n_head: usize, n_head_kv: usize, head_dim: usize, slots: usize, pos0: usize) -> Spec {
    Spec {
        n_head,
        n_head_kv,
        head_dim,
        slots,
        window: None,
        pos0,
        n_tokens: 1,
        elem: KvElem::F32,
        path: Kind::Decode,
        softcap: None,
    }
}

/// A spec of `n_tokens` from `pos0` on `path`, without soft-capping.
#[allow(clippy::too_many_arguments)]
fn spec(
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    slots: usize,
    pos0: usize,
    n_tokens: usize,
    window: Option<usize>,
    elem: KvElem,
    path: Kind,
) -> Spec {
    Spec {
        n_head,
        n_head_kv,
        head_dim,
        slots,
        window,
        pos0,
        n_tokens,
        elem,
        path,
        softcap: None,
    }
}

fn decode_over_lengths_heads_and_head_dims(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &decode_over_lengths_runs())
}

fn decode_over_lengths_runs() -> Vec<Run> {
    let mut runs = Vec::new();
    let mut seed = 10;
    // KV lengths 1, 5, 300, 4097 (position + 1) over head_dim 64/128/256 (the key-stream and
    // one-warp-per-key kernels) and 80 (the one-thread-per-key kernel), and head groupings 1/1,
    // 8/2, 16/8, 12/1 (three blocks of four heads on the first) and 6/2 (three heads a block),
    // in f16 and f32 caches; f16 on both of its kernels (q8_0 has its own case below). The cache of 4100 slots (tens of splits)
    // is for the 8/2 grouping only: the groupings are tested on the shorter caches, and long
    // caches' random contents and references for each would be most of the case's time.
    for (n_head, n_head_kv) in [(1, 1), (8, 2), (16, 8), (12, 1), (6, 2)] {
        for head_dim in [64, 128, 256, 80] {
            for (slots, pos) in [(8, 0), (8, 4), (512, 299), (4100, 4096)] {
                for (elem, path) in [
                    (KvElem::F16, Kind::DecodeKeyStreams),
                    (KvElem::F16, Kind::DecodeWarpPerKey),
                    (KvElem::F32, Kind::Decode),
                ] {
                    // The seeds stay those of the full loop.
                    seed += 1;
                    if slots > 512 && (n_head, n_head_kv) != (8, 2) {
                        continue;
                    }
                    let mut c = case(n_head, n_head_kv, head_dim, slots, pos);
                    c.elem = elem;
                    c.path = path;
                    runs.push(Run::new(c, seed));
                }
            }
        }
    }
    runs
}

fn decode_at_tile_and_split_boundaries(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &split_boundary_runs())
}

fn split_boundary_runs() -> Vec<Run> {
    let mut runs = Vec::new();
    // Heads of 128 in groups of 4 over 2 KV heads, on the one-warp-per-key plan (8-key units,
    // up to 256 splits for this grouping): 1024 slots make 128 splits of 8 keys, and 20_000
    // slots 250 splits of 80 (the combine's many-split path). The kernels spread the current
    // keys over all splits, so the positions put the ends of the key range on both sides of
    // their boundaries and of a one-thread-per-key kernel's 256-key tiles.
    for (slots, positions) in [
        (
            1024,
            &[0usize, 1, 254, 255, 256, 257, 511, 512, 767, 1023][..],
        ),
        (
            20_000,
            &[0, 255, 256, 511, 512, 1024, 10_239, 10_240, 19_999][..],
        ),
    ] {
        for (i, &pos) in positions.iter().enumerate() {
            let mut c = case(8, 2, 128, slots, pos);
            (c.elem, c.path) = match i % 4 {
                0 => (KvElem::F16, Kind::DecodeKeyStreams),
                1 => (KvElem::F32, Kind::Decode),
                2 => (KvElem::Q8_0, Kind::DecodeKeyStreams),
                _ => (KvElem::F16, Kind::DecodeWarpPerKey),
            };
            runs.push(Run::new(c, 100 + i as u64));
        }
    }
    runs
}

fn windowed_on_full_caches_and_rings(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &windowed_runs())
}

fn windowed_runs() -> Vec<Run> {
    let mut runs = Vec::new();
    let mut seed = 200;
    for head_dim in [64, 128, 256, 80] {
        for elem in [KvElem::F16, KvElem::F32] {
            for (n_head, n_head_kv) in [(1, 1), (8, 2), (16, 8)] {
                // Full-length cache, window 128: positions inside and past the window (4096 for
                // one head_dim only, to keep the random cache small).
                let far: &[usize] = if head_dim == 128 { &[4096] } else { &[] };
                for &pos in [5, 127, 128, 300].iter().chain(far) {
                    seed += 1;
                    let mut c = case(n_head, n_head_kv, head_dim, pos + 8, pos);
                    c.window = Some(128);
                    c.elem = elem;
                    runs.push(Run::new(c, seed));
                }
                // Ring of window + batch - 1 = 131 slots for four tokens per step, positions far
                // past the ring size.
                for pos0 in [0, 126, 300, 4093] {
                    seed += 1;
                    let mut c = case(n_head, n_head_kv, head_dim, 131, pos0);
                    c.window = Some(128);
                    c.n_tokens = 4;
                    c.elem = elem;
                    runs.push(Run::new(c, seed));
                }
            }
        }
    }
    runs
}

fn a_few_decode_tokens(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &few_decode_token_runs())
}

fn few_decode_token_runs() -> Vec<Run> {
    // Four tokens at 296..299 of a 300-slot cache (two splits), and three at 4094..4096.
    let mut four = case(16, 8, 256, 300, 296);
    four.n_tokens = 4;
    let mut three = case(8, 2, 80, 4097, 4094);
    three.n_tokens = 3;
    three.elem = KvElem::F16;
    vec![Run::new(four, 300), Run::new(three, 301)]
}

fn q8_0_decode(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &q8_0_decode_runs())
}

fn q8_0_decode_runs() -> Vec<Run> {
    let mut runs = Vec::new();
    let mut seed = 1500;
    // Heads of 64, 128 and 256 on the one-warp-per-key kernel (as Auto picks it and explicitly)
    // and of 96 and 32 on the one-thread-per-key one; short and long caches (one split and
    // many), groupings with blocks of fewer heads than the group. The long cache (4100 slots)
    // for the 8/2 grouping only, as in the decode case above.
    for (n_head, n_head_kv) in [(1, 1), (8, 2), (12, 1)] {
        for head_dim in [64, 128, 256, 96, 32] {
            for (slots, pos) in [(8, 4), (512, 299), (4100, 4096)] {
                for path in [Kind::DecodeKeyStreams, Kind::DecodeWarpPerKey] {
                    // The seeds stay those of the full loop.
                    seed += 1;
                    if slots > 512 && (n_head, n_head_kv) != (8, 2) {
                        continue;
                    }
                    let mut c = case(n_head, n_head_kv, head_dim, slots, pos);
                    c.elem = KvElem::Q8_0;
                    c.path = path;
                    runs.push(Run::new(c, seed));
                }
            }
        }
    }
    // A window on a ring, and several tokens at once.
    for head_dim in [64, 128, 96] {
        seed += 1;
        let mut c = case(8, 2, head_dim, 131, 4093);
        c.window = Some(128);
        c.n_tokens = 4;
        c.elem = KvElem::Q8_0;
        runs.push(Run::new(c, seed));
    }
    runs
}

fn prefill_causal_windowed_and_grouped(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &prefill_runs())
}

fn prefill_runs() -> Vec<Run> {
    let prefill = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window, elem| {
        spec(
            n_head,
            n_head_kv,
            head_dim,
            slots,
            pos0,
            n_tokens,
            window,
            elem,
            Kind::Prefill,
        )
    };
    let specs = [
        // A whole prompt from position 0.
        prefill(8, 2, 128, 512, 0, 300, None, KvElem::F16),
        prefill(16, 8, 64, 64, 0, 37, None, KvElem::F32),
        prefill(1, 1, 256, 300, 0, 300, None, KvElem::F32),
        // A later chunk of a prompt (keys before pos0 already cached).
        prefill(16, 8, 80, 600, 280, 20, None, KvElem::F16),
        // Windowed, on a full cache and on a ring of window + batch - 1 slots.
        prefill(8, 2, 64, 600, 0, 300, Some(128), KvElem::F32),
        prefill(16, 8, 80, 191, 200, 64, Some(128), KvElem::F16),
        prefill(8, 2, 256, 191, 4000, 64, Some(128), KvElem::F32),
        // Tiles of 16 queries: one query past a whole tile, and a chunk of one token.
        prefill(4, 4, 96, 64, 3, 17, None, KvElem::F16),
        prefill(4, 1, 128, 64, 10, 1, None, KvElem::F32),
        // Heads larger than the tiled kernel takes go to the one-query-per-block kernel.
        prefill(4, 2, 320, 64, 0, 40, None, KvElem::F16),
        // A prefill-sized batch through the decode path gives the same answers.
        Spec {
            path: Kind::Decode,
            ..prefill(8, 2, 128, 512, 0, 40, None, KvElem::F16)
        },
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let run = Run::new(c, 400 + i as u64);
            // The same inputs on the other prefill kernel give the same answers.
            if c.path == Kind::Prefill {
                run.and(Kind::PrefillPerQuery)
            } else {
                run
            }
        })
        .collect()
}

fn q8_0_prefill(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &q8_0_prefill_runs())
}

fn q8_0_prefill_runs() -> Vec<Run> {
    let prefill = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window, path| {
        spec(
            n_head,
            n_head_kv,
            head_dim,
            slots,
            pos0,
            n_tokens,
            window,
            KvElem::Q8_0,
            path,
        )
    };
    // Every shape on the tiled, the one-query-per-block and the flash kernel, with the same
    // inputs and references for the three (the GPU test this case replaces drew new inputs for
    // each kernel; the references of prompts of 300 tokens were most of its time).
    let shapes = [
        prefill(8, 2, 128, 512, 0, 300, None, Kind::Prefill),
        prefill(16, 8, 64, 64, 0, 37, None, Kind::Prefill),
        prefill(4, 1, 256, 300, 0, 300, None, Kind::Prefill),
        prefill(8, 8, 64, 600, 256, 65, None, Kind::Prefill),
        prefill(8, 2, 64, 600, 0, 300, Some(128), Kind::Prefill),
        prefill(8, 2, 256, 191, 4000, 64, Some(128), Kind::Prefill),
        prefill(4, 1, 128, 64, 10, 1, None, Kind::Prefill),
        // Heads the flash kernel is not built for, on the other two only.
        prefill(4, 4, 96, 64, 3, 17, None, Kind::Prefill),
        prefill(16, 8, 32, 191, 200, 64, Some(128), Kind::Prefill),
    ];
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let run = Run::new(c, 1600 + i as u64).and(Kind::PrefillPerQuery);
            if matches!(c.head_dim, 64 | 128 | 256) {
                run.and_flash()
            } else {
                run
            }
        })
        .collect()
}

fn flash_prefill(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &flash_runs())
}

fn flash_runs() -> Vec<Run> {
    let flash = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window| {
        spec(
            n_head,
            n_head_kv,
            head_dim,
            slots,
            pos0,
            n_tokens,
            window,
            KvElem::F16,
            Kind::PrefillFlash,
        )
    };
    let specs = [
        // Whole prompts from position 0: tiles of 64 queries (heads of 64 and 128) and of 32
        // (256), the last partial, with 32-key tiles (the second kernel's: 64, or 16 for heads
        // of 256 and in its SIMT build).
        flash(8, 2, 128, 512, 0, 300, None),
        flash(16, 8, 64, 64, 0, 37, None),
        flash(4, 1, 256, 300, 0, 300, None),
        // A later chunk (keys before pos0 already cached), at a key tile boundary and not.
        flash(16, 8, 128, 600, 280, 20, None),
        flash(8, 8, 64, 600, 256, 65, None),
        // Windowed, on a full cache and on a ring of window + batch - 1 slots.
        flash(8, 2, 64, 600, 0, 300, Some(128)),
        flash(8, 2, 256, 191, 4000, 64, Some(128)),
        flash(4, 1, 128, 100, 37, 64, Some(37)),
        // One token.
        flash(4, 1, 128, 64, 10, 1, None),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            // The spec's path is the first flash kernel; the second on the same inputs, and
            // the SIMT builds of both against the same reference for a head of each size, a
            // window and a later chunk.
            let run = Run::new(c, 900 + i as u64).and(Kind::PrefillFlashRegs);
            if [0, 1, 3, 6].contains(&i) {
                run.and(Kind::PrefillFlashSimt)
                    .and(Kind::PrefillFlashRegsSimt)
            } else {
                run
            }
        })
        .collect()
}

/// Gemma 2's soft-capped scores on every kernel: decode (auto, one warp per key, key streams),
/// prefill (tiled, one query per block, flash on the matrix cores and its SIMT build), over f32,
/// f16 and q8_0 caches, against the reference with the same cap. The cap (2) is below the
/// scores these inputs make, so a kernel that skipped it would be far off (the unit test
/// `the_soft_cap_moves_the_reference_far_past_the_tolerances` below).
fn soft_capped_scores(rig: &Rig<'_>) -> crate::Result<()> {
    run_all(rig, &soft_capped_runs())
}

fn soft_capped_runs() -> Vec<Run> {
    let capped = |path, elem, head_dim, slots, pos0, n_tokens, window| Spec {
        softcap: Some(2.0),
        ..spec(8, 2, head_dim, slots, pos0, n_tokens, window, elem, path)
    };
    let mut runs = Vec::new();
    let mut seed = 2300;
    for elem in [KvElem::F32, KvElem::F16, KvElem::Q8_0] {
        for path in [
            Kind::Decode,
            Kind::DecodeWarpPerKey,
            Kind::Prefill,
            Kind::PrefillPerQuery,
        ] {
            for (head_dim, slots, pos0, n_tokens, window) in [
                (64, 300, 299, 1, None),
                (128, 4100, 4096, 3, None),
                (64, 131, 4093, 4, Some(128)),
                (128, 200, 0, 37, None),
            ] {
                let decode = matches!(path, Kind::Decode | Kind::DecodeWarpPerKey);
                // Kind::Decode is the key-stream kernel for f16 and q8_0 caches.
                if decode != (n_tokens <= 4) {
                    continue;
                }
                seed += 1;
                let c = capped(path, elem, head_dim, slots, pos0, n_tokens, window);
                runs.push(Run::new(c, seed));
            }
        }
    }
    // Key tiles read f16 caches only; the flash kernel f16 and q8_0 ones.
    seed += 1;
    runs.push(Run::new(
        capped(
            Kind::DecodeKeyStreams,
            KvElem::F16,
            128,
            4100,
            4096,
            1,
            None,
        ),
        seed,
    ));
    let flash = [
        capped(Kind::PrefillFlash, KvElem::F16, 128, 512, 0, 300, None),
        capped(
            Kind::PrefillFlash,
            KvElem::F16,
            256,
            191,
            4000,
            64,
            Some(128),
        ),
        capped(Kind::PrefillFlash, KvElem::Q8_0, 64, 600, 256, 65, None),
    ];
    // The second flash kernel and the SIMT builds of both with the same inputs and references.
    for c in flash {
        seed += 1;
        runs.push(
            Run::new(c, seed)
                .and(Kind::PrefillFlashRegs)
                .and(Kind::PrefillFlashSimt)
                .and(Kind::PrefillFlashRegsSimt),
        );
    }
    runs
}

fn decode_output_quantized(rig: &Rig<'_>) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let mut noise = seeded(41);
    // (head size, whether the combine can quantize): 64 and 128 split evenly into groups of
    // 32; 80 takes the one-thread-per-key kernel, whose output is left for the quantizer.
    for (d, fused) in [(64, true), (128, true), (80, false)] {
        let shape = AttentionShape {
            n_tokens: 1,
            n_head: 8,
            n_head_kv: 2,
            head_dim_k: d,
            head_dim_v: d,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            window: None,
            slots: 300,
        };
        let q = uniform_vec(&mut noise, 8 * d, -3.0, 3.0);
        let k = uniform_vec(&mut noise, 300 * 2 * d, -1.5, 1.5);
        let v = uniform_vec(&mut noise, 300 * 2 * d, -1.0, 1.0);
        let (dq, dpos) = (rig.upload(&q)?, rig.upload(&[211i32])?);
        let (dk, dv) = (
            DevCache::from_f32(rig, &k, KvElem::F16)?,
            DevCache::from_f32(rig, &v, KvElem::F16)?,
        );
        let (q_view, pos_view) = (rig.view(&dq, q.len())?, rig.view(&dpos, 1)?);
        let (k_view, v_view) = (dk.view(rig)?, dv.view(rig)?);
        let need = decode_workspace_floats(&shape)?;
        let n = 8 * d;
        let what = format!("head size {d}");
        // Every byte 0xff: NaN in the workspace and output.
        let ws = rig.filled::<f32>(need.max(1), 0xff)?;
        let plain = rig.filled::<f32>(n, 0xff)?;
        attention_decode(
            kernels,
            stream,
            &q_view,
            &k_view,
            &v_view,
            &pos_view,
            None,
            &mut rig.view_mut(&plain, n)?,
            &mut rig.view_mut(&ws, need.max(1))?,
            &shape,
        )?;
        let plain = rig.download::<f32>(&plain, n)?;
        let ws = rig.filled::<f32>(need.max(1), 0xff)?;
        let out = rig.filled::<f32>(n, 0xff)?;
        let values = rig.upload(&vec![0x7fi8; n])?;
        let scales = rig.filled::<f32>(n / 32, 0xff)?;
        let mut q8 = Q8ActivationsMut {
            values: rig.view_mut(&values, n)?,
            scales: rig.view_mut(&scales, n / 32)?,
        };
        let did = attention_decode_q8(
            kernels,
            stream,
            &q_view,
            &k_view,
            &v_view,
            &pos_view,
            None,
            &mut rig.view_mut(&out, n)?,
            &mut rig.view_mut(&ws, need.max(1))?,
            &shape,
            Some(&mut q8),
        )?;
        let got = rig.download::<f32>(&out, n)?;
        rig.holds(
            &format!("{what}: quantized in the combine"),
            did == fused,
            format!("quantized: {did}, expected {fused}"),
        );
        let finite = plain.iter().all(|v| v.is_finite());
        rig.holds(
            &format!("{what}: the plain output is finite"),
            finite,
            format!("all finite: {finite}"),
        );
        rig.equal(
            &format!("{what}: the output itself"),
            &f32_bits(&got),
            &f32_bits(&plain),
        );
        if !fused {
            let untouched = rig.download::<i8>(&values, n)?.iter().all(|&v| v == 0x7f);
            rig.holds(
                &format!("{what}: the quantized values are left untouched"),
                untouched,
                format!("untouched: {untouched}"),
            );
            continue;
        }
        // What the quantizer makes of the same output, bit for bit.
        let src = rig.upload(&plain)?;
        let want_values = rig.filled::<i8>(n, 0)?;
        let want_scales = rig.filled::<f32>(n / 32, 0)?;
        let mut want = Q8ActivationsMut {
            values: rig.view_mut(&want_values, n)?,
            scales: rig.view_mut(&want_scales, n / 32)?,
        };
        matvec_q8::quantize(kernels, stream, rig.view(&src, n)?, 1, n, &mut want)?;
        rig.equal(
            &format!("{what}: values"),
            &rig.download::<i8>(&values, n)?,
            &rig.download::<i8>(&want_values, n)?,
        );
        rig.equal(
            &format!("{what}: scales"),
            &f32_bits(&rig.download::<f32>(&scales, n / 32)?),
            &f32_bits(&rig.download::<f32>(&want_scales, n / 32)?),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A captured decode step replayed at new positions

fn captured_decode_step_replays(rig: &Rig<'_>) -> crate::Result<()> {
    // A full cache of 600 slots (three splits, crossed at 256 and 512) and a 32-slot ring with
    // window 32 that wraps many times.
    replay_decode_steps(rig, KvElem::F16, None, 600, 600)?;
    replay_decode_steps(rig, KvElem::F32, Some(32), 32, 200)
}

/// Captures one decode step (rope of q and k, the K/V store, decode attention) into a graph
/// once, then replays it for every position with new inputs and positions written to the
/// device, as the backend's step block does; each step is checked against the references.
fn replay_decode_steps(
    rig: &Rig<'_>,
    elem: KvElem,
    window: Option<usize>,
    slots: usize,
    steps: usize,
) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let (n_head, n_head_kv, d) = (8, 2, 64);
    let params = RopeParams {
        neox: true,
        freq_base: 10_000.0,
        position_scale: 1.0,
        n_rot: d,
    };
    let shape = AttentionShape {
        n_tokens: 1,
        n_head,
        n_head_kv,
        head_dim_k: d,
        head_dim_v: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        window,
        slots,
    };
    let kv_dim = n_head_kv * d;
    let need = decode_workspace_floats(&shape)?;
    let mut q = rig.filled::<f32>(n_head * d, 0)?;
    let mut k_new = rig.filled::<f32>(kv_dim, 0)?;
    let mut v_new = rig.filled::<f32>(kv_dim, 0)?;
    let mut pos = rig.filled::<i32>(1, 0)?;
    let out = rig.filled::<f32>(n_head * d, 0)?;
    let ws = rig.filled::<f32>(need, 0)?;
    let k_cache = DevCache::from_f32(rig, &vec![0.0; slots * kv_dim], elem)?;
    let v_cache = DevCache::from_f32(rig, &vec![0.0; slots * kv_dim], elem)?;

    let rope_q = RopeShape {
        rows: 1,
        n_heads: n_head,
        head_dim: d,
    };
    let rope_k = RopeShape {
        n_heads: n_head_kv,
        ..rope_q
    };
    let store = KvStoreShape {
        rows: 1,
        dim_k: kv_dim,
        dim_v: kv_dim,
        slots,
    };
    // The views, taken before the capture (nothing is allocated or copied while it runs).
    let pos_view = rig.view(&pos, 1)?;
    let (mut q_view, mut k_new_view) = (
        rig.view_mut::<f32>(&q, n_head * d)?,
        rig.view_mut::<f32>(&k_new, kv_dim)?,
    );
    let v_new_view = rig.view(&v_new, kv_dim)?;
    let (mut k_cache_view, mut v_cache_view) = (k_cache.view_mut(rig)?, v_cache.view_mut(rig)?);
    let (mut out_view, mut ws_view) = (rig.view_mut(&out, n_head * d)?, rig.view_mut(&ws, need)?);
    stream.begin_capture()?;
    let captured = (|| -> crate::Result<()> {
        rope(
            kernels,
            stream,
            &mut q_view,
            &pos_view,
            None,
            rope_q,
            &params,
        )?;
        rope(
            kernels,
            stream,
            &mut k_new_view,
            &pos_view,
            None,
            rope_k,
            &params,
        )?;
        store_kv(
            kernels,
            stream,
            &k_new_view.as_const(),
            &v_new_view,
            &mut k_cache_view,
            &mut v_cache_view,
            &pos_view,
            None,
            store,
        )?;
        attention_decode(
            kernels,
            stream,
            &q_view.as_const(),
            &k_cache_view.as_const(),
            &v_cache_view.as_const(),
            &pos_view,
            None,
            &mut out_view,
            &mut ws_view,
            &shape,
        )
    })();
    // The capture ends whether or not the launches went in, so the stream is usable after.
    let graph = stream.end_capture();
    captured?;
    let exec = graph?.instantiate()?;

    let mut noise = seeded(500 + slots as u64);
    let mut hk = HostCache::new(slots * kv_dim, elem);
    let mut hv = HostCache::new(slots * kv_dim, elem);
    for p in 0..steps {
        let positions = [p as i32];
        let (mut hq, mut hkn, hvn) = (
            uniform_vec(&mut noise, n_head * d, -2.0, 2.0),
            uniform_vec(&mut noise, kv_dim, -2.0, 2.0),
            uniform_vec(&mut noise, kv_dim, -1.0, 1.0),
        );
        // Done on the device when they return; the previous replay is done too (the download
        // below waits for it).
        q.copy_from_host(&hq)?;
        k_new.copy_from_host(&hkn)?;
        v_new.copy_from_host(&hvn)?;
        pos.copy_from_host(&positions)?;
        // SAFETY: every buffer the captured work uses (q, k_new, v_new, pos, out, ws and both
        // caches) is alive and unmoved until the end of this function, and the stream is
        // synchronised (by `download`) before the host touches any of them again.
        unsafe { exec.launch(stream) }?;
        let got = rig.download::<f32>(&out, n_head * d)?;

        reference::rope::rope(&mut hq, &positions, None, rope_q, &params)?;
        reference::rope::rope(&mut hkn, &positions, None, rope_k, &params)?;
        hk.store(&hkn, &positions, 1, kv_dim, slots)?;
        hv.store(&hvn, &positions, 1, kv_dim, slots)?;
        let mut want = vec![0.0; n_head * d];
        reference::attention::attention(
            &hq,
            hk.kv(),
            hv.kv(),
            &positions,
            None,
            &mut want,
            &shape,
        )?;
        // GPU and CPU rope give q and k that differ in the last bits (more at larger positions),
        // and in an f16 cache such a difference can move a stored value by one f16 ulp, so the
        // comparison allows for that on top of the attention error.
        let (max_rel, rms_rel) = match elem {
            KvElem::F16 => (2e-3, 5e-4),
            KvElem::F32 => (5e-5 + 1e-6 * p as f32, 1e-5 + 1e-6 * p as f32),
            KvElem::Q8_0 => {
                return Err(rig.failure("the replay runs over f16 and f32 caches only"));
            }
        };
        let what =
            format!("replayed step at position {p} ({elem:?}, window {window:?}, {slots} slots)");
        close_rel(rig, &what, &got, &want, max_rel, rms_rel);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Paged caches: several sequences' blocks in one pool, through block tables

/// A pool of `n_blocks` blocks of `block` rows, and for each sequence a table of `table_len`
/// distinct blocks taken in a scrambled order (so no sequence's blocks are in order or
/// adjacent), the rest left to other sequences or unused.
struct Pool {
    block: usize,
    table_len: usize,
    n_blocks: usize,
    tables: Vec<i32>,
}

impl Pool {
    fn new(sequences: usize, table_len: usize, block: usize, spare: usize) -> Pool {
        let n_blocks = sequences * table_len + spare;
        // A fixed permutation of the blocks: i * 7 mod n (7 is prime to every n used here).
        let order: Vec<i32> = (0..n_blocks)
            .map(|i| ((i * 7 + 3) % n_blocks) as i32)
            .collect();
        Pool {
            block,
            table_len,
            n_blocks,
            tables: order[..sequences * table_len].to_vec(),
        }
    }

    fn rows(&self) -> usize {
        self.n_blocks * self.block
    }

    fn host<'a>(&'a self, seqs: &'a [i32]) -> HostPages<'a> {
        HostPages {
            seqs,
            tables: &self.tables,
            table_len: self.table_len,
            block: self.block,
        }
    }
}

fn paged_stores_and_attention(rig: &Rig<'_>) -> crate::Result<()> {
    let (kernels, stream) = (rig.kernels(), rig.stream());
    let mut noise = seeded(40);
    // Three sequences of 64 slots (tables of 4 blocks of 16) in a pool of 16 blocks; head
    // sizes for the one-warp-per-key decode kernel (64) and the one-thread-per-key one (80).
    let (block, table_len, n_seq) = (16, 4, 3);
    let slots = block * table_len;
    let pool = Pool::new(n_seq, table_len, block, 4);
    let dev_tables = rig.upload(&pool.tables)?;
    let tables = rig.view(&dev_tables, pool.tables.len())?;
    // q8_0 on both decode kernels too (96 is a whole number of blocks but not of 64).
    for (d, elem) in [
        (64, KvElem::F16),
        (80, KvElem::F32),
        (64, KvElem::F32),
        (64, KvElem::Q8_0),
        (96, KvElem::Q8_0),
    ] {
        let (n_head, n_head_kv) = (8, 2);
        let kv_dim = n_head_kv * d;
        let what = format!("head dim {d}, {elem:?}");
        // Every sequence's history, stored through its table by the paged K/V store: rows of
        // sequence s at positions 0..len[s], one launch with the sequences' rows interleaved.
        let lens = [37usize, 5, 64];
        let mut positions = Vec::new();
        let mut seqs = Vec::new();
        for p in 0..64 {
            for (s, &len) in lens.iter().enumerate() {
                if p < len {
                    positions.push(p as i32);
                    seqs.push(s as i32);
                }
            }
        }
        let rows = positions.len();
        let k_src = uniform_vec(&mut noise, rows * kv_dim, -1.7, 1.7);
        let v_src = uniform_vec(&mut noise, rows * kv_dim, -1.0, 1.0);
        // The pool starts as garbage: a row read from the wrong block shows.
        let init = uniform_vec(&mut noise, pool.rows() * kv_dim, -50.0, 50.0);
        let mut want_k = HostCache::from_f32(&init, elem);
        let mut want_v = HostCache::from_f32(&init, elem);
        let host = pool.host(&seqs);
        want_k.store_paged(&k_src, &positions, Some(&host), rows, kv_dim, slots)?;
        want_v.store_paged(&v_src, &positions, Some(&host), rows, kv_dim, slots)?;
        let (dpos, dseqs) = (rig.upload(&positions)?, rig.upload(&seqs)?);
        let pages = KvPages {
            seqs: rig.view(&dseqs, rows)?,
            tables,
            table_len,
            block,
        };
        let (ks, vs) = (rig.upload(&k_src)?, rig.upload(&v_src)?);
        let dk = DevCache::from_f32(rig, &init, elem)?;
        let dv = DevCache::from_f32(rig, &init, elem)?;
        store_kv(
            kernels,
            stream,
            &rig.view(&ks, k_src.len())?,
            &rig.view(&vs, v_src.len())?,
            &mut dk.view_mut(rig)?,
            &mut dv.view_mut(rig)?,
            &rig.view(&dpos, rows)?,
            Some(&pages),
            KvStoreShape {
                rows,
                dim_k: kv_dim,
                dim_v: kv_dim,
                slots,
            },
        )?;
        let got_k = dk.bits(rig)?;
        rig.equal(&format!("{what}: paged K store"), &got_k, &want_k.bits());
        let got_v = dv.bits(rig)?;
        rig.equal(&format!("{what}: paged V store"), &got_v, &want_v.bits());
        let (k_view, v_view) = (dk.view(rig)?, dv.view(rig)?);

        // Decode: one query per sequence at its last position, in one launch.
        let q_pos: Vec<i32> = lens.iter().map(|&l| l as i32 - 1).collect();
        let q_seqs: Vec<i32> = (0..n_seq as i32).collect();
        let shape = AttentionShape {
            n_tokens: n_seq,
            n_head,
            n_head_kv,
            head_dim_k: d,
            head_dim_v: d,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            window: None,
            slots,
        };
        let q = uniform_vec(&mut noise, n_seq * n_head * d, -3.0, 3.0);
        let mut want = vec![0.0; n_seq * n_head * d];
        let q_host = pool.host(&q_seqs);
        reference::attention::attention(
            &q,
            want_k.kv(),
            want_v.kv(),
            &q_pos,
            Some(&q_host),
            &mut want,
            &shape,
        )?;
        let (dq, dqpos, dqseqs) = (rig.upload(&q)?, rig.upload(&q_pos)?, rig.upload(&q_seqs)?);
        let q_pages = KvPages {
            seqs: rig.view(&dqseqs, n_seq)?,
            ..pages
        };
        let need = decode_workspace_floats(&shape)?;
        // Every byte 0xff: NaN in the workspace and output.
        let ws = rig.filled::<f32>(need.max(1), 0xff)?;
        let out = rig.filled::<f32>(want.len(), 0xff)?;
        attention_decode(
            kernels,
            stream,
            &rig.view(&dq, q.len())?,
            &k_view,
            &v_view,
            &rig.view(&dqpos, n_seq)?,
            Some(&q_pages),
            &mut rig.view_mut(&out, want.len())?,
            &mut rig.view_mut(&ws, need.max(1))?,
            &shape,
        )?;
        let got = rig.download::<f32>(&out, want.len())?;
        close_rel(
            rig,
            &format!("{what}: paged decode"),
            &got,
            &want,
            5e-5,
            1e-5,
        );

        // Prefill, every kernel that takes the cache: sequence 0's last 20 positions as one
        // run, through its table.
        let run: Vec<i32> = (17..37).collect();
        let run_seqs = vec![0i32; run.len()];
        let shape = AttentionShape {
            n_tokens: run.len(),
            ..shape
        };
        let q = uniform_vec(&mut noise, run.len() * n_head * d, -3.0, 3.0);
        let mut want = vec![0.0; q.len() / d * d];
        let run_host = pool.host(&run_seqs);
        reference::attention::attention(
            &q,
            want_k.kv(),
            want_v.kv(),
            &run,
            Some(&run_host),
            &mut want,
            &shape,
        )?;
        let (dq, drun, drun_seqs) = (rig.upload(&q)?, rig.upload(&run)?, rig.upload(&run_seqs)?);
        let run_pages = KvPages {
            seqs: rig.view(&drun_seqs, run.len())?,
            ..pages
        };
        let mut prefill_kernels = vec![PrefillKernel::Tiled, PrefillKernel::PerQuery];
        if elem != KvElem::F32 && d == 64 {
            prefill_kernels.push(PrefillKernel::Flash);
        }
        for kernel in prefill_kernels {
            let out = rig.filled::<f32>(want.len(), 0xff)?;
            attention_prefill_on(
                kernels,
                stream,
                kernel,
                &rig.view(&dq, q.len())?,
                &k_view,
                &v_view,
                &rig.view(&drun, run.len())?,
                Some(&run_pages),
                &mut rig.view_mut(&out, want.len())?,
                &shape,
            )?;
            let (max_rel, rms_rel) = if kernel == PrefillKernel::Flash {
                FLASH_TOLERANCE
            } else {
                (5e-5, 1e-5)
            };
            let got = rig.download::<f32>(&out, want.len())?;
            let what = format!("{what}: paged prefill {kernel:?}");
            close_rel(rig, &what, &got, &want, max_rel, rms_rel);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap of the soft-capping case (2) matters at its inputs: the capped and uncapped
    /// references differ by far more than any tolerance there, so a kernel that skipped the cap
    /// would fail it. No GPU needed.
    #[test]
    fn the_soft_cap_moves_the_reference_far_past_the_tolerances() {
        let c = Spec {
            softcap: Some(2.0),
            n_head: 8,
            n_head_kv: 2,
            ..case(8, 2, 64, 300, 299)
        };
        let Inputs {
            shape,
            q,
            k,
            v,
            positions,
        } = case_inputs(&c, 1);
        let run = |shape: &AttentionShape| {
            let mut out = vec![0.0; c.n_head * c.head_dim];
            let (hk, hv) = (HostKv::F32(&k), HostKv::F32(&v));
            reference::attention::attention(&q, hk, hv, &positions, None, &mut out, shape).unwrap();
            out
        };
        let with = run(&shape);
        let without = run(&AttentionShape {
            softcap: None,
            ..shape
        });
        let rms = (with.iter().map(|x| x * x).sum::<f32>() / with.len() as f32).sqrt();
        let max = with
            .iter()
            .zip(&without)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            max > 0.05 * rms,
            "the cap changes the output by only {max} (rms {rms})"
        );
    }
}

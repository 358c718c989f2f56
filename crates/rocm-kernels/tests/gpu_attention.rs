//! GPU tests of rope, the K/V store and attention against the CPU references.
//!
//! Each test gets its device through `hip_ffi::testing::device_or_skip` (a printed skip without
//! a GPU; a failure under `HIPDECODE_REQUIRE_GPU=1`). Tolerances, relative to the RMS of the
//! reference output:
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

mod common;

use hip_ffi::testing::device_or_skip;
use hip_ffi::{DeviceBuffer, DeviceCopy, Stream};
use rocm_kernels::ops::attention::{
    attention_decode, attention_decode_on, attention_decode_q8, attention_prefill,
    attention_prefill_on, decode_splits, decode_workspace_floats, AttentionShape, DecodeKernel,
    PrefillKernel,
};
use rocm_kernels::ops::kv_cache::{
    store_kv, store_rows, KvElem, KvPages, KvSlice, KvSliceMut, KvStoreShape,
};
use rocm_kernels::ops::rope::{rope, RopeParams, RopeShape};
use rocm_kernels::reference;
use rocm_kernels::reference::kv_cache::{f32_to_f16_bits, HostKv};
use rocm_kernels::reference::kv_q8::{quantize_q8_0, Q8_0_BLOCK, Q8_0_BLOCK_BYTES, Q8_0_NAN_SCALE};
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};
use std::sync::MutexGuard;
use test_support::gpu::gpu_lock;
use test_support::rng::{seeded, uniform_vec};
use test_support::tolerance::try_relative_error;

// ---------------------------------------------------------------------------------------------
// Harness

struct Gpu {
    kernels: &'static Kernels,
    stream: Stream,
    // Tests of this binary run one at a time: one of them captures a graph, and the others'
    // allocations and copies then cannot interleave with the capture on any runtime.
    _serial: MutexGuard<'static, ()>,
}

fn gpu(test: &str) -> Option<Gpu> {
    let device = device_or_skip(test)?;
    let serial = gpu_lock();
    let kernels = common::kernels(test, &device);
    let stream = Stream::new(kernels.device()).expect("stream");
    Some(Gpu {
        kernels,
        stream,
        _serial: serial,
    })
}

/// A device buffer of `len` elements of `T`.
struct Buf<T> {
    buf: DeviceBuffer,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: DeviceCopy> Buf<T> {
    fn new(gpu: &Gpu, len: usize) -> Buf<T> {
        let bytes = (len * std::mem::size_of::<T>()).max(16);
        let buf = DeviceBuffer::alloc(gpu.kernels.device(), bytes).expect("device alloc");
        Buf {
            buf,
            len,
            _t: std::marker::PhantomData,
        }
    }

    fn from(gpu: &Gpu, data: &[T]) -> Buf<T> {
        let mut b = Buf::new(gpu, data.len());
        b.write(gpu, data);
        b
    }

    /// Copies `data` to the start of the buffer, in order with the work on the test's stream.
    fn write(&mut self, gpu: &Gpu, data: &[T]) {
        assert!(data.len() <= self.len);
        // SAFETY: `data` outlives the copy: the stream is synchronised before returning.
        unsafe { self.buf.copy_from_host_async(data, &gpu.stream) }.expect("upload");
        gpu.stream.synchronize().expect("sync after upload");
    }

    fn read(&self, gpu: &Gpu) -> Vec<T> {
        gpu.stream.synchronize().expect("sync before download");
        let mut out = vec![T::default(); self.len];
        self.buf.copy_to_host(&mut out).expect("download");
        out
    }

    fn view(&self) -> DeviceSlice<T> {
        // SAFETY: the buffer holds `len` elements of `T` and outlives every launch of the test
        // (each test synchronises its stream before its buffers drop).
        unsafe { DeviceSlice::from_raw(self.buf.ptr().0, self.len) }
    }

    fn view_mut(&mut self) -> DeviceSliceMut<T> {
        // SAFETY: as `view`; the tests never launch two kernels on one buffer concurrently
        // (one stream).
        unsafe { DeviceSliceMut::from_raw(self.buf.ptr().0, self.len) }
    }
}

/// `values` (a whole number of blocks) as q8_0 bytes.
fn q8_0_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() / Q8_0_BLOCK * Q8_0_BLOCK_BYTES];
    quantize_q8_0(values, &mut out);
    out
}

/// A K or V cache on the device in any element type.
enum Cache {
    F16(Buf<u16>),
    F32(Buf<f32>),
    Q8_0(Buf<u8>),
}

impl Cache {
    fn from_f32(gpu: &Gpu, values: &[f32], elem: KvElem) -> Cache {
        match elem {
            KvElem::F16 => {
                let bits: Vec<u16> = values.iter().map(|&v| f32_to_f16_bits(v)).collect();
                Cache::F16(Buf::from(gpu, &bits))
            }
            KvElem::F32 => Cache::F32(Buf::from(gpu, values)),
            KvElem::Q8_0 => Cache::Q8_0(Buf::from(gpu, &q8_0_bytes(values))),
        }
    }

    fn view(&self) -> KvSlice {
        match self {
            Cache::F16(b) => KvSlice::F16(b.view()),
            Cache::F32(b) => KvSlice::F32(b.view()),
            Cache::Q8_0(b) => KvSlice::Q8_0(b.view()),
        }
    }

    /// The cache's contents as raw bits (f16 widened, f32 as its bits, q8_0 bytes widened), for
    /// exact comparison.
    fn bits(&self, gpu: &Gpu) -> Vec<u32> {
        match self {
            Cache::F16(b) => b.read(gpu).into_iter().map(u32::from).collect(),
            Cache::F32(b) => b.read(gpu).into_iter().map(f32::to_bits).collect(),
            Cache::Q8_0(b) => b.read(gpu).into_iter().map(u32::from).collect(),
        }
    }

    fn view_mut(&mut self) -> KvSliceMut {
        match self {
            Cache::F16(b) => KvSliceMut::F16(b.view_mut()),
            Cache::F32(b) => KvSliceMut::F32(b.view_mut()),
            Cache::Q8_0(b) => KvSliceMut::Q8_0(b.view_mut()),
        }
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

    fn store(&mut self, src: &[f32], positions: &[i32], rows: usize, dim: usize, slots: usize) {
        self.store_paged(src, positions, None, rows, dim, slots);
    }

    /// The reference store, through `pages` when given.
    fn store_paged(
        &mut self,
        src: &[f32],
        positions: &[i32],
        pages: Option<&reference::kv_cache::HostPages<'_>>,
        rows: usize,
        dim: usize,
        slots: usize,
    ) {
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
        .expect("reference store");
    }

    /// The contents as raw bits, as [`Cache::bits`] reads the device's.
    fn bits(&self) -> Vec<u32> {
        match self {
            HostCache::F16(v) => v.iter().map(|&b| u32::from(b)).collect(),
            HostCache::F32(v) => v.iter().map(|b| b.to_bits()).collect(),
            HostCache::Q8_0(v) => v.iter().map(|&b| u32::from(b)).collect(),
        }
    }
}

/// Fails on a non-finite value, or when the max error exceeds `max_rel` or the RMS error
/// exceeds `rms_rel`, both relative to the RMS of `want`.
fn assert_close(what: &str, got: &[f32], want: &[f32], max_rel: f32, rms_rel: f32) {
    let e = try_relative_error(got, want).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        e.max_rel() <= f64::from(max_rel) && e.rms_rel() <= f64::from(rms_rel),
        "{what}: max error {:.3e} at {} (got {}, want {}), RMS error {:.3e}; \
         reference RMS {:.3e}, allowed {max_rel:.1e} / {rms_rel:.1e} of it",
        e.max_abs,
        e.worst,
        got[e.worst],
        want[e.worst],
        e.rms_abs,
        e.reference_rms
    );
}

// ---------------------------------------------------------------------------------------------
// Rope

#[test]
fn rope_matches_the_reference_normal_and_neox_with_factors_scale_and_partial_rotation() {
    let Some(gpu) = gpu("rope_matches_the_reference") else {
        return;
    };
    let positions = [0i32, 1, 5, 299, 4096, 32_767];
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
                let rows = positions.len();
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
                reference::rope::rope(&mut want, &positions, ff, shape, &params)
                    .expect("reference");

                let mut dx = Buf::from(&gpu, &x);
                let dpos = Buf::from(&gpu, &positions);
                let dff = Buf::from(&gpu, &factors);
                let dff_view = dff.view();
                rope(
                    gpu.kernels,
                    &gpu.stream,
                    &mut dx.view_mut(),
                    &dpos.view(),
                    with_factors.then_some(&dff_view),
                    shape,
                    &params,
                )
                .expect("rope launch");
                let got = dx.read(&gpu);

                let row_len = n_heads * head_dim;
                for (r, &p) in positions.iter().enumerate() {
                    let tol = 4e-6 + 5e-7 * p as f32 / position_scale;
                    let what = format!(
                        "rope head_dim {head_dim} n_rot {n_rot} neox {neox} scale {position_scale} \
                         factors {with_factors} position {p}"
                    );
                    let range = r * row_len..(r + 1) * row_len;
                    assert_close(&what, &got[range.clone()], &want[range.clone()], tol, tol);
                    // Dimensions past n_rot are untouched, bit for bit.
                    for h in 0..n_heads {
                        let base = r * row_len + h * head_dim;
                        assert_eq!(
                            &got[base + n_rot..base + head_dim],
                            &x[base + n_rot..base + head_dim],
                            "{what}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn rope_with_the_kv_store_leaves_what_rope_then_store_leave() {
    let Some(gpu) = gpu("rope_with_the_kv_store_leaves_what_rope_then_store_leave") else {
        return;
    };
    use rocm_kernels::ops::rope::{rope_pair, rope_pair_store, KvStore};
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
        let (dpos, dff, dv) = (
            Buf::from(&gpu, &positions),
            Buf::from(&gpu, &ff),
            Buf::from(&gpu, &v),
        );
        let dff_view = dff.view();
        let ffv = factors.then_some(&dff_view);
        let zeros = |n: usize| vec![0.0f32; n];
        // Two ops.
        let (mut q1, mut k1) = (Buf::from(&gpu, &q), Buf::from(&gpu, &k));
        let mut kc1 = Cache::from_f32(&gpu, &zeros(slots * k_dim), elem);
        let mut vc1 = Cache::from_f32(&gpu, &zeros(slots * dim_v), elem);
        rope_pair(
            gpu.kernels,
            &gpu.stream,
            &mut q1.view_mut(),
            &mut k1.view_mut(),
            n_heads_kv,
            &dpos.view(),
            ffv,
            shape,
            &params,
        )
        .expect("rope_pair");
        store_kv(
            gpu.kernels,
            &gpu.stream,
            &k1.view(),
            &dv.view(),
            &mut kc1.view_mut(),
            &mut vc1.view_mut(),
            &dpos.view(),
            None,
            KvStoreShape {
                rows,
                dim_k: k_dim,
                dim_v,
                slots,
            },
        )
        .expect("store_kv");
        // One.
        let (mut q2, mut k2) = (Buf::from(&gpu, &q), Buf::from(&gpu, &k));
        let mut kc2 = Cache::from_f32(&gpu, &zeros(slots * k_dim), elem);
        let mut vc2 = Cache::from_f32(&gpu, &zeros(slots * dim_v), elem);
        rope_pair_store(
            gpu.kernels,
            &gpu.stream,
            &mut q2.view_mut(),
            &mut k2.view_mut(),
            n_heads_kv,
            &dpos.view(),
            ffv,
            shape,
            &params,
            Some(KvStore {
                v: &dv.view(),
                dim_v,
                k_cache: &mut kc2.view_mut(),
                v_cache: &mut vc2.view_mut(),
                slots,
                pages: None,
            }),
        )
        .expect("rope_pair_store");
        let what = format!("head_dim {head_dim} n_rot {n_rot} neox {neox} {elem:?}");
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&q2.read(&gpu)), bits(&q1.read(&gpu)), "{what}: q");
        assert_eq!(bits(&k2.read(&gpu)), bits(&k1.read(&gpu)), "{what}: k");
        assert_eq!(kc2.bits(&gpu), kc1.bits(&gpu), "{what}: K cache");
        assert_eq!(vc2.bits(&gpu), vc1.bits(&gpu), "{what}: V cache");
        // The rows' slots were written (not left at zero).
        let written = kc2.bits(&gpu).iter().filter(|&&b| b != 0).count();
        assert!(
            written >= rows * k_dim / 2,
            "{what}: {written} K elements written"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// K/V store

#[test]
fn kv_store_matches_the_reference_bit_for_bit_in_f16_and_f32_with_ring_slots() {
    let Some(gpu) = gpu("kv_store_matches_the_reference") else {
        return;
    };
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
        want_k.store(&k_src, &positions, rows, dim_k, slots);
        want_v.store(&v_src, &positions, rows, dim_v, slots);

        let mut dk = Cache::from_f32(&gpu, &init_k, elem);
        let mut dv = Cache::from_f32(&gpu, &init_v, elem);
        let (ks, vs, dpos) = (
            Buf::from(&gpu, &k_src),
            Buf::from(&gpu, &v_src),
            Buf::from(&gpu, &positions),
        );
        let shape = KvStoreShape {
            rows,
            dim_k,
            dim_v,
            slots,
        };
        store_kv(
            gpu.kernels,
            &gpu.stream,
            &ks.view(),
            &vs.view(),
            &mut dk.view_mut(),
            &mut dv.view_mut(),
            &dpos.view(),
            None,
            shape,
        )
        .expect("store_kv");
        let check = |what: &str, got: &Cache, want: &HostCache| match (got, want) {
            (Cache::F16(g), HostCache::F16(w)) => {
                let g = g.read(&gpu);
                if let Some(i) = g.iter().zip(w).position(|(a, b)| a != b) {
                    panic!(
                        "{what} f16 element {i}: GPU {:#06x}, reference {:#06x}",
                        g[i], w[i]
                    );
                }
            }
            (Cache::F32(g), HostCache::F32(w)) => {
                let g = g.read(&gpu);
                if let Some(i) = g
                    .iter()
                    .zip(w)
                    .position(|(a, b)| a.to_bits() != b.to_bits())
                {
                    panic!("{what} f32 element {i}: GPU {}, reference {}", g[i], w[i]);
                }
            }
            _ => unreachable!(),
        };
        check("K", &dk, &want_k);
        check("V", &dv, &want_v);

        // The one-tensor store writes only its cache.
        let one_pos = [35i32]; // slot 3
        let one_row = uniform_vec(&mut noise, dim_k, -1.0, 1.0);
        want_k.store(&one_row, &one_pos, 1, dim_k, slots);
        let (src, pos) = (Buf::from(&gpu, &one_row), Buf::from(&gpu, &one_pos));
        store_rows(
            gpu.kernels,
            &gpu.stream,
            &src.view(),
            &mut dk.view_mut(),
            &pos.view(),
            None,
            1,
            dim_k,
            slots,
        )
        .expect("store_rows");
        check("K after store_rows", &dk, &want_k);
        check("V after store_rows", &dv, &want_v);
    }
}

#[test]
fn kv_store_refuses_short_views_and_mixed_element_types() {
    let Some(gpu) = gpu("kv_store_refuses_short_views") else {
        return;
    };
    let src = Buf::<f32>::new(&gpu, 4 * 8);
    let pos = Buf::<i32>::new(&gpu, 4);
    let mut cache16 = Cache::F16(Buf::new(&gpu, 16 * 8));
    let mut cache32 = Cache::F32(Buf::new(&gpu, 16 * 8));
    let shape = KvStoreShape {
        rows: 4,
        dim_k: 8,
        dim_v: 8,
        slots: 16,
    };
    let (k, v) = (src.view(), src.view());
    let err = store_kv(
        gpu.kernels,
        &gpu.stream,
        &k,
        &v,
        &mut cache16.view_mut(),
        &mut cache32.view_mut(),
        &pos.view(),
        None,
        shape,
    )
    .expect_err("mixed element types");
    assert!(
        err.to_string().contains("F16") && err.to_string().contains("F32"),
        "{err}"
    );
    let err = store_rows(
        gpu.kernels,
        &gpu.stream,
        &k,
        &mut cache16.view_mut(),
        &pos.view(),
        None,
        4,
        8,
        17,
    )
    .expect_err("too few slots in the view");
    assert!(err.to_string().contains("17 slots"), "{err}");
    let err = store_rows(
        gpu.kernels,
        &gpu.stream,
        &k,
        &mut cache16.view_mut(),
        &pos.view(),
        None,
        5,
        8,
        16,
    )
    .expect_err("too few source rows and positions");
    assert!(err.to_string().contains("kv_store"), "{err}");
}

#[test]
fn kv_store_q8_0_writes_the_bytes_of_quantize_q8_0_on_rings_pages_and_non_finite_blocks() {
    let Some(gpu) = gpu("kv_store_q8_0_writes_the_bytes_of_quantize_q8_0") else {
        return;
    };
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
    want_k.store(&k_src, &positions, rows, dim_k, slots);
    want_v.store(&v_src, &positions, rows, dim_v, slots);
    // The reference store is quantize_q8_0 of each row at its slot; check that much directly.
    let row_k = dim_k / 32 * 34;
    let HostCache::Q8_0(wk) = &want_k else {
        unreachable!()
    };
    let slot13 = &wk[13 * row_k..14 * row_k];
    assert_eq!(slot13, &q8_0_bytes(&k_src[..dim_k])[..]);
    assert_eq!(&slot13[2..7], &[127u8, 1, (-3i8) as u8, 2, (-1i8) as u8]);
    let nan_scale = Q8_0_NAN_SCALE.to_le_bytes();
    assert_eq!(&slot13[2 * 34..2 * 34 + 2], &nan_scale);
    assert_eq!(&slot13[3 * 34..3 * 34 + 2], &nan_scale);

    let mut dk = Cache::from_f32(&gpu, &init_k, KvElem::Q8_0);
    let mut dv = Cache::from_f32(&gpu, &init_v, KvElem::Q8_0);
    let (ks, vs, dpos) = (
        Buf::from(&gpu, &k_src),
        Buf::from(&gpu, &v_src),
        Buf::from(&gpu, &positions),
    );
    store_kv(
        gpu.kernels,
        &gpu.stream,
        &ks.view(),
        &vs.view(),
        &mut dk.view_mut(),
        &mut dv.view_mut(),
        &dpos.view(),
        None,
        KvStoreShape {
            rows,
            dim_k,
            dim_v,
            slots,
        },
    )
    .expect("store_kv q8_0");
    let check = |what: &str, got: &Cache, want: &HostCache| {
        let (g, w) = (got.bits(&gpu), want.bits());
        if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
            panic!(
                "{what}: byte {i} (block {}, byte {} of it): GPU {:#04x}, reference {:#04x}",
                i / 34,
                i % 34,
                g[i],
                w[i]
            );
        }
        assert_eq!(g.len(), w.len(), "{what}");
    };
    check("ring K", &dk, &want_k);
    check("ring V", &dv, &want_v);

    // The one-tensor store writes only its cache.
    let one_pos = [35i32]; // slot 3
    let one_row = uniform_vec(&mut noise, dim_k, -1.0, 1.0);
    want_k.store(&one_row, &one_pos, 1, dim_k, slots);
    let (src, pos) = (Buf::from(&gpu, &one_row), Buf::from(&gpu, &one_pos));
    store_rows(
        gpu.kernels,
        &gpu.stream,
        &src.view(),
        &mut dk.view_mut(),
        &pos.view(),
        None,
        1,
        dim_k,
        slots,
    )
    .expect("store_rows q8_0");
    check("K after store_rows", &dk, &want_k);
    check("V after store_rows", &dv, &want_v);

    // Paged: two sequences' rows interleaved, through scrambled tables of blocks of 4 rows.
    let pool = Pool::new(2, 4, 4, 2);
    let dim = 96;
    let positions = [0i32, 0, 1, 5, 2, 15, 9, 6];
    let seqs = [0i32, 1, 0, 1, 0, 1, 0, 1];
    let src = uniform_vec(&mut noise, positions.len() * dim, -2.0, 2.0);
    let init = uniform_vec(&mut noise, pool.rows() * dim, -9.0, 9.0);
    let mut want = HostCache::from_f32(&init, KvElem::Q8_0);
    let host = pool.host(&seqs);
    want.store_paged(&src, &positions, Some(&host), positions.len(), dim, 16);
    let mut cache = Cache::from_f32(&gpu, &init, KvElem::Q8_0);
    let (dsrc, dpos, dseqs, dtables) = (
        Buf::from(&gpu, &src),
        Buf::from(&gpu, &positions),
        Buf::from(&gpu, &seqs),
        Buf::from(&gpu, &pool.tables),
    );
    let pages = KvPages {
        seqs: dseqs.view(),
        tables: dtables.view(),
        table_len: pool.table_len,
        block: pool.block,
    };
    store_rows(
        gpu.kernels,
        &gpu.stream,
        &dsrc.view(),
        &mut cache.view_mut(),
        &dpos.view(),
        Some(&pages),
        positions.len(),
        dim,
        16,
    )
    .expect("paged store_rows q8_0");
    check("paged", &cache, &want);
}

#[test]
fn q8_0_caches_refuse_rows_and_heads_that_are_not_whole_blocks_and_unfit_kernels() {
    let Some(gpu) = gpu("q8_0_caches_refuse_rows_and_heads_that_are_not_whole_blocks") else {
        return;
    };
    use rocm_kernels::ops::rope::{rope_pair_store, KvStore};
    let src = Buf::<f32>::new(&gpu, 4 * 160);
    let pos = Buf::from(&gpu, &[0i32, 1, 2, 3]);
    let mut k = Cache::Q8_0(Buf::new(&gpu, 16 * 160 / 32 * 34));
    let mut v = Cache::Q8_0(Buf::new(&gpu, 16 * 160 / 32 * 34));
    // A store of rows of 80 values (2.5 blocks).
    let err = store_kv(
        gpu.kernels,
        &gpu.stream,
        &src.view(),
        &src.view(),
        &mut k.view_mut(),
        &mut v.view_mut(),
        &pos.view(),
        None,
        KvStoreShape {
            rows: 4,
            dim_k: 80,
            dim_v: 64,
            slots: 16,
        },
    )
    .expect_err("dim_k 80");
    let msg = err.to_string();
    assert!(
        msg.contains("dim = 80") && msg.contains("multiple of 32"),
        "{msg}"
    );
    let err = store_rows(
        gpu.kernels,
        &gpu.stream,
        &src.view(),
        &mut v.view_mut(),
        &pos.view(),
        None,
        4,
        48,
        16,
    )
    .expect_err("dim 48");
    assert!(err.to_string().contains("48"), "{err}");
    // A q8_0 cache at an odd address.
    let Cache::Q8_0(kb) = &k else { unreachable!() };
    // SAFETY: the view lies inside the buffer (one byte in, one byte shorter) and is refused
    // before any launch, so nothing reads or writes through it.
    let mut odd =
        KvSliceMut::Q8_0(unsafe { DeviceSliceMut::from_raw(kb.view().ptr().0 + 1, kb.len - 1) });
    let err = store_rows(
        gpu.kernels,
        &gpu.stream,
        &src.view(),
        &mut odd,
        &pos.view(),
        None,
        4,
        64,
        16,
    )
    .expect_err("odd address");
    assert!(err.to_string().contains("aligned"), "{err}");
    // Mixed element types.
    let mut v16 = Cache::F16(Buf::new(&gpu, 16 * 64));
    let err = store_kv(
        gpu.kernels,
        &gpu.stream,
        &src.view(),
        &src.view(),
        &mut k.view_mut(),
        &mut v16.view_mut(),
        &pos.view(),
        None,
        KvStoreShape {
            rows: 4,
            dim_k: 64,
            dim_v: 64,
            slots: 16,
        },
    )
    .expect_err("q8_0 K with f16 V");
    assert!(err.to_string().contains("Q8_0"), "{err}");

    // Attention over heads of 80 (K) or 48 (V) values.
    let mut q = Buf::<f32>::new(&gpu, 4 * 4 * 160);
    let mut out = Buf::<f32>::new(&gpu, 4 * 4 * 160);
    let mut ws = Buf::<f32>::new(&gpu, 1 << 16);
    let base = AttentionShape {
        n_tokens: 1,
        n_head: 2,
        n_head_kv: 1,
        head_dim_k: 64,
        head_dim_v: 64,
        scale: 0.1,
        softcap: None,
        window: None,
        slots: 16,
    };
    for (dk, dv, name) in [(80, 80, "head_dim_k = 80"), (64, 48, "head_dim_v = 48")] {
        let shape = AttentionShape {
            head_dim_k: dk,
            head_dim_v: dv,
            ..base
        };
        let err = attention_decode(
            gpu.kernels,
            &gpu.stream,
            &q.view(),
            &k.view(),
            &v.view(),
            &pos.view(),
            None,
            &mut out.view_mut(),
            &mut ws.view_mut(),
            &shape,
        )
        .expect_err("not whole blocks");
        let msg = err.to_string();
        assert!(
            msg.contains(name) && msg.contains("multiple of 32"),
            "{msg}"
        );
        let err = attention_prefill(
            gpu.kernels,
            &gpu.stream,
            &q.view(),
            &k.view(),
            &v.view(),
            &pos.view(),
            None,
            &mut out.view_mut(),
            &shape,
        )
        .expect_err("not whole blocks");
        assert!(err.to_string().contains(name), "{err}");
    }
    // The key-tile decode kernel is f16 only; the flash kernel has no heads of 96.
    let err = attention_decode_on(
        gpu.kernels,
        &gpu.stream,
        DecodeKernel::KeyTiles,
        &q.view(),
        &k.view(),
        &v.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &mut ws.view_mut(),
        &base,
        None,
    )
    .expect_err("key tiles over q8_0");
    assert!(
        err.to_string().contains("key-tile") && err.to_string().contains("Q8_0"),
        "{err}"
    );
    let d96 = AttentionShape {
        head_dim_k: 96,
        head_dim_v: 96,
        ..base
    };
    let err = attention_prefill_on(
        gpu.kernels,
        &gpu.stream,
        PrefillKernel::Flash,
        &q.view(),
        &k.view(),
        &v.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &d96,
    )
    .expect_err("flash with heads of 96");
    assert!(err.to_string().contains("flash"), "{err}");
    // Rope's fused store does not write q8_0: it says to store after rotating.
    let mut x2 = Buf::<f32>::new(&gpu, 4 * 64);
    let err = rope_pair_store(
        gpu.kernels,
        &gpu.stream,
        &mut q.view_mut(),
        &mut x2.view_mut(),
        1,
        &pos.view(),
        None,
        RopeShape {
            rows: 4,
            n_heads: 2,
            head_dim: 64,
        },
        &RopeParams {
            neox: false,
            freq_base: 10_000.0,
            position_scale: 1.0,
            n_rot: 64,
        },
        Some(KvStore {
            v: &src.view(),
            dim_v: 64,
            k_cache: &mut k.view_mut(),
            v_cache: &mut v.view_mut(),
            slots: 16,
            pages: None,
        }),
    )
    .expect_err("rope's fused store into q8_0");
    assert!(err.to_string().contains("store_kv"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Attention

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Decode on the kernel `DecodeKernel::Auto` picks.
    Decode,
    /// Decode on the one-warp-per-key kernel, whatever the cache.
    DecodeWarpPerKey,
    /// Decode on the key-tile kernel (f16 caches only).
    DecodeKeyTiles,
    Prefill,
    /// Prefill on the one-query-per-block kernel.
    PrefillPerQuery,
    /// Prefill on the matrix cores (flash attention), whatever the device's variant.
    PrefillFlash,
}

/// Tolerances (max, RMS, relative to the reference's RMS) of the flash kernel, which rounds
/// queries and probabilities to f16: about 5e-4 of each, so about 1e-3 of the output, where a
/// wrong key or row costs about 1.
const FLASH_TOLERANCE: (f32, f32) = (1e-2, 2e-3);

#[derive(Clone, Copy, Debug)]
struct Case {
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

/// Runs one case with random cache contents in every slot, against the reference reading the
/// same (rounded) cache, and for f16 also against an f32 reference of the unrounded values.
/// A case's shape and random inputs: queries twice as large as keys so the softmax is not
/// flat, every slot of both caches filled, consecutive positions from `pos0`.
struct Inputs {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    positions: Vec<i32>,
}

fn case_inputs(case: &Case, seed: u64) -> Inputs {
    let mut noise = seeded(seed);
    let d = case.head_dim;
    let shape = AttentionShape {
        n_tokens: case.n_tokens,
        n_head: case.n_head,
        n_head_kv: case.n_head_kv,
        head_dim_k: d,
        head_dim_v: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: case.softcap,
        window: case.window,
        slots: case.slots,
    };
    let q = uniform_vec(
        &mut noise,
        case.n_tokens * case.n_head * d,
        -(2.0 * 3f32.sqrt()),
        2.0 * 3f32.sqrt(),
    );
    let k = uniform_vec(
        &mut noise,
        case.slots * case.n_head_kv * d,
        -3f32.sqrt(),
        3f32.sqrt(),
    );
    let v = uniform_vec(&mut noise, case.slots * case.n_head_kv * d, -1.0, 1.0);
    let positions = (0..case.n_tokens).map(|t| (case.pos0 + t) as i32).collect();
    Inputs {
        shape,
        q,
        k,
        v,
        positions,
    }
}

fn run_case(gpu: &Gpu, case: Case, seed: u64) {
    let d = case.head_dim;
    let Inputs {
        shape,
        q,
        k,
        v,
        positions,
    } = case_inputs(&case, seed);

    let (hk, hv) = (
        HostCache::from_f32(&k, case.elem),
        HostCache::from_f32(&v, case.elem),
    );
    let mut want = vec![0.0; case.n_tokens * case.n_head * d];
    reference::attention::attention(&q, hk.kv(), hv.kv(), &positions, None, &mut want, &shape)
        .expect("reference attention");

    let (dq, dpos) = (Buf::from(gpu, &q), Buf::from(gpu, &positions));
    let (dk, dv) = (
        Cache::from_f32(gpu, &k, case.elem),
        Cache::from_f32(gpu, &v, case.elem),
    );
    // NaN-filled output: a value the kernel forgets to write fails the comparison.
    let mut dout = Buf::from(gpu, &vec![f32::NAN; want.len()]);
    match case.path {
        Kind::Decode | Kind::DecodeWarpPerKey | Kind::DecodeKeyTiles => {
            let need = decode_workspace_floats(&shape).expect("workspace size");
            let mut ws = Buf::from(gpu, &vec![f32::NAN; need]);
            let kernel = match case.path {
                Kind::DecodeWarpPerKey => DecodeKernel::WarpPerKey,
                Kind::DecodeKeyTiles => DecodeKernel::KeyTiles,
                _ => DecodeKernel::Auto,
            };
            attention_decode_on(
                gpu.kernels,
                &gpu.stream,
                kernel,
                &dq.view(),
                &dk.view(),
                &dv.view(),
                &dpos.view(),
                None,
                &mut dout.view_mut(),
                &mut ws.view_mut(),
                &shape,
                None,
            )
            .expect("attention_decode");
            gpu.stream.synchronize().expect("sync");
        }
        Kind::Prefill | Kind::PrefillPerQuery | Kind::PrefillFlash => {
            let kernel = match case.path {
                Kind::Prefill => PrefillKernel::Tiled,
                Kind::PrefillFlash => PrefillKernel::Flash,
                _ => PrefillKernel::PerQuery,
            };
            attention_prefill_on(
                gpu.kernels,
                &gpu.stream,
                kernel,
                &dq.view(),
                &dk.view(),
                &dv.view(),
                &dpos.view(),
                None,
                &mut dout.view_mut(),
                &shape,
            )
            .expect("attention_prefill");
        }
    }
    let got = dout.read(gpu);
    let splits = decode_splits(&shape).unwrap_or(0);
    let what = format!("{case:?} (decode splits {splits})");
    let flash = case.path == Kind::PrefillFlash;
    let (max_rel, rms_rel) = if flash { FLASH_TOLERANCE } else { (5e-5, 1e-5) };
    assert_close(&what, &got, &want, max_rel, rms_rel);
    if case.elem == KvElem::F16 {
        let mut exact = vec![0.0; want.len()];
        reference::attention::attention(
            &q,
            HostKv::F32(&k),
            HostKv::F32(&v),
            &positions,
            None,
            &mut exact,
            &shape,
        )
        .expect("f32 reference");
        let (max_rel, rms_rel) = if flash { FLASH_TOLERANCE } else { (5e-3, 1e-3) };
        assert_close(
            &format!("{what} against unrounded f32"),
            &got,
            &exact,
            max_rel,
            rms_rel,
        );
    }
}

fn case(n_head: usize, n_head_kv: usize, head_dim: usize, slots: usize, pos0: usize) -> Case {
    Case {
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

#[test]
fn decode_attention_matches_the_reference_over_lengths_heads_and_head_dims() {
    let Some(gpu) = gpu("decode_attention_matches_the_reference") else {
        return;
    };
    let mut seed = 10;
    // KV lengths 1, 5, 300, 4097 (position + 1) over head_dim 64/128/256 (the key-tile and
    // one-warp-per-key kernels) and 80 (the one-thread-per-key kernel), and head groupings 1/1,
    // 8/2, 16/8, 12/1 (three blocks of four heads on the first) and 6/2 (three heads a block),
    // in both cache types; f16 on both of its kernels.
    for (n_head, n_head_kv) in [(1, 1), (8, 2), (16, 8), (12, 1), (6, 2)] {
        for head_dim in [64, 128, 256, 80] {
            for (slots, pos) in [(8, 0), (8, 4), (512, 299), (4100, 4096)] {
                for (elem, path) in [
                    (KvElem::F16, Kind::DecodeKeyTiles),
                    (KvElem::F16, Kind::DecodeWarpPerKey),
                    (KvElem::F32, Kind::Decode),
                ] {
                    seed += 1;
                    let mut c = case(n_head, n_head_kv, head_dim, slots, pos);
                    c.elem = elem;
                    c.path = path;
                    run_case(&gpu, c, seed);
                }
            }
        }
    }
}

#[test]
fn decode_attention_is_right_on_both_sides_of_tile_and_split_boundaries() {
    let Some(gpu) = gpu("decode_attention_split_boundaries") else {
        return;
    };
    // 1024 slots: four splits of one 256-key tile each. 20_000 slots: 79 tiles, more than
    // MAX_SPLITS, so 40 splits of two tiles (512 keys). Positions on both sides of the tile and
    // split boundaries the current length crosses.
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
            (c.elem, c.path) = match i % 3 {
                0 => (KvElem::F16, Kind::DecodeKeyTiles),
                1 => (KvElem::F32, Kind::Decode),
                _ => (KvElem::F16, Kind::DecodeWarpPerKey),
            };
            run_case(&gpu, c, 100 + i as u64);
        }
    }
}

#[test]
fn windowed_attention_matches_the_reference_on_full_caches_and_rings() {
    let Some(gpu) = gpu("windowed_attention_matches_the_reference") else {
        return;
    };
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
                    run_case(&gpu, c, seed);
                }
                // Ring of window + batch - 1 = 131 slots for four tokens per step, positions far
                // past the ring size.
                for pos0 in [0, 126, 300, 4093] {
                    seed += 1;
                    let mut c = case(n_head, n_head_kv, head_dim, 131, pos0);
                    c.window = Some(128);
                    c.n_tokens = 4;
                    c.elem = elem;
                    run_case(&gpu, c, seed);
                }
            }
        }
    }
}

#[test]
fn decode_attention_can_leave_its_output_quantized_as_the_quantizer_would() {
    let Some(gpu) = gpu("decode_attention_can_leave_its_output_quantized_as_the_quantizer_would")
    else {
        return;
    };
    use rocm_kernels::ops::matvec_q8::{self, Q8ActivationsMut};
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
        let (dq, dpos) = (Buf::from(&gpu, &q), Buf::from(&gpu, &[211i32]));
        let (dk, dv) = (
            Cache::from_f32(&gpu, &k, KvElem::F16),
            Cache::from_f32(&gpu, &v, KvElem::F16),
        );
        let need = decode_workspace_floats(&shape).expect("workspace size");
        let n = 8 * d;
        let run = |quantized: Option<(&mut Buf<i8>, &mut Buf<f32>)>| {
            let mut ws = Buf::from(&gpu, &vec![f32::NAN; need.max(1)]);
            let mut out = Buf::from(&gpu, &vec![f32::NAN; n]);
            let did = match quantized {
                None => {
                    attention_decode(
                        gpu.kernels,
                        &gpu.stream,
                        &dq.view(),
                        &dk.view(),
                        &dv.view(),
                        &dpos.view(),
                        None,
                        &mut out.view_mut(),
                        &mut ws.view_mut(),
                        &shape,
                    )
                    .expect("attention_decode");
                    false
                }
                Some((values, scales)) => {
                    let mut q8 = Q8ActivationsMut {
                        values: values.view_mut(),
                        scales: scales.view_mut(),
                    };
                    attention_decode_q8(
                        gpu.kernels,
                        &gpu.stream,
                        &dq.view(),
                        &dk.view(),
                        &dv.view(),
                        &dpos.view(),
                        None,
                        &mut out.view_mut(),
                        &mut ws.view_mut(),
                        &shape,
                        Some(&mut q8),
                    )
                    .expect("attention_decode_q8")
                }
            };
            (out.read(&gpu), did)
        };
        let (plain, _) = run(None);
        let mut values = Buf::from(&gpu, &vec![0x7fi8; n]);
        let mut scales = Buf::from(&gpu, &vec![f32::NAN; n / 32]);
        let (got, did) = run(Some((&mut values, &mut scales)));
        assert_eq!(did, fused, "head size {d}");
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert!(plain.iter().all(|v| v.is_finite()), "head size {d}");
        assert_eq!(bits(&got), bits(&plain), "head size {d}: the output itself");
        if !fused {
            assert!(values.read(&gpu).iter().all(|&v| v == 0x7f), "untouched");
            continue;
        }
        // What the quantizer makes of the same output, bit for bit.
        let src = Buf::from(&gpu, &plain);
        let mut want_values = Buf::from(&gpu, &vec![0i8; n]);
        let mut want_scales = Buf::from(&gpu, &vec![0f32; n / 32]);
        let mut want = Q8ActivationsMut {
            values: want_values.view_mut(),
            scales: want_scales.view_mut(),
        };
        matvec_q8::quantize(gpu.kernels, &gpu.stream, src.view(), 1, n, &mut want)
            .expect("quantize");
        assert_eq!(
            values.read(&gpu),
            want_values.read(&gpu),
            "head size {d}: values"
        );
        assert_eq!(
            bits(&scales.read(&gpu)),
            bits(&want_scales.read(&gpu)),
            "head size {d}: scales"
        );
    }
}

#[test]
fn a_few_decode_tokens_see_causal_prefixes() {
    let Some(gpu) = gpu("a_few_decode_tokens_see_causal_prefixes") else {
        return;
    };
    // Four tokens at 296..299 of a 300-slot cache (two splits), and three at 4094..4096.
    let mut c = case(16, 8, 256, 300, 296);
    c.n_tokens = 4;
    run_case(&gpu, c, 300);
    let mut c = case(8, 2, 80, 4097, 4094);
    c.n_tokens = 3;
    c.elem = KvElem::F16;
    run_case(&gpu, c, 301);
}

#[test]
fn prefill_attention_matches_the_reference_causal_windowed_and_grouped() {
    let Some(gpu) = gpu("prefill_attention_matches_the_reference") else {
        return;
    };
    let prefill = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window, elem| Case {
        n_head,
        n_head_kv,
        head_dim,
        slots,
        window,
        pos0,
        n_tokens,
        elem,
        path: Kind::Prefill,
        softcap: None,
    };
    let cases = [
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
        Case {
            path: Kind::Decode,
            softcap: None,
            ..prefill(8, 2, 128, 512, 0, 40, None, KvElem::F16)
        },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        run_case(&gpu, c, 400 + i as u64);
        // The same case on the other prefill kernel gives the same answers.
        if c.path == Kind::Prefill {
            let other = Case {
                path: Kind::PrefillPerQuery,
                softcap: None,
                ..c
            };
            run_case(&gpu, other, 400 + i as u64);
        }
    }
}

#[test]
fn flash_prefill_matches_the_reference_causal_windowed_grouped_and_partial() {
    let Some(gpu) = gpu("flash_prefill_matches_the_reference") else {
        return;
    };
    eprintln!("matrix-core variant: {}", gpu.kernels.mma_variant().name());
    let flash = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window| Case {
        n_head,
        n_head_kv,
        head_dim,
        slots,
        window,
        pos0,
        n_tokens,
        elem: KvElem::F16,
        path: Kind::PrefillFlash,
        softcap: None,
    };
    let cases = [
        // Whole prompts from position 0: tiles of 64 queries (heads of 64 and 128) and of 32
        // (256), the last partial, with 32-key tiles.
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
    for (i, c) in cases.into_iter().enumerate() {
        run_case(&gpu, c, 900 + i as u64);
    }
    // The SIMT build of the same kernel, against the same reference: a head of each size, a
    // window and a later chunk.
    let Gpu {
        kernels,
        stream,
        _serial,
    } = gpu;
    let simt = Gpu {
        kernels: common::simt_kernels("flash_prefill_matches_the_reference", kernels.device()),
        stream,
        _serial,
    };
    for i in [0, 1, 3, 6] {
        run_case(&simt, cases[i], 900 + i as u64);
    }
}

#[test]
fn flash_prefill_refuses_what_it_is_not_built_for() {
    let Some(gpu) = gpu("flash_prefill_refuses_what_it_is_not_built_for") else {
        return;
    };
    for (d, elem) in [(80, KvElem::F16), (128, KvElem::F32)] {
        let shape = AttentionShape {
            n_tokens: 4,
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: d,
            head_dim_v: d,
            scale: 0.1,
            softcap: None,
            window: None,
            slots: 16,
        };
        let q = Buf::<f32>::new(&gpu, 4 * 2 * d);
        let pos = Buf::from(&gpu, &[0i32, 1, 2, 3]);
        let (k, v) = match elem {
            KvElem::F16 => (
                Cache::F16(Buf::new(&gpu, 16 * d)),
                Cache::F16(Buf::new(&gpu, 16 * d)),
            ),
            KvElem::F32 => (
                Cache::F32(Buf::new(&gpu, 16 * d)),
                Cache::F32(Buf::new(&gpu, 16 * d)),
            ),
            KvElem::Q8_0 => unreachable!("no q8_0 case here"),
        };
        let mut out = Buf::<f32>::new(&gpu, 4 * 2 * d);
        let err = attention_prefill_on(
            gpu.kernels,
            &gpu.stream,
            PrefillKernel::Flash,
            &q.view(),
            &k.view(),
            &v.view(),
            &pos.view(),
            None,
            &mut out.view_mut(),
            &shape,
        )
        .expect_err("the flash kernel is not built for this");
        assert!(err.to_string().contains("flash"), "{err}");
    }
}

#[test]
fn q8_0_decode_attention_matches_the_reference_over_the_same_bytes() {
    let Some(gpu) = gpu("q8_0_decode_attention_matches_the_reference") else {
        return;
    };
    let mut seed = 1500;
    // Heads of 64, 128 and 256 on the one-warp-per-key kernel (as Auto picks it and explicitly)
    // and of 96 and 32 on the one-thread-per-key one; short and long caches (one split and
    // many), groupings with blocks of fewer heads than the group.
    for (n_head, n_head_kv) in [(1, 1), (8, 2), (12, 1)] {
        for head_dim in [64, 128, 256, 96, 32] {
            for (slots, pos) in [(8, 4), (512, 299), (4100, 4096)] {
                for path in [Kind::Decode, Kind::DecodeWarpPerKey] {
                    seed += 1;
                    let mut c = case(n_head, n_head_kv, head_dim, slots, pos);
                    c.elem = KvElem::Q8_0;
                    c.path = path;
                    run_case(&gpu, c, seed);
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
        run_case(&gpu, c, seed);
    }
}

#[test]
fn q8_0_prefill_attention_matches_the_reference_over_the_same_bytes() {
    let Some(gpu) = gpu("q8_0_prefill_attention_matches_the_reference") else {
        return;
    };
    let prefill = |n_head, n_head_kv, head_dim, slots, pos0, n_tokens, window, path| Case {
        n_head,
        n_head_kv,
        head_dim,
        slots,
        window,
        pos0,
        n_tokens,
        elem: KvElem::Q8_0,
        path,
        softcap: None,
    };
    let mut cases = Vec::new();
    for path in [Kind::Prefill, Kind::PrefillPerQuery, Kind::PrefillFlash] {
        cases.extend([
            prefill(8, 2, 128, 512, 0, 300, None, path),
            prefill(16, 8, 64, 64, 0, 37, None, path),
            prefill(4, 1, 256, 300, 0, 300, None, path),
            prefill(8, 8, 64, 600, 256, 65, None, path),
            prefill(8, 2, 64, 600, 0, 300, Some(128), path),
            prefill(8, 2, 256, 191, 4000, 64, Some(128), path),
            prefill(4, 1, 128, 64, 10, 1, None, path),
        ]);
    }
    // Heads the flash kernel is not built for, on the SIMT kernels.
    for path in [Kind::Prefill, Kind::PrefillPerQuery] {
        cases.push(prefill(4, 4, 96, 64, 3, 17, None, path));
        cases.push(prefill(16, 8, 32, 191, 200, 64, Some(128), path));
    }
    for (i, c) in cases.into_iter().enumerate() {
        run_case(&gpu, c, 1600 + i as u64);
    }
}

/// The cap of the soft-capping test (2) matters at its inputs: the capped and uncapped
/// references differ by far more than any tolerance there, so a kernel that skipped the cap
/// would fail it. No GPU needed.
#[test]
fn the_soft_cap_moves_the_reference_far_past_the_tolerances() {
    let c = Case {
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

/// Gemma 2's soft-capped scores on every kernel: decode (auto, one warp per key, key tiles),
/// prefill (tiled, one query per block, flash on the matrix cores and its SIMT build), over f32,
/// f16 and q8_0 caches, against the reference with the same cap. The cap (2) is below the
/// scores these inputs make, so a kernel that skipped it would be far off
/// (`the_soft_cap_moves_the_reference_far_past_the_tolerances`).
#[test]
fn soft_capped_scores_match_the_reference_on_every_kernel() {
    let Some(gpu) = gpu("soft_capped_scores_match_the_reference") else {
        return;
    };
    let capped = |path, elem, head_dim, slots, pos0, n_tokens, window| Case {
        n_head: 8,
        n_head_kv: 2,
        head_dim,
        slots,
        window,
        pos0,
        n_tokens,
        elem,
        path,
        softcap: Some(2.0),
    };
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
                if decode != (n_tokens <= 4) {
                    continue;
                }
                seed += 1;
                run_case(
                    &gpu,
                    capped(path, elem, head_dim, slots, pos0, n_tokens, window),
                    seed,
                );
            }
        }
    }
    // Key tiles read f16 caches only; the flash kernel f16 and q8_0 ones.
    seed += 1;
    run_case(
        &gpu,
        capped(Kind::DecodeKeyTiles, KvElem::F16, 128, 4100, 4096, 1, None),
        seed,
    );
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
    for c in flash {
        seed += 1;
        run_case(&gpu, c, seed);
    }
    let Gpu {
        kernels,
        stream,
        _serial,
    } = gpu;
    let simt = Gpu {
        kernels: common::simt_kernels("soft_capped_scores_match_the_reference", kernels.device()),
        stream,
        _serial,
    };
    for c in flash {
        seed += 1;
        run_case(&simt, c, seed);
    }
}

#[test]
fn attention_refuses_bad_shapes_and_a_short_workspace() {
    let Some(gpu) = gpu("attention_refuses_bad_shapes") else {
        return;
    };
    let shape = AttentionShape {
        n_tokens: 1,
        n_head: 8,
        n_head_kv: 2,
        head_dim_k: 64,
        head_dim_v: 64,
        scale: 0.125,
        softcap: None,
        window: None,
        slots: 1024,
    };
    let q = Buf::<f32>::new(&gpu, 8 * 64);
    let pos = Buf::<i32>::new(&gpu, 1);
    let k = Cache::F16(Buf::new(&gpu, 1024 * 2 * 64));
    let v32 = Cache::F32(Buf::new(&gpu, 1024 * 2 * 64));
    let v16 = Cache::F16(Buf::new(&gpu, 1024 * 2 * 64));
    let mut out = Buf::<f32>::new(&gpu, 8 * 64);
    let need = decode_workspace_floats(&shape).unwrap();
    assert!(need > 0);
    let mut ws = Buf::<f32>::new(&gpu, need - 1);
    let err = attention_decode(
        gpu.kernels,
        &gpu.stream,
        &q.view(),
        &k.view(),
        &v16.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &mut ws.view_mut(),
        &shape,
    )
    .expect_err("short workspace");
    assert!(err.to_string().contains("workspace"), "{err}");
    let err = attention_prefill(
        gpu.kernels,
        &gpu.stream,
        &q.view(),
        &k.view(),
        &v32.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &shape,
    )
    .expect_err("mixed cache types");
    assert!(
        err.to_string().contains("F16") && err.to_string().contains("F32"),
        "{err}"
    );
    let k32 = Cache::F32(Buf::new(&gpu, 1024 * 2 * 64));
    let mut ws = Buf::<f32>::new(&gpu, need);
    let err = attention_decode_on(
        gpu.kernels,
        &gpu.stream,
        DecodeKernel::KeyTiles,
        &q.view(),
        &k32.view(),
        &v32.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &mut ws.view_mut(),
        &shape,
        None,
    )
    .expect_err("the key-tile kernel on an f32 cache");
    assert!(
        err.to_string().contains("key-tile") && err.to_string().contains("F32"),
        "{err}"
    );
    let mut bad = shape;
    // 7 query heads cannot share 2 KV heads.
    bad.n_head = 7;
    assert!(attention_prefill(
        gpu.kernels,
        &gpu.stream,
        &q.view(),
        &k.view(),
        &v16.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &bad
    )
    .is_err());
}

// ---------------------------------------------------------------------------------------------
// A captured decode step replayed at new positions

/// Captures one decode step (rope of q and k, the K/V store, decode attention) into a graph
/// once, then replays it for every position with new inputs and positions written to the
/// device, as the backend's step block does; each step is checked against the references.
fn replay_decode_steps(gpu: &Gpu, elem: KvElem, window: Option<usize>, slots: usize, steps: usize) {
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
    let mut q = Buf::<f32>::new(gpu, n_head * d);
    let mut k_new = Buf::<f32>::new(gpu, kv_dim);
    let mut v_new = Buf::<f32>::new(gpu, kv_dim);
    let mut pos = Buf::<i32>::new(gpu, 1);
    let mut out = Buf::<f32>::new(gpu, n_head * d);
    let mut ws = Buf::<f32>::new(gpu, decode_workspace_floats(&shape).expect("workspace"));
    let mut k_cache = Cache::from_f32(gpu, &vec![0.0; slots * kv_dim], elem);
    let mut v_cache = Cache::from_f32(gpu, &vec![0.0; slots * kv_dim], elem);

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
    gpu.stream.begin_capture().expect("begin capture");
    rope(
        gpu.kernels,
        &gpu.stream,
        &mut q.view_mut(),
        &pos.view(),
        None,
        rope_q,
        &params,
    )
    .expect("rope q");
    rope(
        gpu.kernels,
        &gpu.stream,
        &mut k_new.view_mut(),
        &pos.view(),
        None,
        rope_k,
        &params,
    )
    .expect("rope k");
    store_kv(
        gpu.kernels,
        &gpu.stream,
        &k_new.view(),
        &v_new.view(),
        &mut k_cache.view_mut(),
        &mut v_cache.view_mut(),
        &pos.view(),
        None,
        store,
    )
    .expect("store");
    attention_decode(
        gpu.kernels,
        &gpu.stream,
        &q.view(),
        &k_cache.view(),
        &v_cache.view(),
        &pos.view(),
        None,
        &mut out.view_mut(),
        &mut ws.view_mut(),
        &shape,
    )
    .expect("attention");
    let graph = gpu.stream.end_capture().expect("end capture");
    let exec = graph.instantiate().expect("instantiate");

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
        q.write(gpu, &hq);
        k_new.write(gpu, &hkn);
        v_new.write(gpu, &hvn);
        pos.write(gpu, &positions);
        // SAFETY: every buffer the captured work uses (q, k_new, v_new, pos, out, ws and both
        // caches) is alive and unmoved until the end of this function, and the stream is
        // synchronised (by `read`) before the host touches any of them again.
        unsafe { exec.launch(&gpu.stream) }.expect("replay");
        let got = out.read(gpu);

        reference::rope::rope(&mut hq, &positions, None, rope_q, &params).expect("rope q");
        reference::rope::rope(&mut hkn, &positions, None, rope_k, &params).expect("rope k");
        hk.store(&hkn, &positions, 1, kv_dim, slots);
        hv.store(&hvn, &positions, 1, kv_dim, slots);
        let mut want = vec![0.0; n_head * d];
        reference::attention::attention(&hq, hk.kv(), hv.kv(), &positions, None, &mut want, &shape)
            .expect("reference");
        // GPU and CPU rope give q and k that differ in the last bits (more at larger positions),
        // and in an f16 cache such a difference can move a stored value by one f16 ulp, so the
        // comparison allows for that on top of the attention error.
        let (max_rel, rms_rel) = match elem {
            KvElem::F16 => (2e-3, 5e-4),
            KvElem::F32 => (5e-5 + 1e-6 * p as f32, 1e-5 + 1e-6 * p as f32),
            KvElem::Q8_0 => unreachable!("replayed over f16 and f32 caches"),
        };
        let what =
            format!("replayed step at position {p} ({elem:?}, window {window:?}, {slots} slots)");
        assert_close(&what, &got, &want, max_rel, rms_rel);
    }
}

#[test]
fn a_captured_decode_step_replays_at_new_positions() {
    let Some(gpu) = gpu("a_captured_decode_step_replays_at_new_positions") else {
        return;
    };
    // A full cache of 600 slots (three splits, crossed at 256 and 512) and a 32-slot ring with
    // window 32 that wraps many times.
    replay_decode_steps(&gpu, KvElem::F16, None, 600, 600);
    replay_decode_steps(&gpu, KvElem::F32, Some(32), 32, 200);
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

    fn host<'a>(&'a self, seqs: &'a [i32]) -> reference::kv_cache::HostPages<'a> {
        reference::kv_cache::HostPages {
            seqs,
            tables: &self.tables,
            table_len: self.table_len,
            block: self.block,
        }
    }
}

#[test]
fn paged_stores_and_attention_read_each_sequences_own_blocks() {
    let Some(gpu) = gpu("paged_stores_and_attention_read_each_sequences_own_blocks") else {
        return;
    };
    let mut noise = seeded(40);
    // Three sequences of 64 slots (tables of 4 blocks of 16) in a pool of 16 blocks; head
    // sizes for the one-warp-per-key decode kernel (64) and the one-thread-per-key one (80).
    let (block, table_len, n_seq) = (16, 4, 3);
    let slots = block * table_len;
    let pool = Pool::new(n_seq, table_len, block, 4);
    let dev_tables = Buf::from(&gpu, &pool.tables);
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
        want_k.store_paged(&k_src, &positions, Some(&host), rows, kv_dim, slots);
        want_v.store_paged(&v_src, &positions, Some(&host), rows, kv_dim, slots);
        let (dpos, dseqs) = (Buf::from(&gpu, &positions), Buf::from(&gpu, &seqs));
        let pages = KvPages {
            seqs: dseqs.view(),
            tables: dev_tables.view(),
            table_len,
            block,
        };
        let (ks, vs) = (Buf::from(&gpu, &k_src), Buf::from(&gpu, &v_src));
        let mut dk = Cache::from_f32(&gpu, &init, elem);
        let mut dv = Cache::from_f32(&gpu, &init, elem);
        store_kv(
            gpu.kernels,
            &gpu.stream,
            &ks.view(),
            &vs.view(),
            &mut dk.view_mut(),
            &mut dv.view_mut(),
            &dpos.view(),
            Some(&pages),
            KvStoreShape {
                rows,
                dim_k: kv_dim,
                dim_v: kv_dim,
                slots,
            },
        )
        .expect("paged store_kv");
        assert_eq!(dk.bits(&gpu), want_k.bits(), "{what}: paged K store");
        assert_eq!(dv.bits(&gpu), want_v.bits(), "{what}: paged V store");

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
        )
        .expect("paged reference attention");
        let (dq, dqpos, dqseqs) = (
            Buf::from(&gpu, &q),
            Buf::from(&gpu, &q_pos),
            Buf::from(&gpu, &q_seqs),
        );
        let q_pages = KvPages {
            seqs: dqseqs.view(),
            ..pages
        };
        let need = decode_workspace_floats(&shape).expect("workspace size");
        let mut ws = Buf::from(&gpu, &vec![f32::NAN; need.max(1)]);
        let mut out = Buf::from(&gpu, &vec![f32::NAN; want.len()]);
        attention_decode(
            gpu.kernels,
            &gpu.stream,
            &dq.view(),
            &dk.view(),
            &dv.view(),
            &dqpos.view(),
            Some(&q_pages),
            &mut out.view_mut(),
            &mut ws.view_mut(),
            &shape,
        )
        .expect("paged attention_decode");
        assert_close(
            &format!("{what}: paged decode"),
            &out.read(&gpu),
            &want,
            5e-5,
            1e-5,
        );

        // Prefill, both kernels: sequence 0's last 20 positions as one run, through its table.
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
        )
        .expect("paged reference prefill");
        let (dq, drun, drun_seqs) = (
            Buf::from(&gpu, &q),
            Buf::from(&gpu, &run),
            Buf::from(&gpu, &run_seqs),
        );
        let run_pages = KvPages {
            seqs: drun_seqs.view(),
            ..pages
        };
        let mut prefill_kernels = vec![PrefillKernel::Tiled, PrefillKernel::PerQuery];
        if elem != KvElem::F32 && d == 64 {
            prefill_kernels.push(PrefillKernel::Flash);
        }
        for kernel in prefill_kernels {
            let mut out = Buf::from(&gpu, &vec![f32::NAN; want.len()]);
            attention_prefill_on(
                gpu.kernels,
                &gpu.stream,
                kernel,
                &dq.view(),
                &dk.view(),
                &dv.view(),
                &drun.view(),
                Some(&run_pages),
                &mut out.view_mut(),
                &shape,
            )
            .expect("paged attention_prefill");
            let (max_rel, rms_rel) = if kernel == PrefillKernel::Flash {
                FLASH_TOLERANCE
            } else {
                (5e-5, 1e-5)
            };
            assert_close(
                &format!("{what}: paged prefill {kernel:?}"),
                &out.read(&gpu),
                &want,
                max_rel,
                rms_rel,
            );
        }
    }
}

#[test]
fn paged_calls_refuse_tables_that_do_not_cover_the_slots() {
    let Some(gpu) = gpu("paged_calls_refuse_tables_that_do_not_cover_the_slots") else {
        return;
    };
    let (src, pos) = (Buf::from(&gpu, &[0.0f32; 8]), Buf::from(&gpu, &[0i32]));
    let tables = Buf::from(&gpu, &[0i32, 1]);
    let mut cache = Cache::from_f32(&gpu, &[0.0; 64], KvElem::F32);
    let store = |pages: &KvPages, cache: &mut Cache, slots: usize| {
        store_rows(
            gpu.kernels,
            &gpu.stream,
            &src.view(),
            &mut cache.view_mut(),
            &pos.view(),
            Some(pages),
            1,
            8,
            slots,
        )
    };
    let pages = KvPages {
        seqs: pos.view(),
        tables: tables.view(),
        table_len: 2,
        block: 4,
    };
    // Two blocks of 4 cover 8 slots, not 9.
    let err = store(&pages, &mut cache, 9).expect_err("slots past the table");
    assert!(err.to_string().contains("9 slots"), "{err}");
    let odd = KvPages { block: 3, ..pages };
    let err = store(&odd, &mut cache, 6).expect_err("a block of 3");
    assert!(err.to_string().contains("power of two"), "{err}");
    assert!(store(&pages, &mut cache, 8).is_ok());
}

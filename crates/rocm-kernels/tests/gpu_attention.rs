//! GPU tests of rope, the K/V store and attention that are not comparisons with the CPU
//! references: the shapes, element types, views and block tables the ops refuse, and the
//! messages they refuse them with. The comparisons are cases of the self-test table
//! (`rocm_kernels::selftest`, group `ATTENTION`), which `gpu_selftest.rs` runs.
//!
//! Each test gets its device through `hip_ffi::testing::device_or_skip` (a printed skip without
//! a GPU; a failure under `HIPDECODE_REQUIRE_GPU=1`).

mod common;

use hip_ffi::testing::device_or_skip;
use hip_ffi::{DeviceBuffer, DeviceCopy, Stream};
use rocm_kernels::ops::attention::{
    attention_decode, attention_decode_on, attention_prefill, attention_prefill_on,
    decode_workspace_floats, AttentionShape, DecodeKernel, PrefillKernel,
};
use rocm_kernels::ops::kv_cache::{
    store_kv, store_rows, KvElem, KvPages, KvSlice, KvSliceMut, KvStoreShape,
};
use rocm_kernels::ops::rope::{RopeParams, RopeShape};
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};
use std::sync::MutexGuard;
use test_support::gpu::gpu_lock;

// ---------------------------------------------------------------------------------------------
// Harness

struct Gpu {
    kernels: &'static Kernels,
    stream: Stream,
    // GPU tests of a process run one at a time (`test_support::gpu` says why).
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
        b.buf.copy_from_host(data).expect("upload");
        b
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

/// A K or V cache on the device in any element type.
enum Cache {
    F16(Buf<u16>),
    F32(Buf<f32>),
    Q8_0(Buf<u8>),
}

impl Cache {
    fn view(&self) -> KvSlice {
        match self {
            Cache::F16(b) => KvSlice::F16(b.view()),
            Cache::F32(b) => KvSlice::F32(b.view()),
            Cache::Q8_0(b) => KvSlice::Q8_0(b.view()),
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

// ---------------------------------------------------------------------------------------------
// K/V store

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
    // The flash kernel has no heads of 96.
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
        for kernel in [PrefillKernel::Flash, PrefillKernel::FlashRegs] {
            let err = attention_prefill_on(
                gpu.kernels,
                &gpu.stream,
                kernel,
                &q.view(),
                &k.view(),
                &v.view(),
                &pos.view(),
                None,
                &mut out.view_mut(),
                &shape,
            )
            .expect_err("the flash kernels are not built for this");
            assert!(err.to_string().contains("flash"), "{kernel:?}: {err}");
        }
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
        DecodeKernel::KeyStreams,
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
    .expect_err("the key-stream kernel on an f32 cache");
    assert!(
        err.to_string().contains("key-stream") && err.to_string().contains("F32"),
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
// Paged caches

#[test]
fn paged_calls_refuse_tables_that_do_not_cover_the_slots() {
    let Some(gpu) = gpu("paged_calls_refuse_tables_that_do_not_cover_the_slots") else {
        return;
    };
    let (src, pos) = (Buf::from(&gpu, &[0.0f32; 8]), Buf::from(&gpu, &[0i32]));
    let tables = Buf::from(&gpu, &[0i32, 1]);
    let mut cache = Cache::F32(Buf::from(&gpu, &[0.0f32; 64]));
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

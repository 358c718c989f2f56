//! Set-up shared by the GPU test binaries (`mod common;` in each): the kernels compiled once per
//! binary, a device-or-skip entry point and device buffer helpers. A test skips with a printed
//! reason without a GPU (fails under `HIPDECODE_REQUIRE_GPU=1`), through
//! `hip_ffi::testing::device_or_skip`.

// Each test binary uses only some of these helpers.
#![allow(dead_code)]

use hip_ffi::{Device, DeviceBuffer, DeviceCopy, Stream};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};
use std::sync::OnceLock;

/// The kernels, compiled once for the whole test binary (through the cache the environment
/// names, so `HIPDECODE_KERNEL_CACHE=off` tests the compile path).
static KERNELS: OnceLock<Result<Kernels, String>> = OnceLock::new();

/// The binary's kernels on `device`, loaded by the first caller; panics naming `test` if
/// loading failed.
pub fn kernels(test: &str, device: &Device) -> &'static Kernels {
    let loaded = KERNELS.get_or_init(|| {
        let cache = KernelCache::from_env().map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        let k = Kernels::load(device, &cache).map_err(|e| e.to_string())?;
        eprintln!(
            "kernels loaded in {:.2?} (wave size {}, cache {:?})",
            started.elapsed(),
            k.wave_size(),
            cache.dir()
        );
        Ok(k)
    });
    loaded
        .as_ref()
        .unwrap_or_else(|e| panic!("{test}: loading the kernels failed: {e}"))
}

/// The kernels with the SIMT variant of the matrix-core layer, whatever the device has (the
/// build the native variants are tested against), loaded once per binary; panics naming
/// `test` if loading failed.
pub fn simt_kernels(test: &str, device: &Device) -> &'static Kernels {
    static SIMT: OnceLock<Result<Kernels, String>> = OnceLock::new();
    let loaded = SIMT.get_or_init(|| {
        let cache = KernelCache::from_env().map_err(|e| e.to_string())?;
        Kernels::load_with_mma(device, &cache, rocm_kernels::mma::MmaSetting::Simt)
            .map_err(|e| e.to_string())
    });
    let k = loaded
        .as_ref()
        .unwrap_or_else(|e| panic!("{test}: loading the SIMT kernels failed: {e}"));
    assert_eq!(k.mma_variant(), rocm_kernels::mma::MmaVariant::Simt);
    k
}

/// The kernels and a fresh stream, or `None` (after a printed skip) without a GPU.
pub fn setup(test: &str) -> Option<(&'static Kernels, Stream)> {
    let device = hip_ffi::testing::device_or_skip(test)?;
    let kernels = kernels(test, &device);
    let stream = Stream::new(kernels.device()).expect("stream");
    Some((kernels, stream))
}

/// A device copy of `data` (at least 4 bytes, so an empty slice still has an address).
pub fn upload<T: DeviceCopy>(k: &Kernels, data: &[T]) -> DeviceBuffer {
    let bytes = std::mem::size_of_val(data).max(4);
    let mut buf = DeviceBuffer::alloc(k.device(), bytes).expect("alloc");
    if !data.is_empty() {
        buf.copy_from_host(data).expect("upload");
    }
    buf
}

pub fn view<T>(buf: &DeviceBuffer, len: usize) -> DeviceSlice<T> {
    assert!(len * std::mem::size_of::<T>() <= buf.len_bytes());
    // SAFETY: the buffer holds `len` values of T (asserted), outlives every use in the test, and
    // each test synchronizes its stream before the buffer is dropped or read.
    unsafe { DeviceSlice::from_raw(buf.ptr().0, len) }
}

pub fn view_mut<T>(buf: &DeviceBuffer, len: usize) -> DeviceSliceMut<T> {
    assert!(len * std::mem::size_of::<T>() <= buf.len_bytes());
    // SAFETY: as `view`; no other view of the buffer is written by concurrent work.
    unsafe { DeviceSliceMut::from_raw(buf.ptr().0, len) }
}

/// The first `len` values of `buf`, after the stream's work is done.
pub fn download<T: DeviceCopy>(stream: &Stream, buf: &DeviceBuffer, len: usize) -> Vec<T> {
    stream.synchronize().expect("sync");
    let mut all: Vec<T> = buf.to_host_vec().expect("download");
    all.truncate(len);
    all
}
